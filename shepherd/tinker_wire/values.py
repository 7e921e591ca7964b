"""The Tinker API's value types in their canonical (JSON-dialect) form: ``TensorData``,
``ModelInput``, ``Datum`` (with provenance spans) and sampling stop sequences.

Whatever dialect a request came in (:mod:`~shepherd.tinker_wire.dialects`), its body is the
JSON form; this module turns it into NumPy arrays and back, and names the field of any
problem (``data[3].loss_fn_inputs.weights: ...``) in a :class:`WireError`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from shepherd.tinker_wire.errors import WireError

_DTYPES = {"int64": np.int64, "float32": np.float32}
#: Loss inputs that are token ids; everything else is float.
INT_INPUTS = frozenset({"target_tokens"})
#: The two kinds of provenance run (the protobuf ``ProvenanceSpan`` oneof's arms).
SPAN_KINDS = ("sampled_tokens", "prompt_tokens")


def tensor(value: Any, where: str, *, dtype: str | None = None) -> np.ndarray:
    """A ``TensorData`` (or a plain list, as some clients send) as a NumPy array."""
    if isinstance(value, list):
        value = {"data": value, "dtype": dtype or "float32"}
    if not isinstance(value, dict) or not isinstance(value.get("data"), list | np.ndarray):
        raise WireError(f"{where}: must be a TensorData object {{data, dtype, shape}}")
    name = value.get("dtype") or dtype or "float32"
    if name not in _DTYPES:
        raise WireError(f"{where}.dtype: {name!r} must be int64 or float32")
    try:
        flat = np.asarray(value["data"], dtype=_DTYPES[name])
    except (TypeError, ValueError, OverflowError):
        raise WireError(f"{where}.data: must be a flat list of numbers") from None
    if flat.ndim != 1:
        raise WireError(f"{where}.data: must be a flat list of numbers")
    shape = value.get("shape")
    crow, col = value.get("sparse_crow_indices"), value.get("sparse_col_indices")
    if crow is not None or col is not None:
        return _dense_from_csr(flat, crow, col, shape, where)
    if shape is None:
        return flat
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise WireError(f"{where}.shape: must be a list of non-negative ints")
    if int(np.prod(shape, dtype=np.int64)) != flat.size:
        raise WireError(f"{where}.shape: {shape} does not hold {flat.size} values")
    return flat.reshape(shape)


def _dense_from_csr(values: np.ndarray, crow: Any, col: Any, shape: Any, where: str) -> np.ndarray:
    if not (isinstance(crow, list) and isinstance(col, list)):
        raise WireError(f"{where}: sparse_crow_indices and sparse_col_indices go together")
    if not (isinstance(shape, list) and len(shape) == 2):
        raise WireError(f"{where}.shape: a sparse (CSR) tensor needs its 2-D dense shape")
    rows, cols = shape
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in [*crow, *col, rows, cols]):
        raise WireError(f"{where}: CSR indices and shape must be integers")
    if len(crow) != rows + 1 or len(col) != values.size or crow[-1] != values.size:
        raise WireError(f"{where}: inconsistent CSR indices for shape {shape}")
    dense = np.zeros((rows, cols), dtype=values.dtype)
    for r in range(rows):
        if not 0 <= crow[r] <= crow[r + 1] <= values.size:
            raise WireError(f"{where}.sparse_crow_indices: not non-decreasing within [0, nnz]")
        for k in range(crow[r], crow[r + 1]):
            c = col[k]
            if not 0 <= c < cols:
                raise WireError(f"{where}.sparse_col_indices: {c} is outside [0, {cols})")
            dense[r, c] = values[k]
    return dense


def tensor_data(array: np.ndarray) -> dict[str, Any]:
    """A NumPy array as ``TensorData`` (float arrays travel as float32, ints as int64).

    ``data`` stays a NumPy array: results wait in a trainer's memory until retrieved, and a
    float32 array is ~8x smaller than the list of Python floats it encodes to (the JSON
    encoder of :mod:`~shepherd.tinker_wire.dialects` converts it on the way out)."""
    flat: np.ndarray
    if array.dtype.kind in "iub":
        flat, name = np.ascontiguousarray(array, dtype=np.int64).reshape(-1), "int64"
    else:
        flat, name = np.ascontiguousarray(array, dtype=np.float32).reshape(-1), "float32"
    return {"data": flat, "dtype": name, "shape": list(array.shape)}


def model_input_tokens(value: Any, where: str) -> list[int]:
    """The tokens of a ``ModelInput`` (only ``encoded_text`` chunks carry tokens here)."""
    if not isinstance(value, dict) or not isinstance(value.get("chunks"), list):
        raise WireError(f"{where}: must be a ModelInput {{chunks: [...]}}")
    tokens: list[int] = []
    for i, chunk in enumerate(value["chunks"]):
        kind = chunk.get("type", "encoded_text") if isinstance(chunk, dict) else None
        if kind != "encoded_text":
            raise WireError(
                f"{where}.chunks[{i}]: only encoded_text chunks are supported (got {kind!r}); "
                "image and audio chunks need a multimodal model"
            )
        chunk_tokens = chunk.get("tokens")
        if not isinstance(chunk_tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in chunk_tokens
        ):
            raise WireError(f"{where}.chunks[{i}].tokens: must be a list of token ids")
        tokens.extend(chunk_tokens)
    return tokens


@dataclass(frozen=True)
class Span:
    """One provenance run (``tinker.types.SampledProvenanceSpan`` / ``PromptProvenanceSpan``):
    the datum positions it covers are positions ``[offset, offset + length)`` of the named
    sequence's sampled tokens (``sampled_tokens``) or of its request's prompt
    (``prompt_tokens``)."""

    kind: str
    sequence_id: str
    offset: int
    length: int


def spans(value: Any, where: str, *, covers: int) -> list[Span] | None:
    """A provenance span list, checked to tile exactly ``covers`` positions; None if absent.

    JSON form (protobuf-JSON of ``tinker_public.ProvenanceSpan``): a list of
    ``{"sampled_tokens": {"sequence_id", "offset", "length"}}`` or
    ``{"prompt_tokens": {...}}``."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise WireError(f"{where}: must be a list of provenance spans")
    out: list[Span] = []
    for i, raw in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in SPAN_KINDS:
            raise WireError(
                f"{at}: must be {{'sampled_tokens': {{...}}}} or {{'prompt_tokens': {{...}}}}"
            )
        kind, body = next(iter(raw.items()))
        if not isinstance(body, dict):
            raise WireError(f"{at}.{kind}: must be an object {{sequence_id, offset, length}}")
        seq = body.get("sequence_id")
        offset, length = body.get("offset", 0), body.get("length")
        if not isinstance(seq, str) or not seq:
            raise WireError(f"{at}.{kind}.sequence_id: must be a non-empty string")
        for name, number in (("offset", offset), ("length", length)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise WireError(f"{at}.{kind}.{name}: must be an integer >= 0")
        assert isinstance(offset, int) and isinstance(length, int)
        out.append(Span(kind, seq, offset, length))
    total = sum(s.length for s in out)
    if total != covers:
        raise WireError(f"{where}: the spans cover {total} positions, the field has {covers}")
    return out


@dataclass
class Datum:
    """One ``Datum``: its input tokens, its loss inputs as arrays and its provenance."""

    tokens: np.ndarray
    inputs: dict[str, np.ndarray]
    input_spans: list[Span] | None = None
    target_spans: list[Span] | None = None


def datums(value: Any, where: str, *, vocab: int, max_len: int) -> list[Datum]:
    """A ``Datum`` list as :class:`Datum` values, every token id checked against ``vocab``."""
    if not isinstance(value, list) or not value:
        raise WireError(f"{where}: must be a non-empty list of Datum")
    out = []
    for i, raw in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(raw, dict):
            raise WireError(f"{at}: must be a Datum {{model_input, loss_fn_inputs}}")
        tokens = model_input_tokens(raw.get("model_input"), f"{at}.model_input")
        if not tokens:
            raise WireError(f"{at}.model_input: has no tokens")
        if len(tokens) > max_len:
            raise WireError(
                f"{at}.model_input: {len(tokens)} tokens exceed max_context_length {max_len}"
            )
        if min(tokens) < 0 or max(tokens) >= vocab:
            raise WireError(f"{at}.model_input: token ids must be in [0, {vocab})")
        raw_inputs = raw.get("loss_fn_inputs") or {}
        if not isinstance(raw_inputs, dict):
            raise WireError(f"{at}.loss_fn_inputs: must be an object of TensorData")
        inputs = {
            name: tensor(
                td,
                f"{at}.loss_fn_inputs.{name}",
                dtype="int64" if name in INT_INPUTS else "float32",
            )
            for name, td in raw_inputs.items()
        }
        input_spans = spans(
            raw.get("model_input_spans"), f"{at}.model_input_spans", covers=len(tokens)
        )
        target = inputs.get("target_tokens")
        target_spans = spans(
            raw.get("loss_fn_input_spans"),
            f"{at}.loss_fn_input_spans",
            covers=int(target.shape[0]) if target is not None and target.ndim >= 1 else 0,
        )
        if (input_spans is None) != (target_spans is None):
            raise WireError(
                f"{at}: model_input_spans and loss_fn_input_spans come as a pair: send both or neither"
            )
        out.append(Datum(np.asarray(tokens, dtype=np.int64), inputs, input_spans, target_spans))
    return out


def stop_sequences(
    value: Any, encode: Callable[[str], list[int]], where: str
) -> list[list[int]] | None:
    """``SamplingParams.stop``: a string, strings, or token ids (each id a stop token);
    None keeps the model's default (stop at EOS)."""
    if value is None:
        return None
    if isinstance(value, str):
        return [encode(value)] if value else []
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            return [encode(v) for v in value if v]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return [[v] for v in value]
    raise WireError(f"{where}: must be a string, a list of strings or a list of token ids")
