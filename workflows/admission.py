"""Everything a job checks and claims before any trainer exists: a scheduled run's templates
and its output model's claim, the worker-side preflight (loop or program, metric, dataset,
base model, deployments), the training shape, the checkpoint it starts from and whether its
output model id is free. A failure here costs no GPU.

Admission itself (priority, quotas, a place in line) is workflows/slot.py; the preflight
sends the job's first ask there.

Reads and changes the job's :class:`~workflows.context.JobContext`; activities:
``take_model_claim``/``settle_model_claim``, ``preflight``, ``resolve_shape``,
``check_checkpoint``, ``check_model_free``, all under the ``lookup`` policy.

Deterministic code only.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    import workflows.checkpointing as checkpointing
    import workflows.policies as policies
    import workflows.slot as slot
    import workflows.versions as versions
    from activities.claims import MODEL_CLAIMED, ClaimActivities, ClaimInput
    from activities.preflight import PreflightActivities
    from activities.promotion import PromotionActivities
    from activities.provisioning import ProvisioningActivities
    from shepherd import search_attributes as sa
    from shepherd.models import PreflightInput, PreflightResult, PromoteInput, ResolveShapeInput
    from shepherd.phases import Phase
    from shepherd.spec import SpecError, resolve_templates
    from workflows.context import JobContext, root_cause
    from workflows.flow import Terminal, required


async def admit(ctx: JobContext) -> None:
    """A new job's checks and claims, in order; any failure ends it before provisioning."""
    if ctx.templated:
        fill_templates(ctx)
        await claim_model(ctx)
    await preflight(ctx)
    spec = ctx.spec
    if spec.trainer.training_shape and ctx.shape_version is None:
        shape = await ctx.act(
            ProvisioningActivities.resolve_shape,
            ResolveShapeInput(backend=spec.backend, shape=spec.trainer.training_shape),
            ctx.pol.lookup,
            "resolve the training shape",
        )
        ctx.shape_version = shape.version
    if spec.training.resume_from and not ctx.s.checkpoints:
        ctx.to_load = spec.training.resume_from
        if problem := await checkpointing.problem(ctx, ctx.to_load):
            raise Terminal(Phase.FAILED, "InvalidCheckpoint", f"training.resume_from: {problem}")
    if spec.output.promote != "none":
        await check_model_free(ctx)


async def preflight(ctx: JobContext) -> None:
    """What only a worker can check (the loop, the metric it reports, the dataset, the base
    model), before anything is provisioned: a failure ends the job here, naming every field
    (activities/preflight.py)."""
    spec = ctx.spec
    c, tr = spec.checkpoint, spec.training
    program = tr.program is not None
    # Where the backend has a scheduler, the preflight also sends the job's first ask: one
    # activity and one workflow task fewer in every job's intake (a burst of thousands).
    ask = slot.new_request(ctx) if workflow.patched(versions.ASK_WITH_PREFLIGHT) else None
    checked: PreflightResult | None = await ctx.act(
        PreflightActivities.preflight,
        PreflightInput(
            backend=spec.backend,
            base_model=spec.trainer.base_model,
            # A program's job: the program (and its arguments) instead of the loop, the
            # metric and the dataset (a program reads its own data).
            loop=None if program else tr.loop,
            program=tr.program,
            args=dict(tr.args),
            metric=None if program or not c.evaluate else c.metric,
            dataset=None if program else tr.dataset,
            validation_split=tr.validation_split,
            deployments={
                field: name
                for field, name in (
                    ("trainer.hot_load_deployment", spec.trainer.hot_load_deployment),
                    ("output.hot_load_deployment", spec.output.hot_load_deployment),
                )
                if name
            },
            ask=ask,
        ),
        ctx.pol.lookup,
        "preflight: loop, metric, dataset, base model",
    )
    if checked is not None and checked.total_steps and not spec.training.total_steps:
        ctx.s.total_steps = checked.total_steps  # a program's, from its arguments
    if checked is not None:
        ctx.slot.enabled = checked.admission
    if ask is not None:
        slot.asked_ahead(ctx, checked is not None and checked.asked)


def fill_templates(ctx: JobContext) -> None:
    """A scheduled run: fill the spec's templates with this run's scheduled time."""
    info = workflow.info()
    when = info.typed_search_attributes.get(sa.SCHEDULED_START) or info.start_time
    try:
        ctx.spec = resolve_templates(ctx.spec, when, strict=False)
    except SpecError as exc:
        raise Terminal(Phase.FAILED, "InvalidSpec", str(exc)) from None
    ctx.templated = False
    ctx.s.labels = ctx.spec.labels
    ctx.upsert([sa.LABELS.value_set(ctx.spec.label_keywords())])


async def claim_model(ctx: JobContext) -> None:
    """A scheduled run's model id is known only now: claim it as a submission would, before
    anything is provisioned, so a second live job with the same id fails here and not at
    promotion. Set after the check (under the claim lock, see activities/claims.py), so that
    of two runs starting together one wins."""
    model_id = ctx.spec.output.model_id
    if ctx.spec.output.promote == "none" or not model_id or not ctx.visible:
        return  # nothing is promoted, or no search attributes to claim with
    try:
        lock = await ctx.act(
            ClaimActivities.take_model_claim,
            ClaimInput(model_id=model_id),
            ctx.pol.lookup,
            f"claim output model {model_id}",
        )
    except ActivityError as err:
        root = root_cause(err)
        if getattr(root, "type", None) == MODEL_CLAIMED:
            raise Terminal(
                Phase.FAILED, MODEL_CLAIMED, getattr(root, "message", str(root))
            ) from None
        raise
    ctx.upsert([sa.OUTPUT_MODEL.value_set(model_id)])
    await ctx.act(
        ClaimActivities.settle_model_claim, lock, ctx.pol.lookup, "publish the model claim"
    )


async def check_model_free(ctx: JobContext) -> None:
    """A taken output model id fails the job before any GPU is spent on it."""
    model_id = required(ctx.spec.output.model_id, "output.model_id")
    probe = PromoteInput(
        backend=ctx.spec.backend,
        trainer_job_id="",
        checkpoint="",
        model_id=model_id,
        base_model=ctx.spec.trainer.base_model,
    )
    try:
        await ctx.act(
            PromotionActivities.check_model_free,
            probe,
            ctx.pol.lookup,
            "check the output model id",
        )
    except ActivityError as err:
        if getattr(root_cause(err), "type", None) == policies.MODEL_EXISTS:
            raise Terminal(
                Phase.FAILED, policies.MODEL_EXISTS, getattr(root_cause(err), "message", "")
            ) from None
        raise
