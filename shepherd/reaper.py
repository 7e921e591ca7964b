"""The reaper: deletes trainers whose job workflow ended without its cleanup.

A job workflow always deletes its trainer — on completion, failure and cancellation — but
what ends a workflow *from outside* (``temporal workflow terminate``, a reset, a bug) skips
that cleanup, and the trainer then holds its GPUs until someone notices. The reaper, a
workflow that a Temporal Schedule runs every few minutes, lists each backend's trainer jobs,
keeps those Shepherd did not create, and deletes those whose job workflow has been closed
(or is missing) for longer than a grace period. What it deleted is its run's result
(``shepherd reaper status``) and a ``reaper.deleted`` log line of the worker.

Which trainers are Shepherd's: an id ``<workflow id>--<4 hex>-g<n>`` names its workflow, and
the hex must be that of one of the workflow's runs (shepherd/trainer_ids.py); any other id is
Shepherd's only if a job workflow recorded its prefix (the ``ShepherdTrainerJobId`` search
attribute) *and* its ``<6 hex>`` is that of one of the workflow's runs. Either way the
generation ``n`` must be one the job reached (at most the one it recorded last): a prefix
alone would take in a hand-made ``<prefix>-g7``. A trainer whose workflow is missing
altogether (deleted, or past the namespace's retention) is deleted only when the id fits the
rule *and* the trainer's display name is that workflow id, as Shepherd sets it: anything
else is not provably Shepherd's and is left alone.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field

#: How often the reaper runs (its Schedule). A terminated job's trainer is deleted at most
#: REAPER_GRACE + REAPER_PERIOD after the end: minutes, where it held GPUs until someone
#: noticed. One pass is a listing of every trainer job and a visibility read per live one.
REAPER_PERIOD = timedelta(minutes=5)
#: A trainer is deleted once its workflow has been closed (or missing) this long. The one
#: default, for ``reaper install``, ``reaper run`` (when no reaper is installed) and
#: ``shepherd dev``. Nothing of a closed job runs after it closed (its cleanup runs before
#: the close), so the grace only covers what visibility may not show yet: the next run of
#: a continue-as-new, a just-started workflow whose trainer exists before its record does,
#: clock skew between worker and server. Seconds would do on a quiet server; minutes leave
#: a loaded visibility store its margin and let whoever terminated a job look at its
#: trainer first, while a trainer still goes within minutes (a dev stack has few slots).
REAPER_GRACE = timedelta(minutes=2)

#: The Schedule that runs the reaper (``shepherd reaper install``, ``shepherd dev``).
SCHEDULE_ID = "shepherd-reaper"
#: The reaper workflow's type name.
WORKFLOW_TYPE = "ShepherdReaper"


class ReaperInput(BaseModel):
    #: Backend profiles to look at (None: every profile the running worker has).
    backends: list[str] | None = None
    #: A trainer is deleted once its workflow has been closed (or missing) this long.
    grace: timedelta = REAPER_GRACE
    #: Report what would be deleted; delete nothing.
    dry_run: bool = False


class ReapedTrainer(BaseModel):
    backend: str
    trainer_job_id: str
    state: str
    #: The job workflow that owned it (None: a missing workflow's id, from the trainer id).
    workflow_id: str | None = None
    #: Why it is an orphan: "workflow TERMINATED 12m ago", "workflow missing".
    reason: str


class ReaperReport(BaseModel):
    started_at: datetime | None = None
    finished_at: datetime | None = None
    dry_run: bool = False
    grace_s: float = 0.0
    #: Trainer jobs looked at (not yet deleted), over every backend.
    checked: int = 0
    #: Shepherd's trainers of live jobs, or of jobs closed within the grace period.
    kept_live: int = 0
    #: Trainers Shepherd did not create (or cannot prove it did): never touched.
    kept_foreign: int = 0
    deleted: list[ReapedTrainer] = Field(default_factory=list)
    #: In a dry run: what would have been deleted.
    would_delete: list[ReapedTrainer] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)


# ------------------------------------------------------------------ the schedule


async def install(
    client: Any,
    task_queue: str,
    *,
    every: timedelta,
    grace: timedelta,
    backends: list[str] | None = None,
    paused: bool = False,
) -> str:
    """Create the reaper's Schedule, or update it to these settings. Returns its id."""
    from temporalio.client import (
        Schedule,
        ScheduleActionStartWorkflow,
        ScheduleAlreadyRunningError,
        ScheduleIntervalSpec,
        ScheduleOverlapPolicy,
        SchedulePolicy,
        ScheduleSpec,
        ScheduleState,
        ScheduleUpdate,
        ScheduleUpdateInput,
    )

    schedule = Schedule(
        action=ScheduleActionStartWorkflow(
            WORKFLOW_TYPE,
            ReaperInput(backends=backends, grace=grace),
            id=f"{SCHEDULE_ID}-run",
            task_queue=task_queue,
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
        # A pass that outlasts the period is not doubled: the next one starts after it.
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
        state=ScheduleState(
            paused=paused,
            note=f"deletes trainers of jobs closed more than {grace} ago (shepherd reaper)",
        ),
    )
    try:
        await client.create_schedule(SCHEDULE_ID, schedule)
    except ScheduleAlreadyRunningError:

        def replace(_: ScheduleUpdateInput) -> ScheduleUpdate:
            return ScheduleUpdate(schedule=schedule)

        await client.get_schedule_handle(SCHEDULE_ID).update(replace)
    return SCHEDULE_ID


class ReaperState(BaseModel):
    """What ``shepherd reaper status`` shows: the Schedule and its latest passes."""

    installed: bool = False
    paused: bool = False
    every_s: float | None = None
    #: The grace its passes use (None: unreadable, e.g. installed by another version).
    grace_s: float | None = None
    task_queue: str | None = None
    next_runs: list[datetime] = Field(default_factory=list)
    #: The latest passes, newest first: (workflow id, its report, or None while running).
    recent: list[tuple[str, ReaperReport | None]] = Field(default_factory=list)


async def state(client: Any, *, last: int = 5) -> ReaperState:
    from temporalio.client import ScheduleActionStartWorkflow
    from temporalio.service import RPCError, RPCStatusCode

    try:
        desc = await client.get_schedule_handle(SCHEDULE_ID).describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return ReaperState()
        raise
    out = ReaperState(installed=True, paused=desc.schedule.state.paused)
    intervals = desc.schedule.spec.intervals
    out.every_s = intervals[0].every.total_seconds() if intervals else None
    action = desc.schedule.action
    if isinstance(action, ScheduleActionStartWorkflow):
        out.task_queue = action.task_queue
        out.grace_s = await _grace_of(client, action.args)
    out.next_runs = list(desc.info.next_action_times[:3])
    for taken in reversed(desc.info.recent_actions[-last:] if last > 0 else []):
        started = taken.action
        workflow_id = getattr(started, "workflow_id", None)
        if workflow_id is None:
            continue
        handle = client.get_workflow_handle(workflow_id, run_id=started.first_execution_run_id)
        report: ReaperReport | None = None
        try:
            report = await handle.query("status", result_type=ReaperReport)
        except Exception:  # noqa: BLE001 - a pass that failed or is gone shows as unknown
            report = None
        out.recent.append((workflow_id, report))
    return out


async def _grace_of(client: Any, args: Any) -> float | None:
    """The grace in a Schedule's reaper input (describe gives the raw payloads)."""
    try:
        (inp,) = await client.data_converter.decode(list(args), [ReaperInput])
    except Exception:  # noqa: BLE001 - another version's input: the grace is unknown
        return None
    return inp.grace.total_seconds() if isinstance(inp, ReaperInput) else None


def duration_text(seconds: float) -> str:
    """``90s``, ``2m``, ``1h30m``: how the CLI shows periods and graces."""
    whole = round(seconds)
    if whole < 120 and (whole % 60 or not whole):
        return f"{whole}s"
    hours, minutes = divmod(whole // 60, 60)
    rest = whole % 60
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes or not hours else "")
    return text + (f"{rest}s" if rest else "")


# ------------------------------------------------------------------ what status asks


#: Where ``status`` looks for the pass that deleted a closed job's trainer: the passes that
#: closed after the job, window by window from its end (a pass deletes it within
#: REAPER_GRACE + the period), at most this many passes' reports in all, so that the status
#: of a job the reaper never touched stays one quick call.
LOOKUP_WINDOWS = (timedelta(minutes=15), timedelta(hours=2), timedelta(days=1))
LOOKUP_MAX_PASSES = 30


class Reaped(BaseModel):
    """A reaper pass deleted this trainer."""

    pass_id: str
    at: datetime | None = None
    trainer: ReapedTrainer


def _visibility_time(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


async def deleted_by_reaper(
    client: Any,
    workflow_id: str,
    trainer_job_id: str,
    *,
    closed_at: datetime | None,
    now: datetime | None = None,
) -> Reaped | None:
    """The reaper pass that deleted ``trainer_job_id``, the trainer of job ``workflow_id``
    that closed at ``closed_at`` without deleting it; None if no pass (read within the
    bounds) did."""
    if closed_at is None:
        return None
    now = now or datetime.now(UTC)
    start, budget = closed_at, LOOKUP_MAX_PASSES
    for span in LOOKUP_WINDOWS:
        if start > now or budget <= 0:
            break
        end = closed_at + span
        query = (
            f'WorkflowType = "{WORKFLOW_TYPE}" AND ExecutionStatus = "Completed" '
            f'AND CloseTime >= "{_visibility_time(start)}" '
            f'AND CloseTime < "{_visibility_time(end)}"'
        )
        passes = [ex async for ex in client.list_workflows(query, limit=budget)]
        budget -= len(passes)
        reports = await asyncio.gather(
            *(
                client.get_workflow_handle(
                    ex.id, run_id=ex.run_id, result_type=ReaperReport
                ).result()
                for ex in passes
            ),
            return_exceptions=True,
        )
        for ex, report in zip(passes, reports, strict=True):
            if not isinstance(report, ReaperReport):
                continue  # unreadable (another version's report): not proof of anything
            for trainer in report.deleted:
                # Another backend's trainer may have the same id: the job must match too.
                owner = trainer.workflow_id or workflow_id
                if trainer.trainer_job_id == trainer_job_id and owner == workflow_id:
                    return Reaped(pass_id=ex.id, at=report.finished_at, trainer=trainer)
        start = end
    return None
