"""Bad input is refused before anything is provisioned; secrets never reach a history;
long jobs continue-as-new; user loops run with the same guarantees; events speed readiness
up while polling stays the fallback."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError

from shepherd.jobs import start_job
from shepherd.phases import Phase
from shepherd.spec import SpecError
from tests.helpers import spec_data
from tests.workflows import user_loops
from tests.workflows.conftest import Stack, make_registry, worker_for
from tests.workflows.test_recovery import SLOW, model_digest


def _spec(**sections: Any) -> dict[str, Any]:
    return spec_data("bad", **sections)


INVALID: list[tuple[dict[str, Any], str]] = [
    (_spec(name="Bad_Name"), "name"),
    (_spec(name="x" * 41), "name"),
    (_spec(labels={"Team": "a"}), "labels"),
    (_spec(trainer={"base_model": ""}), "trainer.base_model"),
    (_spec(trainer={"lora_rank": -1}), "trainer.lora_rank"),
    (_spec(trainer={"learning_rate": 0}), "trainer.learning_rate"),
    (_spec(trainer={"display_name": "d" * 64}), "trainer.display_name"),
    (_spec(trainer={"inactivity_timeout": "4h"}), "trainer.inactivity_timeout"),
    (_spec(trainer={"training_shape": "qwen3-8b"}), "trainer.training_shape"),
    (
        _spec(
            trainer={
                "training_shape": "accounts/fireworks/trainingShapes/qwen3-8b-128k-h200",
                "accelerator_type": "NVIDIA_H100_80GB",
            }
        ),
        "trainer.accelerator_type",
    ),
    (
        _spec(
            trainer={
                "training_shape": "accounts/fireworks/trainingShapes/qwen3-8b-128k-h200",
                "node_count": 2,
            }
        ),
        "trainer.node_count",
    ),
    (_spec(trainer={"accelerator_type": "TPU_V5"}), "trainer.accelerator_type"),
    (_spec(trainer={"lora_rnak": 8}), "trainer.lora_rnak"),
    (_spec(trainer={"forward_only": True}), "trainer.forward_only"),
    (_spec(training={"total_steps": 0}), "training.total_steps"),
    (_spec(training={"total_steps": 5}), "checkpoint.every_steps"),
    (_spec(training={"loop": "not a loop"}), "training.loop"),
    (_spec(training={"loop": "os:system"}), "training.loop"),
    (_spec(training={"micro_batches": 0}), "training.micro_batches"),
    (_spec(training={"resume_from": "step-10"}), "training.resume_from"),
    (_spec(checkpoint={"keep_last": 0}), "checkpoint.keep_last"),
    (
        _spec(checkpoint={"every_steps": 10, "evaluate": False}, output={"promote": "best"}),
        "output.promote",
    ),
    (_spec(output={"model_id": "Bad.Model"}), "output.model_id"),
    (_spec(output={"model_id": None}), "output.model_id"),
    (_spec(scheduling={"priority": 11}), "scheduling.priority"),
    (_spec(policies={"poll_interval": "100ms"}), "policies.poll_interval"),
    (_spec(policies={"pending_timeout": "soon"}), "policies.pending_timeout"),
    (_spec(backend="Fire Works"), "backend"),
]


async def test_invalid_specs_are_refused_before_anything_exists(stack: Stack) -> None:
    before = await stack.admin.stats()
    for data, field in INVALID:
        with pytest.raises(SpecError) as refused:
            await start_job(stack.client, data, task_queue=stack.task_queue)
        fields = [p.field for p in refused.value.problems]
        assert field in fields, (field, fields)
        assert field in str(refused.value)
    after = await stack.admin.stats()
    assert (
        after["creates"] == before["creates"]
        and after["trainersStarted"] == before["trainersStarted"]
    )
    started = [w async for w in stack.client.list_workflows(f'TaskQueue = "{stack.task_queue}"')]
    assert started == []


async def test_unknown_shape_fails_before_a_trainer_is_created(stack: Stack) -> None:
    spec = stack.spec(
        "noshape", trainer={"training_shape": "accounts/fireworks/trainingShapes/no-such-shape"}
    )
    before = (await stack.admin.stats())["creates"]
    handle = await stack.start(spec)
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    assert "trainer.training_shape" in str(failed.value.cause)
    assert (await stack.admin.stats())["creates"] == before
    assert (await stack.status(handle)).trainer_job_id is None


async def test_no_secret_in_any_history(stack: Stack) -> None:
    ok = await stack.start(stack.spec("secretive"))
    await ok.result()
    # A worker with a wrong key: the 401 path must not echo the key either.
    wrong_key = f"lp_WRONG_{uuid.uuid4().hex}"
    queue = f"wrong-{uuid.uuid4().hex[:8]}"
    registry = make_registry(stack.plane, wrong_key)
    async with worker_for(stack.client, queue, registry):
        bad = await start_job(stack.client, stack.spec("unauthorized"), task_queue=queue)
        stack.handles.append(bad)
        with pytest.raises(WorkflowFailureError) as failed:
            await bad.result()
    await registry.aclose()
    assert "Unauthenticated" in str(failed.value.cause.type)  # type: ignore[attr-defined]
    for handle in (ok, bad):
        history = json.dumps((await handle.fetch_history()).to_json_dict())
        for secret in (
            stack.account.api_key,
            wrong_key,
            stack.plane.api_key,
            stack.plane.admin_key,
        ):
            assert secret not in history


async def test_continue_as_new_keeps_a_long_job_going(stack: Stack) -> None:
    long_spec = stack.spec(
        "long",
        training={"total_steps": 40, "steps_per_chunk": 1},
        policies={"max_history_events": 200},
    )
    ref = await stack.start(stack.spec("ref", training={"total_steps": 40}))
    handle = await stack.start(long_spec)
    result = await handle.result()
    await ref.result()
    assert result.phase is Phase.COMPLETED and result.step == 40
    assert result.continued_as_new >= 1
    assert await model_digest(stack, "long-model") == await model_digest(stack, "ref-model")
    runs = [w async for w in stack.client.list_workflows(f'WorkflowId = "{handle.id}"')]
    assert len(runs) == result.continued_as_new + 1
    assert result.cleanup == "done"
    # The curves came across every continue-as-new: a loss for each chunk of every run, and
    # the metric of each evaluated checkpoint (the kept ones hold the same values).
    assert [p.step for p in result.loss_curve] == list(range(1, 41))
    assert result.loss_curve[-1].value == result.last_loss
    assert [p.step for p in result.eval_curve] == [10, 20, 30, 40]
    measured = {p.step: p.value for p in result.eval_curve}
    assert result.checkpoints and all(measured[c.step] == c.metric for c in result.checkpoints)


async def test_user_tinker_loop_survives_a_preemption_with_identical_weights(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHEPHERD_LOOPS", user_loops.REF)
    training = {"loop": "inline-examples", "micro_batches": 2, "total_steps": 30}
    reference = await stack.start(stack.spec("ref", trainer=SLOW, training=training))
    victim = await stack.start(stack.spec("custom", trainer=SLOW, training=training))
    mid = await stack.until(victim, lambda s: s.step >= 12 and s.phase is Phase.TRAINING)
    await stack.admin.preempt(mid.trainer_job_id or "", account=stack.account.id)
    result = await victim.result()
    await reference.result()
    assert result.phase is Phase.COMPLETED and result.model is not None
    assert result.preemptions == 1
    assert await model_digest(stack, "custom-model") == await model_digest(stack, "ref-model")


async def test_an_unregistered_loop_fails_the_job_and_frees_the_trainer(stack: Stack) -> None:
    handle = await stack.start(stack.spec("noloop", training={"loop": "not-registered"}))
    with pytest.raises(WorkflowFailureError) as info:
        await handle.result()
    assert getattr(info.value.cause, "type", None) == "LoopError"
    assert "SHEPHERD_LOOPS" in str(info.value.cause)
    status = await stack.status(handle)
    assert status.phase is Phase.FAILED and status.cleanup == "done"
    assert status.trainer_job_id is None  # refused by the preflight, before any trainer


async def _signals(handle: Any) -> int:
    count = 0
    async for e in handle.fetch_history_events():
        if (
            e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
            and e.workflow_execution_signaled_event_attributes.signal_name == "platform_event"
        ):
            count += 1
    return count


async def test_events_arrive_as_signals(stack: Stack) -> None:
    handle = await stack.start(stack.spec("evented"))
    await handle.result()
    assert await _signals(handle) >= 2  # at least CREATING and RUNNING


@pytest.mark.no_events
async def test_polling_alone_also_gets_there(stack: Stack) -> None:
    handle = await stack.start(stack.spec("polled"))
    result = await handle.result()
    assert result.phase is Phase.COMPLETED
    assert await _signals(handle) == 0


async def test_a_taken_output_model_fails_before_any_trainer(stack: Stack) -> None:
    first = await stack.start(stack.spec("taken"))
    await first.result()  # promotes taken-model
    before = (await stack.admin.stats())["creates"]
    second = await stack.start(stack.spec("taken-again", output={"model_id": "taken-model"}))
    with pytest.raises(WorkflowFailureError) as failed:
        await second.result()
    assert failed.value.cause.type == "ModelExists"  # type: ignore[attr-defined]
    assert "output.model_id" in str(failed.value.cause)
    status = await stack.status(second)
    assert status.trainer_job_id is None and status.phase is Phase.FAILED
    assert (await stack.admin.stats())["creates"] == before
