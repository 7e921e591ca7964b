"""The trainer's life as the job sees it: create one, wait for placement and for RUNNING
(polls raced against the platform's events), hand it to the work that runs on it (which
opens its model or warms its route up), and delete it.

Reads and changes the job's :class:`~workflows.context.JobContext`; activities:
``create_trainer``, ``wait_for_placement``, ``wait_for_running`` (and, for recoveries,
``wait_for_resumable``), ``delete_trainer``, under the policies of the same names.

Deterministic code only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    import workflows.measures as measures
    import workflows.versions as versions
    from activities.provisioning import ProvisioningActivities
    from activities.readiness import ReadinessActivities
    from shepherd import search_attributes as sa
    from shepherd.models import CreateTrainerInput, PlatformJob, TrainerRef
    from shepherd.phases import Phase
    from shepherd.platform import rules
    from workflows.context import JobContext
    from workflows.flow import DEAD, PLACED, RUNNING, PauseNow
    from workflows.held import TrainerWork
    from workflows.policies import ActivityPolicy


async def provision(ctx: JobContext, work: TrainerWork) -> None:
    """A new trainer job (a new id: deleted ids are never reused), ready to work."""
    ctx.s.generation = 0 if ctx.s.trainer_job_id is None else ctx.s.generation + 1
    ctx.s.trainer_job_id = f"{ctx.prefix}-g{ctx.s.generation}"
    ctx.event_state, ctx.observed_at, ctx.serving = None, None, False
    ctx.session = None
    ctx.upsert([sa.TRAINER_JOB_ID.value_set(ctx.s.trainer_job_id)])
    ctx.set_phase(Phase.QUEUED)
    t = ctx.spec.trainer
    # From the create request on, the trainer may exist: a cancel waits for the create to
    # end and cleanup deletes the id (a trainer created after its delete would be nobody's).
    ctx.trainer_live = True
    job = await ctx.act(
        ProvisioningActivities.create_trainer,
        CreateTrainerInput(
            backend=ctx.spec.backend,
            trainer_job_id=ctx.s.trainer_job_id,
            trainer=t,
            shape_version=ctx.shape_version,
            seed=ctx.spec.training.seed,
            preemptible=ctx.preemptible,
            display_name=(t.display_name or ctx.s.workflow_id)[: rules.MAX_DISPLAY_NAME_LEN],
        ),
        ctx.pol.create_trainer,
        f"create trainer {ctx.s.trainer_job_id}",
        wait_for_cancel=True,
    )
    ctx.observe(job)
    await come_up(ctx, work)


async def come_up(ctx: JobContext, work: TrainerWork) -> None:
    """From a created or resumed job to a trainer the work is ready on. The work gets ready
    from the placement on, beside the wait for RUNNING: the RUNNING event's delivery and a
    workflow task are then off a handover's path (policies.BOOT_PROBE_FIRST)."""
    await await_state(
        ctx,
        ReadinessActivities.wait_for_placement,
        PLACED,
        ctx.pol.wait_placement,
        "PendingTimeout",
        "placement",
    )
    ctx.set_phase(Phase.SCHEDULING)
    ctx.session = None  # a (re)started trainer holds no model
    early = _ready_early(ctx, work)
    await await_state(
        ctx,
        ReadinessActivities.wait_for_running,
        RUNNING,
        ctx.pol.wait_running,
        "ReadyTimeout",
        "RUNNING",
        beside=early,
    )
    ctx.set_phase(Phase.PREPARING)
    running_at = workflow.now()
    await (early if early is not None else work.prepare(ctx))
    measures.readiness_lag(ctx.spec.backend, running_at)
    if not ctx.recovering:
        ctx.close_recovery_record()  # (a job that made way for another is back)


def _ready_early(ctx: JobContext, work: TrainerWork) -> asyncio.Future[None] | None:
    """The work's preparation, started before the trainer is RUNNING (None where it is)."""
    if ctx.event_state in RUNNING or not workflow.patched(versions.PREPARE_WHILE_BOOTING):
        return None
    return asyncio.ensure_future(work.prepare(ctx, booting=True))


@contextlib.asynccontextmanager
async def _cancelled_on_error(beside: asyncio.Future[None] | None) -> AsyncIterator[None]:
    """``beside`` cancelled (and its outcome collected) when the block is left by an error."""
    try:
        yield
    except BaseException:
        if beside is not None:
            beside.cancel()  # (a no-op once it ended: its outcome is collected all the same)
            await asyncio.gather(beside, return_exceptions=True)
        raise


async def await_state(
    ctx: JobContext,
    poll: Callable[[Any, TrainerRef], Awaitable[PlatformJob]],
    targets: set[str],
    policy: ActivityPolicy,
    timeout_type: str,
    what: str,
    *,
    death_is_loss: bool = True,
    beside: asyncio.Future[None] | None = None,
) -> PlatformJob | None:
    """Wait for the trainer to reach ``targets``: a polling activity (retries are the poll
    interval) raced against platform events, whichever knows first. A pause asked for meanwhile
    (outside a recovery) stops the wait (:class:`PauseNow`); a death is a loss. A long wait (a
    slot, for days) continues-as-new when the history grows long; the next run waits on
    (``recovery.come_back``). Not the recovery's own short wait for a resumable state: a run
    continued there would not know that the trainer still needs resuming.

    ``beside``: work started with the wait that can only end once the trainer is there (the
    model opened while it boots): its end ends the wait too (the caller awaits it for its
    outcome); any other way out of the wait cancels it first."""
    async with _cancelled_on_error(beside):
        if ctx.event_state in targets:
            return None
        # The recovery's first wait (RECOVERING) is neither paused nor continued.
        interruptible = ctx.stage is not Phase.RECOVERING

        def event_says() -> bool:
            if ctx.cancel_seen() or (beside is not None and beside.done()):
                return True
            if interruptible and (ctx.pause_requested or ctx.history_long()):
                return True
            if ctx.event_state in targets:
                return True
            return death_is_loss and ctx.event_state in DEAD

        ctx.stop_if_cancelled()
        handle = workflow.start_activity_method(
            poll, ctx.ref(), **ctx.options(policy), summary=f"wait for {what}"
        )
        waiter = asyncio.ensure_future(workflow.wait_condition(event_says))
        await ctx.race(handle, waiter)
        if handle.done():
            waiter.cancel()
            try:
                job = handle.result()
            except ActivityError as err:
                ctx.raise_mapped(err, timeout_type, what)
            ctx.observe(job)
            return job
        there_beside = beside is not None and beside.done()
        if interruptible and not ctx.cancel_seen() and not there_beside:
            await ctx.maybe_continue_as_new()  # (the poll is left behind with the old run)
        handle.cancel()
        with contextlib.suppress(ActivityError):
            await handle
        # The poll's cancellation is expected; a cancel request meanwhile surfaces as it.
        ctx.stop_if_cancelled()
        if there_beside:
            return None
        if interruptible and ctx.pause_requested:
            raise PauseNow()
        if ctx.event_state in targets:
            return None
        raise ctx.death_event()


async def delete(ctx: JobContext) -> None:
    """Give the trainer back (sent even after a cancel request)."""
    if not ctx.trainer_live or ctx.s.trainer_job_id is None:
        return
    ctx.s.cleanup = "deleting"
    deleted = await ctx.act(
        ProvisioningActivities.delete_trainer,
        ctx.ref(),
        ctx.pol.delete_trainer,
        "delete the trainer",
        cleanup=True,
    )
    if deleted is not None:
        ctx.observe(deleted)
    ctx.trainer_live = ctx.serving = False
    ctx.session = None
    ctx.s.cleanup = "done"
