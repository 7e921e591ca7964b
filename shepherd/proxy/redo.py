"""A model's redo log: every operation the program sent it since its restore point, in
order, with what each means for the model's step and weights; and, on a trainer the model
was restored on, the part of it that is sent again.

The log is cut when a Shepherd checkpoint becomes the restore point (:mod:`.checkpoints`).
"""

from __future__ import annotations

from shepherd.proxy import checkpoints, operations
from shepherd.proxy.core import Core, Refused
from shepherd.proxy.events import AttachResult
from shepherd.proxy.state import Model, Op
from shepherd.proxy.upstream import Upstream


def log_op(model: Model, op: Op) -> None:
    """``op`` is the model's next operation: into its redo log, with what it means for
    the model's step and weights."""
    op.lpos = model.lpos
    model.lpos += 1
    model.redo.append(op)
    if op.op == "forward_backward":
        model.cur_fbs.append(op)
    elif op.op == "optim_step":
        op.fbs, model.cur_fbs = model.cur_fbs, []
        model.step += 1
        model.wver += 1
        op.step_after = model.step
        model.step_queue.append(op)
    elif op.op == "load_weights":
        model.wver += 1
    op.wver = model.wver


def needs_redo(op: Op) -> bool:
    """Whether a logged operation is sent again after a loss: everything that changes the
    model's state (gradients, weights, optimizer), snapshots the program may sample from,
    and whatever the program still waits for. A forward or named save it was answered is
    not."""
    if op.op in ("forward_backward", "optim_step", "load_weights"):
        return True
    if op.op == "save_weights_for_sampler" and op.body.get("path") is None:
        return True
    return not op.done


async def resend(core: Core, model: Model, up: Upstream, result: AttachResult | None) -> None:
    """Send the model's redo log again, in order; wait for it to be executed."""
    sent: list[Op] = []
    again: list[Op] = []
    for op in list(model.redo):
        if not needs_redo(op):
            continue
        before = op.sends
        try:
            await operations.submit(core, model, op, up)
        except Refused as exc:
            op.fail(exc.message, "user")
            model.redo.remove(op)
            continue
        sent.append(op)
        if before:
            again.append(op)
        if op.op == "optim_step":
            await checkpoints.issue_if_due(core, model, op, up)
    if result is not None:
        # Redone: sent before (an operation logged while no trainer was attached is
        # sent here for the first time).
        result.ops_redone += len(again)
        result.optimizer_steps_redone += sum(op.op == "optim_step" for op in again)
    await core.wait_executed(up, sent)
