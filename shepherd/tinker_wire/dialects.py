"""The two wire dialects of the Tinker API (trainer-api.md §4) and the one canonical form.

A server only ever sees the JSON dialect's body (a dict) and produces JSON-dialect results.
Protobuf — what the ``tinker`` SDK sends for ``forward_backward`` and wants back for
forward/backward and sampling results — is translated here by :mod:`shepherd.tinker_wire.proto`,
imported lazily: without protobuf installed a protobuf request gets a 415 naming the problem,
and the JSON dialect works alone.

Result encoding: protobuf only when the ``Accept`` header names ``application/x-protobuf``
and not ``application/json``. The tinker SDK accepts protobuf only; the Fireworks fork
accepts both and gets JSON, as hosted RLOR trainers answer it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from types import ModuleType
from typing import Any

import numpy as np

from shepherd.tinker_wire.errors import WireError

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
#: Every localplane trainer answer names its operation and dialect; the plane's gateway
#: counts requests by these (trainer-api.md §7, stats).
OP_HEADER = "x-localplane-op"
DIALECT_HEADER = "x-localplane-dialect"
_NUMBER = (int, float)


def _proto() -> ModuleType | None:
    try:
        from shepherd.tinker_wire import proto  # noqa: PLC0415  # optional, lazily
    except ImportError:
        return None
    return proto


def _media(value: str | None) -> str:
    return (value or "").split(";", 1)[0].strip().lower()


def decode_request(
    op: str, content_type: str | None, body: bytes, *, protobuf: bool = True
) -> tuple[dict[str, Any], str]:
    """The canonical (JSON-dialect) body of a request, and the dialect it came in. With
    ``protobuf`` off the server speaks JSON only, as hosted Fireworks trainers do: a protobuf
    body is refused (415)."""
    if _media(content_type) == PROTOBUF:
        if not protobuf:
            raise WireError(
                f"{op}: this trainer speaks the JSON dialect of the Tinker API only (as hosted "
                "Fireworks trainers do); send application/json",
                code=415,
            )
        proto = _proto()
        if proto is None:
            raise WireError(
                f"{op}: this server cannot read application/x-protobuf requests "
                "(protobuf is not installed); send JSON",
                code=415,
            )
        try:
            return proto.decode_request(op, body), "protobuf"
        except WireError:
            raise
        except Exception as exc:
            raise WireError(f"{op}: not a valid protobuf request: {exc}") from None
    if not body.strip():
        return {}, "json"
    try:
        parsed = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise WireError(f"{op}: the request body is not valid JSON") from None
    except RecursionError:
        raise WireError(f"{op}: the request body is JSON nested too deeply") from None
    except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits)
        raise WireError(f"{op}: a JSON number in the request has too many digits") from None
    if not isinstance(parsed, dict):
        raise WireError(f"{op}: the request body must be a JSON object")
    return parsed, "json"


def wants_protobuf(accept: str | None) -> bool:
    media = {_media(part) for part in (accept or "").split(",")}
    return PROTOBUF in media and JSON not in media


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(value: Any) -> bytes:
    """Compact JSON, with NumPy arrays (how results hold tensors) as lists."""
    return json.dumps(value, separators=(",", ":"), default=_json_default).encode()


def encode_result(
    op: str, result: dict[str, Any], accept: str | None, *, protobuf: bool = True
) -> tuple[bytes, str]:
    """A result's payload and media type, in the dialect the client asked for (JSON only
    when ``protobuf`` is off, whatever it asked for)."""
    if protobuf and wants_protobuf(accept):
        proto = _proto()
        if proto is not None and proto.can_encode(op):
            return proto.encode_result(op, result), PROTOBUF
    return dumps(result), JSON


def retry_varying(op: str, body: dict[str, Any]) -> tuple[str, ...]:
    """Fields of a sequenced request that name it rather than say what it asks, and may differ
    between a retry and its original: ``type`` always, and an anonymous sampler save's
    ``sampling_session_seq_id`` (tinker numbers that sampler afresh on every attempt of the
    same save, ``TrainingClient.save_weights_for_sampler``'s ``_send_request``)."""
    if op == "save_weights_for_sampler" and body.get("path") is None:
        return ("type", "sampling_session_seq_id")
    return ("type",)


def canonical_digest(body: Any, *, ignore: Iterable[str] = ()) -> str:
    """sha256 of a request body's content, the same whichever dialect or key order it came in.

    Two requests with equal digests ask for the same thing: a retry (the SDKs resend the
    very same body; their idempotency keys travel in headers) digests equal, a different
    request with the same ``seq_id`` does not. ``ignore`` names top-level fields that may
    legitimately differ between a retry and its original. ``None`` values count as absent,
    integers and integral floats as equal, and a list of numbers as the array it encodes
    (so a protobuf body and its JSON twin digest equal).
    """
    skip = set(ignore)
    h = hashlib.sha256()

    def numbers(array: np.ndarray) -> None:
        flat = np.ascontiguousarray(array, dtype=np.float64).reshape(-1)
        h.update(b"a%d[" % flat.size)
        h.update(flat.tobytes())
        h.update(b"]")

    def feed(value: Any) -> None:
        if value is None:
            h.update(b"n")
        elif isinstance(value, bool):
            h.update(b"t" if value else b"f")
        elif isinstance(value, int | float | np.integer | np.floating):
            number = float(value)
            h.update(b"i%d;" % int(number) if number.is_integer() else b"r" + repr(number).encode())
        elif isinstance(value, str):
            encoded = value.encode()
            h.update(b"s%d:" % len(encoded) + encoded)
        elif isinstance(value, np.ndarray) and value.dtype.kind in "iuf":
            numbers(value)
        elif isinstance(value, list | tuple) and value and all(type(v) in _NUMBER for v in value):
            numbers(np.asarray(value, dtype=np.float64))  # a token or value list: C speed
        elif isinstance(value, list | tuple | np.ndarray):
            h.update(b"l%d[" % len(value))
            for item in value:
                feed(item)
            h.update(b"]")
        elif isinstance(value, dict):
            items = sorted((str(k), v) for k, v in value.items() if v is not None)
            h.update(b"d%d{" % len(items))
            for key, item in items:
                feed(key)
                feed(item)
            h.update(b"}")
        else:
            feed(repr(value))

    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if k not in skip}
    feed(body)
    return h.hexdigest()
