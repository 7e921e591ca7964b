"""Recurring experiments as Temporal Schedules — never a home-made timer.

Each run is an ordinary job workflow (``job-<name>-<scheduled time>``), labelled with its
schedule (label ``schedule=<name>``, search attribute ``ShepherdSchedule``). The spec may
refer to the run's scheduled time, e.g. ``output.model_id: nightly-{scheduled_time:%Y%m%d}``
or a dataset path by date; the templates are filled per run. A spec is validated at
creation by filling its templates with the current time, so a broken one never reaches a
schedule.

Model ids. A run claims its filled-in ``output.model_id`` when it starts, before anything is
provisioned, with the same check and lock as a submission: if another live job, sweep or run
holds the id, the run fails at once (``ModelClaimed``, naming the holder). The overlap policy
decides whether runs of one schedule are live together at all: ``skip``, ``buffer_one`` and
``cancel_other`` never start a run while the previous one is live (``cancel_other`` waits for
the cancelled run to end), so they never collide; ``allow_all`` (and backfills) let runs
overlap but not share a model id — runs whose templates fill to the same id (a date-only
template on an hourly schedule, a fixed id) are refused while the holder is live, and runs
with distinct ids overlap freely.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleBackfill,
    ScheduleCalendarSpec,
    ScheduleHandle,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleRange,
    ScheduleSpec,
    ScheduleState,
)
from temporalio.common import SearchAttributePair
from temporalio.service import RPCError, RPCStatusCode

from shepherd import outcome
from shepherd import search_attributes as sa
from shepherd.jobs import WORKFLOW_TYPE, job_search_attributes, static_summary
from shepherd.models import JobInput
from shepherd.spec import (
    JobSpec,
    input_error,
    is_template,
    load_job_spec,
    parse_duration,
    resolve_templates,
    validate_spec,
)

T = TypeVar("T")

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


def _duration(field: str, value: timedelta | str | None) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    try:
        return parse_duration(value)
    except ValueError as exc:  # pydantic's error: the rule in its message
        raise input_error(field, str(exc), "schedule") from None


#: How long a trigger's fate is waited for: the schedule's workflow takes it within a
#: second; a run that waits for another to be cancelled (cancel_other) may take longer.
TRIGGER_SETTLE = timedelta(seconds=5)


class TriggerResult(BaseModel):
    """What a trigger did: ``started`` (``workflow_id``), ``skipped`` by the overlap
    policy, ``waiting`` (buffered until a live run ends), or ``dropped``."""

    outcome: Literal["started", "skipped", "waiting", "dropped"]
    workflow_id: str | None = None
    detail: str = ""


def schedule_id(name: str) -> str:
    return f"{SCHEDULE_PREFIX}{name}"


def check_name(name: str) -> None:
    if not NAME_RE.match(name):
        raise input_error(
            "schedule name", "must be 1-40 characters of a-z, 0-9 and '-'", "schedule"
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


def _cron_field(ranges: Sequence[ScheduleRange], full: tuple[int, int]) -> str:
    parts = []
    for r in ranges:
        end = max(r.end, r.start)
        if (r.start, end) == full:
            text = "*"
        elif r.start == end:
            text = str(r.start)
        else:
            text = f"{r.start}-{end}"
        parts.append(text if r.step <= 1 else f"{text}/{r.step}")
    return ",".join(parts) or "*"


def _calendar_text(cal: ScheduleCalendarSpec) -> str:
    """A cron-like line for a calendar: the server keeps cron expressions only in this
    structured form, so a describe does not give the expression back."""
    fields = [
        _cron_field(cal.minute, (0, 59)),
        _cron_field(cal.hour, (0, 23)),
        _cron_field(cal.day_of_month, (1, 31)),
        _cron_field(cal.month, (1, 12)),
        _cron_field(cal.day_of_week, (0, 6)),
    ]
    return f"cron {' '.join(fields)!r}"


def _spec_text(spec: ScheduleSpec, memo: Mapping[str, Any]) -> str:
    if isinstance(memo.get("spec"), str):
        return memo["spec"]  # the user's own words, kept at creation
    parts = [f"cron {c!r}" for c in spec.cron_expressions]
    parts += [_calendar_text(c) for c in spec.calendars]
    parts += [f"every {i.every}" for i in spec.intervals]
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
        spec: JobSpec | Mapping[str, Any] | str | Path,
        *,
        cron: list[str] | str | None = None,
        every: timedelta | str | None = None,
        overlap: Overlap = "skip",
        catchup_window: timedelta | str | None = None,
        jitter: timedelta | str | None = None,
        paused: bool = False,
        note: str = "",
        task_queue: str | None = None,
    ) -> ScheduleInfo:
        """A schedule running ``spec`` (a JobSpec, a mapping or a spec file) on cron
        expressions or every ``every`` — one of the two."""
        check_name(name)
        crons = [cron] if isinstance(cron, str) else list(cron or [])
        if not all(isinstance(c, str) and c.strip() for c in crons):
            raise input_error("cron", "must be cron expressions such as '0 3 * * *'", "schedule")
        if not crons and every is None:
            raise input_error("schedule", "give --cron EXPR or --every DURATION", "schedule")
        if crons and every is not None:
            # Temporal would run on the union of both: say which one is meant instead.
            raise input_error("schedule", "give --cron or --every, not both", "schedule")
        every = _duration("every", every)
        catchup_window = _duration("catchup_window", catchup_window)
        jitter = _duration("jitter", jitter)
        if every is not None and every < timedelta(seconds=1):
            raise input_error("every", "must be at least 1s", "schedule")
        if overlap not in OVERLAP:
            raise input_error("overlap", "must be one of " + ", ".join(OVERLAP), "schedule")
        spec = load_job_spec(spec)
        output = spec.output
        if output.promote != "none" and output.model_id and not is_template(output.model_id):
            # Every run after the first would find the model taken (or claimed) and fail.
            raise input_error(
                "output.model_id",
                f"{output.model_id!r} is the same for every run: template it with the run's "
                f"time, e.g. {output.model_id}-{{scheduled_time:%Y%m%d-%H%M}}, or set "
                "output.promote: none",
                "schedule",
            )
        template = prepare_template(spec, name)
        # Each run claims its model id itself, once its templates are filled, and only after
        # checking no other live job holds it; a claim set at start (a fixed id) would make two
        # runs starting together (a backfill, allow_all) refuse each other.
        attrs = job_search_attributes(template, SearchAttributePair(sa.SCHEDULE, name), claim=False)
        action = ScheduleActionStartWorkflow(
            WORKFLOW_TYPE,
            JobInput(spec=template, templated=True),
            id=f"job-{template.name}",  # Temporal appends each run's scheduled time
            task_queue=task_queue or template.scheduling.task_queue or self.task_queue,
            typed_search_attributes=attrs,
            static_summary=f"scheduled by {name}: " + static_summary(template),
        )
        schedule = Schedule(
            action=action,
            spec=ScheduleSpec(
                cron_expressions=crons,
                intervals=[ScheduleIntervalSpec(every=every)] if every else [],
                jitter=jitter,
            ),
            policy=SchedulePolicy(
                overlap=OVERLAP[overlap], catchup_window=catchup_window or timedelta(minutes=1)
            ),
            state=ScheduleState(
                paused=paused,
                note=note or f"created by shepherd: {_describe_spec(crons, every)}",
            ),
        )
        try:
            await self.client.create_schedule(
                schedule_id(name),
                schedule,
                memo={"spec": _describe_spec(crons, every)},
            )
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
        desc = await self._existing(name, self.handle(name).describe())
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
        try:
            memo = await desc.memo()
        except Exception:  # a memo written by another tool: describe the calendar instead
            memo = {}
        return ScheduleInfo(
            name=name,
            schedule_id=desc.id,
            job=job,
            spec=_spec_text(desc.schedule.spec, memo),
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
        return outcome.shown_phase(d.typed_search_attributes.get(sa.PHASE), d.status) or (
            d.status.name if d.status else None
        )

    @staticmethod
    async def _existing(name: str, call: Awaitable[T]) -> T:
        """``call``'s result; a missing schedule is ``KeyError("no schedule 'x'")``, not the
        server's "workflow not found for ID: temporal-sys-scheduler:..."."""
        try:
            return await call
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise KeyError(f"no schedule {name!r}") from None
            raise

    async def pause(self, name: str, note: str = "") -> None:
        await self._existing(name, self.handle(name).pause(note=note or "paused by shepherd"))

    async def unpause(self, name: str, note: str = "") -> None:
        await self._existing(name, self.handle(name).unpause(note=note or "unpaused by shepherd"))

    async def trigger(self, name: str, overlap: Overlap | None = None) -> TriggerResult:
        """Start a run now. Temporal accepts a trigger and then applies the overlap policy,
        so the answer says what became of it: started (the run's workflow id), or
        skipped / waiting because a run is still live (the policy's word)."""
        if overlap is not None and overlap not in OVERLAP:
            raise input_error("overlap", "must be one of " + ", ".join(OVERLAP), "schedule")
        handle = self.handle(name)
        described = await self._existing(name, handle.describe())
        before, buffered = described.info, described.raw_description.info.buffer_size
        policy = OVERLAP[overlap] if overlap else None
        await self._existing(name, handle.trigger(overlap=policy))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TRIGGER_SETTLE.total_seconds()
        while True:
            desc = await self._existing(name, handle.describe())
            info = desc.info
            if info.num_actions > before.num_actions:
                started = info.recent_actions[-1] if info.recent_actions else None
                return TriggerResult(
                    outcome="started",
                    workflow_id=getattr(started.action, "workflow_id", None) if started else None,
                )
            live = ", ".join(getattr(r, "workflow_id", "?") for r in info.running_actions)
            chosen = (policy or desc.schedule.policy.overlap).name.lower()
            if info.num_actions_skipped_overlap > before.num_actions_skipped_overlap:
                return TriggerResult(
                    outcome="skipped",
                    detail=f"the overlap policy is {chosen} and {live or 'a run'} is still live",
                )
            if desc.raw_description.info.buffer_size > buffered:
                return TriggerResult(
                    outcome="waiting",
                    detail=f"it starts when {live or 'the live run'} has ended (overlap "
                    f"policy {chosen})",
                )
            if loop.time() >= deadline:
                # Temporal names a run by its start second: a start in the same second as
                # another run of this schedule is dropped without a word.
                return TriggerResult(
                    outcome="dropped",
                    detail=f"no run started within {TRIGGER_SETTLE.total_seconds():.0f}s; a "
                    "run of this schedule that started in the same second takes its id: "
                    "trigger again",
                )
            await asyncio.sleep(0.2)

    async def backfill(
        self, name: str, start: datetime, end: datetime, overlap: Overlap = "allow_all"
    ) -> None:
        """Run every action the schedule would have taken in [start, end) (also while paused)."""
        if end <= start:
            raise input_error("backfill", "TO must be after FROM", "backfill")
        await self._existing(
            name,
            self.handle(name).backfill(
                ScheduleBackfill(start_at=start, end_at=end, overlap=OVERLAP[overlap])
            ),
        )

    async def delete(self, name: str) -> None:
        """Delete the schedule; a missing one raises ``KeyError("no schedule 'x'")``."""
        await self._existing(name, self.handle(name).delete())


def parse_time(value: str | datetime) -> datetime:
    """ISO 8601 (``2026-11-20T00:00:00Z``, ``2026-11-20``); naive times are UTC."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    text = value.strip().replace("Z", "+00:00")
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
