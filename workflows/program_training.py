"""A program's work on the trainer (:class:`~workflows.held.TrainerWork`): an unmodified Tinker
program run once (``run_program``, activities/programs.py) behind the job's data-plane proxy,
for as long as it runs, while the lifecycle keeps owning the trainer. Around the program's run:

* the route is warmed up for the proxy when a trainer turns RUNNING (``prepare``);
* the proxy is handed each trainer that comes up (``program_attach``), after a death or a
  pause as after the first start: it restores the program's model from its last checkpoint
  and redoes what came after, and the program's waiting requests go on — **that is how a
  program survives a preemption without a restart**;
* the proxy is told when the trainer is gone (``program_detach``: the program's requests
  wait) and, for a pause, asked for a checkpoint first (``program_checkpoint``);
* the job's status follows what the proxy reports (``program_started`` and
  ``program_progress``, signals the workflow hands to :meth:`ProgramTraining.started` and
  :meth:`ProgramTraining.progress`), checkpoints beyond ``keep_last`` are pruned (never the
  proxy's restore point).

The program itself never restarts, except when its worker dies: the retried ``run_program``
attempt starts it again on another worker (``program_started`` says where).

Deterministic code only.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType

with workflow.unsafe.imports_passed_through():
    import workflows.checkpointing as checkpointing
    import workflows.policies as policies
    import workflows.slot as slot
    import workflows.versions as versions
    from activities.programs import ProgramActivities
    from activities.readiness import ReadinessActivities
    from shepherd.curves import MAX_METRIC_POINTS, add_point
    from shepherd.models import (
        CheckpointRecord,
        ProgramAttachInput,
        ProgramAttachResult,
        ProgramCarry,
        ProgramControlInput,
        ProgramProgress,
        ProgramSettings,
        ProgramStarted,
        RunProgramInput,
        WarmUpInput,
        WarmUpResult,
    )
    from shepherd.phases import Phase
    from shepherd.program_metrics import MAX_NAMES as MAX_METRIC_NAMES
    from shepherd.spec import MAX_KEPT_METRICS, PROGRAM_METRICS
    from workflows.context import JobContext
    from workflows.flow import DEAD, Lost, PauseNow, Terminal, required


class ProgramTraining:
    """TRAINING for a job that names a program (``training.program``)."""

    def __init__(self, carried: ProgramCarry | None = None) -> None:
        c = carried or ProgramCarry()
        #: The activity holding the program (None before it starts, and between starts), and
        #: whether it adopts one that runs already (a run continued from another).
        self._run: Any = None
        self._adopting = False
        #: The control queue of the worker an adoption was asked of.
        self._adopted_at: str | None = None
        #: Where the program is steered (its worker's control queue; None: not known yet).
        self._queue: str | None = c.control_queue
        #: The workflow's starts of the program, and the newest (start, attempt) heard of.
        self._generation = c.generation
        self._started = c.started
        #: The trainer the program's proxy serves from.
        self._attached: str | None = c.attached
        #: The proxy saw the trainer gone (the reason), until a recovery deals with it.
        self._lost: str | None = None
        #: The checkpoint the proxy restores the program's model from after a loss.
        self._restore_point: str | None = c.restore_point
        #: A checkpoint arrived: older ones beyond ``checkpoint.keep_last`` are pruned.
        self._prune = c.prune
        #: The program's worker said it exited 0, its final checkpoint with it: whatever
        #: becomes of its activity, it is never started again.
        self._exited = c.exited

    def carry(self) -> ProgramCarry:
        return ProgramCarry(
            control_queue=self._queue if self._run is not None else None,
            generation=self._generation,
            started=self._started,
            attached=self._attached,
            restore_point=self._restore_point,
            prune=self._prune,
            exited=self._exited,
        )

    def reattach(self, ctx: JobContext) -> None:
        """The program runs on where the last run left it: take it over there (its worker's
        hold queue). A worker that is gone does not take it; ``train`` then starts it again."""
        if self._queue is None:
            return
        self._adopted_at = self._queue
        self._run = workflow.start_activity_method(
            ProgramActivities.run_program,
            self._input(ctx, adopt=True),
            **ctx.pol.adopt_program.options(),
            task_queue=policies.hold_queue(self._queue),
            priority=ctx.task_priority(),
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"adopt program {ctx.spec.training.program}",
        )
        self._adopting = True

    # ------------------------------------------------------------------ signals

    def started(self, ctx: JobContext, started: ProgramStarted) -> None:
        key = (started.generation, started.attempt)
        if key < self._started:
            return  # an older attempt's word, late
        self._started = key
        self._queue = started.control_queue
        # A new proxy serves from nothing yet; an adopted one says what it serves from.
        self._attached = started.attached if started.adopted else None
        if started.total_steps and not ctx.spec.training.total_steps:
            ctx.s.total_steps = started.total_steps

    def progress(self, ctx: JobContext, progress: ProgramProgress) -> None:
        following, was = progress.following, ctx.s.following
        if following is not None:
            ctx.s.following = following
            if was is not None and was.number != following.number:
                # Another of the program's models is the job's from now on (a pipeline's
                # next stage): its steps, its checkpoints, its best. (The same model made
                # again by a program started again is no new one.)
                ctx.s.step, ctx.s.best = progress.step, None
                workflow.logger.info("following %s", following.describe())
        ctx.s.step = max(ctx.s.step, progress.step)
        if progress.last_loss is not None:
            ctx.s.last_loss = progress.last_loss
        for step, loss in progress.losses:
            add_point(ctx.s.loss_curve, step, loss)
        # The program's own metrics first: a checkpoint in the same report is measured by
        # the newest of them.
        self._metrics(ctx, progress)
        for record in progress.checkpoints:
            self._took_checkpoint(ctx, record)
            self._prune = True
        if progress.restore_point:
            self._restore_point = progress.restore_point
        if progress.trainer_lost and self._attached == ctx.s.trainer_job_id:
            self._lost = progress.trainer_lost
        for problem in progress.problems:
            ctx.notice(problem)
        self._exited = self._exited or progress.exited
        if workflow.patched(versions.PROGRAM_STEP_LISTED):
            ctx.publish_step()
        ctx.publish()

    @staticmethod
    def _metrics(ctx: JobContext, progress: ProgramProgress) -> None:
        """What the program wrote to its metrics file: the newest value of each metric, and
        the curves the job keeps (by the program's own step)."""
        s = ctx.s
        for point in progress.metrics:
            for name, value in point.values.items():
                if name in s.metric_curves or len(s.metric_curves) < MAX_KEPT_METRICS:
                    add_point(
                        s.metric_curves.setdefault(name, []), point.step, value, MAX_METRIC_POINTS
                    )
        if progress.latest_metrics:
            s.metrics = dict(list(progress.latest_metrics.items())[:MAX_METRIC_NAMES])
            s.metrics_step = progress.metrics_step
            tracked = _program_metric(ctx)
            if tracked and tracked not in s.metrics and not any(tracked in n for n in s.notices):
                said = ", ".join(sorted(s.metrics)[:12])
                ctx.notice(
                    f"checkpoint.metric {tracked!r}: the program's metrics file has no such "
                    f"metric (it writes {said}); its checkpoints are not measured"
                )

    @staticmethod
    def _took_checkpoint(ctx: JobContext, record: CheckpointRecord) -> None:
        """A checkpoint the proxy saved: the job's checkpoints, its best by
        ``checkpoint.metric`` — the step's mean training loss (``train_loss``, from the wire),
        or one of the program's own metrics, its newest value when the checkpoint is told."""
        record.saved_at = record.saved_at or workflow.now()
        if ctx.spec.checkpoint.evaluate and record.metric is None:
            tracked = _program_metric(ctx)
            record.metric = ctx.s.metrics.get(tracked) if tracked else ctx.s.last_loss
        if ctx.spec.checkpoint.evaluate and record.metric is not None:
            if checkpointing.is_better(ctx, record):
                ctx.s.best = record
            ctx.s.eval_value = record.metric
            # The tracked metric's curve (a program's: the training loss at each checkpoint).
            add_point(ctx.s.eval_curve, record.step, record.metric)
        checkpointing.add(ctx, record)

    # ------------------------------------------------------------------ the interface

    async def prepare(self, ctx: JobContext, *, booting: bool = False) -> None:
        """The proxy opens (or restores) the program's model once it is handed the trainer;
        the route is warmed up for it here."""
        warm: WarmUpResult = await ctx.act(
            ReadinessActivities.warm_up,
            WarmUpInput(
                backend=ctx.spec.backend,
                trainer_job_id=ctx.ref().trainer_job_id,
                probes=ctx.pol.warmup_probes,
                booting=booting,
            ),
            ctx.pol.warm_up_booting if booting else ctx.pol.warm_up,
            f"warm up the route ({ctx.pol.warmup_probes} probes)",
            timeout_type="WarmUpTimeout",
        )
        ctx.s.route_races += warm.route_races
        ctx.serving = True
        ctx.to_load = None
        ctx.publish()

    async def train(self, ctx: JobContext) -> None:
        """Run the program (started once), hand it the trainer, and wait for it to end — or
        for a death, a pause or a cancel, which the lifecycle handles around it while the
        program's requests wait. An adopted program whose worker is gone is started again."""
        while True:
            if self._run is None:
                self._start(ctx)
            await self._serve(ctx)
            try:
                await self._run
            except ActivityError as err:
                ctx.stop_if_cancelled()
                if self._exited:
                    # Its work is done and told (its final checkpoint with it): what failed
                    # after is the worker's, and the job goes on from its checkpoints.
                    ctx.notice(
                        f"program {ctx.spec.training.program} exited 0; its activity then "
                        f"failed ({_said(err)}): the job goes on from its checkpoints"
                    )
                    self._run = None
                    break
                if self._adopting and _gone(err, any_timeout=False):
                    self._run = None
                    if self._queue is not None and self._queue != self._adopted_at:
                        # Another attempt said meanwhile that it runs the program elsewhere
                        # (its first worker died just before the run ended): take that one.
                        self.reattach(ctx)
                        continue
                    # Its worker died (or forgot it) across the run boundary: start it again,
                    # in the same log directory (it resumes from its own checkpoints).
                    ctx.notice(
                        f"program {ctx.spec.training.program}: its worker is gone "
                        f"({_said(err)}); starting it again"
                    )
                    self._queue, self._attached = None, None
                    continue
                root = err.cause
                if isinstance(root, ApplicationError) and root.type == policies.PROGRAM_FAILED:
                    raise Terminal(Phase.FAILED, policies.PROGRAM_FAILED, root.message) from None
                ctx.raise_mapped(err, "ProgramTimeout", f"program {ctx.spec.training.program}")
            finally:
                if self._run is not None and self._run.done():
                    self._run = None
            break
        if self._prune:  # the final checkpoint
            self._prune = False
            await checkpointing.prune(ctx, self.keep())

    def _start(self, ctx: JobContext) -> None:
        ctx.stop_if_cancelled()
        self._generation += 1
        self._adopting = False
        self._run = workflow.start_activity_method(
            ProgramActivities.run_program,
            self._input(ctx),
            **ctx.options(ctx.pol.run_program),
            # A cancel waits until the program is stopped (SIGTERM, then SIGKILL).
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"run program {ctx.spec.training.program}",
        )

    async def _serve(self, ctx: JobContext) -> None:
        """Until the program's activity ends: attach each trainer that comes up, prune, and
        stop for a death (:class:`Lost`), a pause (:class:`PauseNow`), a cancel, or a long
        history (continue-as-new; the program runs on and the next run adopts it)."""

        def died() -> bool:
            return ctx.event_state in DEAD or self._lost is not None

        while not self._run.done():
            if self._wants_trainer(ctx) and ctx.serving and not died():
                await self._attach(ctx)
                continue
            if self._attached == ctx.s.trainer_job_id and ctx.s.phase is not Phase.TRAINING:
                ctx.set_phase(Phase.TRAINING)  # (until then: PREPARING, or RECOVERING)
            if self._prune:
                self._prune = False
                await checkpointing.prune(ctx, self.keep())
                await slot.note_checkpoint(ctx)  # (it may make way for a more urgent job now)
                continue
            waiter = asyncio.ensure_future(
                workflow.wait_condition(
                    lambda: (
                        ctx.pause_requested
                        or died()
                        or ctx.cancel_seen()
                        or self._prune
                        or (self._wants_trainer(ctx) and ctx.serving)
                        or self._may_continue(ctx)
                    )
                )
            )
            await ctx.race(self._run, waiter)
            if self._run.done():
                waiter.cancel()
                return
            ctx.stop_if_cancelled()
            if died():
                await self._detach_quietly(ctx, "the trainer died")
                self._attached = None
                said, self._lost = self._lost, None
                if ctx.event_state in DEAD:
                    raise ctx.death_event()
                # No platform event (polling only): the proxy's word, verified with the
                # control plane; the recovery asks the platform what it is.
                raise Lost(policies.TRAINER_LOST, None, f"the program's proxy: {said}")
            if ctx.pause_requested:
                raise PauseNow()
            if self._may_continue(ctx):
                await ctx.maybe_continue_as_new()

    def _may_continue(self, ctx: JobContext) -> bool:
        """Continue-as-new once the history is long — and the program has said where it
        runs: the next run must find it there, or it would start a second one."""
        return self._queue is not None and ctx.history_long()

    async def checkpoint_for_pause(self, ctx: JobContext) -> CheckpointRecord | None:
        """A checkpoint of the program's model now (None: it has none, or no trainer serves)."""
        if not ctx.serving or self._run is None or self._queue is None:
            return None
        try:
            record: CheckpointRecord | None = await self._control(
                ctx,
                ProgramActivities.program_checkpoint,
                ProgramControlInput(reason="pause"),
                "checkpoint the program for the pause",
            )
        except _Gone:
            return None
        except ActivityError:
            # The trainer was lost before the checkpoint was taken: the pause goes on, and
            # the job resumes from its last checkpoint (as a loop's pause does).
            ctx.stop_if_cancelled()
            self._attached = None
            return None
        self._attached = None  # the proxy holds the program's requests now
        if record is not None:
            self._took_checkpoint(ctx, record)
        return record

    async def finish(self, ctx: JobContext) -> None:
        return None  # a program evaluates itself: its final checkpoint carries its last loss

    async def stop(self, ctx: JobContext) -> None:
        """The job ends without completing: the program is stopped (the activity's
        cancellation does it) before the trainer is deleted."""
        if self._run is None or self._run.done():
            return
        self._run.cancel()
        with contextlib.suppress(ActivityError, asyncio.CancelledError):
            await self._run

    def keep(self) -> set[str]:
        return {self._restore_point} if self._restore_point else set()

    # ------------------------------------------------------------------ the proxy

    def _input(self, ctx: JobContext, *, adopt: bool = False) -> RunProgramInput:
        spec = ctx.spec
        return RunProgramInput(
            backend=spec.backend,
            program=required(spec.training.program, "training.program"),
            args=dict(spec.training.args),
            settings=ProgramSettings(
                base_model=spec.trainer.base_model,
                lora_rank=spec.trainer.lora_rank,
                checkpoint_every=spec.checkpoint.every_steps,
                call_timeout_s=ctx.pol.step_timeout.total_seconds(),
                route_race_retries=ctx.pol.route_race_retries,
                route_race_window_s=ctx.pol.route_race_window.total_seconds(),
                metrics=[m for m in (_program_metric(ctx), *spec.training.metrics) if m],
                follow=str(spec.training.follow),
            ),
            seed_from=ctx.s.parent_workflow_id,
            generation=self._generation,
            adopt=adopt,
        )

    def _wants_trainer(self, ctx: JobContext) -> bool:
        return self._queue is not None and self._attached != ctx.s.trainer_job_id

    async def _attach(self, ctx: JobContext) -> None:
        """Hand the program's proxy the trainer that serves now."""
        trainer = required(ctx.s.trainer_job_id, "the trainer's id")
        started = self._started
        try:
            done: ProgramAttachResult = await self._control(
                ctx,
                ProgramActivities.program_attach,
                ProgramAttachInput(trainer_job_id=trainer),
                f"attach the program to {trainer}",
            )
        except _Gone:
            if self._started == started:
                self._queue = None  # wait for the attempt that runs it now
            return
        except ActivityError as err:
            # The trainer was lost while the proxy restored the program's model on it (a
            # preemption during the restore): a loss like any other, recovered from.
            ctx.raise_mapped(err, "ProgramTimeout", f"attach the program to {trainer}")
        self._attached = trainer
        restored = done.restored_from is not None or done.ops_redone
        if restored and ctx.s.recoveries and ctx.s.recoveries[-1].weights_verified is None:
            # A restore after a recovery: what it redid, and whether the weights came back
            # as they were.
            record = ctx.s.recoveries[-1]
            record.steps_redone = done.optimizer_steps_redone
            record.weights_verified = done.digests_match
        ctx.publish()

    async def _control(self, ctx: JobContext, fn: Any, arg: Any, summary: str) -> Any:
        """A control activity on the program's worker; ``_Gone`` when that worker does not
        run it any more (another attempt starts on another worker)."""
        ctx.stop_if_cancelled()
        policy = ctx.pol.program_control
        try:
            return await workflow.execute_activity_method(
                fn, arg, **policy.options(), task_queue=self._queue, summary=summary
            )
        except ActivityError as err:
            if _gone(err):
                raise _Gone() from None
            raise

    async def _detach_quietly(self, ctx: JobContext, reason: str) -> None:
        """Best effort (a worker that is gone holds nothing to tell)."""
        if self._run is None or self._queue is None or self._run.done():
            return
        with contextlib.suppress(_Gone, ActivityError):
            await self._control(
                ctx,
                ProgramActivities.program_detach,
                ProgramControlInput(reason=reason),
                f"detach: {reason}",
            )


def _program_metric(ctx: JobContext) -> str | None:
    """The tracked metric when the program's metrics file gives it (None: the wire's)."""
    metric = ctx.spec.checkpoint.metric
    return None if metric in PROGRAM_METRICS else metric


class _Gone(Exception):
    """The program's worker does not run it any more."""


def _gone(err: ActivityError, *, any_timeout: bool = True) -> bool:
    """Whether an activity on a program's worker failed because that worker does not run
    the program (any more): it said so, or did not take the task in time, or stopped
    heartbeating (``any_timeout``: any timeout counts)."""
    root = err.cause
    if isinstance(root, TimeoutError):
        return any_timeout or root.type in (TimeoutType.SCHEDULE_TO_START, TimeoutType.HEARTBEAT)
    return isinstance(root, ApplicationError) and root.type == policies.PROGRAM_GONE


def _said(err: ActivityError) -> str:
    root = err.cause
    if isinstance(root, TimeoutError) and root.type is not None:
        return f"{root.type.name.lower().replace('_', '-')} timeout"
    return getattr(root, "message", None) or str(root)
