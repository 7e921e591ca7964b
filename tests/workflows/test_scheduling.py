"""Shepherd admits jobs to a backend's capacity itself (issue 31): the backend's scheduler
workflow (workflows/scheduler.py) over the real dev server and localplane. Each test has a
backend of its own (a profile with declared ``slots`` and queues, on the test's account), so
its scheduler is its own."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from activities.scheduling import SchedulingActivities
from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd.models import JobStatus, PauseRequest, PauseResult, ResumeRequest
from shepherd.phases import Phase
from shepherd.scheduling import (
    HOLDING_PRIORITY,
    QueueConfig,
    SchedulerState,
    scheduler_id,
    task_priority,
)
from tests.helpers import Account
from tests.workflows.conftest import KEY_ENV, Stack, open_stack
from tests.workflows.test_recovery import model_digest
from workers.config import BackendProfile, BackendRegistry

SLOW = {"extra_args": ["--compute-delay-ms=60"]}


def registry_with(
    plane: PlaneProcess, api_key: str, backend: str, slots: int, **profile: Any
) -> BackendRegistry:
    """The test's stack profile ``local`` (no admission: references run there) and a
    backend of its own whose profile declares ``slots``."""
    local = BackendProfile(name="local", url=plane.url, api_key_env=KEY_ENV, events=True)
    mine = BackendProfile(
        name=backend, url=plane.url, api_key_env=KEY_ENV, events=True, slots=slots, **profile
    )
    return BackendRegistry({"local": local, backend: mine}, env={KEY_ENV: api_key})


@pytest.fixture
def backend() -> str:
    return f"b{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def sched(
    client: Any,
    plane: PlaneProcess,
    admin: PlaneAdmin,
    account: Account,
    backend: str,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Stack]:
    """A stack whose worker serves the test's backend, of the slots and queues the test's
    ``capacity`` marker gives (2 slots, no queues by default)."""
    marker = request.node.get_closest_marker("capacity")
    profile: dict[str, Any] = {
        "slots": 2,
        "holder_check_s": 2.0,
        **(marker.kwargs if marker else {}),
    }
    slots = profile.pop("slots")
    async with open_stack(
        client,
        plane,
        admin,
        account,
        registry=registry_with(plane, account.api_key, backend, slots, **profile),
    ) as st:
        yield st


def job(
    stack: Stack,
    name: str,
    backend: str,
    steps: int = 30,
    policies: dict[str, Any] | None = None,
    trainer: dict[str, Any] | None = None,
    **scheduling: Any,
) -> Any:
    return stack.spec(
        name,
        backend=backend,
        trainer=trainer or SLOW,
        training={"total_steps": steps},
        checkpoint={"every_steps": 5, "keep_last": 2},
        scheduling=scheduling,
        policies=policies or {},
    )


async def cli(stack: Stack, *args: str) -> tuple[int, str]:
    """``shepherd <args>`` as a user runs it, against the test's server: exit code, output."""
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": stack.client.service_client.config.target_host,
        "SHEPHERD_TASK_QUEUE": stack.task_queue,
        "COLUMNS": "200",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "shepherd.cli.main", *args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def scheduler(stack: Stack, backend: str) -> SchedulerState:
    """The scheduler's state (waiting for it to start, with the first job's ask)."""
    handle = stack.client.get_workflow_handle(scheduler_id(backend))
    async with asyncio.timeout(30):
        while True:
            try:
                return await handle.query("state", result_type=SchedulerState)
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
            await asyncio.sleep(0.1)


async def activity_priorities(handle: WorkflowHandle[Any, Any]) -> dict[str, set[int]]:
    """Each activity type the job ran -> the task priority keys it was scheduled with."""
    keys: dict[str, set[int]] = {}
    async for e in handle.fetch_history_events():
        if e.HasField("activity_task_scheduled_event_attributes"):
            a = e.activity_task_scheduled_event_attributes
            keys.setdefault(a.activity_type.name, set()).add(a.priority.priority_key)
    return keys


async def phase_of(stack: Stack, handle: WorkflowHandle[Any, Any]) -> Phase:
    return (await stack.status(handle)).phase


async def admission_order(
    stack: Stack, backend: str, until: asyncio.Event, into: list[str]
) -> None:
    """The jobs in the order the scheduler admitted them (its holders, as they appear)."""
    while not until.is_set():
        state = await scheduler(stack, backend)
        into.extend(j for j in state.holders if j not in into)
        assert len(state.holders) <= state.capacity.slots, state.holders  # never over
        await asyncio.sleep(0.05)


@pytest.mark.capacity(slots=2)
async def test_the_most_urgent_job_is_admitted_next_and_knows_its_place(
    sched: Stack, backend: str
) -> None:
    """A priority-10 job submitted behind 50 priority-0 jobs on 2 slots (2 running, 48
    waiting) is admitted when the first slot frees; those behind it follow in the order
    they arrived."""
    from shepherd.client import Shepherd

    stop, order = asyncio.Event(), []
    watcher = asyncio.ensure_future(admission_order(sched, backend, stop, order))
    # The first two hold their slots long enough to look at who waits behind them.
    lows = [await sched.start(job(sched, f"low{i}", backend, steps=30)) for i in range(2)]
    async with asyncio.timeout(60):
        while len((await scheduler(sched, backend)).holders) < 2:
            await asyncio.sleep(0.05)
    lows += await asyncio.gather(
        *(sched.start(job(sched, f"low{i}", backend, steps=5)) for i in range(2, 50))
    )
    async with asyncio.timeout(90):
        while True:
            state = await scheduler(sched, backend)
            if len(state.holders) == 2 and len(state.waiting) == 48:
                break
            await asyncio.sleep(0.1)
    arrived = [a.job for a in sorted(state.waiting, key=lambda a: a.arrival)]
    urgent = await sched.start(job(sched, "urgent", backend, steps=5, priority=10))
    # While it waits, it knows where it stands (status, from the scheduler) and why.
    sh = Shepherd(sched.client, task_queue=sched.task_queue)
    async with asyncio.timeout(30):
        while (waiting := await sh.get(urgent.id).status()).placement is None:
            await asyncio.sleep(0.1)
    assert waiting.phase is Phase.QUEUED and waiting.placement is not None
    assert (waiting.placement.position, waiting.placement.length) == (1, 49)
    assert "capacity" in waiting.placement.waits_for
    # And when it should start: as the sooner of the two running jobs ends (30 steps each).
    async with asyncio.timeout(30):
        while (now := await sh.get(urgent.id).status()).phase is Phase.QUEUED:
            if now.placement is not None and now.placement.starts_in_s is not None:
                break
            await asyncio.sleep(0.2)
    assert now.placement is not None and now.placement.starts_in_s is not None, now
    assert 0 <= now.placement.starts_in_s <= 60, now.placement
    behind = await sh.get(arrived[0]).status()
    assert behind.placement is not None and behind.placement.position == 2
    assert "1 job(s) ahead" in behind.placement.waits_for
    listed = {row.workflow_id: row for row in await sh.list(name="urgent")}
    assert listed[urgent.id].placement is not None
    assert listed[urgent.id].placement.position == 1  # `shepherd list` says so too
    assert (await urgent.result()).phase is Phase.COMPLETED
    # The first slot freed went to the urgent job; the next ones in the order they arrived.
    async with asyncio.timeout(60):
        while len(order) < 6:
            await asyncio.sleep(0.1)
    stop.set()
    await watcher
    assert set(order[:2]) == {h.id for h in lows[:2]}, order
    assert order[2:6] == [urgent.id, *arrived[:3]], order
    for handle in lows[2:]:  # the rest need not run: their places go back as they cancel
        await handle.cancel()
    async with asyncio.timeout(60):
        while (final := await scheduler(sched, backend)).waiting or final.holders:
            await asyncio.sleep(0.2)


@pytest.mark.capacity(
    slots=2,
    queues={
        "a": QueueConfig(name="a", quota=1, borrow_limit=1),
        "b": QueueConfig(name="b", quota=1),
    },
)
async def test_a_queue_borrows_idle_quota_and_gives_it_back_without_losing_a_step(
    sched: Stack, backend: str
) -> None:
    spec = {"steps": 60, "preemptible": True}
    ref = await sched.start(job(sched, "ref", "local", steps=60))
    first = await sched.start(job(sched, "a1", backend, queue="a", **spec))
    second = await sched.start(job(sched, "a2", backend, queue="a", **spec))
    for handle in (first, second):  # a borrows b's idle slot; both checkpoint once
        await sched.until(handle, lambda s: s.phase is Phase.TRAINING and bool(s.checkpoints), 60)
    owner = await sched.start(job(sched, "b1", backend, steps=10, queue="b"))
    done = [await h.result() for h in (owner, first, second)]
    assert all(s.phase is Phase.COMPLETED for s in done)
    # The borrowed slot went back to its owner: one of the two made way, once, and went on
    # from its checkpoint to the weights of a run never interrupted.
    made_way = [s for s in done[1:] if s.priority_preemptions]
    assert len(made_way) == 1 and made_way[0].preemptions == 0, done
    assert [r.reason for r in made_way[0].recoveries] == ["priority"]
    said = made_way[0].recoveries[0].message
    assert "reclaim" in said and owner.id in said
    assert [s.recoveries for s in done[1:] if not s.priority_preemptions] == [[]]
    await ref.result()
    for name in ("a1", "a2"):
        assert await model_digest(sched, f"{name}-model") == await model_digest(sched, "ref-model")
    state = await scheduler(sched, backend)
    assert state.preemptions == {"reclaim": 1} and state.holders == {}


async def holding(stack: Stack, backend: str, job_id: str, timeout: float = 30) -> None:
    """Until the scheduler holds a slot for ``job_id``."""
    async with asyncio.timeout(timeout):
        while job_id not in (await scheduler(stack, backend)).holders:
            await asyncio.sleep(0.1)


async def all_given_back(stack: Stack, backend: str, timeout: float = 30) -> None:
    """Until the scheduler holds no slot for anyone."""
    async with asyncio.timeout(timeout):
        while (await scheduler(stack, backend)).holders:
            await asyncio.sleep(0.1)


@pytest.mark.capacity(slots=1)
async def test_every_ending_gives_the_slot_back(sched: Stack, backend: str) -> None:
    async def held_by(handle: WorkflowHandle[Any, Any]) -> None:
        await holding(sched, backend, handle.id, timeout=60)

    async def free() -> None:
        await all_given_back(sched, backend)

    # Completed.
    done = await sched.start(job(sched, "done", backend, steps=5, priority=2))
    await done.result()
    await free()
    # Its tasks ran at its own priority until it held a trainer, then ahead of all that
    # hold none (a GPU idles while they wait).
    keys = await activity_priorities(done)
    # (Its preflight sent its ask: no activity of its own for it.)
    assert "ask_for_slot" not in keys, keys
    assert keys["preflight"] == {task_priority(2).priority_key} != {1}, keys
    for held in ("create_trainer", "open_model", "train_chunk", "save_checkpoint"):
        assert keys[held] == {HOLDING_PRIORITY.priority_key}, keys
    # Cancelled while holding it, and while waiting for it.
    holder = await sched.start(job(sched, "held", backend, steps=500))
    await held_by(holder)
    waiter = await sched.start(job(sched, "waits", backend, steps=500))
    await sched.until(waiter, lambda s: s.admission is not None, 30)
    await waiter.cancel()
    with pytest.raises(WorkflowFailureError):
        await waiter.result()
    assert waiter.id not in {a.job for a in (await scheduler(sched, backend)).waiting}
    await holder.cancel()
    with pytest.raises(WorkflowFailureError):
        await holder.result()
    await free()
    # Failed (its trainer deleted outside Shepherd), paused (its resume waits for a slot).
    failing = await sched.start(job(sched, "doomed", backend, steps=500))
    trainer = (await sched.until(failing, lambda s: s.phase is Phase.TRAINING, 60)).trainer_job_id
    await sched.account.client.delete_job(trainer or "")
    with pytest.raises(WorkflowFailureError):
        await failing.result()
    assert (await sched.status(failing)).phase is Phase.FAILED
    await free()
    paused = await sched.start(job(sched, "napper", backend, steps=40))
    await sched.until(paused, lambda s: s.phase is Phase.TRAINING and bool(s.checkpoints), 60)
    await paused.execute_update("request_pause", PauseRequest(), result_type=PauseResult)
    await free()
    other = await sched.start(job(sched, "meanwhile", backend, steps=500))
    await held_by(other)
    await paused.execute_update("request_resume", ResumeRequest(), result_type=JobStatus)
    resumed = await sched.status(paused)
    assert resumed.phase is Phase.QUEUED and resumed.admission is not None  # waits its turn
    # Terminated from outside (no cleanup): the scheduler takes the slot back by itself.
    await other.terminate(reason="an operator's terminate")
    final: JobStatus = await paused.result()
    assert final.phase is Phase.COMPLETED and final.step == 40
    await free()
    # Terminated while waiting (no cleanup, no word): when its turn comes its grant finds
    # nobody, and the slot goes to the next in line at once.
    holder = await sched.start(job(sched, "holds", backend, steps=500))
    await held_by(holder)
    gone = await sched.start(job(sched, "gone", backend, steps=500))
    await sched.until(gone, lambda s: s.admission is not None, 30)
    after = await sched.start(job(sched, "after", backend, steps=5))
    await sched.until(after, lambda s: s.admission is not None, 30)
    await gone.terminate(reason="an operator's terminate")
    await holder.cancel()
    with pytest.raises(WorkflowFailureError):
        await holder.result()
    assert (await after.result()).phase is Phase.COMPLETED
    await free()
    state = await scheduler(sched, backend)
    assert state.waiting == [] and state.reserved == {} and state.yielding == {}


async def activity_types(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """The activities the job scheduled, in order."""
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        async for e in handle.fetch_history_events()
        if e.HasField("activity_task_scheduled_event_attributes")
    ]


async def signals(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """The signals in the job's history, in order."""
    return [
        e.workflow_execution_signaled_event_attributes.signal_name
        async for e in handle.fetch_history_events()
        if e.HasField("workflow_execution_signaled_event_attributes")
    ]


@pytest.mark.capacity(slots=1)
async def test_the_preflight_asks_and_a_grant_before_its_answer_is_kept(
    sched: Stack, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preflight sends the job's first ask once its checks pass. The scheduler may
    grant it (a free slot) before the preflight's answer reaches the job: the grant is the
    job's, the job trains on it and gives it back, and it asked once."""
    sent: list[list[str]] = []
    original = SchedulingActivities._send_asks

    async def send_then_wait(
        self: SchedulingActivities, client: Any, tq: str, backend_: str, asks: list[Any]
    ) -> None:
        await original(self, client, tq, backend_, asks)
        sent.append([a.job for a in asks])
        for a in asks:  # the grant is signalled before this activity answers
            await holding(sched, backend, a.job)
            handle = sched.client.get_workflow_handle(a.job)
            async with asyncio.timeout(30):
                while "slot_granted" not in await signals(handle):
                    await asyncio.sleep(0.05)

    monkeypatch.setattr(SchedulingActivities, "_send_asks", send_then_wait)
    first = await sched.start(job(sched, "early-grant", backend, steps=5))
    final = await first.result()
    assert final.phase is Phase.COMPLETED and final.step == 5
    assert sent == [[first.id]]
    types = await activity_types(first)
    assert types[0] == "preflight" and "ask_for_slot" not in types, types
    # The grant reached the job before the preflight's answer (the race this test is about):
    # the preflight is the job's first activity.
    kinds = [
        e.workflow_execution_signaled_event_attributes.signal_name
        if e.HasField("workflow_execution_signaled_event_attributes")
        else "completed"
        async for e in first.fetch_history_events()
        if e.HasField("workflow_execution_signaled_event_attributes")
        or e.HasField("activity_task_completed_event_attributes")
    ]
    assert kinds.index("slot_granted") < kinds.index("completed"), kinds
    await all_given_back(sched, backend)


@pytest.mark.capacity(slots=1)
async def test_a_job_whose_preflight_could_not_ask_asks_itself(
    sched: Stack, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler unreachable for the preflight's ask (its signal failing): no refusal,
    the job sends its own ask with its own retries, and runs."""
    original = SchedulingActivities._send_asks
    failed: list[str] = []

    async def fail_once(
        self: SchedulingActivities, client: Any, tq: str, backend_: str, asks: list[Any]
    ) -> None:
        if not failed:
            failed.extend(a.job for a in asks)
            raise RPCError("the scheduler is away", RPCStatusCode.UNAVAILABLE, b"")
        await original(self, client, tq, backend_, asks)

    monkeypatch.setattr(SchedulingActivities, "_send_asks", fail_once)
    handle = await sched.start(job(sched, "asks-itself", backend, steps=5))
    final = await handle.result()
    assert final.phase is Phase.COMPLETED and failed == [handle.id]
    types = await activity_types(handle)
    assert types[0] == "preflight" and types.count("ask_for_slot") == 1, types
    assert types.index("ask_for_slot") < types.index("create_trainer"), types
    await all_given_back(sched, backend)


@pytest.mark.capacity(slots=3, queues={"a": QueueConfig(name="a", quota=1)})
async def test_a_quota_changed_while_jobs_wait_takes_effect_at_once(
    sched: Stack, backend: str
) -> None:
    first = await sched.start(job(sched, "q1", backend, steps=3000, queue="a"))
    await sched.until(first, lambda s: s.phase is Phase.TRAINING, 60)
    second = await sched.start(job(sched, "q2", backend, steps=5, queue="a"))
    waiting = await sched.until(second, lambda s: s.admission is not None, 30)
    assert waiting.phase is Phase.QUEUED
    handle = sched.client.get_workflow_handle(scheduler_id(backend))
    state = await handle.query("state", result_type=SchedulerState)
    assert [a.job for a in state.waiting] == [second.id]
    # As an operator does it: `shepherd queues`, validated before anything changes.
    code, out = await cli(sched, "queues", "set", backend, "a", "--quota", "4")
    assert code != 0 and "add up to 4, more than the backend's 3 slots" in out, out
    code, out = await cli(sched, "queues", "remove", backend, "nope")
    assert code != 0 and "'nope' is not declared" in out, out
    code, out = await cli(sched, "queues", "set", backend, "a", "--quota", "2")
    assert code == 0 and "a" in out, out
    assert (await second.result()).phase is Phase.COMPLETED  # while the first still trains
    assert (await sched.status(first)).phase in (Phase.TRAINING, Phase.CHECKPOINTING)
    code, out = await cli(sched, "queues", "--json")
    assert code == 0, out
    mine = next(s for s in json.loads(out) if s["backend"] == backend)
    assert mine["queues"]["a"]["quota"] == 2 and list(mine["holders"]) == [first.id]
    await first.cancel()


@pytest.mark.capacity(slots=2, capabilities=["h100"])
async def test_a_job_needing_what_no_backend_has_is_refused_at_submission(
    sched: Stack, backend: str
) -> None:
    from shepherd.client import Shepherd
    from shepherd.preflight import SubmissionRefused

    sh = Shepherd(sched.client, task_queue=sched.task_queue)
    with pytest.raises(SubmissionRefused) as refused:
        await sh.submit(job(sched, "big", backend, required_capabilities=["a100"]))
    assert refused.value.field == "scheduling.required_capabilities"
    assert "a100" in str(refused.value) and "h100" in str(refused.value)
    fits = await sh.submit(job(sched, "fits", backend, steps=5, required_capabilities=["h100"]))
    sched.handles.append(sched.client.get_workflow_handle(fits.id))
    assert (await fits.wait()).phase is Phase.COMPLETED


@pytest.mark.capacity(slots=1, places_every_s=1.0, places_first=2)
async def test_the_first_waiting_jobs_are_told_their_place_which_their_web_ui_page_shows(
    sched: Stack, backend: str
) -> None:
    """The scheduler tells the first jobs of each line where they stand (as it changes), the
    ones further back the range they stand in: the job's own status and its Web UI page
    (current details) say it, without a client asking the scheduler; once admitted, they
    say nothing of a line."""
    from temporalio.api.sdk.v1 import WorkflowMetadata

    from shepherd.models import JobStatus

    async def own(handle: WorkflowHandle[Any, Any]) -> tuple[JobStatus, str]:
        status = await handle.query("status", result_type=JobStatus)
        meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        return status, meta.current_details

    async def told(handle: WorkflowHandle[Any, Any], position: int, length: int | None) -> None:
        """Until the job says it stands at ``position`` (of ``length``: None where the line's
        length when it was told depends on the order its asks arrived in)."""
        said = f"position {position} of {length or ''}"
        async with asyncio.timeout(30):
            while True:
                status, page = await own(handle)
                p = status.placement
                if p is not None and p.position == position and length in (None, p.length):
                    assert said in (status.admission or "") and said in page, (status, page)
                    assert f"shepherd-scheduler-{backend}" in page
                    return
                await asyncio.sleep(0.2)

    first = await sched.start(job(sched, "running", backend, steps=3000))
    await sched.until(first, lambda st: st.phase is Phase.TRAINING, 60)
    # One after the other (each asks from an activity of its own: their asks could overtake).
    w0 = await sched.start(job(sched, "w0", backend, steps=3000))
    await told(w0, 1, 1)
    w1 = await sched.start(job(sched, "w1", backend, steps=3000))
    await told(w1, 2, 2)
    urgent = await sched.start(job(sched, "urgent", backend, steps=5, priority=9))
    await told(urgent, 1, 3)
    await told(w0, 2, 3)  # it moved back (the line's length alone is not news: not retold)
    status, _ = await own(w0)
    assert status.placement is not None and "1 job(s) ahead" in status.placement.waits_for
    # w1, third, is beyond the first two: it hears the range it stands in, not a place.
    async with asyncio.timeout(30):
        while "position 3-100 of 3 in queue default" not in (await own(w1))[1]:
            await asyncio.sleep(0.2)
    status, page = await own(w1)
    assert status.placement is None and "the 2 job(s) or more ahead" in page, page
    await first.cancel()
    # The urgent job is admitted, then w0: w1 hears it moved up, each time.
    assert (await urgent.result()).phase is Phase.COMPLETED
    await told(w1, 1, 1)
    await w0.cancel()
    async with asyncio.timeout(30):
        while True:
            status, page = await own(w1)
            if status.phase is Phase.TRAINING:
                break
            await asyncio.sleep(0.2)
    assert status.placement is None and status.admission is None and "position" not in page
    # Admitted, its workflow's tasks go ahead of every job's intake; paused (waiting again),
    # back to its own priority.
    assert await task_priority_key(w1) == HOLDING_PRIORITY.priority_key == 1
    await sched.until(w1, lambda st: bool(st.checkpoints), 60)
    await w1.execute_update("request_pause", PauseRequest(), result_type=PauseResult)
    await sched.until(w1, lambda st: st.phase is Phase.PAUSED, 60)
    async with asyncio.timeout(30):
        while await task_priority_key(w1) != task_priority(5).priority_key:
            await asyncio.sleep(0.2)
    await w1.cancel()


async def task_priority_key(handle: WorkflowHandle[Any, Any]) -> int:
    """The priority key the server dispatches the workflow's tasks with now."""
    return (await handle.describe()).raw_description.workflow_execution_info.priority.priority_key


H100, A100 = "NVIDIA_H100_80GB", "NVIDIA_A100_80GB"


@pytest.mark.capacity(slots=2, pools={H100: 1, A100: 1})
async def test_a_backends_slots_per_accelerator_type_admit_each_job_to_its_own(
    sched: Stack, backend: str
) -> None:
    """A backend with one H100 slot and one A100 slot: a second H100 job waits for the H100
    (saying so) while an A100 job submitted after it trains; a job naming a type the
    backend has no slots for is refused at submission, naming the field."""
    from shepherd.client import Shepherd
    from shepherd.preflight import SubmissionRefused

    def on(accelerator: str | None, name: str, steps: int) -> Any:
        return job(sched, name, backend, steps, trainer={**SLOW, "accelerator_type": accelerator})

    first = await sched.start(on(H100, "h1", 3000))
    await sched.until(first, lambda st: st.phase is Phase.TRAINING, 60)
    second = await sched.start(on(H100, "h2", 5))
    sh = Shepherd(sched.client, task_queue=sched.task_queue)
    async with asyncio.timeout(30):
        while (waiting := await sh.get(second.id).status()).placement is None:
            await asyncio.sleep(0.1)
    assert waiting.phase is Phase.QUEUED and waiting.placement is not None
    assert f"capacity for {H100}" in waiting.placement.waits_for
    third = await sched.start(on(A100, "a1", 5))
    assert (await third.result()).phase is Phase.COMPLETED  # while h2 still waits
    assert (await sched.status(second)).phase is Phase.QUEUED
    state = await scheduler(sched, backend)
    assert {j: h.pool for j, h in state.holders.items()} == {first.id: H100}
    code, out = await cli(sched, "queues")
    assert code == 0 and f"pools {A100} 0 of 1, {H100} 1 of 1" in out, out
    for accelerator, said in ((None, "names neither"), ("NVIDIA_B200_180GB", "B200")):
        with pytest.raises(SubmissionRefused) as refused:
            await sh.submit(on(accelerator, "nowhere", 5))
        assert refused.value.field == "trainer.accelerator_type"
        assert said in str(refused.value) and f"{A100}, {H100} only" in str(refused.value)
    # An operator gives the backend a second H100 while they run: h2 is admitted at once.
    code, out = await cli(
        sched,
        "queues",
        "capacity",
        backend,
        "--slots",
        "3",
        "--pool",
        f"{H100}=2",
        "--pool",
        f"{A100}=1",
    )
    assert code == 0, out
    assert (await second.result()).phase is Phase.COMPLETED
    assert (await sched.status(first)).phase in (Phase.TRAINING, Phase.CHECKPOINTING)
    code, out = await cli(sched, "queues", "capacity", backend, "--slots", "3", "--pool", "x y=1")
    assert code != 0 and "'x y' is not an accelerator type" in out, out
    await first.cancel()


@pytest.mark.capacity(slots=3)
async def test_urgent_jobs_preempt_the_lowest_preemptible_loop_and_program_never_the_rest(
    programs_env: Path, sched: Stack, backend: str
) -> None:
    """Three slots: a non-preemptible job (the lowest priority of all), a preemptible loop
    and a preemptible program. Two urgent jobs arrive in turn: the first takes the loop's
    slot (the lowest preemptible), the second the program's; the non-preemptible job is never
    asked. Each victim pauses at a checkpoint, waits its turn and ends as if undisturbed:
    the loop with a reference run's weights, the program with its per-step losses and one
    program start."""
    from tests.workflows.test_programs import per_step, printed, program_starts, sft_spec

    ref = await sched.start(job(sched, "lref", "local", steps=40))
    clean = await sched.start(sft_spec(sched, "pclean", steps=16))
    steady = await sched.start(job(sched, "steady", backend, steps=120, priority=0))
    loop = await sched.start(job(sched, "lvictim", backend, steps=40, priority=1, preemptible=True))
    program = await sched.start(
        sft_spec(
            sched,
            "pvictim",
            steps=16,
            backend=backend,
            scheduling={"priority": 2, "preemptible": True},
        )
    )
    for handle in (loop, program):  # preemptible once each has checkpointed
        await sched.until(handle, lambda s: s.phase is Phase.TRAINING and bool(s.checkpoints), 90)
    first = await sched.start(job(sched, "urgent1", backend, steps=5, priority=10))
    await sched.until(loop, lambda s: s.priority_preemptions == 1, 60)
    second = await sched.start(job(sched, "urgent2", backend, steps=5, priority=10))
    done = {h.id: await h.result() for h in (first, second, loop, program, steady)}
    assert all(s.phase is Phase.COMPLETED for s in done.values()), done
    for victim, urgent in ((loop, first), (program, second)):
        status = done[victim.id]
        assert status.priority_preemptions == 1 and status.preemptions == 0
        assert [r.reason for r in status.recoveries] == ["priority"]
        assert urgent.id in status.recoveries[0].message
    assert done[steady.id].priority_preemptions == 0 and not done[steady.id].recoveries
    await ref.result()
    await clean.result()
    assert await model_digest(sched, "lvictim-model") == await model_digest(sched, "lref-model")
    assert per_step(printed(programs_env, program)) == per_step(printed(programs_env, clean))
    assert await program_starts(program) == 1
    state = await scheduler(sched, backend)
    assert state.preemptions == {"priority": 2} and state.holders == {}
