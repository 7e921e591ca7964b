"""Shepherd's checkpoints of a model, and the redo log cut behind them.

Every ``checkpoint_every`` optimizer steps (or when the redo log reaches
:data:`MAX_REDO_OPS`) the proxy issues, right after the program's ``optim_step`` in the
model's trainer sequence, its own ``save_weights`` (with optimizer state: resumable) and the
promotable ``save_weights_for_sampler`` twin. Once both are saved the checkpoint is reported
(the job's model's raise a :class:`CheckpointEvent`), and once every operation before it is
answered too it becomes the model's *restore point*: the redo log is truncated there, and
the snapshots that leave the log get their means of being made again (:mod:`.snapshots`).

A checkpoint on demand (a pause, the program's end) is the owner's:
:meth:`ProgramProxy.checkpoint_now <shepherd.proxy.proxy.ProgramProxy.checkpoint_now>`.
"""

from __future__ import annotations

import structlog

from shepherd.models import CheckpointRecord
from shepherd.proxy import operations, snapshots
from shepherd.proxy.core import Core, Refused
from shepherd.proxy.events import CheckpointEvent
from shepherd.proxy.settings import MAX_REDO_OPS, PROGRESS_HISTORY
from shepherd.proxy.state import Checkpoint, Model, Op
from shepherd.proxy.upstream import Upstream

log = structlog.stdlib.get_logger("shepherd.proxy")


async def issue_if_due(core: Core, model: Model, op: Op, up: Upstream) -> None:
    """After an optim_step is sent (fresh or redone): Shepherd's checkpoint of the
    weights it makes, when one is due."""
    if op.step_after is None or op.lpos is None or not core.live(up):
        return
    step = (model.step_base or 0) + op.step_after
    due = step % core.settings.checkpoint_every == 0 or len(model.redo) >= MAX_REDO_OPS
    known = [model.checkpoint, *model.pending]
    if not due or any(c is not None and c.wver == op.wver and not c.failed for c in known):
        return
    await issue(core, model, up, step=step, wver=op.wver, lpos=op.lpos + 1)


async def issue(
    core: Core, model: Model, up: Upstream, *, step: int, wver: int, lpos: int
) -> Checkpoint:
    """Save the model's state (with optimizer: resumable) and its promotable sampler
    twin, as its next two trainer operations: the weights of version ``wver``, which
    the operations before log position ``lpos`` made."""
    name = core.settings.checkpoint_name(step, model.index)
    if core.account is None:
        core.account = await core.platform.account_id()
    job = f"accounts/{core.account}/rlorTrainerJobs/{up.trainer_job_id}"
    state_op = Op("save_weights", {"model_id": model.program_id, "path": name}, internal=True)
    sampler_op = Op(
        "save_weights_for_sampler",
        {"model_id": model.program_id, "path": f"{name}-sampler"},
        internal=True,
    )
    ckpt = Checkpoint(
        name=name,
        step=step,
        lpos=lpos,
        wver=wver,
        trainer_job_id=up.trainer_job_id,
        state_op=state_op,
        sampler_op=sampler_op,
        ref=f"{job}/checkpoints/{name}",
        record=CheckpointRecord(
            name=f"{job}/checkpoints/{name}",
            sampler=f"{job}/checkpoints/{name}-sampler",
            step=step,
            trainer_job_id=up.trainer_job_id,
            model=model.index + 1,
        ),
    )
    for op in (state_op, sampler_op):
        op.model = model
    model.pending.append(ckpt)
    try:
        await operations.submit(core, model, state_op, up)
        await operations.submit(core, model, sampler_op, up)
    except Refused as exc:
        model.pending.remove(ckpt)
        log.error("proxy.checkpoint_refused", name=name, error=exc.message[:500])
    return ckpt


def settled(core: Core, model: Model) -> None:
    """One of the model's checkpoint saves was answered: a failed checkpoint is dropped, a
    saved one reported (once), and the restore point moved up where it may be."""
    for ckpt in list(model.pending):
        if ckpt.failed:
            model.pending.remove(ckpt)
            log.error("proxy.checkpoint_failed", name=ckpt.name, step=ckpt.step)
        elif ckpt.saved and ckpt.name not in core.reported_checkpoints:
            core.reported_checkpoints.add(ckpt.name)
            ckpt.record = ckpt.record.model_copy(update={"saved_at": None})
            log.info("proxy.checkpoint_saved", name=ckpt.record.name, step=ckpt.step)
            if core.is_followed(model):
                core.progress.checkpoints.append(ckpt.record)
                del core.progress.checkpoints[:-PROGRESS_HISTORY]
                core.emit(CheckpointEvent(record=ckpt.record))
    truncate(core, model)


def truncate(core: Core, model: Model) -> None:
    """Make the newest saved checkpoint the restore point once every operation before it
    was answered: the redo log then starts after it."""
    while model.pending and model.pending[0].saved:
        ckpt = model.pending[0]
        before = [op for op in model.redo if op.lpos is not None and op.lpos < ckpt.lpos]
        if not all(op.done for op in before):
            return
        model.pending.pop(0)
        # Gradients accumulated since the last weights change are not in a checkpoint
        # (it holds weights and optimizer state): those forward_backwards stay.
        last_change = max(
            (i for i, op in enumerate(before) if op.op in ("optim_step", "load_weights")),
            default=-1,
        )
        keep = [op for op in before[last_change + 1 :] if op.op == "forward_backward"]
        gone = [op for op in before if op not in keep]
        model.redo = keep + [op for op in model.redo if op.lpos is None or op.lpos >= ckpt.lpos]
        prev, model.checkpoint = model.checkpoint, ckpt
        snapshots.left_log(core, model, ckpt, before, gone, prev)
        pinned = snapshots.pinned(core)
        for op in gone:
            if id(op) not in pinned:  # a snapshot's recipe still needs it
                op.release()
