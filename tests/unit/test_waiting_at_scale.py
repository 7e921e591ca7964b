"""Pure parts of waiting at scale: trainer ids that name their workflow, the fallback poll
delays, worker sizing from the environment; and why a trainer died, from its platform state."""

from __future__ import annotations

from datetime import timedelta

import pytest

from shepherd.models import PlatformJob
from shepherd.platform import rules
from shepherd.trainer_ids import owner_of, trainer_prefix
from workers.main import WorkerSizing
from workflows import policies
from workflows.job import classify


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
