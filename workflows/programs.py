"""What runs in TRAINING when the job names a program: one seam of the lifecycle.

A loop's job trains in chunks of steps (``TrainingJobWorkflow._train``); a program's job
runs the program once (``run_program``, activities/programs.py), behind the job's data-plane
proxy, for as long as it runs. Everything else is the same lifecycle: the workflow
provisions, waits, warms the route up, recovers from a preemption with its declared
policies, pauses, cancels and deletes. Around the program's run, the workflow

* hands the proxy each trainer that comes up (``program_attach``), after a death or a pause
  as after the first start: the proxy restores the program's model from its last checkpoint
  and redoes what came after, and the program's waiting requests go on — **that is how a
  program survives a preemption without a restart**;
* tells the proxy when the trainer is gone (``program_detach``: the program's requests wait)
  and, for a pause, asks it for a checkpoint first (``program_checkpoint``);
* keeps the job's status from what the proxy reports (steps, losses, checkpoints: the
  ``program_progress`` signal) and promotes the best or last checkpoint at the end.

The program itself never restarts, except when its worker dies: the retried ``run_program``
attempt starts it again on another worker (``program_started`` tells the workflow where).

Deterministic code only.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from activities.programs import ProgramActivities
    from shepherd.curves import add_point
    from shepherd.models import (
        CheckpointRecord,
        ProgramAttachInput,
        ProgramAttachResult,
        ProgramControlInput,
        ProgramProgress,
        ProgramSettings,
        ProgramStarted,
        RunProgramInput,
    )
    from shepherd.phases import Phase
    from workflows import policies
    from workflows.flow import DEAD, Lost, PauseNow, Terminal, required

if TYPE_CHECKING:
    from workflows.job import TrainingJobWorkflow


class ProgramSeam:
    """The program's side of TRAINING, for :class:`~workflows.job.TrainingJobWorkflow`
    (a mixin: it reads the job's state and uses its helpers)."""

    #: The running ``run_program`` activity (None before it starts).
    _program: Any = None
    #: Where the program's current attempt is steered (its worker's control queue).
    _program_queue: str | None = None
    #: The attempt that control queue belongs to, and the trainer that attempt serves from.
    _program_attempt: int = 0
    _program_attached: str | None = None
    #: The proxy saw the trainer gone (the reason), until a recovery deals with it.
    _program_lost: str | None = None
    #: The checkpoint the proxy restores the program's model from after a loss: never pruned.
    _program_restore_point: str | None = None
    #: A checkpoint arrived: older ones beyond ``checkpoint.keep_last`` are pruned.
    _program_prune: bool = False

    # ----------------------------------------------------------------- signals

    @workflow.signal(name="program_started")
    def program_started(self, started: ProgramStarted) -> None:
        if started.attempt < self._program_attempt:
            return  # an older attempt's word, late
        self._program_attempt = started.attempt
        self._program_queue = started.control_queue
        self._program_attached = None  # a new proxy: it serves from nothing yet
        job: TrainingJobWorkflow = self  # type: ignore[assignment]
        if started.total_steps and not job.spec.training.total_steps:
            job.s.total_steps = started.total_steps

    @workflow.signal(name="program_progress")
    def program_progress(self, progress: ProgramProgress) -> None:
        job: TrainingJobWorkflow = self  # type: ignore[assignment]
        job.s.step = max(job.s.step, progress.step)
        if progress.last_loss is not None:
            job.s.last_loss = progress.last_loss
        for step, loss in progress.losses:
            add_point(job.s.loss_curve, step, loss)
        for record in progress.checkpoints:
            self._took_checkpoint(record)
            self._program_prune = True
        if progress.restore_point:
            self._program_restore_point = progress.restore_point
        if progress.trainer_lost and self._program_attached == job.s.trainer_job_id:
            self._program_lost = progress.trainer_lost
        job._publish()

    def _took_checkpoint(self, record: CheckpointRecord) -> None:
        """A checkpoint the proxy saved: the job's checkpoints, its best (by the step's
        mean training loss, ``train_loss``, which is what a program's job can measure)."""
        job: TrainingJobWorkflow = self  # type: ignore[assignment]
        record.saved_at = record.saved_at or workflow.now()
        if job.spec.checkpoint.evaluate and record.metric is None:
            record.metric = job.s.last_loss
        if job.spec.checkpoint.evaluate and record.metric is not None:
            best = job.s.best
            if (
                best is None
                or best.metric is None
                or (
                    record.metric < best.metric
                    if job.spec.checkpoint.mode == "min"
                    else record.metric > best.metric
                )
            ):
                job.s.best = record
            job.s.eval_value = record.metric
            # The tracked metric's curve (a program's: the training loss at each checkpoint).
            add_point(job.s.eval_curve, record.step, record.metric)
        job.s.checkpoints = [c for c in job.s.checkpoints if c.name != record.name] + [record]
        job.s.checkpoints.sort(key=lambda c: (c.step, c.saved_at or workflow.now()))

    # ----------------------------------------------------------------- the run

    def _program_input(self) -> RunProgramInput:
        job: TrainingJobWorkflow = self  # type: ignore[assignment]
        spec = job.spec
        return RunProgramInput(
            backend=spec.backend,
            program=required(spec.training.program, "training.program"),
            args=dict(spec.training.args),
            settings=ProgramSettings(
                base_model=spec.trainer.base_model,
                lora_rank=spec.trainer.lora_rank,
                checkpoint_every=spec.checkpoint.every_steps,
                call_timeout_s=job.pol.step_timeout.total_seconds(),
                route_race_retries=job.pol.route_race_retries,
                route_race_window_s=job.pol.route_race_window.total_seconds(),
            ),
            seed_from=job.s.parent_workflow_id,
        )

    def _program_wants_trainer(self) -> bool:
        job: TrainingJobWorkflow = self  # type: ignore[assignment]
        return self._program_queue is not None and self._program_attached != job.s.trainer_job_id

    async def _run_program(self) -> None:
        """TRAINING for a program: run it (started once), hand it the trainer, and wait
        for it to end — or for a death, a pause or a cancel, which the lifecycle handles
        around it while the program's requests wait."""
        job: TrainingJobWorkflow = self  # type: ignore[assignment]
        if self._program is None:
            job._stop_if_cancelled()
            options = await job._options(job.pol.run_program)
            self._program = workflow.start_activity_method(
                ProgramActivities.run_program,
                self._program_input(),
                **options,
                # A cancel waits until the program is stopped (SIGTERM, then SIGKILL).
                cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                summary=f"run program {job.spec.training.program}",
            )

        def died() -> bool:
            return job._event_state in DEAD or self._program_lost is not None

        while True:
            if self._program_wants_trainer() and job._serving and not died():
                await self._attach()
                continue
            if self._program_attached == job.s.trainer_job_id and job.s.phase is not Phase.TRAINING:
                job._set_phase(Phase.TRAINING)  # (until then: PREPARING, or RECOVERING)
            if self._program_prune:
                self._program_prune = False
                await job._prune()
                continue
            waiter = asyncio.ensure_future(
                workflow.wait_condition(
                    lambda: (
                        job._pause_requested
                        or died()
                        or job._cancel_seen()
                        or self._program_prune
                        or (self._program_wants_trainer() and job._serving)
                    )
                )
            )
            await job._race(self._program, waiter)
            if self._program.done():
                waiter.cancel()
                break
            job._stop_if_cancelled()
            if died():
                await self._control_quietly("program_detach", "the trainer died")
                self._program_attached = None
                said, self._program_lost = self._program_lost, None
                if job._event_state in DEAD:
                    raise job._death_event()
                # No platform event (polling only): the proxy's word, verified with the
                # control plane; the recovery asks the platform what it is.
                raise Lost(policies.TRAINER_LOST, None, f"the program's proxy: {said}")
            if job._pause_requested:
                raise PauseNow()
        try:
            await self._program
            if self._program_prune:  # the final checkpoint
                self._program_prune = False
                await job._prune()
        except ActivityError as err:
            job._stop_if_cancelled()
            root = err.cause
            if isinstance(root, ApplicationError) and root.type == policies.PROGRAM_FAILED:
                raise Terminal(Phase.FAILED, policies.PROGRAM_FAILED, root.message) from None
            job._raise_mapped(err, "ProgramTimeout", f"program {job.spec.training.program}")
        finally:
            self._program = None

    async def _attach(self) -> None:
        """Hand the program's proxy the trainer that serves now."""
        job: TrainingJobWorkflow = self  # type: ignore[assignment]
        trainer = required(job.s.trainer_job_id, "the trainer's id")
        attempt = self._program_attempt
        try:
            done: ProgramAttachResult = await self._control(
                ProgramActivities.program_attach,
                ProgramAttachInput(trainer_job_id=trainer),
                f"attach the program to {trainer}",
            )
        except _Gone:
            if self._program_attempt == attempt:
                self._program_queue = None  # wait for the attempt that runs it now
            return
        self._program_attached = trainer
        restored = done.restored_from is not None or done.ops_redone
        if restored and job.s.recoveries and job.s.recoveries[-1].weights_verified is None:
            # A restore after a recovery: what it redid, and whether the weights came back
            # as they were.
            record = job.s.recoveries[-1]
            record.steps_redone = done.optimizer_steps_redone
            record.weights_verified = done.digests_match
        job._publish()

    async def _program_checkpoint(self) -> CheckpointRecord | None:
        """For a pause: a checkpoint of the program's model now (None: it has none)."""
        if self._program is None or self._program_queue is None:
            return None
        try:
            record: CheckpointRecord | None = await self._control(
                ProgramActivities.program_checkpoint,
                ProgramControlInput(reason="pause"),
                "checkpoint the program for the pause",
            )
        except _Gone:
            return None
        self._program_attached = None  # the proxy holds the program's requests now
        if record is not None:
            self._took_checkpoint(record)
        return record

    async def _control(self, fn: Any, arg: Any, summary: str) -> Any:
        """A control activity on the program's worker; ``_Gone`` when that worker does
        not run it any more (another attempt starts on another worker)."""
        job: TrainingJobWorkflow = self  # type: ignore[assignment]
        job._stop_if_cancelled()
        policy = job.pol.program_control
        try:
            return await workflow.execute_activity_method(
                fn, arg, **policy.options(), task_queue=self._program_queue, summary=summary
            )
        except ActivityError as err:
            root = err.cause
            gone = isinstance(root, TimeoutError) or (
                isinstance(root, ApplicationError) and root.type == policies.PROGRAM_GONE
            )
            if gone:
                raise _Gone() from None
            raise

    async def _control_quietly(self, name: str, reason: str) -> None:
        """Best effort (a worker that is gone holds nothing to tell)."""
        if self._program is None or self._program_queue is None or self._program.done():
            return
        fn = {"program_detach": ProgramActivities.program_detach}[name]
        with contextlib.suppress(_Gone, ActivityError):
            await self._control(fn, ProgramControlInput(reason=reason), f"detach: {reason}")

    async def _stop_program(self) -> None:
        """At the end of a job that did not complete: the program is stopped (the activity's
        cancellation does it) before the trainer is deleted."""
        if self._program is None or self._program.done():
            return
        self._program.cancel()
        with contextlib.suppress(ActivityError, asyncio.CancelledError):
            await self._program


class _Gone(Exception):
    """The program's worker does not run it any more."""
