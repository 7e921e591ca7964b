"""What a program's run tells its workflow (activities/program_run.py): a report that cannot
be delivered for a while is kept and sent with the next; one whose workflow is closed for good
ends the reports quietly — never an error nobody handles ("Task exception was never
retrieved ... _report() ... RPCError", issue 30)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from temporalio.service import RPCError, RPCStatusCode

from activities.program_run import ProgramRun
from shepherd import programs
from shepherd.models import CheckpointRecord


class _Proxy:
    restore_point = None
    trainer_job_id = None


class _Handle:
    def __init__(self, fail: list[RPCStatusCode]) -> None:
        self.fail, self.sent = fail, []

    async def signal(self, name: str, arg: Any) -> None:
        if self.fail:
            raise RPCError("no", self.fail.pop(0), b"")
        self.sent.append((name, arg))


def _run(tmp_path: Path, handle: _Handle) -> ProgramRun:
    return ProgramRun(
        workflow_id="job-x",
        name="p",
        program=programs.Program(name="p", module="pkg.p"),
        args={},
        directory=tmp_path,
        proxy=_Proxy(),  # type: ignore[arg-type]
        platform=None,  # type: ignore[arg-type]
        handle=handle,  # type: ignore[arg-type]
        environment={},
        generation=1,
        control_queue="q",
        metrics=[],
    )


def _checkpoint(step: int) -> CheckpointRecord:
    return CheckpointRecord(name=f"step-{step:08d}", step=step, trainer_job_id="t")


async def test_a_report_that_failed_is_sent_with_the_next(tmp_path: Path) -> None:
    handle = _Handle([RPCStatusCode.UNAVAILABLE])  # the server restarts
    run = _run(tmp_path, handle)
    run.checkpoints.append(_checkpoint(4))
    run.dirty = True
    await run._flush()
    assert handle.sent == [] and run.dirty  # kept
    run.checkpoints.append(_checkpoint(8))
    await run._flush()
    [(name, sent)] = handle.sent
    assert name == "program_progress" and [c.step for c in sent.checkpoints] == [4, 8]
    assert not run.dirty


async def test_a_closed_workflow_ends_the_reports_without_an_error(tmp_path: Path) -> None:
    handle = _Handle([RPCStatusCode.NOT_FOUND])  # terminated from outside
    run = _run(tmp_path, handle)
    run.checkpoints.append(_checkpoint(4))
    run.dirty = True
    reporter = asyncio.ensure_future(run._report())
    run.events.put_nowait(object())  # (an event the reporter ignores)
    await run._flush()
    assert run.unheard and handle.sent == []
    run.checkpoints.append(_checkpoint(8))
    run.dirty = True
    await run._flush()  # nothing more is tried
    assert handle.sent == []
    reporter.cancel()
    await asyncio.gather(reporter, return_exceptions=True)
