"""Recurring experiments as Temporal Schedules — never a home-made timer.

Each run is an ordinary job workflow (``job-<name>-<scheduled time>``), labelled with its
schedule (label ``schedule=<name>``, search attribute ``ShepherdSchedule``). The spec may
refer to the run's scheduled time, e.g. ``output.model_id: nightly-{scheduled_time:%Y%m%d}``
or a dataset path by date; the templates are filled per run. A spec is validated at
creation by filling its templates with the current time, so a broken one never reaches a
schedule.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleBackfill,
    ScheduleHandle,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
)
from temporalio.common import SearchAttributePair
from temporalio.service import RPCError, RPCStatusCode

from shepherd import search_attributes as sa
from shepherd.jobs import WORKFLOW_TYPE, job_search_attributes, static_summary
from shepherd.models import JobInput
from shepherd.spec import JobSpec, SpecError, SpecProblem, resolve_templates, validate_spec

SCHEDULE_PREFIX = "sched-"
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")

Overlap = Literal["skip", "buffer_one", "cancel_other", "allow_all"]
OVERLAP: dict[str, ScheduleOverlapPolicy] = {
    "skip": ScheduleOverlapPolicy.SKIP,
    "buffer_one": ScheduleOverlapPolicy.BUFFER_ONE,
    "cancel_other": ScheduleOverlapPolicy.CANCEL_OTHER,
    "allow_all": ScheduleOverlapPolicy.ALLOW_ALL,
}


class ScheduleRun(BaseModel):
    workflow_id: str
    scheduled_at: datetime | None = None
    started_at: datetime | None = None
    #: The job's outcome: its phase (RUNNING jobs: their current phase), or the execution status.
    outcome: str | None = None


class ScheduleInfo(BaseModel):
    name: str
    schedule_id: str
    job: str
    spec: str = ""
    paused: bool = False
    note: str = ""
    overlap: str = ""
    next_runs: list[datetime] = Field(default_factory=list)
    recent_runs: list[ScheduleRun] = Field(default_factory=list)
    running: list[str] = Field(default_factory=list)
    total_runs: int = 0


def schedule_id(name: str) -> str:
    return f"{SCHEDULE_PREFIX}{name}"


def _check_name(name: str) -> None:
    if not NAME_RE.match(name):
        raise SpecError(
            [SpecProblem(field="schedule name", rule="must be 1-40 characters of a-z, 0-9 and '-'")]
        )


def prepare_template(spec: JobSpec, name: str) -> JobSpec:
    """The spec a schedule keeps: labelled with the schedule, and proven valid by filling
    its templates with the current time."""
    data = spec.model_dump(mode="json")
    data["labels"] = {**data.get("labels", {}), "schedule": name}
    template = validate_spec(data)
    resolve_templates(template, datetime.now(UTC))  # raises SpecError naming any broken field
    return template


def _describe_spec(cron: list[str], every: timedelta | None) -> str:
    parts = [f"cron {c!r}" for c in cron]
    if every:
        parts.append(f"every {every}")
    return ", ".join(parts)


class Schedules:
    """Create and steer the schedules of recurring jobs (``shepherd schedule ...``)."""

    def __init__(self, client: Client, task_queue: str) -> None:
        self.client = client
        self.task_queue = task_queue

    def handle(self, name: str) -> ScheduleHandle:
        return self.client.get_schedule_handle(schedule_id(name))

    async def create(
        self,
        name: str,
        spec: JobSpec,
        *,
        cron: list[str] | None = None,
        every: timedelta | None = None,
        overlap: Overlap = "skip",
        catchup_window: timedelta | None = None,
        jitter: timedelta | None = None,
        paused: bool = False,
        note: str = "",
        task_queue: str | None = None,
    ) -> ScheduleInfo:
        _check_name(name)
        if not cron and every is None:
            raise SpecError(
                [SpecProblem(field="schedule", rule="give --cron EXPR or --every DURATION")]
            )
        if every is not None and every < timedelta(seconds=1):
            raise SpecError([SpecProblem(field="every", rule="must be at least 1s")])
        if overlap not in OVERLAP:
            raise SpecError(
                [SpecProblem(field="overlap", rule="must be one of " + ", ".join(OVERLAP))]
            )
        template = prepare_template(spec, name)
        attrs = job_search_attributes(template, SearchAttributePair(sa.SCHEDULE, name))
        action = ScheduleActionStartWorkflow(
            WORKFLOW_TYPE,
            JobInput(spec=template, templated=True),
            id=f"job-{template.name}",  # Temporal appends each run's scheduled time
            task_queue=task_queue or template.scheduling.queue or self.task_queue,
            typed_search_attributes=attrs,
            static_summary=f"scheduled by {name}: " + static_summary(template),
        )
        schedule = Schedule(
            action=action,
            spec=ScheduleSpec(
                cron_expressions=list(cron or []),
                intervals=[ScheduleIntervalSpec(every=every)] if every else [],
                jitter=jitter,
            ),
            policy=SchedulePolicy(
                overlap=OVERLAP[overlap], catchup_window=catchup_window or timedelta(minutes=1)
            ),
            state=ScheduleState(
                paused=paused,
                note=note or f"created by shepherd: {_describe_spec(cron or [], every)}",
            ),
        )
        try:
            await self.client.create_schedule(schedule_id(name), schedule)
        except RPCError as exc:
            raise ValueError(f"cannot create schedule {name!r}: {exc.message}") from None
        except Exception as exc:  # the SDK raises ScheduleAlreadyRunningError
            if type(exc).__name__ == "ScheduleAlreadyRunningError":
                raise ValueError(f"schedule {name!r} already exists") from None
            raise
        return await self.describe(name)

    async def list(self) -> list[ScheduleInfo]:
        out = []
        async for entry in await self.client.list_schedules():
            if entry.id.startswith(SCHEDULE_PREFIX):
                out.append(await self.describe(entry.id.removeprefix(SCHEDULE_PREFIX)))
        return out

    async def describe(self, name: str, *, recent: int = 10) -> ScheduleInfo:
        try:
            desc = await self.handle(name).describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise KeyError(f"no schedule {name!r}") from None
            raise
        action = desc.schedule.action
        job = ""
        if isinstance(action, ScheduleActionStartWorkflow):
            job = action.id
        runs = []
        for act in list(desc.info.recent_actions)[-recent:]:
            wid = getattr(act.action, "workflow_id", "")
            runs.append(
                ScheduleRun(
                    workflow_id=wid,
                    scheduled_at=act.scheduled_at,
                    started_at=act.started_at,
                    outcome=await self._outcome(wid),
                )
            )
        spec = desc.schedule.spec
        return ScheduleInfo(
            name=name,
            schedule_id=desc.id,
            job=job,
            spec=_describe_spec(
                list(spec.cron_expressions), spec.intervals[0].every if spec.intervals else None
            ),
            paused=desc.schedule.state.paused,
            note=desc.schedule.state.note or "",
            overlap=desc.schedule.policy.overlap.name.lower()
            if desc.schedule.policy.overlap
            else "",
            next_runs=list(desc.info.next_action_times[:5]),
            recent_runs=runs,
            running=[getattr(r, "workflow_id", "") for r in desc.info.running_actions],
            total_runs=desc.info.num_actions,
        )

    async def _outcome(self, workflow_id: str) -> str | None:
        if not workflow_id:
            return None
        try:
            d = await self.client.get_workflow_handle(workflow_id).describe()
        except RPCError:
            return None
        phase = d.typed_search_attributes.get(sa.PHASE)
        return phase or (d.status.name if d.status else None)

    async def pause(self, name: str, note: str = "") -> None:
        await self.handle(name).pause(note=note or "paused by shepherd")

    async def unpause(self, name: str, note: str = "") -> None:
        await self.handle(name).unpause(note=note or "unpaused by shepherd")

    async def trigger(self, name: str, overlap: Overlap | None = None) -> None:
        await self.handle(name).trigger(overlap=OVERLAP[overlap] if overlap else None)

    async def backfill(
        self, name: str, start: datetime, end: datetime, overlap: Overlap = "allow_all"
    ) -> None:
        """Run every action the schedule would have taken in [start, end) (also while paused)."""
        if end <= start:
            raise SpecError([SpecProblem(field="backfill", rule="TO must be after FROM")])
        await self.handle(name).backfill(
            ScheduleBackfill(start_at=start, end_at=end, overlap=OVERLAP[overlap])
        )

    async def delete(self, name: str) -> None:
        await self.handle(name).delete()


def parse_time(value: str | datetime) -> datetime:
    """ISO 8601 (``2026-11-20T00:00:00Z``, ``2026-11-20``); naive times are UTC."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    text = value.strip().replace("Z", "+00:00")
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
