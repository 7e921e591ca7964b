"""A cancel, and a pause, at every point where the lifecycle waits.

One row per activity or timer the lifecycle awaits — before the trainer, while it comes up,
while it trains, checkpoints and evaluates, while the result is promoted, during cleanup, and
again inside a recovery. The platform holds that very request (localplane's request holds)
or stays in that very state (its faults), the test checks the job is waiting there, and then
cancels (or pauses) it. A new await point without a row here is visible in review.

Every cancel row ends CANCELLED with every trainer DELETED (each created at most once), no
model promoted, and nothing but cleanup sent after the cancel request (no chunk, no save, no
promotion). Every pause row ends PAUSED holding no trainer, and resumes to the weights a
run without the pause ends with.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import CancelledError

from localplane.admin import PlaneAdmin
from shepherd.models import JobStatus, PauseRequest, PauseResult, ResumeRequest
from shepherd.phases import Phase
from shepherd.platform import NotFound
from shepherd.states import JobState
from tests.helpers import wait_state
from tests.workflows.conftest import Stack, worker_for

#: Data-plane paths end in the trainer's own path (gateway prefix before it).
DATA = r"/training/v1/rlorTrainerJobs/[^/]+/[^/]+/api/v1/"
#: Activities a cancelled job may still schedule: its cleanup.
CLEANUP = {"delete_trainer", "retract_model"}


@dataclass(frozen=True)
class Point:
    """Where the job is caught: a held request (``hold``: method, path regex) and/or
    plane faults that keep it in a state; ``phase`` is what its status shows meanwhile."""

    name: str
    phase: Phase
    hold: tuple[str, str] | None = None
    faults: dict[str, Any] = field(default_factory=dict)
    #: The point is inside a recovery: the trainer is preempted after the first checkpoint.
    recovery: bool = False
    #: A pause is accepted there (not while PENDING, EVALUATING or EXPORTING).
    pausable: bool = True
    #: The job reaches the point before any trainer exists.
    before_trainer: bool = False
    #: The job is caught when the model is being made (the plane has it, not READY).
    model_pending: bool = False
    #: How many requests the hold catches.
    count: int = 1
    #: A pause row lets the held request go only after this long (a step the pause must
    #: give up after the step timeout); others let it go at once.
    release_after_s: float = 0.5
    #: Arrange the point only once the job shows this phase (a hold that would also catch
    #: the calls before it).
    after: Phase | None = None


POINTS = [
    Point(
        "check the output model",
        Phase.PENDING,
        hold=("GET", r"/v1/accounts/[^/]+/models/"),
        pausable=False,
        before_trainer=True,
    ),
    Point(
        "create the trainer",
        Phase.QUEUED,
        hold=("POST", r"/v1/accounts/[^/]+/rlorTrainerJobs$"),
    ),
    Point("wait for a slot", Phase.QUEUED, faults={"capacity": 0}),
    Point("wait for RUNNING", Phase.SCHEDULING, faults={"bootDelaySeconds": 60}),
    Point("open the model", Phase.PREPARING, hold=("POST", DATA + "create_session$")),
    Point("warm the route up", Phase.PREPARING, hold=("GET", DATA + "healthz$")),
    # A step whose optim_step never reaches the trainer ...
    Point("a chunk", Phase.TRAINING, hold=("POST", DATA + "optim_step$"), release_after_s=4),
    # ... and one the trainer applies while its results do not come back: either outlives
    # the step timeout (3 s) after a pause, and the pause's checkpoint must come after it.
    Point(
        "a step in flight",
        Phase.TRAINING,
        hold=("POST", DATA + "retrieve_future$"),
        count=1000,
        release_after_s=4,
        after=Phase.TRAINING,
    ),
    Point("a checkpoint", Phase.CHECKPOINTING, hold=("POST", DATA + "save_weights$")),
    Point("an evaluation", Phase.CHECKPOINTING, hold=("POST", DATA + "forward$")),
    Point(
        "cleanup",
        Phase.EVALUATING,
        hold=("DELETE", r"/v1/accounts/[^/]+/rlorTrainerJobs/[^/:]+$"),
        pausable=False,
    ),
    Point("promotion", Phase.EXPORTING, hold=("POST", r":promote$"), pausable=False),
    Point(
        "wait for the model",
        Phase.EXPORTING,
        faults={"promotionSeconds": 60},
        pausable=False,
        model_pending=True,
    ),
    Point(
        "recovery: wait for a resumable state",
        Phase.RECOVERING,
        # Long enough to be caught there; short, as a pause waits until it passes.
        faults={"deathSettleSeconds": 5},
        recovery=True,
    ),
    Point(
        "recovery: resume",
        Phase.RECOVERING,
        hold=("POST", r"/rlorTrainerJobs/[^/]+:resume$"),
        recovery=True,
    ),
    Point(
        "recovery: wait for RUNNING",
        Phase.RECOVERING,
        faults={"bootDelaySeconds": 60},
        recovery=True,
    ),
    Point(
        "recovery: reload the checkpoint",
        Phase.RECOVERING,
        hold=("POST", DATA + "load_weights$"),
        recovery=True,
    ),
    Point(
        "recovery: warm the route up",
        Phase.RECOVERING,
        hold=("GET", DATA + "healthz$"),
        recovery=True,
    ),
]
IDS = [p.name.replace(" ", "-").replace(":", "") for p in POINTS]

#: 60 ms per step and small chunks: every point comes within a second or two. A short step
#: timeout: the pause rows wait out a held step (the chunk then gives the step up).
SPEC: dict[str, Any] = {
    "trainer": {"extra_args": ["--compute-delay-ms=60"]},
    "training": {"total_steps": 16},
    "checkpoint": {"every_steps": 4, "keep_last": 2},
    "policies": {"poll_interval": "1s", "heartbeat_timeout": "5s", "step_timeout": "3s"},
}

#: Final weights of a run without faults, pauses or cancels (the same for every account).
_REFERENCE: dict[str, str] = {}


async def until(check: Any, timeout: float = 30.0) -> Any:
    """Ask ``check()`` until it gives a truthy value (a test-side wait)."""
    async with asyncio.timeout(timeout):
        while not (found := await check()):
            await asyncio.sleep(0.05)
        return found


async def catch(stack: Stack, admin: PlaneAdmin, point: Point, name: str) -> tuple[Any, str | None]:
    """Start a job and bring it to ``point``; returns its handle and the hold's id."""
    handle = await stack.start(stack.spec(name, **SPEC))
    hold_id = None
    if point.recovery:
        # Train past the first checkpoint, then arrange the point and preempt.
        status = await stack.until(handle, lambda s: s.phase is Phase.TRAINING and s.step >= 4)
        trainer = status.trainer_job_id or ""
    if point.after:
        await stack.until(handle, lambda s: s.phase is point.after)
    if point.faults:
        await admin.set_faults(point.faults)
    if point.hold:
        hold_id = await admin.hold(point.hold[1], method=point.hold[0], count=point.count)
    if point.recovery:
        await admin.preempt(trainer)
    if hold_id:
        await until(lambda: admin.held(hold_id))
    elif point.model_pending:
        await until(lambda: model_exists(stack, f"{name}-model"))
    status = await stack.until(handle, lambda s: s.phase is point.phase)
    if point.faults and not point.hold and not point.model_pending:
        # Caught in a state: make sure the job waits in it (its status says the state).
        waits_in = {
            "capacity": JobState.PENDING,
            "bootDelaySeconds": JobState.CREATING,
            "deathSettleSeconds": JobState.CREATING,
        }[next(iter(point.faults))]
        status = await stack.until(handle, lambda s: s.platform_state == waits_in.value)
    assert status.phase is point.phase
    return handle, hold_id


async def model_exists(stack: Stack, model_id: str) -> bool:
    try:
        await stack.account.client.get_model(model_id)
    except NotFound:
        return False
    return True


async def sent_after_cancel(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """Activities scheduled after the cancel request, other than cleanup."""
    after, cancelled = [], False
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED:
            cancelled = True
        elif cancelled and event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            if name not in CLEANUP:
                after.append(name)
    assert cancelled, "no cancel request in the history"
    return after


async def trainers_gone(stack: Stack) -> dict[str, dict[str, Any]]:
    """Every trainer job of the (fresh) account is DELETED and was created once."""
    ids = [j.job_id for j in (await stack.account.client.list_jobs()).rlor_trainer_jobs]
    for trainer_id in ids:
        await wait_state(stack.account.client, trainer_id, JobState.DELETED)
    stats = (await stack.admin.stats())["jobs"]
    jobs = {t: stats.get(stack.job_name(t), {}) for t in ids}
    for job in jobs.values():
        assert job.get("creates", 0) <= 1 and not job.get("liveTrainer")
    return jobs


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS, ids=IDS)
async def test_cancel_at(stack: Stack, faults: PlaneAdmin, point: Point) -> None:
    handle, hold_id = await catch(stack, faults, point, "cancelled")
    await handle.cancel()
    if hold_id:
        # The held request reaches the platform late (if its caller still waits for it).
        await faults.release(hold_id)
    await faults.reset_faults()  # e.g. a boot delay must not hold the cleanup up
    async with asyncio.timeout(60):
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    assert isinstance(failed.value.cause, CancelledError)
    status = await stack.status(handle)
    assert status.phase is Phase.CANCELLED and status.cleanup == "done"

    assert await sent_after_cancel(handle) == []
    jobs = await trainers_gone(stack)
    assert (jobs == {}) if point.before_trainer else (len(jobs) == 1)
    assert not await model_exists(stack, "cancelled-model")


async def reference_digest(stack: Stack) -> str:
    if "digest" not in _REFERENCE:
        handle = await stack.start(stack.spec("reference", **SPEC))
        await handle.result()
        model = await stack.account.client.get_model("reference-model")
        _REFERENCE["digest"] = str((model.model_extra or {})["weightsDigest"])
    return _REFERENCE["digest"]


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS, ids=IDS)
async def test_pause_at(stack: Stack, faults: PlaneAdmin, point: Point) -> None:
    expected = await reference_digest(stack)
    handle, hold_id = await catch(stack, faults, point, "paused")
    pause = asyncio.ensure_future(
        handle.execute_update("request_pause", PauseRequest(), result_type=PauseResult)
    )
    if not point.pausable:
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await pause
        assert "cannot be paused" in str(refused.value.cause)
        assert (await stack.status(handle)).phase is point.phase  # nothing changed
        await handle.cancel()  # (the cancel rows follow such a job to its end)
        if hold_id:
            await faults.release(hold_id)
        return
    if hold_id:
        # Let the held call end (the pause is taken at the next point that can take it).
        await asyncio.sleep(point.release_after_s)
        await faults.release(hold_id)
    await faults.reset_faults()
    await faults.set_faults(promotionSeconds=0.2, routeLagSeconds={"min": 0.0, "max": 0.3})
    async with asyncio.timeout(60):
        paused = await pause
    status = await stack.status(handle)
    assert status.phase is Phase.PAUSED and paused.step == status.step
    jobs = await trainers_gone(stack)  # no trainer held while paused
    assert all(not j.get("liveTrainer") for j in jobs.values())

    await handle.execute_update("request_resume", ResumeRequest(), result_type=JobStatus)
    result = await handle.result()
    assert result.phase is Phase.COMPLETED and result.step == SPEC["training"]["total_steps"]
    model = await stack.account.client.get_model("paused-model")
    assert (model.model_extra or {})["weightsDigest"] == expected
    for job in (await stack.admin.stats())["jobs"].values():
        assert job.get("creates", 0) <= 1


# ------------------------------------------------------- a cancel beside a platform event

#: How many times each variant below runs (the issue's chaos run lost 2 cancels in 3; the
#: race is made certain here, so a few runs suffice in the suite; more on request).
RACE_RUNS = int(os.environ.get("SHEPHERD_RACE_RUNS", "1"))


@pytest.mark.slow
@pytest.mark.parametrize("run", range(RACE_RUNS))
@pytest.mark.parametrize("recovering", [False, True], ids=["coming-up", "recovering"])
async def test_cancel_in_the_same_task_as_the_running_event(
    stack: Stack, faults: PlaneAdmin, recovering: bool, run: int
) -> None:
    """The lost cancel of issue 16: the cancel request and the platform's RUNNING event in
    one workflow task while the job waits for RUNNING (polling, raced against the event).
    The worker is stopped so that both land in the task the next worker takes: the race
    happens every time, not one time in three."""
    task_queue = f"tq-{uuid.uuid4().hex}"
    spec = stack.spec("raced", **SPEC)
    handle = await stack.start(spec, task_queue=task_queue)
    async with worker_for(stack.client, task_queue, stack.registry):
        if recovering:
            status = await stack.until(handle, lambda s: s.phase is Phase.TRAINING and s.step >= 4)
            await faults.set_faults(bootDelaySeconds=3)
            await faults.preempt(status.trainer_job_id or "")
            await stack.until(handle, lambda s: s.stage is Phase.SCHEDULING)
        else:
            await faults.set_faults(bootDelaySeconds=3)
            await stack.until(handle, lambda s: s.phase is Phase.SCHEDULING)
        trainer = (await stack.status(handle)).trainer_job_id or ""
    # No worker: the RUNNING event (the bridge signals it) and the cancel wait together.
    await wait_state(stack.account.client, trainer, JobState.RUNNING)
    await until(lambda: running_signalled(handle))
    await handle.cancel()
    async with worker_for(stack.client, task_queue, stack.registry):
        async with asyncio.timeout(60):
            with pytest.raises(WorkflowFailureError) as failed:
                await handle.result()
    assert isinstance(failed.value.cause, CancelledError)
    assert await sent_after_cancel(handle) == []
    await trainers_gone(stack)
    assert not await model_exists(stack, "raced-model")


async def running_signalled(handle: WorkflowHandle[Any, Any]) -> bool:
    """The history holds the platform's RUNNING event for the job's current trainer."""
    last = None
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            attrs = event.workflow_execution_signaled_event_attributes
            if attrs.signal_name == "platform_event":
                last = attrs.input.payloads[0].data
    return last is not None and JobState.RUNNING.value.encode() in last
