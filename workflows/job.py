"""``TrainingJob``: the whole life of one training job as one durable workflow.

The workflow keeps the job's state (:class:`~workflows.context.JobContext`), answers its
messages (queries, signals and updates: validate, record, wake — nothing else), and runs the
lifecycle, whose steps live each in a module named for it:

    admission (workflows/admission.py) → provision and come up (trainer.py) → train — a loop
    or a program (held.py: loop_training.py, program_training.py) — with recoveries and
    pauses as they come (recovery.py) → evaluate, promote, publish (finish.py) → and
    **always** delete the trainer, also on failure and cancellation.

Deterministic code only: no I/O, clocks or randomness here; every side effect is an activity
whose timeouts and retries are declared in ``workflows.policies``. How a change to this code
reaches jobs that run for days: docs/upgrades.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    import workflows.admission as admission
    import workflows.checkpointing as checkpointing
    import workflows.finish as finish
    import workflows.recovery as recovery
    import workflows.slot as slot
    import workflows.trainer as trainer
    import workflows.versions as versions
    from shepherd import search_attributes as sa
    from shepherd.models import (
        ErrorInfo,
        JobInput,
        JobStatus,
        PauseRequest,
        PauseResult,
        PlatformEvent,
        ProgramProgress,
        ProgramStarted,
        ResumeRequest,
    )
    from shepherd.phases import Phase
    from shepherd.platform import rules
    from shepherd.scheduling import MakeWay, PlaceNotice, SlotGrant
    from shepherd.spec import JobSpec
    from shepherd.trainer_ids import trainer_prefix
    from workflows.context import JobContext, root_cause
    from workflows.flow import BadSignal, Lost, PauseNow, Terminal, required
    from workflows.held import TrainerWork
    from workflows.loop_training import LoopTraining
    from workflows.program_training import ProgramTraining

M = TypeVar("M", bound=BaseModel)


@workflow.defn(name="TrainingJob")
class TrainingJobWorkflow:
    @workflow.init
    def __init__(self, inp: JobInput) -> None:
        self.ctx = JobContext(inp)
        #: What runs while a trainer is held, chosen by the spec.
        self.work: TrainerWork = (
            ProgramTraining(inp.carried_flags.program)
            if inp.spec.training.program is not None
            else LoopTraining()
        )
        self.ctx.carry_work = self.work.carry

    @property
    def spec(self) -> JobSpec:
        return self.ctx.spec

    @property
    def s(self) -> JobStatus:
        return self.ctx.s

    # ================================================================== the life

    @workflow.run
    async def run(self, inp: JobInput) -> JobStatus:
        ctx = self.ctx
        # The baseline lifecycle's marker (docs/upgrades.md): recorded by runs before the
        # baseline, no longer needed; histories with or without it replay.
        workflow.deprecate_patch(versions.REPLAY_SAFE)
        self._begin()
        try:
            await self._with_deadline(self._lifecycle)
        except (asyncio.CancelledError, ActivityError) as err:
            # A cancel request reaches an awaited activity as ActivityError(CancelledError).
            if not is_cancelled_exception(err):
                root = root_cause(err)
                error = ErrorInfo(
                    type=getattr(root, "type", None) or type(root).__name__,
                    message=getattr(root, "message", None) or str(root),
                )
                await finish.finish(ctx, self.work, Phase.FAILED, error)
                raise ApplicationError(error.message, type=error.type, non_retryable=True) from None
            await finish.finish(ctx, self.work, Phase.CANCELLED, None)
            raise
        except Terminal as t:
            await finish.finish(ctx, self.work, t.phase, ErrorInfo(type=t.type, message=t.message))
            raise ApplicationError(t.message, type=t.type, non_retryable=True) from None
        except ApplicationError as err:
            # The workflow's own business error: the job fails as for any other, cleaned up.
            error = ErrorInfo(type=err.type or "ApplicationError", message=err.message)
            await finish.finish(ctx, self.work, Phase.FAILED, error)
            raise ApplicationError(error.message, type=error.type, non_retryable=True) from None
        await finish.finish(ctx, self.work, Phase.COMPLETED, None)
        return ctx.s

    async def _lifecycle(self) -> None:
        ctx, work = self.ctx, self.work
        if ctx.carried:
            work.reattach(ctx)  # what ran on its worker when the last run continued-as-new
        else:
            await admission.admit(ctx)
        lost: Lost | None = None
        while True:
            ctx.stop_if_cancelled()
            try:
                if lost is not None:
                    current, lost = lost, None
                    await recovery.recover(ctx, work, current)
                if ctx.pause_requested or ctx.s.phase is Phase.PAUSED:
                    await recovery.pause(ctx, work)
                if not ctx.trainer_live:
                    await slot.take(ctx)  # (where the backend declares its capacity)
                    await trainer.provision(ctx, work)
                elif not ctx.serving:
                    await recovery.come_back(ctx, work)  # (a run continued while it came up)
                await work.train(ctx)
                break
            except Lost as exc:
                lost = exc
            except PauseNow:
                continue
        await finish.evaluate(ctx, work)
        await finish.promote(ctx)
        if ctx.spec.output.hot_load_deployment:
            await finish.publish(ctx)

    def _begin(self) -> None:
        """The run's identity in the status, the trainer ids and the search attributes."""
        ctx, info = self.ctx, workflow.info()
        ctx.s.workflow_id = info.workflow_id
        if ctx.s.started_at is None:
            ctx.s.started_at = workflow.now()
        if ctx.prefix is None:
            # The event bridge finds the workflow from such an id, without visibility.
            ctx.prefix = trainer_prefix(
                ctx.spec.name, info.workflow_id, info.run_id, owner_in_id=True
            )
        if not ctx.carried:
            updates = [
                sa.JOB_NAME.value_set(ctx.spec.name),
                sa.LABELS.value_set(ctx.spec.label_keywords()),
            ]
            if ctx.s.parent_workflow_id:
                updates.append(sa.PARENT.value_set(ctx.s.parent_workflow_id))
            ctx.upsert(updates)
        ctx.publish(force=True)

    async def _with_deadline(self, body: Callable[[], Awaitable[None]]) -> None:
        limit = self.ctx.spec.scheduling.max_runtime
        if limit is None:
            await body()
            return
        started = required(self.ctx.s.started_at, "the job's start time")
        remaining = limit - (workflow.now() - started)
        main = asyncio.ensure_future(body())
        timer = asyncio.ensure_future(
            workflow.sleep(max(remaining, timedelta(seconds=1)), summary="max runtime")
        )
        try:
            done, _ = await workflow.wait([main, timer], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # The workflow's cancel hits this coroutine only; stop the lifecycle too.
            timer.cancel()
            main.cancel()
            await workflow.wait([main])
            raise
        if main in done:
            timer.cancel()
            main.result()
            return
        main.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await main
        self.ctx.stop_if_cancelled()  # a cancel request while the lifecycle stopped wins
        raise Terminal(
            Phase.FAILED,
            "MaxRuntimeExceeded",
            f"the job ran longer than scheduling.max_runtime ({limit})",
        )

    # ================================================================== messages

    @workflow.query(name="status")
    def query_status(self) -> JobStatus:
        return self.ctx.s

    @workflow.query(name="spec")
    def query_spec(self) -> JobSpec:
        """The spec this job runs (after schedule templates were resolved)."""
        return self.ctx.spec

    @workflow.signal(name="platform_event")
    def platform_event(self, event: PlatformEvent) -> None:
        ctx = self.ctx
        if event.trainer_job_id != ctx.s.trainer_job_id or event.event_id <= ctx.event_id:
            return
        if ctx.stale(event.event_time):
            return  # older than what a poll already showed (e.g. the death before a resume)
        ctx.event_id = event.event_id
        if event.event_time is not None:
            ctx.observed_at = event.event_time  # newer than any poll's answer before it
        ctx.event_state, ctx.event_message = event.state, event.message
        ctx.s.platform_state, ctx.s.platform_message = event.state, event.message

    @workflow.signal(name="program_started")
    def program_started(self, started: ProgramStarted) -> None:
        if isinstance(self.work, ProgramTraining):
            self.work.started(self.ctx, started)

    @workflow.signal(name="program_progress")
    def program_progress(self, progress: ProgramProgress) -> None:
        if isinstance(self.work, ProgramTraining):
            self.work.progress(self.ctx, progress)

    @workflow.signal(name="slot_granted")
    def slot_granted(self, grant: SlotGrant) -> None:
        slot.granted(self.ctx, grant)

    @workflow.signal(name="make_way")
    def make_way(self, notice: MakeWay) -> None:
        slot.asked_to_make_way(self.ctx, notice)

    @workflow.signal(name="place")
    def place(self, notice: PlaceNotice) -> None:
        slot.told_place(self.ctx, notice)

    @workflow.signal(name="pause")
    # Exactly RawValue (the SDK passes the payload through only then); None: no input.
    def pause_signal(self, request: RawValue = None) -> None:  # type: ignore[assignment]
        """Pause from the Web UI or ``temporal workflow signal --name pause``."""
        try:
            self._signal_input("pause", request, PauseRequest)
        except BadSignal:
            return
        if problem := self._pause_problem():
            self.ctx.notice(f"signal pause ignored: {problem}")
            return
        self._pause()

    @workflow.signal(name="resume")
    # Exactly RawValue (the SDK passes the payload through only then); None: no input.
    def resume_signal(self, request: RawValue = None) -> None:  # type: ignore[assignment]
        """Resume from the Web UI or ``temporal workflow signal --name resume``."""
        try:
            parsed = self._signal_input("resume", request, ResumeRequest)
        except BadSignal:
            return
        if problem := self._resume_problem(parsed):
            self.ctx.notice(f"signal resume ignored: {problem}")
            return
        self.ctx.resume_requested = True
        self.ctx.resume_checkpoint = parsed.checkpoint if parsed else None

    @workflow.update(name="request_pause")
    async def request_pause(self, request: PauseRequest) -> PauseResult:
        """Checkpoint, delete the trainer, wait. Returns the checkpoint saved."""
        s = self.ctx.s
        self._pause()
        await workflow.wait_condition(lambda: s.phase is Phase.PAUSED or s.phase.is_terminal())
        return PauseResult(checkpoint=s.paused_checkpoint, step=s.step)

    @request_pause.validator
    def _validate_pause(self, request: PauseRequest) -> None:
        if problem := self._pause_problem():
            raise ValueError(problem)

    @workflow.update(name="request_resume")
    async def request_resume(self, request: ResumeRequest) -> JobStatus:
        """Provision a new trainer and continue (from ``checkpoint`` when given)."""
        ctx = self.ctx
        if request.checkpoint:
            # Before anything is provisioned; refused, the job stays PAUSED.
            if problem := await checkpointing.problem(ctx, request.checkpoint):
                raise ApplicationError(
                    f"resume refused: {problem}", type="InvalidCheckpoint", non_retryable=True
                )
            ctx.resume_checked = True
        ctx.resume_requested = True
        ctx.resume_checkpoint = request.checkpoint
        await workflow.wait_condition(
            lambda: ctx.s.phase is not Phase.PAUSED and not ctx.resume_requested
        )
        return ctx.s

    @request_resume.validator
    def _validate_resume(self, request: ResumeRequest) -> None:
        if problem := self._resume_problem(request):
            raise ValueError(problem)

    def _pause(self) -> None:
        # A user's pause wins over the scheduler's asking the job to make way (which would
        # have it resume by itself): the job pauses, and gives its slot back.
        self.ctx.pause_requested = True
        self.ctx.slot.make_way = None

    def _pause_problem(self) -> str | None:
        phase = self.ctx.s.phase
        if phase.is_terminal():
            return f"the job has finished ({phase.value})"
        if phase is Phase.PAUSED or (self.ctx.pause_requested and not self.ctx.slot.make_way):
            return "the job is already paused (or pausing)"
        if phase in (Phase.PENDING, Phase.EVALUATING, Phase.EXPORTING):
            return f"the job cannot be paused while {phase.value}"
        return None

    def _resume_problem(self, request: ResumeRequest | None) -> str | None:
        ctx = self.ctx
        if ctx.s.phase is not Phase.PAUSED and not ctx.pause_requested:
            return f"the job is not paused ({ctx.s.phase.value})"
        if ctx.resume_requested:
            return "a resume is already in progress"
        if (
            request
            and request.checkpoint
            and not rules.CHECKPOINT_NAME_RE.match(request.checkpoint)
        ):
            return "checkpoint: must be accounts/<a>/rlorTrainerJobs/<j>/checkpoints/<c>"
        return None

    def _signal_input(self, name: str, raw: RawValue | None, model: type[M]) -> M | None:
        """A signal's input, read here rather than by the SDK, which would drop a bad one with
        only a log line: a bad input becomes a notice in the status and a warning."""
        if raw is None:
            return None
        try:
            data = workflow.payload_converter().from_payload(raw.payload)
            return None if data is None else model.model_validate(data)
        except Exception as exc:  # noqa: BLE001 - any unreadable input is the sender's error
            detail = str(exc).splitlines()
            self.ctx.notice(f"signal {name} ignored: unreadable input ({' '.join(detail[:3])})")
            raise BadSignal() from None
