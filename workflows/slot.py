"""A job's slot on its backend: taken before its trainer is created, held through recoveries
(a preemption by the platform is no reason to lose one's place), given back wherever the
trainer goes for good or for a while — the finish's cleanup on every ending, a pause, and a
priority preemption (the scheduler asked it to make way: it requeues, keeping its place).

Only where the backend's profile declares its capacity (``slots``): the backend's scheduler
(workflows/scheduler.py) then decides who is admitted; elsewhere the platform's own queue
does, as before.

Reads and changes the job's :class:`~workflows.context.JobContext` (``ctx.slot``);
activities ``ask_for_slot``, ``release_slot``, ``note_checkpointed`` (policy
``SLOT_MESSAGE``); a new job's first ask goes with its preflight (workflows/admission.py).

Deterministic code only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import workflows.measures as measures
    import workflows.policies as policies
    import workflows.versions as versions
    from activities.scheduling import SchedulingActivities
    from shepherd.models import AskForSlotInput, SlotNoteInput
    from shepherd.phases import Phase
    from shepherd.scheduling import (
        DEFAULT_QUEUE,
        Ask,
        Checkpointed,
        MakeWay,
        PlaceNotice,
        Release,
        SlotGrant,
        pool_of,
        scheduler_id,
    )
    from workflows.context import JobContext
    from workflows.flow import PauseNow


async def take(ctx: JobContext) -> None:
    """Wait in Shepherd's queue (QUEUED) until the backend's scheduler admits the job. A
    pause meanwhile stops the wait (its place is given back); a long wait continues-as-new."""
    slot = ctx.slot
    if not slot.enabled or slot.held:
        return
    spec = ctx.spec
    if not slot.asked:
        ctx.stop_if_cancelled()
        ask = new_request(ctx)
        await ctx.act(
            SchedulingActivities.ask_for_slot,
            AskForSlotInput(backend=spec.backend, ask=ask),
            policies.SLOT_MESSAGE,
            f"ask for a slot (queue {ask.queue}, priority {ask.priority})",
        )
    # (The Web UI shows the line itself on the scheduler's page.) The scheduler's word of
    # its place may have come already (while the ask was sent, or before a continue-as-new).
    if ctx.s.admission is None:
        ctx.s.admission = (
            f"waiting in Shepherd's queue {spec.scheduling.queue or DEFAULT_QUEUE} "
            f"(the line: workflow {scheduler_id(spec.backend)})"
        )
    ctx.set_phase(Phase.QUEUED)
    while not slot.held:
        await workflow.wait_condition(
            lambda: slot.held or ctx.cancel_seen() or ctx.pause_requested or ctx.history_long()
        )
        ctx.stop_if_cancelled()
        if slot.held:
            break
        if ctx.pause_requested:
            raise PauseNow()
        await ctx.maybe_continue_as_new()
    ctx.s.admission, ctx.s.placement = None, None
    ctx.publish()


def new_request(ctx: JobContext) -> Ask:
    """The job's next request for a slot, taken as asked from now on, before the call that
    sends it: the scheduler's grant may reach the job before that call's answer does, and a
    cancel meanwhile gives the place back (the ask may land)."""
    spec, slot = ctx.spec, ctx.slot
    ask = Ask(
        job=ctx.s.workflow_id,
        seq=slot.seq + 1,
        queue=spec.scheduling.queue or DEFAULT_QUEUE,
        priority=spec.scheduling.priority,
        preemptible=spec.scheduling.preemptible,
        capabilities=list(spec.scheduling.required_capabilities),
        pool=pool_of(spec.trainer.training_shape, spec.trainer.accelerator_type),
        arrival=slot.arrival,
    )
    slot.seq, slot.asked, slot.asked_at = ask.seq, True, workflow.now()
    return ask


def asked_ahead(ctx: JobContext, sent: bool) -> None:
    """The preflight's word on the job's first request (:func:`new_request`), which it was
    to send once every check passed. Not sent (no scheduler here, or the send failed):
    :func:`take` asks itself, with the next number (a request that landed after all is
    replaced by it)."""
    slot = ctx.slot
    if not sent and not slot.held:
        slot.asked, slot.asked_at = False, None


def told_place(ctx: JobContext, notice: PlaceNotice) -> None:
    """The scheduler's word of where the job stands (its place, or the range it stands in,
    as it changes): shown in its status and on its Web UI page until it is admitted."""
    slot = ctx.slot
    if not slot.asked or slot.held or notice.seq != slot.seq:
        return
    p = notice.placement
    if notice.within is None:
        ctx.s.placement, where = p, f"position {p.position}"
    else:  # a range, not a place: the status's placement says nothing it does not know
        ctx.s.placement, where = None, f"position {p.position:,}-{notice.within:,}"
    ctx.s.admission = (
        f"{where} of {p.length:,} in queue {p.queue}: waits for {p.waits_for} "
        f"(as of {notice.at:%H:%M:%S} UTC; the line: workflow {scheduler_id(ctx.spec.backend)})"
    )
    ctx.publish()


def granted(ctx: JobContext, grant: SlotGrant) -> None:
    """The scheduler's ``slot_granted`` (for the job's current request only)."""
    slot = ctx.slot
    if slot.asked and grant.seq == slot.seq:
        slot.held, slot.noted, slot.make_way = True, False, None
        slot.arrival = grant.arrival
        if slot.asked_at is not None:
            measures.admission_wait(ctx.spec.backend, grant.queue, slot.asked_at)


def asked_to_make_way(ctx: JobContext, notice: MakeWay) -> None:
    """The scheduler's ``make_way``: as a pause of its own (checkpoint, trainer let go), after
    which the job asks again, keeping its place (``recovery.pause``)."""
    slot = ctx.slot
    if not slot.held or notice.seq != slot.seq or slot.make_way is not None:
        return
    slot.make_way = notice
    if not ctx.pause_requested and ctx.s.phase is not Phase.PAUSED:
        ctx.pause_requested = True


async def give_back(ctx: JobContext, *, requeue: bool = False, waits: bool = False) -> None:
    """The slot (or the place in line) back to the scheduler: sent even after a cancel.
    ``waits``: the job waits again (a pause, making way), and its workflow's tasks go back
    to its own priority (they went ahead of every job's intake while it held the slot)."""
    slot = ctx.slot
    if not slot.enabled or not (slot.asked or slot.held):
        return
    await ctx.act(
        SchedulingActivities.release_slot,
        SlotNoteInput(
            backend=ctx.spec.backend,
            release=Release(job=ctx.s.workflow_id, seq=slot.seq, requeue=requeue),
            priority_key=ctx.priority.priority_key if waits else None,
        ),
        policies.SLOT_MESSAGE,
        "give the slot back" + (" (requeued: making way for another job)" if requeue else ""),
        cleanup=True,
    )
    slot.asked = slot.held = False
    ctx.s.admission, ctx.s.placement = None, None


async def give_back_with(ctx: JobContext, trainer_gone: Coroutine[Any, Any, None]) -> None:
    """A finishing job's trainer delete and its slot's return, sent together: the next job's
    admission (the scheduler's grant, that job's create) overlaps the delete instead of
    following it. The platform may see the next create a moment before the delete; it
    queues it for that moment (at most one per slot freed). Either failing still lets the
    other be done; the first failure is raised."""
    slot = ctx.slot
    if not slot.enabled or not (slot.asked or slot.held):
        await trainer_gone
        return
    if not workflow.patched(versions.SLOT_BACK_WITH_THE_TRAINER):
        await trainer_gone
        await give_back(ctx)
        return
    outcomes = await asyncio.gather(trainer_gone, give_back(ctx), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


async def note_checkpoint(ctx: JobContext) -> None:
    """The job checkpointed since it was admitted: from now on it may be preempted for a more
    urgent job (it would lose only the steps since). Said once per admission."""
    slot = ctx.slot
    if not slot.enabled or not slot.held or slot.noted:
        return
    slot.noted = True
    await ctx.act(
        SchedulingActivities.note_checkpointed,
        SlotNoteInput(
            backend=ctx.spec.backend, checkpointed=Checkpointed(job=ctx.s.workflow_id, seq=slot.seq)
        ),
        policies.SLOT_MESSAGE,
        "tell the scheduler: checkpointed",
    )
