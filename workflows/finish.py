"""The end of a job: the work's last duties and the trainer given back (EVALUATING), the
chosen checkpoint promoted to a model (EXPORTING) and served where the spec says; and, for
every ending, the cleanup that always runs and the outcome recorded.

Reads and changes the job's :class:`~workflows.context.JobContext`; activities:
``promote_checkpoint`` (policy ``promote``; a cancel waits for it), ``wait_for_model``,
``publish_to_deployment``, ``retract_model``, and the trainer's delete.

Deterministic code only.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    import workflows.policies as policies
    import workflows.slot as slot
    import workflows.trainer as trainer
    from activities.promotion import PromotionActivities
    from shepherd import search_attributes as sa
    from shepherd.models import ErrorInfo, ModelInfo, PromoteInput, PublishInput
    from shepherd.phases import Phase
    from workflows.context import JobContext, root_cause
    from workflows.flow import Terminal, required
    from workflows.held import TrainerWork


async def evaluate(ctx: JobContext, work: TrainerWork) -> None:
    """What the work owes at its end (a loop's final evaluation); then the GPUs go back:
    the checkpoint is all promotion needs."""
    ctx.set_phase(Phase.EVALUATING)
    await work.finish(ctx)
    await slot.give_back_with(ctx, trainer.delete(ctx))


async def promote(ctx: JobContext) -> None:
    """The best or the last checkpoint, as ``output.promote`` says, made a model."""
    output = ctx.spec.output
    if output.promote == "none":
        return
    chosen = ctx.s.best if output.promote == "best" else ctx.s.last_checkpoint
    if chosen is None and output.promote == "best" and ctx.s.checkpoints:
        metric = ctx.spec.checkpoint.metric
        wrote = ", ".join(sorted(ctx.s.metrics)[:12])
        raise Terminal(
            Phase.FAILED,
            policies.METRIC_MISSING,
            f"output.promote: 'best', but no checkpoint was measured by checkpoint.metric "
            f"{metric!r}"
            + (f" (the program's metrics file has {wrote})" if wrote else "")
            + f"; its checkpoints are kept: promote one with its name (last: "
            f"{ctx.s.checkpoints[-1].name})",
        )
    if chosen is None:
        program = ctx.spec.training.program
        raise Terminal(
            Phase.FAILED,
            policies.NO_CHECKPOINT,
            f"output.promote: {output.promote!r}, but the job has no checkpoint to promote"
            + (
                f" (program {program!r} made no model: set output.promote to 'none' for a "
                "program that trains nothing)"
                if program
                else ""
            ),
        )
    model_id = required(output.model_id, "output.model_id")
    ctx.set_phase(Phase.EXPORTING)
    request = PromoteInput(
        backend=ctx.spec.backend,
        trainer_job_id=chosen.trainer_job_id,
        # The promotable (sampler) twin of the chosen checkpoint, as hosted trainers need.
        checkpoint=chosen.sampler or chosen.name,
        model_id=model_id,
        base_model=ctx.spec.trainer.base_model,
    )
    ctx.promotion = request
    # A cancel waits for the promote call to end, so that taking the model back comes after
    # it: a promotion the platform finishes later would bring the model back.
    model: ModelInfo = await ctx.act(
        PromotionActivities.promote_checkpoint,
        request,
        ctx.pol.promote,
        f"promote {chosen.name.rsplit('/', 1)[-1]}",
        wait_for_cancel=True,
    )
    if model.state != "READY":
        model = await ctx.act(
            PromotionActivities.wait_for_model,
            request,
            ctx.pol.wait_model,
            "wait for the model",
        )
    ctx.promotion = None
    ctx.s.model = model
    ctx.upsert([sa.MODEL.value_set(model.name)])


async def publish(ctx: JobContext) -> None:
    """Serve the job's result: hot-load the promoted checkpoint (or, promoting none, the best
    or last) onto ``output.hot_load_deployment``."""
    deployment = required(ctx.spec.output.hot_load_deployment, "the deployment to publish to")
    output = ctx.spec.output
    chosen = ctx.s.best if output.promote == "best" else ctx.s.last_checkpoint
    chosen = chosen or ctx.s.best or ctx.s.last_checkpoint
    if chosen is None:
        return
    ctx.s.deployment = await ctx.act(
        PromotionActivities.publish_to_deployment,
        PublishInput(
            backend=ctx.spec.backend,
            deployment=deployment,
            checkpoint=chosen.sampler or chosen.name,
            base_model=ctx.spec.trainer.base_model,
        ),
        ctx.pol.publish,
        f"hot-load {chosen.name.rsplit('/', 1)[-1]} onto {deployment}",
    )
    ctx.publish()


async def finish(ctx: JobContext, work: TrainerWork, phase: Phase, error: ErrorInfo | None) -> None:
    """Always give the trainer back, then record the outcome. A failing cleanup is reported
    on its own and never replaces the job's outcome."""
    ctx.s.error = error
    try:
        await work.stop(ctx)  # before its trainer goes (it would only meet errors)
        await slot.give_back_with(ctx, trainer.delete(ctx))
        if phase is Phase.CANCELLED and ctx.promotion is not None:
            await ctx.act(
                PromotionActivities.retract_model,
                ctx.promotion,
                ctx.pol.retract_model,
                "take the promoted model back",
                cleanup=True,
            )
    except ActivityError as err:
        ctx.s.cleanup = f"failed: {getattr(root_cause(err), 'message', str(err))}"
    if ctx.s.cleanup == "pending":
        ctx.s.cleanup = "done"
    ctx.set_phase(phase)
