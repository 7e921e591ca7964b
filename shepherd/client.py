"""The Python API: submit, find, watch and steer training jobs.

    from shepherd import Shepherd

    sh = await Shepherd.connect()                     # TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE
    job = await sh.submit("examples/quickstart.yaml", overrides=["training.total_steps=100"])
    async for status in job.watch():
        print(status.phase, status.step, status.last_loss)
    final = await job.wait()

Every method returns typed models (:class:`~shepherd.models.JobStatus` ...). A spec is
validated before anything is started: an invalid one raises :class:`~shepherd.spec.SpecError`
listing every problem with its field.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import math
import re
import secrets
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from pydantic import BaseModel, Field
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from shepherd import outcome, preflight
from shepherd import search_attributes as sa
from shepherd.jobs import (
    WORKFLOW_TYPE,
    JobPlan,
    check_workers,
    check_workflow_id,
    plan_job,
    start_job,
)
from shepherd.models import (
    CheckpointRecord,
    JobStatus,
    ModelInfo,
    PauseRequest,
    PauseResult,
    ResumeRequest,
)
from shepherd.phases import Phase
from shepherd.preflight import SubmissionRefused
from shepherd.schedules import Schedules
from shepherd.scheduling import (
    SCHEDULER_TYPE,
    Capacity,
    Placement,
    QueueConfig,
    SchedulerState,
    scheduler_id,
)
from shepherd.spec import (
    JOB_NAME,
    QUEUE_NAME,
    JobSpec,
    SpecError,
    input_error,
    label_problem,
    load_job_spec,
)
from shepherd.spec import apply_overrides as apply_overrides  # shepherd.client's API too
from shepherd.sweep import SweepInput, SweepSpec, SweepStatus, load_sweep, validate_sweep
from shepherd.temporal import TemporalSettings, connect

T = TypeVar("T")
P = ParamSpec("P")
S = TypeVar("S")

#: A worker answers a status query in milliseconds (a closed job's, after replaying its
#: history, in a second or two); a query no worker takes (nothing polls the job's task
#: queue) would wait for ever. Past this, the status is read from the search attributes.
STATUS_QUERY_TIMEOUT = timedelta(seconds=10)
#: A backend's scheduler answers from memory; one no worker serves would wait for ever.
SCHEDULER_QUERY_TIMEOUT = timedelta(seconds=5)


class JobFailed(Exception):
    """The job ended FAILED, PREEMPTED or CANCELLED; ``status`` says how and why."""

    def __init__(self, status: JobStatus) -> None:
        error = f": {status.error.type}: {status.error.message}" if status.error else ""
        super().__init__(f"job {status.workflow_id} ended {status.phase.value}{error}")
        self.status = status


class JobEnded(Exception):
    """The job (or sweep) had already ended: there is nothing to cancel (pause, resume)."""

    def __init__(self, workflow_id: str, outcome: str, action: str = "cancel") -> None:
        super().__init__(f"{workflow_id} had already ended ({outcome}); nothing to {action}")
        self.workflow_id = workflow_id
        self.outcome = outcome
        self.action = action


class JobNotFound(LookupError):
    """No job (or sweep) has this workflow id in the namespace (the CLI's exit code 4)."""

    def __init__(self, workflow_id: str, namespace: str | None = None) -> None:
        where = f" in namespace {namespace!r}" if namespace else ""
        super().__init__(f"not found: no job or sweep {workflow_id!r}{where}")
        self.workflow_id = workflow_id
        self.namespace = namespace


class TemporalUnreachable(ConnectionError):
    """Temporal's frontend did not answer at ``address`` (the CLI's exit code 3)."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"cannot reach Temporal at {address} ({reason})")
        self.address = address
        self.reason = reason


def transport_reason(text: str) -> str:
    """What went wrong, in words, from the SDK's transport error (a Rust ``tonic`` error
    printed whole): ``tcp connect error: Connection refused``."""
    kind = re.search(r'ConnectError\("([^"]+)"', text)
    detail = re.search(r'(?:message|error): "([^"]+)"', text)
    said = [m[1] for m in (kind, detail) if m]
    if said:
        return ": ".join(said)
    return text.split("tonic::")[0].rstrip(" :(") or "no answer"


def _api_error(exc: Exception, sh: Shepherd, workflow_id: str | None) -> Exception:
    """An RPC error as the API's own (a missing workflow, an unreachable server); any
    other stays what it is."""
    if not isinstance(exc, RPCError):
        # A lazy client connects at its first call, and says so with a RuntimeError.
        if "client connect" in str(exc) or "tonic::transport" in str(exc):
            return TemporalUnreachable(sh.address, transport_reason(str(exc)))
        return exc
    if exc.status == RPCStatusCode.UNAVAILABLE:
        return TemporalUnreachable(sh.address, transport_reason(exc.message))
    if exc.status == RPCStatusCode.NOT_FOUND:
        if "namespace" in exc.message.lower():
            return input_error("namespace", exc.message, "argument")
        if workflow_id is not None:
            return JobNotFound(workflow_id, sh.client.namespace)
    return exc


def _api_error_of(target: Any, exc: Exception) -> Exception:
    """:func:`_api_error` for a call on ``target``: a job's or a sweep's handle (``id``,
    ``_sh``), or the connection itself."""
    return _api_error(exc, getattr(target, "_sh", target), getattr(target, "id", None))


def _translated(
    method: Callable[Concatenate[S, P], Awaitable[T]],
) -> Callable[Concatenate[S, P], Awaitable[T]]:
    """A call on a job, a sweep or the connection that raises the API's errors, not the
    SDK's RPC errors."""

    @functools.wraps(method)
    async def call(self: S, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await method(self, *args, **kwargs)
        except (RPCError, RuntimeError) as exc:
            error = _api_error_of(self, exc)
            if error is exc:
                raise
            raise error from None

    return call


def _translated_iter(
    method: Callable[Concatenate[S, P], AsyncIterator[T]],
) -> Callable[Concatenate[S, P], AsyncIterator[T]]:
    """:func:`_translated` for a method that yields."""

    @functools.wraps(method)
    async def call(self: S, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[T]:
        inner = method(self, *args, **kwargs)
        try:
            async for item in inner:
                yield item
        except (RPCError, RuntimeError) as exc:
            error = _api_error_of(self, exc)
            if error is exc:
                raise
            raise error from None
        finally:
            # A caller that stops early closes this one; the method's own cleanup runs now.
            if isinstance(inner, AsyncGenerator):
                await inner.aclose()

    return call


def _interval(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise input_error("interval", "must be a positive number of seconds", "argument")
    if not math.isfinite(value):
        raise input_error("interval", "must be a finite number of seconds", "argument")
    return float(value)


def _task_queue(value: Any) -> str | None:
    """A task queue argument: None (the spec's, else the connection's), or a name."""
    if value is None:
        return None
    if not isinstance(value, str) or not QUEUE_NAME.match(value):
        raise input_error(
            "task_queue",
            "must be a task queue name: 1-200 characters of letters, digits, '.', '_', ':', "
            "'/' and '-' (or None: the spec's scheduling.task_queue, else the connection's)",
            "argument",
        )
    return value


def _rerun(value: Any) -> None:
    if not isinstance(value, bool):
        raise input_error("rerun", "must be True or False", "argument")


#: ``host:port`` (a name, an IPv4 address or a bracketed IPv6 one).
_ADDRESS = re.compile(r"\A(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):[0-9]{1,5}\Z")
#: Temporal's namespace names.
_NAMESPACE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{1,254}\Z")


def own_checkpoint(
    workflow_id: str, status: JobStatus, spec: JobSpec | None, name: str, field: str
) -> str:
    """``name`` (a full name, or a short one such as ``step-00000040``) as the full name of
    one of this job's checkpoints: the ones it keeps, the one a pause saved, the one it
    started from. Anything else is refused: resuming from another job's weights (or
    account's) would silently make this job that one."""
    known = [c.name for c in status.checkpoints]
    known += [n for n in (status.paused_checkpoint, spec and spec.training.resume_from) if n]
    if name in known:
        return name
    by_short = {n.rsplit("/", 1)[-1]: n for n in known}
    if name in by_short:
        return by_short[name]
    shorts = ", ".join(sorted(by_short)) or "none yet"
    raise input_error(
        field,
        f"{name[:200]!r} is not a checkpoint of {workflow_id} (its checkpoints: {shorts})",
        "argument",
    )


async def _ended(handle: WorkflowHandle[Any, Any]) -> str | None:
    """How the workflow ended (by Temporal's outcome of the run, see shepherd.outcome), or
    None while running. Temporal accepts a cancel request for a closed workflow silently,
    so ask first."""
    desc = await handle.describe()
    if desc.status == WorkflowExecutionStatus.RUNNING:
        return None
    return outcome.ended_label(desc.typed_search_attributes.get(sa.PHASE), desc.status)


def _looked_up(workflow_id: Any) -> str:
    """A workflow id to look up: any id Temporal may hold, but not empty, not blank and on
    one line (the server's answer to those names its own request fields)."""
    if not isinstance(workflow_id, str) or not workflow_id.strip() or not workflow_id.isprintable():
        raise input_error("workflow_id", "must be a workflow id (not empty, one line)", "argument")
    return workflow_id


def _require_job(workflow_id: str, workflow_type: str | None) -> None:
    if workflow_type == WORKFLOW_TYPE:
        return
    if workflow_type == "Sweep":
        what = f"a sweep, not a job; see `shepherd sweep status {workflow_id}`"
    else:
        what = f"a {workflow_type} workflow, not a Shepherd job"
    raise input_error("workflow_id", f"{workflow_id!r} is {what}", "argument")


def _from_visibility(workflow_id: str, desc: Any, why: BaseException) -> JobStatus:
    """What visibility alone tells of a job whose workflow cannot answer a query (no
    worker polls its task queue, or its history no longer replays)."""
    attrs = desc.typed_search_attributes
    labels = dict(kv.split("=", 1) for kv in (attrs.get(sa.LABELS) or []) if "=" in kv)
    reason = (getattr(why, "message", None) or str(why)).splitlines()[0][:300]
    if "TMPRL1100" in reason or "ondeterminism" in reason:
        notice = (
            "live status unavailable: the job's history does not replay against the code "
            f"the workers run (a bug, or an incompatible version): {reason}; shown from the "
            "search attributes"
        )
    else:
        notice = (
            f"no worker answered the status query ({reason}); shown from the search "
            f"attributes (is a worker polling task queue {desc.task_queue!r}?)"
        )
    model = attrs.get(sa.MODEL)
    return JobStatus(
        workflow_id=workflow_id,
        name=attrs.get(sa.JOB_NAME) or "",
        labels=labels,
        phase=Phase(attrs.get(sa.PHASE) or Phase.PENDING.value),
        trainer_job_id=attrs.get(sa.TRAINER_JOB_ID),
        step=attrs.get(sa.STEP) or 0,
        started_at=desc.start_time,
        updated_at=desc.close_time or desc.start_time,
        cleanup="unknown",
        model=ModelInfo(name=model, state="READY") if model else None,
        notices=[notice],
    )


#: A waiting job's start is estimated from at most this many running jobs (one query each).
MAX_ESTIMATED_HOLDERS = 32


def starts_in(remaining: list[float | None], *, ahead: int) -> float | None:
    """When a job with ``ahead`` jobs before it should be admitted: as the running jobs end
    (their ``remaining`` seconds), each slot freed goes to the next in line, so it is the
    (ahead+1)-th soonest end. None where a running job cannot tell, or more jobs are ahead
    than run now (their own runs would have to be guessed)."""
    if ahead >= len(remaining) or any(r is None for r in remaining):
        return None
    return sorted(r for r in remaining if r is not None)[ahead]


class JobSummary(BaseModel):
    """One line of a job list (from Temporal visibility, no worker needed)."""

    workflow_id: str
    run_id: str | None = None
    name: str | None = None
    phase: str | None = None
    execution_status: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    trainer_job_id: str | None = None
    step: int | None = None
    model: str | None = None
    start_time: datetime | None = None
    close_time: datetime | None = None
    #: A job waiting for admission: its place and what it waits for.
    placement: Placement | None = None

    @classmethod
    def from_execution(cls, ex: WorkflowExecution) -> JobSummary:
        attrs = ex.typed_search_attributes
        labels = dict(kv.split("=", 1) for kv in (attrs.get(sa.LABELS) or []) if "=" in kv)
        return cls(
            workflow_id=ex.id,
            run_id=ex.run_id,
            name=attrs.get(sa.JOB_NAME),
            # A closed run shows how it really ended, not the last phase it published.
            phase=outcome.shown_phase(attrs.get(sa.PHASE), ex.status),
            execution_status=ex.status.name if ex.status else None,
            labels=labels,
            trainer_job_id=attrs.get(sa.TRAINER_JOB_ID),
            step=attrs.get(sa.STEP),
            model=attrs.get(sa.MODEL),
            start_time=ex.start_time,
            close_time=ex.close_time,
        )


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def list_query(
    *,
    labels: Mapping[str, str] | None = None,
    phase: Phase | str | None = None,
    name: str | None = None,
) -> str:
    """A visibility query over Shepherd's search attributes (also usable in the Web UI). A
    job is listed once, as its latest run: the runs it continued-as-new from are not jobs."""
    clauses = ['WorkflowType = "TrainingJob"', 'ExecutionStatus != "ContinuedAsNew"']
    for key, value in sorted((labels or {}).items()):
        if not isinstance(key, str) or not isinstance(value, str):
            raise input_error("labels", "keys and values must be strings", "argument")
        if problem := label_problem(key, value):
            raise input_error("labels", problem, "argument")
        clauses.append(f"{sa.LABELS.name} = {_quote(f'{key}={value}')}")
    if phase is not None and (not isinstance(phase, str) or phase.upper() not in Phase.__members__):
        raise input_error("phase", f"must be one of {', '.join(Phase.__members__)}", "argument")
    if name is not None and (not isinstance(name, str) or not JOB_NAME.match(name)):
        raise input_error(
            "name", "must be a job name: 1-40 characters of a-z, 0-9 and '-'", "argument"
        )
    if phase is not None:
        clauses.append(outcome.phase_query(Phase(phase.upper())))
    if name is not None:
        clauses.append(f"{sa.JOB_NAME.name} = {_quote(name)}")
    return " AND ".join(clauses)


def load_sweep_spec(
    sweep: SweepSpec | Mapping[str, Any] | str | Path, overrides: list[str] | None = None
) -> SweepSpec:
    """A validated sweep from a model, a mapping or a YAML/JSON path; ``overrides`` apply to
    its base job spec."""
    if isinstance(sweep, str | Path):
        return load_sweep(sweep, overrides=overrides)
    if isinstance(sweep, SweepSpec):
        return sweep
    if isinstance(sweep, Mapping):
        return validate_sweep(copy.deepcopy(dict(sweep)), overrides=overrides)
    raise input_error(
        "sweep",
        "must be a SweepSpec, a mapping or the path of a YAML/JSON file, "
        f"not {type(sweep).__name__}",
        "argument",
    )


class JobHandle:
    """One job (a lifecycle workflow), found by its workflow id."""

    def __init__(self, shepherd: Shepherd, workflow_id: str, run_id: str | None = None) -> None:
        self._sh = shepherd
        self.id = workflow_id
        self._handle: WorkflowHandle[Any, JobStatus] = shepherd.client.get_workflow_handle(
            workflow_id, result_type=JobStatus
        )

    def __repr__(self) -> str:
        return f"JobHandle({self.id!r})"

    @_translated
    async def status(self) -> JobStatus:
        """The job's status as the workflow published it, corrected by how Temporal says
        the run ended (a terminated run shows TERMINATED, never its last live phase)."""
        desc = await self._handle.describe()
        _require_job(self.id, desc.workflow_type)
        try:
            status = await self._handle.query(
                "status", result_type=JobStatus, rpc_timeout=STATUS_QUERY_TIMEOUT
            )
        except (WorkflowQueryFailedError, RPCError) as exc:
            if isinstance(exc, RPCError) and exc.status == RPCStatusCode.NOT_FOUND:
                raise
            status = _from_visibility(self.id, desc, exc)
        failure = None
        closed = desc.status not in (None, WorkflowExecutionStatus.RUNNING)
        if closed:
            failure = await outcome.closing_failure(self._handle)
        status = outcome.reconcile(status, desc.status, failure)
        if closed and status.cleanup != "done" and status.trainer_job_id:
            await self._after_the_end(status, desc.close_time)
        if status.admission and not closed:
            status.placement = await self._placement(status)
        if not closed:
            status.retrying = retrying(desc.raw_description.pending_activities)
        return status

    async def _placement(self, status: JobStatus) -> Placement | None:
        """Where a job waiting for admission stands, as its backend's scheduler says, and
        when it should start (:func:`starts_in`)."""
        handle = self._sh.client.get_workflow_handle(scheduler_id(status.backend))
        try:
            said = await handle.query("where", self.id, rpc_timeout=STATUS_QUERY_TIMEOUT)
            if said is None:
                return None
            place = Placement.model_validate(said)
            # (The running jobs only: the whole line may be thousands.)
            state = await handle.query(
                "summary", 0, result_type=SchedulerState, rpc_timeout=STATUS_QUERY_TIMEOUT
            )
        except (WorkflowQueryFailedError, RPCError):
            return None  # best effort: the job's own status says it waits

        async def remaining(job: str) -> float | None:
            try:
                held = await self._sh.client.get_workflow_handle(job).query(
                    "status", result_type=JobStatus, rpc_timeout=STATUS_QUERY_TIMEOUT
                )
            except (WorkflowQueryFailedError, RPCError):
                return None
            return held.remaining_s()

        holders = list(state.holders)[:MAX_ESTIMATED_HOLDERS]
        left = list(await asyncio.gather(*(remaining(job) for job in holders)))
        place.starts_in_s = starts_in(left, ahead=place.position - 1)
        return place

    async def _after_the_end(self, status: JobStatus, closed_at: datetime | None) -> None:
        """A job that ended without deleting its trainer: what the platform state it last
        saw is worth now, and whether the reaper has deleted the trainer since."""
        from shepherd import reaper

        assert status.trainer_job_id is not None
        reaped = await reaper.deleted_by_reaper(
            self._sh.client, self.id, status.trainer_job_id, closed_at=closed_at
        )
        if reaped is None:
            if status.platform_state:
                # The job's last word on its trainer, not the trainer's state now.
                seen = f"{status.platform_message} " if status.platform_message else ""
                status.platform_message = f"{seen}(last seen before the job ended)"
            return
        when = reaped.at.isoformat(timespec="seconds") if reaped.at else "?"
        status.platform_state = "JOB_STATE_DELETED"
        status.platform_message = f"deleted by the reaper at {when}"
        status.cleanup = (
            f"done by the reaper: trainer {status.trainer_job_id} deleted at {when} "
            f"({reaped.trainer.reason}; pass {reaped.pass_id})"
        )

    async def _live_step(self) -> int:
        """The last step a running chunk (or program) reported in its heartbeat (0: none)."""
        try:
            desc = await self._handle.describe()
            for pending in desc.raw_description.pending_activities:
                if pending.activity_type.name not in ("train_chunk", "run_program"):
                    continue
                payloads = pending.heartbeat_details.payloads
                if payloads:
                    (beat,) = await self._sh.client.data_converter.decode(payloads[:1])
                    if isinstance(beat, dict) and isinstance(beat.get("step"), int):
                        return int(beat["step"])
        except RPCError:
            pass  # best effort: the chunk's end brings the step anyway
        return 0

    @_translated
    async def spec(self) -> JobSpec:
        return await self._handle.query("spec", result_type=JobSpec)

    @_translated
    async def wait(self, *, raise_on_failure: bool = True) -> JobStatus:
        """The final status. A job that did not complete raises :class:`JobFailed` (or, with
        ``raise_on_failure=False``, returns its final status)."""
        try:
            return await self._handle.result()
        except WorkflowFailureError:
            status = await self.status()
            if raise_on_failure:
                raise JobFailed(status) from None
            return status

    @_translated_iter
    async def watch(self, *, interval: float = 0.5) -> AsyncIterator[JobStatus]:
        """Each change of the status (phase, step, platform state, recoveries ...), until the
        job ends; the last one yielded is the final status."""
        import asyncio

        interval = _interval(interval)
        result = asyncio.ensure_future(self._handle.result())
        last: tuple[Any, ...] | None = None
        try:
            while True:
                status = await self.status()
                if status.phase is Phase.TRAINING:
                    # The workflow counts steps when a chunk ends; the chunk's heartbeat
                    # counts every step, so progress moves within a chunk too.
                    status.step = max(status.step, await self._live_step())
                key = (
                    status.phase,
                    status.step,
                    status.total_steps,
                    status.metrics_step,
                    status.placement.position if status.placement else None,
                    status.platform_state,
                    len(status.recoveries),
                    status.paused_checkpoint,
                    status.model,
                )
                if key != last:
                    last = key
                    yield status
                if status.phase.is_terminal() or result.done():
                    final = await self.status()
                    if (final.phase, final.step) != key[:2]:
                        yield final
                    return
                await asyncio.wait({result}, timeout=interval)
        finally:
            result.cancel()

    async def _live_job(self, action: str) -> None:
        """Refuse ``action`` on a workflow that is not a job, or a job that has ended."""
        desc = await self._handle.describe()
        _require_job(self.id, desc.workflow_type)
        if desc.status != WorkflowExecutionStatus.RUNNING:
            label = outcome.ended_label(desc.typed_search_attributes.get(sa.PHASE), desc.status)
            raise JobEnded(self.id, label, action)

    async def _update(self, action: str, name: str, arg: Any, result_type: type[T]) -> T:
        await self._live_job(action)
        try:
            return await self._handle.execute_update(name, arg, result_type=result_type)
        except RPCError as exc:
            # It ended meanwhile ("workflow execution already completed").
            if exc.status == RPCStatusCode.NOT_FOUND and (ended := await _ended(self._handle)):
                raise JobEnded(self.id, ended, action) from None
            raise

    @_translated
    async def pause(self, reason: str = "") -> PauseResult:
        """Checkpoint, give the trainer back, wait. Returns the checkpoint saved."""
        return await self._update(
            "pause", "request_pause", PauseRequest(reason=reason), PauseResult
        )

    @_translated
    async def resume(self, checkpoint: str | None = None) -> JobStatus:
        """A new trainer, loaded from ``checkpoint`` (default: the one saved at pause): one
        of this job's checkpoints, by full or short name (``step-00000040``)."""
        if checkpoint is not None:
            if not isinstance(checkpoint, str):
                raise input_error("checkpoint", "must be a checkpoint name", "argument")
            status, spec = await self.status(), await self.spec()
            checkpoint = own_checkpoint(self.id, status, spec, checkpoint, "checkpoint")
        return await self._update(
            "resume", "request_resume", ResumeRequest(checkpoint=checkpoint), JobStatus
        )

    @_translated
    async def cancel(self, reason: str = "") -> None:
        """Cancel; the trainer is still deleted and checkpoints are kept. A job that has
        already ended raises :class:`JobEnded`."""
        if outcome := await _ended(self._handle):
            raise JobEnded(self.id, outcome)
        await self._handle.cancel(reason=reason)

    @_translated
    async def checkpoints(self) -> list[CheckpointRecord]:
        return list((await self.status()).checkpoints)

    @_translated
    async def retry(
        self,
        *,
        from_checkpoint: str | None = None,
        overrides: list[str] | Mapping[str, Any] | None = None,
        workflow_id: str | None = None,
    ) -> JobHandle:
        """A new job from a checkpoint of this one (default: its best, else its last), with
        changed resources (``overrides``), linked to this job as its parent.

        A program's job is retried from the program's own checkpoints instead: the new job
        starts the program in a copy of this job's log directory (a program that resumes
        from there goes on from its last checkpoint; one that does not starts over)."""
        status, spec = await self.status(), await self.spec()
        if spec.training.program is not None:
            if from_checkpoint is not None:
                raise input_error(
                    "from_checkpoint",
                    "is for a loop's job; a program resumes from its own checkpoints (the "
                    "retry starts it in a copy of this job's log directory)",
                    "argument",
                )
            new_spec = load_job_spec(spec.model_dump(mode="json"), overrides)
            return await self._sh.submit(
                new_spec, workflow_id=workflow_id, parent_workflow_id=self.id
            )
        checkpoint = from_checkpoint
        if checkpoint is None:
            chosen = status.best or status.last_checkpoint
            checkpoint = chosen.name if chosen else None
        if checkpoint is not None:
            if not isinstance(checkpoint, str):
                raise input_error("from_checkpoint", "must be a checkpoint name", "argument")
            checkpoint = own_checkpoint(self.id, status, spec, checkpoint, "from_checkpoint")
        data = spec.model_dump(mode="json")
        data["training"]["resume_from"] = checkpoint
        new_spec = load_job_spec(data, overrides)
        return await self._sh.submit(new_spec, workflow_id=workflow_id, parent_workflow_id=self.id)

    @_translated
    async def describe(self) -> Any:
        return await self._handle.describe()


class SweepHandle:
    """One sweep (a parent workflow whose trials are job workflows)."""

    def __init__(self, shepherd: Shepherd, workflow_id: str) -> None:
        self._sh = shepherd
        self.id = workflow_id
        self._handle: WorkflowHandle[Any, SweepStatus] = shepherd.client.get_workflow_handle(
            workflow_id, result_type=SweepStatus
        )

    def __repr__(self) -> str:
        return f"SweepHandle({self.id!r})"

    @_translated
    async def status(self) -> SweepStatus:
        """The sweep's status. A sweep that failed (or was terminated or timed out) says so
        with the reason, even where its last recorded state still read RUNNING."""
        desc = await self._handle.describe()
        if desc.workflow_type != "Sweep":
            what = "a job" if desc.workflow_type == WORKFLOW_TYPE else f"a {desc.workflow_type}"
            raise input_error(
                "workflow_id", f"{self.id!r} is {what} workflow, not a sweep", "argument"
            )
        status = await self._handle.query("status", result_type=SweepStatus)
        if status.phase != "RUNNING":
            return status
        if desc.status in (None, WorkflowExecutionStatus.RUNNING):
            return status
        if desc.status == WorkflowExecutionStatus.COMPLETED:
            return status
        status.phase = {
            WorkflowExecutionStatus.CANCELED: "CANCELLED",
        }.get(desc.status, "FAILED")
        if status.error is None:
            status.error = await self._failure(desc.status)
        return status

    async def _failure(self, ended: WorkflowExecutionStatus) -> str:
        try:
            await self._handle.result()
        except WorkflowFailureError as exc:
            cause: BaseException = exc
            # The reason is at the end of the chain (an activity's own error, not
            # "ActivityError: Activity task failed").
            while (inner := getattr(cause, "cause", None) or cause.__cause__) is not None:
                cause = inner
            kind = getattr(cause, "type", None) or type(cause).__name__
            message = getattr(cause, "message", None) or str(cause)
            return f"{kind}: {message}" if message else kind
        return ended.name

    @_translated
    async def wait(self) -> SweepStatus:
        try:
            return await self._handle.result()
        except WorkflowFailureError:
            return await self.status()

    @_translated_iter
    async def watch(self, *, interval: float = 1.0) -> AsyncIterator[SweepStatus]:
        import asyncio

        interval = _interval(interval)
        result = asyncio.ensure_future(self._handle.result())
        last = None
        try:
            while True:
                status = await self.status()
                key = status.model_dump_json()
                if key != last:
                    last = key
                    yield status
                if result.done():
                    final = await self.status()
                    if final.model_dump_json() != last:
                        yield final
                    return
                await asyncio.wait({result}, timeout=interval)
        finally:
            result.cancel()

    @_translated
    async def cancel(self, reason: str = "") -> None:
        """Cancel the sweep: every running trial is cancelled and cleans its trainer up. A
        sweep that has already ended raises :class:`JobEnded`."""
        if outcome := await _ended(self._handle):
            raise JobEnded(self.id, outcome)
        await self._handle.cancel(reason=reason)

    def trial(self, index: int) -> JobHandle:
        return JobHandle(self._sh, f"{self.id}-t{index}")


class Shepherd:
    """Connection to Shepherd (a Temporal namespace and the workers' task queue)."""

    def __init__(self, client: Client, *, task_queue: str) -> None:
        self.client = client
        self.task_queue = task_queue
        self.schedules = Schedules(client, task_queue)

    @property
    def address(self) -> str:
        """The Temporal frontend this connection talks to (``host:port``)."""
        return str(self.client.service_client.config.target_host)

    @_translated
    async def submit_sweep(
        self,
        sweep: SweepSpec | Mapping[str, Any] | str | Path,
        *,
        overrides: list[str] | None = None,
        workflow_id: str | None = None,
        task_queue: str | None = None,
        rerun: bool = False,
    ) -> SweepHandle:
        """Validate and start a sweep (``sweep-<name>-<suffix>`` unless given). Its
        ``promote_best.model_id`` is claimed like a job's output model id."""
        spec = load_sweep_spec(sweep, overrides)
        _rerun(rerun)
        if workflow_id is not None:
            check_workflow_id(workflow_id)
        elif rerun:
            raise input_error("rerun", "a re-run needs the workflow id to run again", "argument")
        queue = _task_queue(task_queue) or spec.base.scheduling.task_queue or self.task_queue
        await check_workers(self.client, spec.base, queue, "base.")
        model_id = spec.promote_best.model_id if spec.promote_best else None
        claim = [SearchAttributePair(sa.OUTPUT_MODEL, model_id)] if model_id else []
        handle = await preflight.start_guarded(
            self.client,
            "Sweep",
            SweepInput(sweep=spec),
            workflow_id=workflow_id or f"sweep-{spec.name}-{secrets.token_hex(3)}",
            task_queue=queue,
            rerun=rerun,
            model_id=model_id,
            model_field="promote_best.model_id",
            result_type=SweepStatus,
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(sa.JOB_NAME, spec.name),
                    SearchAttributePair(sa.LABELS, spec.base.label_keywords()),
                    *claim,
                ]
            ),
            static_summary=f"sweep {spec.name}: {spec.method} over {', '.join(sorted(spec.parameters))}, "
            f"{spec.max_trials} trials x{spec.parallelism}, {spec.goal} {spec.metric}",
        )
        return SweepHandle(self, handle.id)

    def get_sweep(self, workflow_id: str) -> SweepHandle:
        return SweepHandle(self, _looked_up(workflow_id))

    @classmethod
    async def connect(
        cls,
        address: str | None = None,
        namespace: str | None = None,
        *,
        task_queue: str | None = None,
        api_key: str | None = None,
        tls: bool | None = None,
    ) -> Shepherd:
        """Arguments win over the environment (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``,
        ``TEMPORAL_API_KEY``, ``TEMPORAL_TLS*``, ``SHEPHERD_TASK_QUEUE``); None means "from
        the environment". A server that does not answer raises :class:`TemporalUnreachable`."""
        updates: dict[str, Any] = {}
        if address is not None:
            if not isinstance(address, str) or not _ADDRESS.match(address):
                raise input_error("address", "must be host:port, e.g. localhost:7233", "argument")
            updates["address"] = address
        if namespace is not None:
            if not isinstance(namespace, str) or not _NAMESPACE.match(namespace):
                raise input_error(
                    "namespace",
                    "must be a namespace name: 2-255 characters of letters, digits, '.', '_' "
                    "and '-'",
                    "argument",
                )
            updates["namespace"] = namespace
        if (queue := _task_queue(task_queue)) is not None:
            updates["task_queue"] = queue
        if api_key:
            updates["api_key"] = api_key
        if tls is not None:
            updates["tls"] = tls
        settings = TemporalSettings().model_copy(update=updates)
        try:
            client = await connect(settings)
        except RuntimeError as exc:
            # The SDK says it as a Rust transport error ("tonic::transport::Error(...)").
            raise TemporalUnreachable(settings.address, transport_reason(str(exc))) from None
        return cls(client, task_queue=settings.task_queue)

    @_translated
    async def submit(
        self,
        spec: JobSpec | Mapping[str, Any] | str | Path,
        *,
        overrides: list[str] | Mapping[str, Any] | None = None,
        workflow_id: str | None = None,
        task_queue: str | None = None,
        parent_workflow_id: str | None = None,
        rerun: bool = False,
    ) -> JobHandle:
        """Validate and start a job; its workflow id is ``job-<name>-<suffix>`` unless given.

        Refused with :class:`~shepherd.spec.SpecError` (bad spec or arguments) or
        :class:`~shepherd.preflight.SubmissionRefused`: ``workflow_id`` is a live job, or
        a job that ended and ``rerun`` is not set; the output model id is claimed by another
        live job; no worker serves the backend."""
        job_spec, queue = self._job_args(spec, overrides, workflow_id, task_queue, rerun)
        if parent_workflow_id is not None:
            await self._check_parent(parent_workflow_id)
        handle = await start_job(
            self.client,
            job_spec,
            task_queue=queue,
            workflow_id=workflow_id,
            parent_workflow_id=parent_workflow_id,
            rerun=rerun,
        )
        return JobHandle(self, handle.id)

    @_translated
    async def plan(
        self,
        spec: JobSpec | Mapping[str, Any] | str | Path,
        *,
        overrides: list[str] | Mapping[str, Any] | None = None,
        workflow_id: str | None = None,
        task_queue: str | None = None,
        rerun: bool = False,
    ) -> JobPlan:
        """Everything :meth:`submit` checks, without starting anything (a dry run)."""
        job_spec, queue = self._job_args(spec, overrides, workflow_id, task_queue, rerun)
        return await plan_job(
            self.client, job_spec, task_queue=queue, workflow_id=workflow_id, rerun=rerun
        )

    def _job_args(
        self,
        spec: Any,
        overrides: Any,
        workflow_id: Any,
        task_queue: str | None,
        rerun: bool,
    ) -> tuple[JobSpec, str]:
        job_spec = load_job_spec(spec, overrides)
        queue = _task_queue(task_queue)
        _rerun(rerun)
        if workflow_id is not None:
            check_workflow_id(workflow_id)
        elif rerun:
            raise input_error("rerun", "a re-run needs the workflow id to run again", "argument")
        return job_spec, queue or job_spec.scheduling.task_queue or self.task_queue

    async def _check_parent(self, parent_workflow_id: Any) -> None:
        """The parent a job is linked to must be a job (``retry`` links to its own)."""
        field = "parent_workflow_id"
        if not isinstance(parent_workflow_id, str):
            raise input_error(field, "must be the workflow id of an existing job", "argument")
        try:
            check_workflow_id(parent_workflow_id)
        except SpecError as exc:
            raise input_error(field, exc.problems[0].rule, "argument") from None
        try:
            desc = await self.client.get_workflow_handle(parent_workflow_id).describe()
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND or "namespace" in exc.message.lower():
                raise
            raise input_error(
                field,
                f"{parent_workflow_id!r} is no job here: must be the workflow id of an "
                "existing job",
                "argument",
            ) from None
        if desc.workflow_type != WORKFLOW_TYPE:
            raise input_error(
                field,
                f"{parent_workflow_id!r} is a {desc.workflow_type} workflow: must be the "
                "workflow id of an existing job",
                "argument",
            )

    def get(self, workflow_id: str) -> JobHandle:
        return JobHandle(self, _looked_up(workflow_id))

    # ------------------------------------------------------------------ admission

    async def schedulers(self) -> list[SchedulerState]:
        """The state of every backend's scheduler (the backends that admit jobs) that a
        worker answers for. All are asked at once: a scheduler no worker serves any more (a
        backend taken out of the workers' profiles) costs one query timeout, not one each."""
        ids = await self._scheduler_ids()

        async def state(workflow_id: str) -> SchedulerState | None:
            try:
                return await self.client.get_workflow_handle(workflow_id).query(
                    "summary", result_type=SchedulerState, rpc_timeout=SCHEDULER_QUERY_TIMEOUT
                )
            except (WorkflowQueryFailedError, RPCError):
                return None  # closing, or no worker serves its backend: left out

        states = [s for s in await asyncio.gather(*(state(i) for i in ids)) if s is not None]
        return sorted(states, key=lambda s: s.backend)

    async def _scheduler_ids(self) -> list[str]:
        """The workflow ids of the backends' running schedulers."""
        query = f'WorkflowType = "{SCHEDULER_TYPE}" AND ExecutionStatus = "Running"'
        return [ex.id async for ex in self.client.list_workflows(query)]

    @_translated
    async def scheduler(self, backend: str) -> SchedulerState:
        """One backend's scheduler state."""
        try:
            return await self.client.get_workflow_handle(scheduler_id(backend)).query(
                "summary", result_type=SchedulerState, rpc_timeout=SCHEDULER_QUERY_TIMEOUT
            )
        except RPCError as exc:
            if exc.status == RPCStatusCode.DEADLINE_EXCEEDED:
                raise input_error(
                    "backend",
                    f"backend {backend!r}'s scheduler does not answer: no running worker has "
                    "its profile",
                    "argument",
                ) from None
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            raise input_error(
                "backend",
                f"no scheduler runs for backend {backend!r}: its profile declares no capacity "
                "(SHEPHERD_BACKEND_<NAME>_SLOTS), or no job of it has asked for a slot yet",
                "argument",
            ) from None

    async def _change_scheduler(self, backend: str, update: str, arg: Any) -> SchedulerState:
        await self.scheduler(backend)  # (a clear error where none runs)
        handle = self.client.get_workflow_handle(scheduler_id(backend))
        try:
            return await handle.execute_update(update, arg, result_type=SchedulerState)
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            raise input_error(
                "queue", getattr(cause, "message", None) or str(cause or exc), "argument"
            ) from None

    @_translated
    async def configure_queue(self, backend: str, queue: QueueConfig) -> SchedulerState:
        """Declare or change a queue of ``backend``'s (in effect at once)."""
        return await self._change_scheduler(backend, "configure", queue)

    @_translated
    async def remove_queue(self, backend: str, name: str) -> SchedulerState:
        return await self._change_scheduler(backend, "remove_queue", name)

    @_translated
    async def set_capacity(self, backend: str, capacity: Capacity) -> SchedulerState:
        """Change ``backend``'s capacity (fewer slots: nobody is stopped; admissions wait)."""
        return await self._change_scheduler(backend, "set_capacity", capacity)

    @_translated
    async def list(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        phase: Phase | str | None = None,
        name: str | None = None,
        query: str | None = None,
        limit: int = 100,
    ) -> list[JobSummary]:
        """Jobs by label, phase or name (Temporal visibility over the search attributes),
        newest first; at most ``limit`` of them."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise input_error("limit", "must be a whole number of jobs, at least 1", "argument")
        if query is not None and not isinstance(query, str):
            raise input_error("query", "must be a visibility query (a string)", "argument")
        q = list_query(labels=labels, phase=phase, name=name)
        if query:
            q = f"{q} AND ({query})"
        out = []
        try:
            async for ex in self.client.list_workflows(q, limit=limit):
                out.append(JobSummary.from_execution(ex))
        except RPCError as exc:
            if exc.status != RPCStatusCode.INVALID_ARGUMENT:
                raise
            raise input_error("query", f"the job query failed: {exc.message}", "argument") from None
        if queued := [row for row in out if row.phase == Phase.QUEUED.value]:
            # Where each job waiting for admission stands (its backend's scheduler says).
            lines = await self._scheduler_ids()

            async def where(row: JobSummary) -> None:
                for line in lines:
                    try:
                        said = await self.client.get_workflow_handle(line).query(
                            "where", row.workflow_id, rpc_timeout=SCHEDULER_QUERY_TIMEOUT
                        )
                    except (WorkflowQueryFailedError, RPCError):
                        continue
                    if said is not None:
                        row.placement = Placement.model_validate(said)
                        return

            await asyncio.gather(*(where(row) for row in queued))
        return out


def retrying(pending: Any) -> list[str]:
    """Each of a job's activities that failed and waits for its next attempt: which, how
    many times, the last error (its first line) and when it tries again."""
    out = []
    for p in pending:
        if p.attempt < 2 or not p.HasField("last_failure"):
            continue
        cause = (p.last_failure.message or "?").splitlines()[0]
        when = ""
        if p.HasField("next_attempt_schedule_time"):
            left = p.next_attempt_schedule_time.ToDatetime(tzinfo=UTC) - datetime.now(UTC)
            when = f"; next in {max(left.total_seconds(), 0):.0f}s"
        out.append(f"{p.activity_type.name} (attempt {p.attempt}{when}): {cause}"[:500])
    return out


__all__ = [
    "JobEnded",
    "JobFailed",
    "JobNotFound",
    "JobPlan",
    "SweepHandle",
    "JobHandle",
    "JobSummary",
    "Shepherd",
    "SpecError",
    "SubmissionRefused",
    "TemporalUnreachable",
    "WorkflowExecutionStatus",
]
