"""Step boundaries of Shepherd's Tinker client: a boundary (``drain``) waits for samples as
for sequenced operations, and an abandoned step's operations are made sure to reach the
trainer (``confirm_submitted``). Pure client logic, against a scripted trainer."""

from __future__ import annotations

import asyncio
from typing import Any

from shepherd.platform import RequestTimeout
from shepherd.tinker_client import TrainingClient


class ScriptedTrainer:
    """The trainer calls the client makes, answered by the test."""

    def __init__(self) -> None:
        self.sample_gate = asyncio.Event()
        self.submitted: list[tuple[str, int]] = []
        self.fail_next_submit = False

    async def create_sampling_session(self, *_: Any, **__: Any) -> str:
        return "sampler-1"

    async def call(self, op: str, body: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        assert op == "asample"
        await self.sample_gate.wait()
        return {"sequences": [{"tokens": [1, 2], "stop_reason": "length"}]}

    async def submit(self, op: str, body: dict[str, Any], **_: Any) -> str:
        if self.fail_next_submit:
            self.fail_next_submit = False
            raise RequestTimeout("lost on the way", method="POST", url=op)
        self.submitted.append((op, body["seq_id"]))
        return f"req-{body['seq_id']}"

    async def result(self, request_id: str, *, timeout: float) -> dict[str, Any]:
        return {"metrics": {}}


def client(trainer: ScriptedTrainer) -> TrainingClient:
    return TrainingClient(
        trainer,  # type: ignore[arg-type]
        session_id="s",
        model_id="s:train:1",
        base_model="m",
        next_seq=1,
        timeout=5,
    )


async def test_a_step_boundary_waits_for_samples_in_flight() -> None:
    trainer = ScriptedTrainer()
    tc = client(trainer)
    sampler = tc.create_sampling_client("sampler-step-1")
    future = sampler.sample([1, 2, 3], 1, {"max_tokens": 2})  # not awaited by the "loop"
    drained = asyncio.ensure_future(tc.drain())
    await asyncio.sleep(0.05)
    assert not drained.done(), "the boundary was recorded while a sample was in flight"
    trainer.sample_gate.set()
    await asyncio.wait_for(drained, 1)
    assert future.done()


async def test_an_abandoned_steps_operations_reach_the_trainer_in_order() -> None:
    trainer = ScriptedTrainer()
    tc = client(trainer)
    trainer.fail_next_submit = True
    lost = tc.forward_backward([], "cross_entropy")  # seq 1: its submission is lost
    tc.optim_step({"learning_rate": 1e-3})  # seq 2
    await asyncio.sleep(0.05)
    assert lost.done() and trainer.submitted == [("optim_step", 2)]
    assert tc.optim_steps == 1 and tc.next_seq == 3
    await tc.confirm_submitted()
    # seq 1 sent again (the trainer would otherwise hold seq 2 and every later one).
    assert trainer.submitted == [("optim_step", 2), ("forward_backward", 1)]
    await tc.confirm_submitted()  # nothing left unconfirmed
    assert len(trainer.submitted) == 2
