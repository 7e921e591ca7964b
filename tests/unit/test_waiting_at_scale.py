"""Pure parts of waiting at scale: trainer ids that name their workflow, the fallback poll
delays, worker sizing from the environment; and why a trainer died, from its platform state."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from temporalio.common import RetryPolicy
from temporalio.testing import ActivityEnvironment

from activities.base import keepalive
from activities.readiness import ReadinessActivities
from shepherd.models import PlatformJob, TrainerRef
from shepherd.platform import rules
from shepherd.trainer_ids import owner_of, trainer_prefix
from workers.main import WorkerSizing
from workflows import policies
from workflows.recovery import classify


@pytest.mark.parametrize("workflow_id", ["job-demo-1a2b3c", "a", "x--y", "job-" + "n" * 44])
def test_a_fitting_workflow_id_is_carried_by_its_trainer_ids(workflow_id: str) -> None:
    prefix = trainer_prefix("demo", workflow_id, "run-1")
    for generation in (0, 7, 9999):
        trainer = f"{prefix}-g{generation}"
        assert rules.check_resource_id(trainer) is None
        assert owner_of(trainer) == workflow_id


@pytest.mark.parametrize(
    "workflow_id",
    ["Job-Upper", "sched-2026-11-23T10:00:00Z", "job-" + "n" * 60, "job-a\n", "a/b"],
)
def test_other_workflow_ids_keep_the_name_based_id(workflow_id: str) -> None:
    trainer = f"{trainer_prefix('demo', workflow_id, 'run-1')}-g0"
    assert rules.check_resource_id(trainer) is None
    assert trainer.startswith("demo-")
    assert owner_of(trainer) is None


def test_two_runs_of_one_workflow_id_get_different_trainers() -> None:
    assert trainer_prefix("d", "job-x", "run-1") != trainer_prefix("d", "job-x", "run-2")


def test_ids_of_the_older_scheme_name_no_owner() -> None:
    old = f"{trainer_prefix('demo-', 'job-x', 'r', owner_in_id=False)}-g3"
    assert owner_of(old) is None


def test_fallback_polls_double_to_their_cap_with_bounded_jitter() -> None:
    first, cap = timedelta(seconds=5), timedelta(minutes=10)
    j = policies.EVENT_FALLBACK_JITTER
    for attempt, base in [(1, 5), (2, 10), (3, 20), (8, 600), (60, 600)]:
        low = policies.fallback_poll_delay(attempt, first, cap, 0.0)
        high = policies.fallback_poll_delay(attempt, first, cap, 0.999999)
        assert low == timedelta(seconds=base * (1 - j))
        assert timedelta(seconds=base) < high <= timedelta(seconds=base * (1 + j))


def test_worker_sizing_from_the_environment() -> None:
    sizing = WorkerSizing.from_env(
        {"SHEPHERD_WORKER_MAX_CACHED_WORKFLOWS": "4000", "SHEPHERD_WORKER_STICKY_TIMEOUT_S": "2.5"}
    )
    assert sizing.max_cached_workflows == 4000 and sizing.sticky_timeout_s == 2.5
    assert WorkerSizing.from_env({}) == WorkerSizing()
    with pytest.raises(SystemExit, match="SHEPHERD_WORKER_WAIT_SLOTS"):
        WorkerSizing.from_env({"SHEPHERD_WORKER_WAIT_SLOTS": "many"})
    with pytest.raises(SystemExit, match="must be > 0"):
        WorkerSizing.from_env({"SHEPHERD_WORKER_ACTIVITY_SLOTS": "0"})


@pytest.mark.parametrize(
    ("state", "code", "message", "reason"),
    [
        ("JOB_STATE_FAILED", "UNAVAILABLE", "node reclaimed", "preemption"),
        ("JOB_STATE_FAILED", "INTERNAL", "trainer crashed (exit code 1)", "failure"),
        ("JOB_STATE_FAILED", "INVALID_ARGUMENT", "bad config", "refused"),
        ("JOB_STATE_FAILED", "FAILED_PRECONDITION", "quota", "refused"),
        ("JOB_STATE_IDLE", "", "inactive", "idle"),
        ("JOB_STATE_DELETED", "", "", "deleted"),
    ],
)
def test_why_a_trainer_died_from_the_platforms_words(
    state: str, code: str, message: str, reason: str
) -> None:
    job = PlatformJob(trainer_job_id="t", state=state, status_code=code, message=message)
    assert classify(job) == reason


class _Events:
    """A client provider whose backend does (or does not) push its events."""

    def __init__(self, events: bool, admits: bool = False) -> None:
        self._events, self._admits = events, admits

    def client(self, backend: str) -> Any:
        raise AssertionError("no platform call expected")

    def events(self, backend: str) -> bool:
        return self._events

    def admits(self, backend: str) -> bool:
        return self._admits


def _env(attempt: int) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        attempt=attempt,
        retry_policy=RetryPolicy(initial_interval=timedelta(seconds=5), backoff_coefficient=1.0),
    )
    return env


def _delay_after(attempt: int, *, events: bool) -> timedelta | None:
    acts = ReadinessActivities(_Events(events))
    ref = TrainerRef(backend="local", trainer_job_id="t")
    return _env(attempt).run(  # type: ignore[no-any-return]
        acts._fallback,
        ref,
        policies.EVENT_FALLBACK_PLACEMENT_CAP,
        policies.EVENT_FALLBACK_PLACEMENT_FIRST,
    )


def _admitted_delays(attempts: int, *, admits: bool) -> list[timedelta | None]:
    acts = ReadinessActivities(_Events(events=False, admits=admits))
    ref = TrainerRef(backend="local", trainer_job_id="t")
    return [_env(a).run(acts._admitted_placement, ref) for a in range(1, attempts + 1)]


def test_without_events_an_admitted_job_looks_for_its_placement_soon_then_at_the_poll() -> None:
    # Its slot was given back as the last holder's trainer was being deleted: the platform
    # places it within moments, not a 5 s poll later.
    delays = _admitted_delays(8, admits=True)
    seconds = [d.total_seconds() for d in delays if d is not None]
    assert seconds == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    # Where the platform's own queue admits (no declared slots), the fixed poll stays.
    assert _admitted_delays(3, admits=False) == [None, None, None]


def test_with_events_a_job_waiting_for_a_slot_looks_again_only_minutes_later() -> None:
    # Not at the spec's 5 s poll interval: a burst of submissions would poll through the
    # minutes its own starts keep the server busy (policies.py, "waiting at scale").
    j = policies.EVENT_FALLBACK_JITTER
    first = policies.EVENT_FALLBACK_PLACEMENT_FIRST
    second = _delay_after(1, events=True)
    assert second is not None and first * (1 - j) <= second <= first * (1 + j)
    third = _delay_after(2, events=True)
    assert third is not None and third >= 2 * first * (1 - j)
    assert _delay_after(9, events=True) <= policies.EVENT_FALLBACK_PLACEMENT_CAP * (1 + j)  # type: ignore[operator]
    # Without events the retry policy's fixed interval stays the poll.
    assert _delay_after(1, events=False) is None


def _beats_during(seconds: float, heartbeat_timeout: timedelta) -> list[dict[str, Any]]:
    """The heartbeats a keepalive sends around a call of ``seconds``, the progress moving."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=heartbeat_timeout)
    sent: list[dict[str, Any]] = []
    env.on_heartbeat = lambda *details: sent.append(dict(details[0]))

    async def call() -> None:
        progress = {"step": 0}
        async with keepalive(progress, policies.KEEPALIVE):
            for step in range(1, 11):
                await asyncio.sleep(seconds / 10)
                progress["step"] = step

    asyncio.run(env.run(call))
    return sent


def test_a_short_call_sends_no_heartbeat_and_a_long_one_its_latest_progress() -> None:
    # Each heartbeat is a write on the server; a call shorter than the quiet start needs none.
    assert _beats_during(0.5, timedelta(seconds=4)) == []
    sent = _beats_during(1.6, timedelta(seconds=4))
    assert sent and all(0 < b["step"] < 10 for b in sent) and len(sent) <= 2, sent
    # A short heartbeat timeout shortens the quiet start (a quarter of it) and the spacing.
    sent = _beats_during(0.5, timedelta(seconds=0.4))
    assert len(sent) >= 3 and sent[0]["step"] <= 3, sent
