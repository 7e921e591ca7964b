"""The protobuf dialect of the Tinker API: what the `tinker` SDK (0.38) puts on the wire.

The tinker SDK sends `forward_backward` (and `forward`, as `forward_backward` with
`forward_only`) as a protobuf `tinker_public.ForwardBackwardRequest`, and asks for the results
of forward/backward and sampling futures as protobuf (`Accept: application/x-protobuf`): it
refuses a JSON body for those. Everything else it sends and accepts is JSON.

This module translates between those messages and the JSON dialect (the bodies and results
`FiretitanServiceClient` sends and reads), so a trainer never sees protobuf. The message
definitions are rebuilt here from their field numbers rather than imported from the `tinker`
package: a trainer must run without the SDK installed. Only the messages these two directions
need are declared; fields a newer client adds arrive as unknown fields and are ignored, as
protobuf does. Provenance spans (`Datum.model_input_spans` / `loss_fn_input_spans`) come out in
their protobuf-JSON form, `[{"sampled_tokens": {"sequence_id", "offset", "length"}}, ...]`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_PACKAGE = "tinker_public"
_F = descriptor_pb2.FieldDescriptorProto

# DType enum values of tinker_public.proto.
DTYPE_FLOAT32 = 1
DTYPE_INT64 = 2
DTYPE_INT32 = 3
DTYPE_BFLOAT16 = 4
STOP_REASON_STOP = 0
STOP_REASON_LENGTH = 1
#: The logprob of an empty `TopkLogprobs` cell (its token id is 0), as the SDK defines it.
TOPK_EMPTY_LOGPROB = -99999.0

_PROTO_TO_NUMPY: dict[int, np.dtype[Any]] = {
    DTYPE_FLOAT32: np.dtype("<f4"),
    DTYPE_INT64: np.dtype("<i8"),
    DTYPE_INT32: np.dtype("<i4"),
    DTYPE_BFLOAT16: np.dtype("<u2"),
}
# The public wire knows two dtypes; int32 widens to int64 and bfloat16 to float32, as the SDK does.
_PROTO_TO_PUBLIC = {
    DTYPE_FLOAT32: "float32",
    DTYPE_BFLOAT16: "float32",
    DTYPE_INT64: "int64",
    DTYPE_INT32: "int64",
}
_PUBLIC_TO_PROTO = {"float32": DTYPE_FLOAT32, "int64": DTYPE_INT64}
_STOP_REASONS = {"stop": STOP_REASON_STOP, "length": STOP_REASON_LENGTH}

#: Ops whose protobuf request form this module reads.
_DECODABLE = frozenset({"forward_backward", "forward"})
#: Ops whose results the SDK wants as protobuf (keyed by the op that created the future).
_ENCODABLE = {
    "forward_backward": "ForwardBackwardOutput",
    "forward": "ForwardBackwardOutput",
    "asample": "SampleResponse",
    "sample": "SampleResponse",
}


def _field(
    name: str,
    number: int,
    ftype: Any,  # a FieldDescriptorProto.Type value
    *,
    repeated: bool = False,
    type_name: str | None = None,
    oneof: int | None = None,
    proto3_optional: bool = False,
) -> descriptor_pb2.FieldDescriptorProto:
    field = descriptor_pb2.FieldDescriptorProto(
        name=name,
        number=number,
        type=ftype,
        label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL,
    )
    if type_name is not None:
        field.type_name = f".{_PACKAGE}.{type_name}"
    if oneof is not None:
        field.oneof_index = oneof
    if proto3_optional:
        field.proto3_optional = True
    return field


def _message(
    name: str,
    fields: Iterable[descriptor_pb2.FieldDescriptorProto],
    *,
    oneofs: Iterable[str] = (),
    nested: Iterable[descriptor_pb2.DescriptorProto] = (),
) -> descriptor_pb2.DescriptorProto:
    msg = descriptor_pb2.DescriptorProto(name=name)
    msg.field.extend(fields)
    for oneof in oneofs:
        msg.oneof_decl.add(name=oneof)
    msg.nested_type.extend(nested)
    return msg


def _map_entry(
    name: str, value: descriptor_pb2.FieldDescriptorProto
) -> descriptor_pb2.DescriptorProto:
    entry = _message(name, [_field("key", 1, _F.TYPE_STRING), value])
    entry.options.map_entry = True
    return entry


def _file() -> descriptor_pb2.FileDescriptorProto:
    """tinker_public.proto, reduced to the messages the trainer reads and writes.

    Field numbers and types are those of `tinker/proto/tinker_public_pb2.py` (tinker 0.38).
    """
    fd = descriptor_pb2.FileDescriptorProto(
        name="localplane_tinker_public.proto", package=_PACKAGE, syntax="proto3"
    )
    fd.enum_type.add(name="StopReason").value.extend(
        [
            descriptor_pb2.EnumValueDescriptorProto(name="STOP_REASON_STOP", number=0),
            descriptor_pb2.EnumValueDescriptorProto(name="STOP_REASON_LENGTH", number=1),
        ]
    )
    fd.enum_type.add(name="DType").value.extend(
        descriptor_pb2.EnumValueDescriptorProto(name=name, number=number)
        for name, number in [
            ("DTYPE_UNSPECIFIED", 0),
            ("DTYPE_FLOAT32", 1),
            ("DTYPE_INT64", 2),
            ("DTYPE_INT32", 3),
            ("DTYPE_BFLOAT16", 4),
        ]
    )
    enum = _F.TYPE_ENUM
    msg_t = _F.TYPE_MESSAGE
    fd.message_type.extend(
        [
            _message(
                "SampleResponse",
                [
                    _field("sequences", 1, msg_t, repeated=True, type_name="SampledSequence"),
                    _field("prompt_logprobs", 2, _F.TYPE_BYTES, oneof=0, proto3_optional=True),
                    _field(
                        "topk_prompt_logprobs",
                        3,
                        msg_t,
                        type_name="TopkLogprobs",
                        oneof=1,
                        proto3_optional=True,
                    ),
                    _field("prompt_cache_hit_tokens", 4, _F.TYPE_INT32),
                ],
                oneofs=["_prompt_logprobs", "_topk_prompt_logprobs"],
            ),
            _message(
                "TopkLogprobs",
                [
                    _field("token_ids", 1, _F.TYPE_BYTES),
                    _field("logprobs", 2, _F.TYPE_BYTES),
                    _field("k", 3, _F.TYPE_INT32),
                    _field("length", 4, _F.TYPE_INT32),
                ],
            ),
            _message(
                "SampledSequence",
                [
                    _field("stop_reason", 1, enum, type_name="StopReason"),
                    _field("tokens", 2, _F.TYPE_BYTES),
                    _field("logprobs", 3, _F.TYPE_BYTES, oneof=0, proto3_optional=True),
                ],
                oneofs=["_logprobs"],
            ),
            _message(
                "SparseCsr",
                [
                    _field("values", 1, _F.TYPE_BYTES),
                    _field("crow_indices", 2, _F.TYPE_BYTES),
                    _field("col_indices", 3, _F.TYPE_BYTES),
                ],
            ),
            _message(
                "Tensor",
                [
                    _field("dense", 1, _F.TYPE_BYTES, oneof=0),
                    _field("sparse_csr", 2, msg_t, type_name="SparseCsr", oneof=0),
                    _field("dtype", 3, enum, type_name="DType"),
                    _field("shape", 4, _F.TYPE_INT64, repeated=True),
                ],
                oneofs=["encoding"],
            ),
            _message(
                "BatchedTensor",
                [
                    _field("data", 1, _F.TYPE_BYTES),
                    _field("offsets", 2, _F.TYPE_BYTES),
                    _field("dtype", 3, enum, type_name="DType"),
                    _field("trailing_shape", 4, _F.TYPE_INT64, repeated=True),
                ],
            ),
            _message(
                "ArrayRecord",
                [
                    _field("type_tag", 1, _F.TYPE_STRING),
                    _field("fields", 2, msg_t, repeated=True, type_name="ArrayRecord.FieldsEntry"),
                    _field("num_datums", 3, _F.TYPE_INT64),
                ],
                nested=[
                    _map_entry("FieldsEntry", _field("value", 2, msg_t, type_name="BatchedTensor"))
                ],
            ),
            _message(
                "ForwardBackwardOutput",
                [
                    _field("loss_fn_output_type", 1, _F.TYPE_STRING),
                    _field("loss_fn_outputs", 2, msg_t, repeated=True, type_name="ArrayRecord"),
                    _field(
                        "metrics",
                        3,
                        msg_t,
                        repeated=True,
                        type_name="ForwardBackwardOutput.MetricsEntry",
                    ),
                ],
                nested=[_map_entry("MetricsEntry", _field("value", 2, _F.TYPE_DOUBLE))],
            ),
            _message(
                "ForwardBackwardRequest",
                [
                    _field("model_id", 1, _F.TYPE_STRING),
                    _field("seq_id", 2, _F.TYPE_INT32),
                    _field("data", 3, msg_t, repeated=True, type_name="Datum"),
                    _field("loss_fn", 4, _F.TYPE_STRING),
                    _field(
                        "loss_fn_config",
                        5,
                        msg_t,
                        repeated=True,
                        type_name="ForwardBackwardRequest.LossFnConfigEntry",
                    ),
                    _field("forward_only", 6, _F.TYPE_BOOL),
                    _field(
                        "loss_fn_config_v2",
                        7,
                        msg_t,
                        repeated=True,
                        type_name="ForwardBackwardRequest.LossFnConfigV2Entry",
                    ),
                ],
                nested=[
                    _map_entry("LossFnConfigEntry", _field("value", 2, _F.TYPE_DOUBLE)),
                    _map_entry(
                        "LossFnConfigV2Entry",
                        _field("value", 2, msg_t, type_name="LossConfigValue"),
                    ),
                ],
            ),
            _message(
                "LossConfigValue",
                [
                    _field("number", 1, _F.TYPE_DOUBLE, oneof=0),
                    _field("text", 2, _F.TYPE_STRING, oneof=0),
                ],
                oneofs=["value"],
            ),
            _message(
                "Datum",
                [
                    _field("model_input", 1, msg_t, repeated=True, type_name="Chunk"),
                    _field(
                        "loss_fn_inputs",
                        2,
                        msg_t,
                        repeated=True,
                        type_name="Datum.LossFnInputsEntry",
                    ),
                    _field(
                        "model_input_spans", 3, msg_t, repeated=True, type_name="ProvenanceSpan"
                    ),
                    _field(
                        "loss_fn_input_spans", 4, msg_t, repeated=True, type_name="ProvenanceSpan"
                    ),
                ],
                nested=[
                    _map_entry("LossFnInputsEntry", _field("value", 2, msg_t, type_name="Tensor"))
                ],
            ),
            _message(
                "ProvenanceSpan",
                [
                    _field("prompt_tokens", 1, msg_t, type_name="PromptProvenanceSpan", oneof=0),
                    _field("sampled_tokens", 2, msg_t, type_name="SampledProvenanceSpan", oneof=0),
                ],
                oneofs=["span"],
            ),
            *(
                _message(
                    name,
                    [
                        _field("sequence_id", 1, _F.TYPE_STRING),
                        _field("offset", 2, _F.TYPE_INT64),
                        _field("length", 3, _F.TYPE_INT64),
                    ],
                )
                for name in ("PromptProvenanceSpan", "SampledProvenanceSpan")
            ),
            _message(
                "Chunk",
                [_field("encoded_text", 1, msg_t, type_name="EncodedTextChunk", oneof=0)],
                oneofs=["chunk"],
            ),
            _message("EncodedTextChunk", [_field("tokens", 1, _F.TYPE_BYTES)]),
        ]
    )
    return fd


# A private pool: the `tinker` package, when a test imports it into the same process, registers
# its own tinker_public.* names in the default pool; keeping ours apart avoids any clash.
_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())


def _cls(name: str) -> Any:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.{name}"))


ForwardBackwardRequest = _cls("ForwardBackwardRequest")
ForwardBackwardOutput = _cls("ForwardBackwardOutput")
SampleResponse = _cls("SampleResponse")


# --- requests: protobuf -> JSON dialect ------------------------------------------------------


def decode_request(op: str, body: bytes) -> dict[str, Any]:
    """The JSON-dialect body for a protobuf request to `op`.

    A `forward_backward` request with `forward_only` set is a forward pass: its body comes back
    in the shape of the JSON dialect's `forward` endpoint (`forward_input`) and carries
    `"forward_only": true`, so the caller can route it as `forward`.
    Raises ValueError (message names the field) for a malformed message or an op that has no
    protobuf form.
    """
    if op not in _DECODABLE:
        raise ValueError(f"{op} has no protobuf request form; send it as JSON")
    msg = ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:  # protobuf raises DecodeError, a Message error subclass
        raise ValueError(f"body is not a ForwardBackwardRequest message: {exc}") from exc
    if not msg.model_id:
        raise ValueError("model_id is required")
    if not msg.loss_fn:
        raise ValueError("loss_fn is required")
    data = [_datum(i, datum) for i, datum in enumerate(msg.data)]
    if not data:
        raise ValueError("data must hold at least one datum")
    inner: dict[str, Any] = {"data": data, "loss_fn": msg.loss_fn}
    config = _loss_fn_config(msg)
    if config:
        inner["loss_fn_config"] = config
    forward_only = bool(msg.forward_only) or op == "forward"
    out: dict[str, Any] = {"model_id": msg.model_id, "seq_id": int(msg.seq_id)}
    if forward_only:
        out["forward_input"] = inner
        out["forward_only"] = True
    else:
        out["forward_backward_input"] = inner
    return out


def _loss_fn_config(msg: Any) -> dict[str, float | str]:
    # The SDK writes every value twice (legacy float map and v2); v2 wins where both exist.
    config: dict[str, float | str] = {key: float(v) for key, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():
        kind = value.WhichOneof("value")
        if kind == "number":
            config[key] = float(value.number)
        elif kind == "text":
            config[key] = value.text
    return config


def _datum(index: int, datum: Any) -> dict[str, Any]:
    chunks = []
    for j, chunk in enumerate(datum.model_input):
        if chunk.WhichOneof("chunk") != "encoded_text":
            raise ValueError(
                f"data[{index}].model_input.chunks[{j}]: only encoded_text chunks are supported"
            )
        raw = chunk.encoded_text.tokens
        if len(raw) % 4:
            raise ValueError(f"data[{index}].model_input.chunks[{j}].tokens: not int32 bytes")
        tokens = np.frombuffer(raw, dtype="<i4").astype(np.int64).tolist()
        chunks.append({"type": "encoded_text", "tokens": tokens})
    inputs = {
        name: _tensor(f"data[{index}].loss_fn_inputs.{name}", tensor)
        for name, tensor in sorted(datum.loss_fn_inputs.items())
    }
    out: dict[str, Any] = {"model_input": {"chunks": chunks}, "loss_fn_inputs": inputs}
    for name in ("model_input_spans", "loss_fn_input_spans"):
        spans = getattr(datum, name)
        if len(spans):
            out[name] = [_span(s) for s in spans]
    return out


def _span(span: Any) -> dict[str, Any]:
    kind = span.WhichOneof("span") or "sampled_tokens"
    arm = getattr(span, kind)
    return {
        kind: {"sequence_id": arm.sequence_id, "offset": int(arm.offset), "length": int(arm.length)}
    }


def _tensor(where: str, msg: Any) -> dict[str, Any]:
    """A protobuf Tensor as JSON-dialect TensorData (always dense)."""
    np_dtype = _PROTO_TO_NUMPY.get(msg.dtype)
    if np_dtype is None:
        raise ValueError(f"{where}: unsupported dtype {msg.dtype}")
    shape = [int(s) for s in msg.shape]
    encoding = msg.WhichOneof("encoding")
    if encoding == "sparse_csr":
        values = _frombuffer(where, msg.sparse_csr.values, np_dtype)
        crow = _frombuffer(where, msg.sparse_csr.crow_indices, np.dtype("<i8"))
        cols = _frombuffer(where, msg.sparse_csr.col_indices, np.dtype("<i8"))
        if len(shape) != 2 or len(crow) != shape[0] + 1 or len(cols) != len(values):
            raise ValueError(f"{where}: inconsistent sparse CSR tensor")
        dense = np.zeros(shape, dtype=values.dtype)
        for row in range(shape[0]):
            lo, hi = int(crow[row]), int(crow[row + 1])
            dense[row, cols[lo:hi]] = values[lo:hi]
        arr = dense.reshape(-1)
    else:
        arr = _frombuffer(where, msg.dense, np_dtype)
    if msg.dtype == DTYPE_BFLOAT16:
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    public = _PROTO_TO_PUBLIC[msg.dtype]
    arr = arr.astype(np.float32 if public == "float32" else np.int64)
    if not shape:
        shape = [int(arr.size)]
    if math.prod(shape) != arr.size:
        raise ValueError(f"{where}: shape {shape} does not match {arr.size} values")
    # An array, not a list: the codecs and the trainer take either, and a big batch decodes
    # several times faster without a Python float per value.
    return {"data": arr, "dtype": public, "shape": shape}


def _frombuffer(where: str, raw: bytes, dtype: np.dtype[Any]) -> np.ndarray:
    if len(raw) % dtype.itemsize:
        raise ValueError(f"{where}: {len(raw)} bytes is not a whole number of {dtype} values")
    return np.frombuffer(raw, dtype=dtype)


# --- results: JSON dialect -> protobuf --------------------------------------------------------


def can_encode(op: str) -> bool:
    """Whether the result of a future created by `op` has a protobuf form."""
    return op in _ENCODABLE


def encode_result(op: str, result: Mapping[str, Any]) -> bytes:
    """The protobuf message the tinker SDK expects for the (JSON-dialect) result of `op`."""
    kind = _ENCODABLE.get(op)
    if kind == "ForwardBackwardOutput":
        return _forward_backward_output(result).SerializeToString()
    if kind == "SampleResponse":
        return _sample_response(result).SerializeToString()
    raise ValueError(f"{op} results have no protobuf form")


def _forward_backward_output(result: Mapping[str, Any]) -> Any:
    out = ForwardBackwardOutput()
    out.loss_fn_output_type = str(result.get("loss_fn_output_type") or "ArrayRecord")
    for key, value in (result.get("metrics") or {}).items():
        out.metrics[str(key)] = float(value)
    datums = [
        {name: _array(f"loss_fn_outputs[{i}].{name}", v) for name, v in d.items()}
        for i, d in enumerate(result.get("loss_fn_outputs") or [])
    ]
    # One ArrayRecord per run of datums whose fields agree in dtype and trailing shape: the
    # SDK concatenates the records' datums in order, and each BatchedTensor is rectangular
    # apart from its leading dimension.
    run: list[dict[str, tuple[np.ndarray, str]]] = []
    signature: tuple | None = None
    for datum in datums:
        sig = tuple(sorted((n, dt, a.shape[1:]) for n, (a, dt) in datum.items()))
        if run and sig != signature:
            _add_record(out, run)
            run = []
        run.append(datum)
        signature = sig
    if run:
        _add_record(out, run)
    return out


def _add_record(out: Any, datums: list[dict[str, tuple[np.ndarray, str]]]) -> None:
    record = out.loss_fn_outputs.add()
    record.type_tag = out.loss_fn_output_type
    record.num_datums = len(datums)
    for name in datums[0]:
        arrays = [d[name][0] for d in datums]
        public = datums[0][name][1]
        np_dtype = np.dtype("<f4") if public == "float32" else np.dtype("<i8")
        flat = [np.ascontiguousarray(a, dtype=np_dtype).reshape(-1) for a in arrays]
        sizes = np.array([0] + [f.nbytes for f in flat], dtype="<i8")
        batched = record.fields[name]
        batched.data = b"".join(f.tobytes() for f in flat)
        batched.offsets = np.cumsum(sizes, dtype="<i8").tobytes()
        batched.dtype = _PUBLIC_TO_PROTO[public]
        batched.trailing_shape.extend(int(s) for s in arrays[0].shape[1:])


def _array(where: str, value: Any) -> tuple[np.ndarray, str]:
    """A JSON-dialect tensor (TensorData dict, list or ndarray) as (array, public dtype)."""
    if isinstance(value, Mapping):
        public = str(value.get("dtype") or "float32")
        if public not in _PUBLIC_TO_PROTO:
            raise ValueError(f"{where}: unsupported dtype {public}")
        arr = np.asarray(
            value.get("data", []), dtype=np.float32 if public == "float32" else np.int64
        )
        shape = value.get("shape")
        if shape:
            arr = arr.reshape([int(s) for s in shape])
        return (arr if arr.ndim else arr.reshape(1)), public
    arr = np.asarray(value)
    public = "int64" if np.issubdtype(arr.dtype, np.integer) else "float32"
    return (arr if arr.ndim else arr.reshape(1)), public


def _sample_response(result: Mapping[str, Any]) -> Any:
    out = SampleResponse()
    for i, seq in enumerate(result.get("sequences") or []):
        reason = seq.get("stop_reason", "stop")
        if reason not in _STOP_REASONS:
            raise ValueError(f"sequences[{i}].stop_reason: unknown value {reason!r}")
        msg = out.sequences.add()
        msg.stop_reason = _STOP_REASONS[reason]
        msg.tokens = np.asarray(seq.get("tokens") or [], dtype="<i4").tobytes()
        logprobs = seq.get("logprobs")
        if logprobs is not None:
            msg.logprobs = np.asarray(logprobs, dtype="<f4").tobytes()
    prompt_logprobs = result.get("prompt_logprobs")
    if prompt_logprobs is not None:
        # The wire marks positions without a logprob (the first prompt token) as NaN.
        values = [math.nan if v is None else float(v) for v in prompt_logprobs]
        out.prompt_logprobs = np.asarray(values, dtype="<f4").tobytes()
    topk = result.get("topk_prompt_logprobs")
    if topk is not None:
        _topk_logprobs(out.topk_prompt_logprobs, topk)
    if result.get("prompt_cache_hit_tokens"):
        out.prompt_cache_hit_tokens = int(result["prompt_cache_hit_tokens"])
    return out


def _topk_logprobs(msg: Any, rows: list[Any]) -> None:
    """Per-position top-k pairs (None where nothing was scored) as the SDK's dense
    `TopkLogprobs`: row-major [length, k] matrices whose empty cells hold the sentinel
    (token 0, logprob -99999); the SDK reads an all-sentinel row back as None."""
    pairs = [None if row is None else _topk_pairs(row) for row in rows]
    # At least one column: a prompt with nothing scored still reads back as [None, ...].
    k = max((len(p[0]) for p in pairs if p is not None), default=0) or 1
    ids = np.zeros((len(rows), k), dtype="<i4")
    logprobs = np.full((len(rows), k), TOPK_EMPTY_LOGPROB, dtype="<f4")
    for i, pair in enumerate(pairs):
        if pair is not None:
            ids[i, : len(pair[0])] = pair[0]
            logprobs[i, : len(pair[1])] = pair[1]
    msg.token_ids = ids.tobytes()
    msg.logprobs = logprobs.tobytes()
    msg.k = k
    msg.length = len(rows)


def _topk_pairs(row: Any) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, logprobs) of one position: a structured (token_id, logprob) row, as a
    localplane trainer keeps them, or JSON's [[id, logprob], ...]."""
    arr = np.asarray(row)
    if arr.dtype.names:
        return arr[arr.dtype.names[0]], arr[arr.dtype.names[1]]
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    arr = arr.astype(np.float64).reshape(-1, 2)
    return arr[:, 0].astype(np.int64), arr[:, 1]
