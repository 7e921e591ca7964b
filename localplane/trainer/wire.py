"""The Tinker API's value types as the trainer reads and writes them (canonical JSON form):
``TensorData``, ``ModelInput``, ``Datum``, sampling parameters.

Whatever dialect a request came in (:mod:`localplane.trainer.dialects`), the service sees
the JSON form; this module turns it into NumPy arrays and back, and names the field of any
problem so the client sees ``data[3].loss_fn_inputs.weights: ...``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_DTYPES = {"int64": np.int64, "float32": np.float32}
#: Loss inputs that are token ids; everything else is float.
_INT_INPUTS = frozenset({"target_tokens"})


class UserError(Exception):
    """A request the trainer cannot apply as sent; a future fails with category ``user``."""


def tensor(value: Any, where: str, *, dtype: str | None = None) -> np.ndarray:
    """A ``TensorData`` (or a plain list, as some clients send) as a NumPy array."""
    if isinstance(value, list):
        value = {"data": value, "dtype": dtype or "float32"}
    if not isinstance(value, dict) or not isinstance(value.get("data"), list):
        raise UserError(f"{where}: must be a TensorData object {{data, dtype, shape}}")
    name = value.get("dtype") or dtype or "float32"
    if name not in _DTYPES:
        raise UserError(f"{where}.dtype: {name!r} must be int64 or float32")
    try:
        flat = np.asarray(value["data"], dtype=_DTYPES[name])
    except (TypeError, ValueError):
        raise UserError(f"{where}.data: must be a flat list of numbers") from None
    if flat.ndim != 1:
        raise UserError(f"{where}.data: must be a flat list of numbers")
    shape = value.get("shape")
    crow, col = value.get("sparse_crow_indices"), value.get("sparse_col_indices")
    if crow is not None or col is not None:
        return _dense_from_csr(flat, crow, col, shape, where)
    if shape is None:
        return flat
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise UserError(f"{where}.shape: must be a list of non-negative ints")
    if int(np.prod(shape, dtype=np.int64)) != flat.size:
        raise UserError(f"{where}.shape: {shape} does not hold {flat.size} values")
    return flat.reshape(shape)


def _dense_from_csr(values: np.ndarray, crow: Any, col: Any, shape: Any, where: str) -> np.ndarray:
    if not (isinstance(crow, list) and isinstance(col, list)):
        raise UserError(f"{where}: sparse_crow_indices and sparse_col_indices go together")
    if not (isinstance(shape, list) and len(shape) == 2):
        raise UserError(f"{where}.shape: a sparse (CSR) tensor needs its 2-D dense shape")
    rows, cols = shape
    if len(crow) != rows + 1 or len(col) != values.size or crow[-1] != values.size:
        raise UserError(f"{where}: inconsistent CSR indices for shape {shape}")
    dense = np.zeros((rows, cols), dtype=values.dtype)
    for r in range(rows):
        for k in range(crow[r], crow[r + 1]):
            c = col[k]
            if not 0 <= c < cols:
                raise UserError(f"{where}.sparse_col_indices: {c} is outside [0, {cols})")
            dense[r, c] = values[k]
    return dense


def tensor_data(array: np.ndarray) -> dict[str, Any]:
    """A NumPy array as ``TensorData`` (float arrays travel as float32, ints as int64)."""
    if array.dtype.kind in "iub":
        flat = np.asarray(array, dtype=np.int64)
        name = "int64"
    else:
        flat = np.asarray(array, dtype=np.float32)
        name = "float32"
    return {"data": flat.reshape(-1).tolist(), "dtype": name, "shape": list(array.shape)}


def model_input_tokens(value: Any, where: str) -> list[int]:
    """The tokens of a ``ModelInput`` (only ``encoded_text`` chunks carry tokens here)."""
    if not isinstance(value, dict) or not isinstance(value.get("chunks"), list):
        raise UserError(f"{where}: must be a ModelInput {{chunks: [...]}}")
    tokens: list[int] = []
    for i, chunk in enumerate(value["chunks"]):
        kind = chunk.get("type", "encoded_text") if isinstance(chunk, dict) else None
        if kind != "encoded_text":
            raise UserError(
                f"{where}.chunks[{i}]: only encoded_text chunks are supported by this trainer "
                f"(got {kind!r})"
            )
        chunk_tokens = chunk.get("tokens")
        if not isinstance(chunk_tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in chunk_tokens
        ):
            raise UserError(f"{where}.chunks[{i}].tokens: must be a list of token ids")
        tokens.extend(chunk_tokens)
    return tokens


def datums(
    value: Any, where: str, *, vocab: int, max_len: int
) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
    """``Datum`` list -> ``(input tokens, loss_fn_inputs)`` pairs, as the model takes them."""
    if not isinstance(value, list) or not value:
        raise UserError(f"{where}: must be a non-empty list of Datum")
    out = []
    for i, datum in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(datum, dict):
            raise UserError(f"{at}: must be a Datum {{model_input, loss_fn_inputs}}")
        tokens = model_input_tokens(datum.get("model_input"), f"{at}.model_input")
        if not tokens:
            raise UserError(f"{at}.model_input: has no tokens")
        if len(tokens) > max_len:
            raise UserError(
                f"{at}.model_input: {len(tokens)} tokens exceed max_context_length {max_len}"
            )
        if min(tokens) < 0 or max(tokens) >= vocab:
            raise UserError(f"{at}.model_input: token ids must be in [0, {vocab})")
        raw_inputs = datum.get("loss_fn_inputs") or {}
        if not isinstance(raw_inputs, dict):
            raise UserError(f"{at}.loss_fn_inputs: must be an object of TensorData")
        inputs = {
            name: tensor(
                td,
                f"{at}.loss_fn_inputs.{name}",
                dtype="int64" if name in _INT_INPUTS else "float32",
            )
            for name, td in raw_inputs.items()
        }
        out.append((np.asarray(tokens, dtype=np.int64), inputs))
    return out


def stop_sequences(value: Any, encode: Any, where: str) -> list[list[int]] | None:
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
    raise UserError(f"{where}: must be a string, a list of strings or a list of token ids")
