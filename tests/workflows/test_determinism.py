"""The determinism stress run, short (tests/determinism.py; bench/determinism.py runs it
long): a worker with no workflow cache, jobs paused, resumed, cancelled and preempted at
random moments while they are queried; every job ends as it should, with a clean run's
weights, and every history replays."""

from __future__ import annotations

import os

import pytest

from tests.determinism import StressConfig, run_stress
from tests.workflows.conftest import Stack

#: The seed of the random moments; another seed (or several) on request.
SEED = int(os.environ.get("SHEPHERD_STRESS_SEED", "7"))


@pytest.mark.slow
async def test_every_job_ends_as_it_should_and_every_history_replays(stack: Stack) -> None:
    cfg = StressConfig(jobs=10, seed=SEED)
    report = await run_stress(stack.client, stack.admin, stack.account.client, stack.registry, cfg)
    assert report.problems == [], "\n".join([str(report), *report.problems])
    assert report.completed + report.cancelled == cfg.jobs
    assert report.histories_replayed == cfg.jobs + 1  # and the reference run
    # The random moments did happen (seeded: the same ones every run), and the jobs were
    # queried while they ran (at least once each on average, however busy the machine).
    assert report.paused and report.preempted and report.cancelled, report
    assert report.queries_while_running >= cfg.jobs, report
