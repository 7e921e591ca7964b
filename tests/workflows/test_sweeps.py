"""Sweeps on the real stack: trials are job workflows under a parallelism cap; the best is
picked by the metric and promoted; losers stop early; cancelling cleans every trial up."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus

from shepherd.client import Shepherd, SweepHandle
from shepherd.states import JobState
from shepherd.sweep import SweepStatus
from tests.helpers import wait_state
from tests.workflows.conftest import Stack

PARAMS = {
    "trainer.learning_rate": {"type": "double", "min": 0.003, "max": 0.03, "scale": "log"},
    "trainer.lora_rank": {"type": "int", "min": 0, "max": 8, "step": 4},
    "training.batch_size": {"type": "categorical", "values": [16, 32]},
}


def sweep_data(stack: Stack, name: str, **fields: Any) -> dict[str, Any]:
    base = stack.spec(f"{name}-base").model_dump(mode="json")
    return {
        "name": name,
        "spec": base,
        "parameters": PARAMS,
        "max_trials": 4,
        "parallelism": 2,
        **fields,
    }


async def run_sweep(stack: Stack, data: dict[str, Any]) -> tuple[SweepHandle, SweepStatus]:
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    handle = await sh.submit_sweep(data)
    stack.handles.append(stack.client.get_workflow_handle(handle.id))
    return handle, await handle.wait()


async def trial_windows(stack: Stack, status: SweepStatus) -> list[tuple[datetime, datetime]]:
    windows = []
    for trial in status.trials:
        d = await stack.client.get_workflow_handle(trial.workflow_id).describe()
        assert d.start_time and d.close_time
        windows.append((d.start_time, d.close_time))
    return windows


def max_overlap(windows: list[tuple[datetime, datetime]]) -> int:
    edges = sorted([(s, 1) for s, _ in windows] + [(e, -1) for _, e in windows])
    live = peak = 0
    for _, delta in edges:
        live += delta
        peak = max(peak, live)
    return peak


async def assert_no_trainer_left(stack: Stack) -> None:
    # Deletion is asynchronous on the platform: wait for every tombstone, then count.
    trainers = [job.job_id async for job in stack.account.client.iter_jobs()]
    for trainer in trainers:
        await wait_state(stack.account.client, trainer, JobState.DELETED)
    jobs = (await stack.admin.stats())["jobs"]
    mine = {k: v for k, v in jobs.items() if f"/{stack.account.id}/" in k}
    assert len(mine) == len(trainers) > 0 and all(v["liveTrainer"] is False for v in mine.values())


async def test_random_sweep_with_parallelism_picks_and_promotes_the_best(stack: Stack) -> None:
    handle, status = await run_sweep(
        stack, sweep_data(stack, "rand", method="random", promote_best={"model_id": "rand-best"})
    )
    assert status.phase == "COMPLETED"
    assert [t.state for t in status.trials] == ["completed"] * 4
    metrics = [t.metric for t in status.trials]
    assert all(m is not None for m in metrics)
    assert status.best == metrics.index(min(metrics))  # type: ignore[type-var]
    best = status.best_trial
    assert best is not None and set(best.params) == set(PARAMS)
    model = await stack.account.client.get_model("rand-best")
    assert model.state == "READY" and model.checkpoint == best.best_checkpoint
    assert max_overlap(await trial_windows(stack, status)) <= 2
    # Every trial is an ordinary job workflow, labelled with its sweep.
    trial = await stack.client.get_workflow_handle(status.trials[0].workflow_id).describe()
    assert trial.workflow_type == "TrainingJob"
    await assert_no_trainer_left(stack)


async def test_grid_sweep_walks_the_grid_in_order(stack: Stack) -> None:
    params = {
        "trainer.lora_rank": {"type": "int", "min": 0, "max": 4, "step": 4},
        "training.batch_size": {"type": "categorical", "values": [16, 32]},
    }
    _, status = await run_sweep(
        stack, {**sweep_data(stack, "grid", method="grid", max_trials=3), "parameters": params}
    )
    assert [t.params for t in status.trials] == [
        {"trainer.lora_rank": 0, "training.batch_size": 16},
        {"trainer.lora_rank": 0, "training.batch_size": 32},
        {"trainer.lora_rank": 4, "training.batch_size": 16},
    ]
    assert all(t.state == "completed" for t in status.trials)


async def test_bayes_sweep_asks_optuna_from_an_activity(stack: Stack) -> None:
    handle, status = await run_sweep(
        stack, sweep_data(stack, "bayes", method="bayes", max_trials=5, parallelism=1)
    )
    assert status.phase == "COMPLETED" and len(status.trials) == 5
    suggestions = 0
    async for e in stack.client.get_workflow_handle(handle.id).fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            suggestions += (
                e.activity_task_scheduled_event_attributes.activity_type.name == "suggest_trial"
            )
    assert suggestions == 5
    for trial in status.trials:
        lr = trial.params["trainer.learning_rate"]
        assert 0.003 <= lr <= 0.03 and trial.params["trainer.lora_rank"] in (0, 4, 8)


async def test_median_rule_stops_losing_trials(stack: Stack) -> None:
    # Two good learning rates and two hopeless ones, all running at once on slow steps.
    params = {"trainer.learning_rate": {"type": "categorical", "values": [0.02, 0.015, 1e-6, 2e-6]}}
    base = stack.spec(
        "med-base", trainer={"extra_args": ["--compute-delay-ms=40"]}, training={"total_steps": 60}
    ).model_dump(mode="json")
    data = {
        "name": "median",
        "spec": base,
        "parameters": params,
        "method": "grid",
        "max_trials": 4,
        "parallelism": 4,
        "early_stopping": {"type": "median", "min_trials": 2, "min_step": 10},
    }
    _, status = await run_sweep(stack, data)
    stopped = [t for t in status.trials if t.state == "stopped"]
    assert stopped, [(t.params, t.state, t.reports) for t in status.trials]
    assert all(t.params["trainer.learning_rate"] < 1e-3 for t in stopped)
    best = status.best_trial
    assert best is not None and best.params["trainer.learning_rate"] > 1e-3
    for trial in stopped:
        d = await stack.client.get_workflow_handle(trial.workflow_id).describe()
        assert d.status == WorkflowExecutionStatus.CANCELED
    await assert_no_trainer_left(stack)


async def test_cancelling_a_sweep_cancels_and_cleans_every_trial(stack: Stack) -> None:
    base = stack.spec(
        "cx-base", trainer={"extra_args": ["--compute-delay-ms=80"]}, training={"total_steps": 100}
    ).model_dump(mode="json")
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    handle = await sh.submit_sweep(
        {"name": "cx", "spec": base, "parameters": PARAMS, "max_trials": 4, "parallelism": 2}
    )
    stack.handles.append(stack.client.get_workflow_handle(handle.id))

    async def two_running() -> bool:
        status = await handle.status()
        if sum(t.state == "running" for t in status.trials) != 2:
            return False
        phases = [(await sh.get(t.workflow_id).status()).phase.value for t in status.trials]
        return phases == ["TRAINING", "TRAINING"]

    import asyncio

    async with asyncio.timeout(60):
        while not await two_running():
            await asyncio.sleep(0.2)
    await handle.cancel()
    status = await handle.wait()
    assert status.phase == "CANCELLED"
    assert [t.state for t in status.trials] == ["cancelled", "cancelled"]
    for trial in status.trials:
        d = await stack.client.get_workflow_handle(trial.workflow_id).describe()
        assert d.status == WorkflowExecutionStatus.CANCELED
    await assert_no_trainer_left(stack)
