"""Bringing the trainer back after it stopped serving, and pausing the job meanwhile.

A loss is classified from the platform's own words (:func:`classify`): a preemption or a
platform restart is paid from the infrastructure budget (``policies.max_preemptions``), a
failure from ``policies.max_failures``; a trainer deleted outside Shepherd, or refused for a
reason a new one would meet again, fails the job at once. Otherwise the trainer is resumed
(or, after enough preemptions of a spot trainer, replaced by an on-demand one) and comes up
again; the work restores itself from the last checkpoint (``to_load``).

A pause checkpoints the work, lets the trainer go (no GPU is held) and waits for a resume.

Reads and changes the job's :class:`~workflows.context.JobContext`; activities:
``wait_for_resumable`` (policy ``wait_resumable``), ``resume_trainer``, and the trainer's
(workflows/trainer.py) and checkpoints' (workflows/checkpointing.py).

Deterministic code only.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import workflows.checkpointing as checkpointing
    import workflows.measures as measures
    import workflows.policies as policies
    import workflows.slot as slot
    import workflows.trainer as trainer
    import workflows.versions as versions
    from activities.readiness import ReadinessActivities
    from activities.recovery import RecoveryActivities
    from shepherd.models import PlatformJob, RecoveryRecord
    from shepherd.phases import Phase
    from shepherd.states import JobState
    from workflows.context import JobContext
    from workflows.flow import DEAD, RESUMABLE_OR_RUNNING, Lost, Terminal
    from workflows.held import TrainerWork

#: A trainer that died with these codes was refused by the platform (its configuration, its
#: data): another trainer would die the same way, so the job fails at once, in its words.
_REFUSED_CODES = {"INVALID_ARGUMENT", "FAILED_PRECONDITION"}
#: Recoveries caused by the infrastructure, paid from the preemption budget.
_INFRA_REASONS = {"preemption", "platform_restart", "idle"}


def classify(job: PlatformJob | None) -> str:
    """Why a trainer died, from the platform's own words."""
    if job is None:
        return "failure"
    state = JobState(job.state)
    message = job.message.lower()
    if state.is_gone():
        return "deleted"
    if state is JobState.IDLE:
        return "idle"
    if "restart" in message:
        return "platform_restart"
    if job.status_code == "UNAVAILABLE" or any(
        w in message for w in ("preempt", "reclaim", "spot")
    ):
        return "preemption"
    if job.status_code in _REFUSED_CODES:
        return "refused"
    return "failure"


async def recover(ctx: JobContext, work: TrainerWork, lost: Lost) -> None:
    """The trainer behind ``lost`` serving again (or the job ended, if it cannot be)."""
    if lost.job is None and lost.kind == policies.TRAINER_LOST:
        lost = await _platform_view(ctx, lost)
    job = lost.job
    at_step = max(ctx.s.step, lost.applied_step or 0)
    reason = "deleted" if lost.kind == policies.TRAINER_GONE else classify(job)
    if lost.kind not in (policies.TRAINER_LOST, policies.TRAINER_GONE):
        reason = "failure"
    if reason == "refused":
        raise Terminal(
            Phase.FAILED,
            "TrainerRefused",
            f"trainer {ctx.s.trainer_job_id} failed for a reason a new one would meet "
            f"again: {job.message if job else lost.detail}",
        )
    if reason == "deleted":
        ctx.trainer_live = False
        raise Terminal(
            Phase.FAILED,
            "TrainerDeleted",
            f"trainer {ctx.s.trainer_job_id} was deleted outside Shepherd "
            f"({job.state if job else '?'})",
        )
    _charge(ctx, reason, lost)
    record = RecoveryRecord(
        number=len(ctx.s.recoveries) + 1,
        reason=reason,
        platform_state=job.state if job else "",
        message=(job.message if job and job.message else lost.detail)[:500],
        at_step=at_step,
        started_at=workflow.now(),
    )
    ctx.s.recoveries.append(record)
    measures.recovery(ctx.spec.backend, reason)
    ctx.serving = False
    ctx.session = None
    if job is not None and job.trainer_job_id == ctx.s.trainer_job_id:
        ctx.observe(job)
    else:
        ctx.event_state = None  # unknown: ask the platform, do not trust an old event
    ctx.set_phase(Phase.RECOVERING)
    ctx.recovering = True
    ctx.to_load = checkpointing.recovery_checkpoint(ctx)
    fallback = ctx.pol.fallback_to_on_demand_after
    if ctx.preemptible and fallback is not None and ctx.s.preemptions >= fallback:
        # Keep getting reclaimed: continue on a non-preemptible trainer instead.
        record.action = "new-trainer"
        await trainer.delete(ctx)
        ctx.preemptible = False
        await trainer.provision(ctx, work)
    else:
        state = await trainer.await_state(
            ctx,
            ReadinessActivities.wait_for_resumable,
            RESUMABLE_OR_RUNNING,
            ctx.pol.wait_resumable,
            "RecoveryTimeout",
            "a resumable state",
            death_is_loss=False,
        )
        current = state.state if state else ctx.event_state
        if current != JobState.RUNNING.value:
            resumed = await ctx.act(
                RecoveryActivities.resume_trainer,
                ctx.ref(),
                ctx.pol.resume_trainer,
                "resume the trainer",
                timeout_type="RecoveryTimeout",
            )
            ctx.observe(resumed)
        ctx.set_phase(Phase.QUEUED)  # (only the stage changes: no command)
        await trainer.come_up(ctx, work)
    _recovered(ctx)


async def come_back(ctx: JobContext, work: TrainerWork) -> None:
    """A run continued from another (continue-as-new) while its trainer was coming up, after
    its creation or in a recovery: wait on for it."""
    await trainer.come_up(ctx, work)
    if ctx.recovering:
        _recovered(ctx)


def _recovered(ctx: JobContext) -> None:
    """The trainer serves again: the recovery's record is complete."""
    ctx.recovering = False
    ctx.close_recovery_record()


async def _platform_view(ctx: JobContext, lost: Lost) -> Lost:
    """A loss known only by the proxy's word (or a failed call's), the platform's view of the
    trainer not in it: wait until the platform says what the trainer is (resumable, or
    running) — a restarting platform answers once it is back, and says it restarted — so the
    loss is counted for what it was (a platform restart is no trainer failure)."""
    if not workflow.patched(versions.ASK_THE_PLATFORM_WHY):
        return lost
    ctx.set_phase(Phase.RECOVERING)  # (the wait is neither paused nor continued)
    ctx.event_state = None  # an old event's RUNNING is no answer
    await trainer.await_state(
        ctx,
        ReadinessActivities.wait_for_resumable,
        RESUMABLE_OR_RUNNING,
        ctx.pol.wait_resumable,
        "RecoveryTimeout",
        "the platform's word on the lost trainer",
        death_is_loss=False,
    )
    if ctx.event_state in DEAD:
        dead = ctx.death_event()
        return Lost(dead.kind, dead.job, lost.detail, lost.applied_step)
    return lost


def _charge(ctx: JobContext, reason: str, lost: Lost) -> None:
    """Count the loss against its budget; an exhausted budget ends the job."""
    if reason in _INFRA_REASONS:
        # A platform restart is no preemption (and no reason to leave spot capacity); it is
        # paid from the same infrastructure budget.
        if reason == "platform_restart":
            ctx.s.platform_restarts += 1
        else:
            ctx.s.preemptions += 1
        infra = ctx.s.preemptions + ctx.s.platform_restarts
        if infra > ctx.pol.max_preemptions:
            restarts = ctx.s.platform_restarts
            raise Terminal(
                Phase.PREEMPTED,
                "PreemptionBudgetExhausted",
                f"{ctx.s.preemptions} preemptions"
                + (f" and {restarts} platform restarts" if restarts else "")
                + f" exceed policies.max_preemptions ({ctx.pol.max_preemptions}); "
                f"retry from checkpoint {checkpointing.recovery_checkpoint(ctx) or '(none)'}",
            )
        return
    ctx.s.failures += 1
    if ctx.s.failures > ctx.pol.max_failures:
        raise Terminal(
            Phase.FAILED,
            "TrainerFailed",
            f"{ctx.s.failures} trainer failures exceed policies.max_failures "
            f"({ctx.pol.max_failures}); last: {lost.detail}",
        )


async def pause(ctx: JobContext, work: TrainerWork) -> None:
    """Checkpoint the work, let the trainer go, wait for a resume (from the checkpoint the
    resume names, checked first, else the pause's). A run continued from a paused one
    (continue-as-new) is paused already: it only waits. A pause the scheduler asked for (the
    job makes way for a more urgent one) waits for nobody: the job asks for its slot again,
    keeping its place, and goes on from the checkpoint when its turn comes."""
    if ctx.s.phase is not Phase.PAUSED:
        ctx.pauses += 1
        at_step = ctx.s.step
        record = await work.checkpoint_for_pause(ctx)
        checkpoint = record.name if record else checkpointing.recovery_checkpoint(ctx)
        if record:
            ctx.s.step = record.step
        ctx.to_load = checkpoint
        await trainer.delete(ctx)  # no GPU is held while paused
        ctx.pause_requested = False
        if (notice := ctx.slot.make_way) is not None:
            ctx.slot.make_way = None
            ctx.s.priority_preemptions += 1
            ctx.s.recoveries.append(
                RecoveryRecord(
                    number=len(ctx.s.recoveries) + 1,
                    reason="priority",
                    platform_state="",
                    message=f"made way for {notice.for_job}: {notice.reason}"[:500],
                    at_step=at_step,
                    started_at=workflow.now(),
                    action="requeue",
                )
            )
            measures.recovery(ctx.spec.backend, "priority")
            await slot.give_back(ctx, requeue=True, waits=True)
            return
        await slot.give_back(ctx, waits=True)
        ctx.s.paused_checkpoint = checkpoint
        ctx.set_phase(Phase.PAUSED)
    while True:
        await workflow.wait_condition(
            lambda: ctx.resume_requested or ctx.cancel_seen() or ctx.history_long()
        )
        ctx.stop_if_cancelled()
        if not ctx.resume_requested:
            await ctx.maybe_continue_as_new()  # a pause of weeks, answering signals
            continue
        chosen, ctx.resume_checkpoint = ctx.resume_checkpoint, None
        # A resume by signal has no answer: a bad checkpoint keeps the job PAUSED and says
        # why in its status (the resume update answered already, when it checked).
        unchecked = chosen and not ctx.resume_checked
        if unchecked and (problem := await checkpointing.problem(ctx, chosen or "")):
            ctx.resume_requested = False
            ctx.notice(f"resume refused: {problem}")
            continue
        ctx.resume_requested = ctx.resume_checked = False
        if chosen:
            ctx.to_load = chosen
        return
