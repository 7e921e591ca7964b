"""localplane's protobuf dialect against the real `tinker` SDK's own converters: what the SDK
serializes, the plane reads as the JSON dialect; what the plane writes, the SDK reads back."""

from __future__ import annotations

import numpy as np
import pytest
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import (
    deserialize_forward_backward_output,
    deserialize_sample_response,
)

from localplane.trainer.backend import PromptTopk
from localplane.trainer.sampling import topk_wire
from shepherd.tinker_wire import proto as proto_dialect


def _request(forward_only: bool = False, config: dict | None = None) -> bytes:
    datums = [
        types.Datum(
            model_input=types.ModelInput.from_ints([72, 105, 33]),
            loss_fn_inputs={
                "target_tokens": types.TensorData(data=[105, 33, 256], dtype="int64", shape=[3]),
                "weights": types.TensorData(data=[0.0, 1.0, 1.0], dtype="float32", shape=[3]),
            },
        ),
        types.Datum(
            model_input=types.ModelInput.from_ints([1, 2]),
            loss_fn_inputs={"target_tokens": [2, 3], "weights": [1.0, 0.5]},
        ),
    ]
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=datums, loss_fn="cross_entropy", loss_fn_config=config
        ),
        model_id="sess:train:0",
        seq_id=7,
    )
    msg = forward_backward_request_to_proto(request)
    msg.forward_only = forward_only
    return msg.SerializeToString()


def _plain(tensor: dict) -> dict:
    """Decoded tensors carry their data as arrays (a big batch decodes without a Python
    float per value); compare them as the JSON dialect's lists."""
    assert isinstance(tensor["data"], np.ndarray)
    return {**tensor, "data": tensor["data"].tolist()}


def test_forward_backward_request_decodes_to_the_json_dialect() -> None:
    body = proto_dialect.decode_request(
        "forward_backward", _request(config={"clip_low_threshold": 0.8, "mode": "x"})
    )
    assert body["model_id"] == "sess:train:0" and body["seq_id"] == 7
    assert "forward_only" not in body
    inner = body["forward_backward_input"]
    assert inner["loss_fn"] == "cross_entropy"
    assert inner["loss_fn_config"] == {"clip_low_threshold": 0.8, "mode": "x"}
    first, second = inner["data"]
    assert first["model_input"] == {"chunks": [{"type": "encoded_text", "tokens": [72, 105, 33]}]}
    assert _plain(first["loss_fn_inputs"]["target_tokens"]) == {
        "data": [105, 33, 256],
        "dtype": "int64",
        "shape": [3],
    }
    assert _plain(first["loss_fn_inputs"]["weights"]) == {
        "data": [0.0, 1.0, 1.0],
        "dtype": "float32",
        "shape": [3],
    }
    assert second["loss_fn_inputs"]["weights"]["data"].tolist() == [1.0, 0.5]


def test_forward_only_becomes_a_forward_body() -> None:
    body = proto_dialect.decode_request("forward_backward", _request(forward_only=True))
    assert body["forward_only"] is True
    assert "forward_backward_input" not in body
    assert body["forward_input"]["loss_fn"] == "cross_entropy"


def test_malformed_requests_name_the_problem() -> None:
    with pytest.raises(ValueError, match="not a ForwardBackwardRequest"):
        proto_dialect.decode_request("forward_backward", b"\xff\xff\xff")
    with pytest.raises(ValueError, match="no protobuf request form"):
        proto_dialect.decode_request("optim_step", b"")
    with pytest.raises(ValueError, match="model_id"):
        proto_dialect.decode_request("forward_backward", b"")


def test_forward_backward_output_reads_back_in_the_sdk() -> None:
    result = {
        "loss_fn_output_type": "ArrayRecord",
        "loss_fn_outputs": [
            {
                "logprobs": {"data": [-0.5, -1.0, -2.0], "dtype": "float32", "shape": [3]},
                "elementwise_loss": {"data": [0.0, 1.0, 2.0], "dtype": "float32", "shape": [3]},
            },
            {
                "logprobs": {"data": [-3.0], "dtype": "float32", "shape": [1]},
                "elementwise_loss": [4.0],
            },
        ],
        "metrics": {"loss:sum": 7.0},
    }
    assert proto_dialect.can_encode("forward_backward") and proto_dialect.can_encode("forward")
    out = deserialize_forward_backward_output(proto_dialect.encode_result("forward", result))
    assert out.metrics == {"loss:sum": 7.0}
    assert out.loss_fn_output_type == "ArrayRecord"
    assert len(out.loss_fn_outputs) == 2
    assert out.loss_fn_outputs[0]["logprobs"].tolist() == [-0.5, -1.0, -2.0]
    assert out.loss_fn_outputs[0]["elementwise_loss"].shape == [3]
    assert out.loss_fn_outputs[1]["logprobs"].tolist() == [-3.0]
    assert out.loss_fn_outputs[1]["elementwise_loss"].tolist() == [4.0]


def test_sample_response_reads_back_in_the_sdk() -> None:
    result = {
        "sequences": [
            {"tokens": [104, 105, 256], "logprobs": [-0.1, -0.2, -0.3], "stop_reason": "stop"},
            {"tokens": [104], "logprobs": [-0.4], "stop_reason": "length"},
        ],
        "prompt_logprobs": [None, -1.5],
    }
    assert proto_dialect.can_encode("asample") and not proto_dialect.can_encode("optim_step")
    out = deserialize_sample_response(proto_dialect.encode_result("asample", result))
    first, second = out.sequences
    assert first.tokens == [104, 105, 256] and first.stop_reason == "stop"
    assert np.allclose(first.logprobs, [-0.1, -0.2, -0.3])
    assert second.stop_reason == "length" and second.tokens == [104]
    assert out.prompt_logprobs is not None
    assert out.prompt_logprobs[0] is None  # NaN on the wire, None in the SDK
    assert out.prompt_logprobs[1] == pytest.approx(-1.5)


def test_topk_prompt_logprobs_read_back_in_the_sdk() -> None:
    """Top-k prompt logprobs as the SDK's dense TopkLogprobs: unscored positions read back as
    None, rows as (token id, logprob) pairs, from a trainer's structured rows or JSON pairs;
    a [T, K] forward output reads back with its shape."""
    rows = topk_wire(
        PromptTopk(1, np.array([[7, 3], [3, 7]]), np.array([[-0.5, -1.25], [-0.25, -2.0]]))
    )
    expected = [None, [(7, -0.5), (3, -1.25)], [(3, -0.25), (7, -2.0)]]
    as_json = [None, [[7, -0.5], [3, -1.25]], [[3, -0.25], [7, -2.0]]]
    for topk in (rows, as_json):
        result = {"sequences": [], "topk_prompt_logprobs": topk}
        out = deserialize_sample_response(proto_dialect.encode_result("asample", result))
        assert out.topk_prompt_logprobs == expected
        assert out.prompt_logprobs is None
    nothing = {"sequences": [], "topk_prompt_logprobs": [None]}  # a one-token prompt
    assert deserialize_sample_response(
        proto_dialect.encode_result("asample", nothing)
    ).topk_prompt_logprobs == [None]
    absent = deserialize_sample_response(proto_dialect.encode_result("asample", {"sequences": []}))
    assert absent.topk_prompt_logprobs is None

    grid = np.arange(6, dtype=np.float32).reshape(3, 2)
    out = deserialize_forward_backward_output(
        proto_dialect.encode_result(
            "forward",
            {
                "loss_fn_outputs": [
                    {"logprobs": {"data": grid.reshape(-1), "dtype": "float32", "shape": [3, 2]}}
                ]
            },
        )
    )
    assert out.loss_fn_outputs[0]["logprobs"].shape == [3, 2]
    assert out.loss_fn_outputs[0]["logprobs"].to_numpy().tolist() == grid.tolist()


def test_unknown_stop_reason_is_rejected() -> None:
    with pytest.raises(ValueError, match="stop_reason"):
        proto_dialect.encode_result(
            "asample", {"sequences": [{"tokens": [], "stop_reason": "eos"}]}
        )
