"""Shepherd's Tinker ``TrainingClient`` sends the optimizer a loop asks for, as tinker's own
``OptimStepRequest`` does (``adam_params`` for Adam, ``optimizer_params`` with its ``type``
otherwise), so a trainer that cannot run it refuses it instead of silently running Adam."""

from __future__ import annotations

from typing import Any

from tinker import types

from shepherd.tinker_client import TrainingClient


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def submit(self, op: str, body: dict[str, Any], **_: Any) -> str:
        self.calls.append((op, body))
        return f"req-{body['seq_id']}"

    async def result(self, request_id: str, *, timeout: float) -> dict[str, Any]:
        return {"metrics": {}}


def _client(trainer: _Recorder) -> TrainingClient:
    return TrainingClient(
        trainer,  # type: ignore[arg-type]  # only submit/result are used
        session_id="s",
        model_id="m",
        base_model="b",
        next_seq=1,
        timeout=5.0,
        info=None,
        tokenizer_id="t",
    )


async def test_adam_goes_as_adam_params_and_dimuon_keeps_its_type() -> None:
    trainer = _Recorder()
    client = _client(trainer)
    await client.optim_step(types.AdamParams(learning_rate=1e-3)).result_async()
    await client.optim_step(types.DimuonParams(learning_rate=1e-3)).result_async()
    (op1, adam), (op2, dimuon) = trainer.calls
    assert op1 == op2 == "optim_step"
    assert adam["adam_params"]["learning_rate"] == 1e-3 and "optimizer_params" not in adam
    assert dimuon["optimizer_params"]["type"] == "dimuon" and "adam_params" not in dimuon
    assert (adam["seq_id"], dimuon["seq_id"]) == (1, 2)
