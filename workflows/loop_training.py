"""A registered loop's work on the trainer (:class:`~workflows.held.TrainerWork`): open the
model (create it, or load the checkpoint the job starts from), train in chunks of steps,
checkpoint every ``checkpoint.every_steps`` and evaluate there, evaluate at the end.

Each chunk is one ``train_chunk`` activity raced against a pause, a cancel and the
platform's word that the trainer died: any of them stops it at a step boundary, and what the
chunk got done is the job's step. Activities: ``open_model``, ``train_chunk``,
``save_checkpoint``, ``evaluate`` (policies ``open_model``, ``train_chunk``,
``data_plane_call``).

Deterministic code only.
"""

from __future__ import annotations

import asyncio
import contextlib

from temporalio import workflow
from temporalio.exceptions import ActivityError, FailureError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    import workflows.checkpointing as checkpointing
    import workflows.policies as policies
    import workflows.slot as slot
    from activities.checkpoints import CheckpointActivities
    from activities.training import TrainingActivities
    from shepherd.curves import add_point
    from shepherd.models import (
        CheckpointRecord,
        ChunkResult,
        EvaluateInput,
        LoopSettings,
        OpenModelInput,
        SaveCheckpointInput,
        TrainChunkInput,
        TrialProgress,
    )
    from shepherd.phases import Phase
    from workflows.context import JobContext
    from workflows.flow import DEAD, Lost, PauseNow, Terminal


class LoopTraining:
    """TRAINING for a job that names a loop (``training.loop``)."""

    def __init__(self) -> None:
        #: The last chunk ended without saying where the model is (see ``_run_chunk``).
        self.position_unknown = False

    # ------------------------------------------------------------------ the interface

    async def prepare(self, ctx: JobContext, *, booting: bool = False) -> None:
        """One activity: open the model (it needs no warm route: it re-sends a request
        after a route 404, so it runs while the route propagates), then the warm-up probes
        (after its calls, so consecutive probes prove every replica)."""
        t = ctx.spec.trainer
        model = OpenModelInput(
            backend=ctx.spec.backend,
            trainer_job_id=ctx.ref().trainer_job_id,
            base_model=t.base_model,
            lora_rank=t.lora_rank,
            seed=ctx.spec.training.seed,
            checkpoint=ctx.to_load,
            call_timeout_s=ctx.call_timeout_s(),
            warm_up_probes=ctx.pol.warmup_probes,
            booting=booting,
        )
        opening = f"load {ctx.to_load.rsplit('/', 1)[-1]}" if ctx.to_load else "create the model"
        opened = await ctx.act(
            TrainingActivities.open_model,
            model,
            ctx.pol.open_model_booting if booting else ctx.pol.open_model,
            f"{opening}, warm up the route ({ctx.pol.warmup_probes} probes)",
            timeout_type="WarmUpTimeout",
        )
        ctx.s.route_races += opened.route_races
        ctx.session = opened.session
        self.position_unknown = False
        ctx.serving = True
        ctx.s.step = opened.step
        ctx.to_load = None
        ctx.publish()

    async def train(self, ctx: JobContext) -> None:
        total = ctx.spec.total_steps
        every = ctx.spec.checkpoint.every_steps
        chunk = ctx.spec.steps_per_chunk
        while ctx.s.step < total:
            if ctx.pause_requested:
                raise PauseNow()
            next_checkpoint = (ctx.s.step // every + 1) * every
            first, last = ctx.s.step + 1, min(ctx.s.step + chunk, next_checkpoint, total)
            ctx.set_phase(Phase.TRAINING)
            result = await self._run_chunk(ctx, first, last)
            ctx.s.step = result.last_step
            if result.last_loss is not None:
                ctx.s.last_loss = result.last_loss
            loss = result.mean_loss if result.mean_loss is not None else result.last_loss
            if loss is not None:
                add_point(ctx.s.loss_curve, result.last_step, loss)
            ctx.s.route_races += result.route_races
            ctx.publish_step(force=True)
            ctx.publish()
            if last % every == 0 or last == total:
                await self.checkpoint(ctx, f"step-{last:08d}")
            await ctx.maybe_continue_as_new()

    async def checkpoint_for_pause(self, ctx: JobContext) -> CheckpointRecord | None:
        if not (ctx.trainer_live and ctx.serving) or self.position_unknown:
            return None
        try:
            return await self.checkpoint(ctx, f"pause-{ctx.pauses}", evaluate=False)
        except Lost:
            return None

    async def finish(self, ctx: JobContext) -> None:
        """The final evaluation, unless the last checkpoint was evaluated at this step."""
        last = ctx.s.last_checkpoint
        if not (last and last.step == ctx.s.step and last.metric is not None):
            await self._evaluate(ctx)

    async def stop(self, ctx: JobContext) -> None:
        return None  # a chunk stops with the workflow's cancellation

    def keep(self) -> set[str]:
        return set()

    def carry(self) -> None:
        return None  # the job's state says all a loop needs (its model: ``ctx.session``)

    def reattach(self, ctx: JobContext) -> None:
        return None  # nothing of a loop's runs beyond its workflow

    # ------------------------------------------------------------------ chunks

    def _settings(self, ctx: JobContext) -> LoopSettings:
        tr = ctx.spec.training
        return LoopSettings(
            loop=tr.loop,
            dataset=tr.dataset,
            batch_size=tr.batch_size,
            micro_batches=tr.micro_batches,
            seed=tr.seed,
            learning_rate=ctx.spec.trainer.learning_rate,
            max_context_length=ctx.spec.trainer.max_context_length
            or policies.DEFAULT_MAX_CONTEXT_LENGTH,
            validation_split=tr.validation_split,
            total_steps=ctx.spec.total_steps,
        )

    async def _run_chunk(self, ctx: JobContext, first: int, last: int) -> ChunkResult:
        def died() -> bool:
            return ctx.event_state in DEAD

        if died():
            raise ctx.death_event()  # known dead: do not even schedule the chunk
        ctx.stop_if_cancelled()
        handle = workflow.start_activity_method(
            TrainingActivities.train_chunk,
            TrainChunkInput(
                backend=ctx.spec.backend,
                trainer_job_id=ctx.ref().trainer_job_id,
                base_model=ctx.spec.trainer.base_model,
                session=ctx.model(),
                first_step=first,
                last_step=last,
                settings=self._settings(ctx),
                route_race_retries=ctx.pol.route_race_retries,
                route_race_window_s=ctx.pol.route_race_window.total_seconds(),
                step_timeout_s=ctx.pol.step_timeout.total_seconds(),
            ),
            **ctx.options(ctx.pol.train_chunk),
            # A pause stops the chunk at a step boundary before the checkpoint is taken.
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"train steps {first}-{last}",
        )
        # A pause, or the platform's word that the trainer died, stops the chunk early.
        stop = asyncio.ensure_future(
            workflow.wait_condition(lambda: ctx.pause_requested or died() or ctx.cancel_seen())
        )
        await ctx.race(handle, stop)
        if not handle.done() and died():
            # Let the chunk see the death itself: a running attempt stops at once, one
            # between retries starts and meets the dead route; either reports the exact
            # step reached (a cancel between attempts carries no progress).
            with contextlib.suppress(asyncio.TimeoutError):
                await workflow.wait_condition(
                    lambda: handle.done(), timeout=policies.CHUNK_DEATH_REPORT_GRACE
                )
        if not handle.done():
            handle.cancel()
        else:
            stop.cancel()
        try:
            result = await handle
        except ActivityError as err:
            # A cancel request surfaces here as the chunk's own cancellation (when we were
            # stopping the chunk anyway): it is the job's cancel, not a pause or a death.
            ctx.stop_if_cancelled()
            # A cancel we asked for (no attempt was running, so no partial result).
            if is_cancelled_exception(err) and ctx.pause_requested:
                # Temporal answers the cancel of an activity not running with
                # ACTIVITY_ID_NOT_STARTED whether no attempt ever started or one is between
                # attempts; and an attempt that timed out may still have reached the trainer
                # (its worker too busy to heartbeat): how far the model got, and which seq_ids
                # it took, is unknown. The pause keeps no checkpoint of it (its save could reuse
                # a seq_id, or hold steps the job never counted): it resumes from the last.
                self.position_unknown = True
                raise PauseNow() from None
            if is_cancelled_exception(err) and died():
                # Cancelled: a running attempt's cancellation carries its last heartbeat (how
                # far the dead trainer got); one between attempts carries none (Temporal's
                # ACTIVITY_ID_NOT_STARTED), and the recovery counts from the last chunk's end.
                lost = ctx.death_event()
                lost.applied_step = self._heartbeat_step(ctx, err)
                raise lost from None
            ctx.raise_mapped(err, "ChunkTimeout", "training")
        ctx.model().next_seq = result.next_seq
        if not result.partial:
            return result
        ctx.s.step = max(ctx.s.step, result.last_step)
        ctx.stop_if_cancelled()  # the chunk stopped for the job's cancel
        if died():
            lost = ctx.death_event()
            lost.applied_step = result.last_step
            raise lost
        raise PauseNow()

    @staticmethod
    def _heartbeat_step(ctx: JobContext, err: ActivityError) -> int | None:
        """The step in the last heartbeat of a cancelled chunk (for this model), if any."""
        details = getattr(err.cause, "details", None) or ()
        beat = details[0] if details and isinstance(details[0], dict) else {}
        if beat.get("model_id") != ctx.model().model_id:
            return None
        step = beat.get("step")
        return step if isinstance(step, int) else None

    # ------------------------------------------------------------------ checkpoints

    async def checkpoint(
        self, ctx: JobContext, name: str, *, evaluate: bool | None = None
    ) -> CheckpointRecord:
        ctx.set_phase(Phase.CHECKPOINTING)
        saved = await ctx.act(
            CheckpointActivities.save_checkpoint,
            SaveCheckpointInput(
                backend=ctx.spec.backend,
                trainer_job_id=ctx.ref().trainer_job_id,
                base_model=ctx.spec.trainer.base_model,
                session=ctx.model(),
                name=name,
                step=ctx.s.step,
                call_timeout_s=ctx.call_timeout_s(),
            ),
            ctx.pol.data_plane_call,
            f"save checkpoint {name}",
        )
        ctx.model().next_seq = saved.next_seq
        record = saved.record
        record.saved_at = workflow.now()
        if ctx.spec.checkpoint.evaluate if evaluate is None else evaluate:
            record.metric = await self._evaluate(ctx)
            if checkpointing.is_better(ctx, record):
                ctx.s.best = record
            if ctx.report_to:
                await self._report(ctx, record)
        checkpointing.add(ctx, record)
        await checkpointing.prune(ctx, self.keep())
        ctx.publish()
        if not name.startswith("pause-"):
            await slot.note_checkpoint(ctx)  # (it may make way for a more urgent job now)
        return record

    async def _report(self, ctx: JobContext, record: CheckpointRecord) -> None:
        """Best effort: a sweep that is gone must not fail its trial."""
        if not ctx.report_to or record.metric is None:
            return
        ctx.stop_if_cancelled()
        try:
            await workflow.get_external_workflow_handle(ctx.report_to).signal(
                "trial_progress",
                TrialProgress(
                    workflow_id=ctx.s.workflow_id, step=record.step, metric=record.metric
                ),
            )
        except FailureError as exc:
            workflow.logger.warning("progress report to %s failed: %s", ctx.report_to, exc)

    async def _evaluate(self, ctx: JobContext) -> float:
        result = await ctx.act(
            TrainingActivities.evaluate,
            EvaluateInput(
                backend=ctx.spec.backend,
                trainer_job_id=ctx.ref().trainer_job_id,
                base_model=ctx.spec.trainer.base_model,
                session=ctx.model(),
                step=ctx.s.step,
                settings=self._settings(ctx),
                call_timeout_s=ctx.call_timeout_s(),
            ),
            ctx.pol.data_plane_call,
            "evaluate",
        )
        ctx.model().next_seq = result.next_seq
        metric = ctx.spec.checkpoint.metric
        if metric not in result.metrics:
            raise Terminal(
                Phase.FAILED,
                policies.METRIC_MISSING,
                f"checkpoint.metric: the trainer's evaluation reports {sorted(result.metrics)}, "
                f"not {metric!r}",
            )
        ctx.s.eval_value = result.metrics[metric]
        add_point(ctx.s.eval_curve, ctx.s.step, ctx.s.eval_value)
        return result.metrics[metric]
