"""The Tinker API on the wire, in one place for every party that speaks it.

localplane's trainer (which serves the API) and Shepherd's data-plane proxy (which sits
between a ``tinker``-SDK program and a trainer) read and write the same bodies, so they share
these codecs rather than each keeping a copy that can drift:

* :mod:`~shepherd.tinker_wire.dialects` — a request body (JSON or protobuf) to the canonical
  JSON-dialect dict and a result back to the dialect the client asked for; the header names
  localplane's trainers answer with.
* :mod:`~shepherd.tinker_wire.proto` — the protobuf messages of the ``tinker`` SDK (0.38),
  rebuilt from their field numbers so nothing here needs the SDK installed.
* :mod:`~shepherd.tinker_wire.values` — the value types (``TensorData``, ``ModelInput``,
  ``Datum``, provenance spans, stop sequences) as NumPy arrays and back.
* :mod:`~shepherd.tinker_wire.errors` — :class:`~shepherd.tinker_wire.errors.WireError`, the
  one exception every codec raises for a body it cannot read, naming the field.

Import cost matters: a localplane trainer process imports this package at start-up (it
pays for every module, once per job), so nothing here pulls in pydantic, FastAPI or the
``tinker`` SDK; protobuf loads only when a protobuf body arrives.
"""
