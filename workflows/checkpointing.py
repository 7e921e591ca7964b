"""The job's checkpoints, whichever work took them: the list ``status`` shows, the best by
the tracked metric, which one a recovery or a resume starts from, keeping the last K, and
whether a checkpoint can start a trainer of this job at all.

Reads and changes the job's :class:`~workflows.context.JobContext`; activities:
``prune_checkpoints`` (policy ``prune``), ``check_checkpoint`` (policy ``lookup``).

Deterministic code only.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import workflows.versions as versions
    from activities.checkpoints import CheckpointActivities
    from shepherd.models import CheckCheckpointInput, CheckpointRecord, PruneCheckpointsInput
    from workflows.context import JobContext


def is_better(ctx: JobContext, record: CheckpointRecord) -> bool:
    """Whether ``record`` beats the job's best by the tracked metric (``checkpoint.mode``).
    A tie goes to the later checkpoint: where the metric does not tell two checkpoints
    apart (an RL objective that is 0.0 at every step), the one trained longer is the best,
    and ``status`` does not call either of them best for their metric
    (``JobStatus.best_decided``)."""
    best = ctx.s.best
    if best is None or best.metric is None:
        return True
    if record.metric is None:
        return False
    if record.metric == best.metric and workflow.patched(versions.TIES_GO_TO_THE_LATER):
        return True
    return (
        record.metric < best.metric
        if ctx.spec.checkpoint.mode == "min"
        else (record.metric > best.metric)
    )


def add(ctx: JobContext, record: CheckpointRecord) -> None:
    """``record`` into the job's list (a name saved again replaces its entry), by step."""
    ctx.s.checkpoints = [c for c in ctx.s.checkpoints if c.name != record.name] + [record]
    # By model (a program that trained several), then by step.
    ctx.s.checkpoints.sort(key=lambda c: (c.model or 0, c.step, c.saved_at or workflow.now()))


def recovery_checkpoint(ctx: JobContext) -> str | None:
    """Where a new trainer starts from: the best or the last checkpoint (as the spec says),
    else the spec's ``training.resume_from``."""
    if ctx.spec.checkpoint.resume_from == "best" and ctx.s.best:
        return ctx.s.best.name
    if mine := ctx.s.followed_checkpoints():
        return max(mine, key=lambda c: c.step).name
    return ctx.spec.training.resume_from


async def prune(ctx: JobContext, also_keep: set[str]) -> None:
    """Keep the last K checkpoints, the best, the one a pause saved or a trainer will load,
    and ``also_keep`` (what the work needs: a program's restore point)."""
    if ctx.prune_unsupported:
        return
    # Only the followed model's: another model's last checkpoint may be where the proxy
    # restores that model from (a program's earlier stage it still uses).
    mine = ctx.s.followed_checkpoints()
    keep = {c.name for c in ctx.s.checkpoints if c not in mine}
    keep |= {c.name for c in mine[-ctx.spec.checkpoint.keep_last :]}
    keep |= {c.name for c in (ctx.s.best,) if c} | {
        n for n in (ctx.s.paused_checkpoint, ctx.to_load, *also_keep) if n
    }
    doomed = [c for c in ctx.s.checkpoints if c.name not in keep]
    if not doomed:
        return
    names = [n for c in doomed for n in (c.name, c.sampler) if n]
    result = await ctx.act(
        CheckpointActivities.prune_checkpoints,
        PruneCheckpointsInput(backend=ctx.spec.backend, checkpoints=names),
        ctx.pol.prune,
        f"prune {len(doomed)} old checkpoint(s)",
    )
    ctx.prune_unsupported = result.unsupported
    gone = set(result.deleted)
    ctx.s.checkpoints = [c for c in ctx.s.checkpoints if c.name not in gone]


async def problem(ctx: JobContext, checkpoint: str) -> str | None:
    """Why a trainer of this job cannot start from ``checkpoint`` (None: it can)."""
    t = ctx.spec.trainer
    checked = await ctx.act(
        CheckpointActivities.check_checkpoint,
        CheckCheckpointInput(
            backend=ctx.spec.backend,
            checkpoint=checkpoint,
            base_model=t.base_model,
            lora_rank=t.lora_rank,
        ),
        ctx.pol.lookup,
        f"check checkpoint {checkpoint.rsplit('/', 1)[-1]}",
    )
    return checked.problem
