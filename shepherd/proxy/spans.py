"""Provenance spans: a datum of ``forward``/``forward_backward`` may name tokens a sampler
produced by the sampled sequence's id (``stable_reinforce``'s recorded sequences) instead
of carrying their log-probabilities. Those ids are the program's and name what one trainer
sampled, so the proxy keeps the sampled sequences' log-probabilities from the answers and
sends each datum with the ``logprobs`` its spans stand for: it means the same on every
trainer, the first send and the redo alike.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from typing import Any

from shepherd.proxy.settings import MAX_KEPT_SEQUENCE_TOKENS
from shepherd.proxy.state import FutureTable, Op

#: The fields of a datum that name sampled sequences.
_SPANS = ("loss_fn_input_spans", "model_input_spans")


class Spans:
    """The sampled sequences' log-probabilities, by the program's sequence id (the newest,
    within :data:`MAX_KEPT_SEQUENCE_TOKENS`), and the mapping of a body's spans."""

    def __init__(self, futures: FutureTable) -> None:
        #: The program's futures: a sample's ticket knows the trainer's sequence ids.
        self._futures = futures
        self._sequences: OrderedDict[str, array[float]] = OrderedDict()
        self._tokens = 0

    def keep(self, op: Op, answer: dict[str, Any]) -> None:
        """The log-probabilities of sequences sampled for provenance (their program ids),
        newest kept, within :data:`MAX_KEPT_SEQUENCE_TOKENS`."""
        for i, seq in enumerate(answer.get("sequences") or []):
            logprobs = seq.get("logprobs") if isinstance(seq, dict) else None
            if not isinstance(logprobs, list) or not all(
                isinstance(x, int | float) for x in logprobs
            ):
                continue
            key = f"{op.request_id}:{i}"
            self._sequences[key] = array("d", logprobs)
            self._tokens += len(logprobs)
        while self._tokens > MAX_KEPT_SEQUENCE_TOKENS and self._sequences:
            _, gone = self._sequences.popitem(last=False)
            self._tokens -= len(gone)

    def translate(self, body: dict[str, Any]) -> None:
        """Provenance spans name sampled sequences by the program's ids. Where the proxy
        kept the sequences (sampled with ``record_stability_info``), the spans become the
        ``logprobs`` they stand for, sent with the datum — what the trainer would resolve
        them to — so a datum means the same on every trainer: one that never sampled them
        after a preemption, and the redo on it (always, so the first send and the redo
        carry the same numbers). Otherwise they are mapped to the trainer's ids."""
        for key in ("forward_input", "forward_backward_input"):
            inner = body.get(key)
            if not isinstance(inner, dict):
                continue
            data = []
            for datum in inner.get("data") or []:
                if isinstance(datum, dict) and (
                    datum.get("loss_fn_input_spans") or datum.get("model_input_spans")
                ):
                    datum = self._inline(datum) or dict(datum)
                    for name in _SPANS:
                        if datum.get(name):
                            datum[name] = [self._map_span(s) for s in datum[name]]
                data.append(datum)
            body[key] = {**inner, "data": data}

    def _inline(self, datum: dict[str, Any]) -> dict[str, Any] | None:
        """``datum`` with its spans replaced by the sampler log-probabilities they name, or
        None when a sequence it names is not kept (or a span does not fit it)."""
        spans = datum.get("loss_fn_input_spans") or []
        inputs = datum.get("loss_fn_inputs")
        if not isinstance(spans, list) or not isinstance(inputs, dict):
            return None
        total = 0
        for span in spans:
            arm = next(iter(span.values()), None) if isinstance(span, dict) else None
            if not isinstance(arm, dict) or not isinstance(arm.get("length"), int):
                return None
            total += arm["length"]
        sent = inputs.get("logprobs")
        values = sent.get("data") if isinstance(sent, dict) else sent
        q = (
            [float(x) for x in values]
            if isinstance(values, list) and len(values) == total
            else None
        )
        q = q if q is not None else [0.0] * total
        pos = 0
        for span in spans:
            kind, arm = next(iter(span.items()))
            length, offset = arm["length"], arm.get("offset", 0)
            if kind == "sampled_tokens":
                kept = self._sequences.get(str(arm.get("sequence_id")))
                if kept is None or not isinstance(offset, int) or offset + length > len(kept):
                    return None
                q[pos : pos + length] = kept[offset : offset + length]
            pos += length
        out = {k: v for k, v in datum.items() if k not in _SPANS}
        out["loss_fn_inputs"] = {
            **inputs,
            "logprobs": {"data": q, "dtype": "float32", "shape": [total]},
        }
        return out

    def _map_span(self, span: Any) -> Any:
        if not isinstance(span, dict):
            return span
        out = {}
        for kind, arm in span.items():
            if isinstance(arm, dict) and isinstance(arm.get("sequence_id"), str):
                arm = {**arm, "sequence_id": self._trainer_sequence_id(arm["sequence_id"])}
            out[kind] = arm
        return out

    def _trainer_sequence_id(self, program_sequence: str) -> str:
        head, _, index = program_sequence.rpartition(":")
        op = self._futures.get(head)
        if op is not None and index.isdigit() and int(index) < len(op.trainer_sequence_ids):
            return op.trainer_sequence_ids[int(index)]
        return program_sequence
