"""What the CLI prints, as a user's pipe or terminal gets it (no server)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime

from shepherd.cli.common import same_address
from shepherd.cli.render import progress_line, show_status
from shepherd.models import JobStatus, RecoveryRecord

NAME = "accounts/dev/rlorTrainerJobs/job-a-name-as-long-as-names-may-be-is-forty0-0a1b2c--3d4e-g0/checkpoints/step-00000020"

TABLE = f"""
from shepherd.cli.render import checkpoint_table
from shepherd.models import CheckpointRecord, JobStatus
checkpoint_table(JobStatus(checkpoints=[CheckpointRecord(name={NAME!r}, step=20, trainer_job_id="t")]))
"""


def test_a_piped_table_is_never_cut() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    done = subprocess.run(
        [sys.executable, "-c", TABLE], capture_output=True, text=True, env=env, check=True
    )
    rows = [line for line in done.stdout.splitlines() if NAME in line]
    assert len(rows) == 1 and "│" in rows[0], done.stdout  # a table row, the name whole


def test_one_step_redone_is_one_step(capsys: object) -> None:
    status = JobStatus(
        recoveries=[
            RecoveryRecord(
                number=1,
                reason="preemption",
                platform_state="JOB_STATE_FAILED",
                message="preempted",
                at_step=11,
                resumed_from_step=10,
                steps_redone=1,
                started_at=datetime.now(UTC),
            )
        ]
    )
    show_status(status)
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "1 step redone" in out and "1 steps" not in out


def test_a_priority_preemption_says_who_took_the_slot_and_why(capsys: object) -> None:
    why = "made way for job-urgent: priority: job-urgent (priority 10) needs the slot"
    record = RecoveryRecord(
        number=1,
        reason="priority",
        platform_state="",
        message=why,
        at_step=40,
        resumed_from_step=40,
        steps_redone=0,
        started_at=datetime.now(UTC),
        action="requeue",
    )
    show_status(JobStatus(recoveries=[record]))
    out = " ".join(capsys.readouterr().out.split())  # type: ignore[attr-defined]
    assert (
        f"recovery 1: priority at step 40 -> step 40 (0 steps redone, 0.0s, requeue): {why}" in out
    )


def test_what_a_job_retries_is_shown_as_the_platform_said_it(capsys: object) -> None:
    said = "save_checkpoint (attempt 3; next in 4s): [Errno 28] No space left on device"
    show_status(JobStatus(retrying=[said]))
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert f"retrying: {said}" in " ".join(out.split())


def test_loopback_names_are_one_address() -> None:
    assert same_address("127.0.0.1:7233", "localhost:7233")
    assert not same_address("127.0.0.1:7233", "localhost:7234")
    assert not same_address("10.0.0.1:7233", "localhost:7233")
    assert progress_line(JobStatus()).startswith("PENDING")
