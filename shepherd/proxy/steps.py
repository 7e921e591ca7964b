"""The job's progress, read from the wire: every optimizer step of the job's model reported
in order once its answer and its forward_backwards' are in (a step event with the step's
mean loss and the optimizer's metrics), and the weights digest after each step, where the
trainer reports one (what a restore is verified against, :mod:`.restore`).
"""

from __future__ import annotations

from shepherd.platform import PlatformError
from shepherd.proxy.core import Core
from shepherd.proxy.events import StepEvent
from shepherd.proxy.state import Model, Op
from shepherd.proxy.upstream import Detached, TrainerGone, Upstream


def job_step(model: Model) -> int:
    """The model's step as the job counts it."""
    return (model.step_base or 0) + model.step


def loss_of(op: Op) -> float | None:
    """A forward_backward's ``loss:sum``, as the program was answered (or the trainer)."""
    result = op.result or op.trainer_result or {}
    value = (result.get("metrics") or {}).get("loss:sum")
    return float(value) if isinstance(value, int | float) else None


def flush(core: Core, model: Model) -> None:
    """Step events, in order, for every optim_step answered with its forward_backwards."""
    up = core.up
    while model.step_queue:
        op = model.step_queue[0]
        if not op.done or not all(fb.done for fb in op.fbs):
            return
        model.step_queue.pop(0)
        if op.error is not None or op.step_after is None:
            continue
        step = (model.step_base or 0) + op.step_after
        if step <= model.reported_step:
            continue  # reported before the loss; the redo answered it again
        model.reported_step = step
        if not core.is_followed(model):
            continue
        losses = [x for x in (loss_of(fb) for fb in op.fbs) if x is not None]
        loss = sum(losses) / len(losses) if losses else None
        core.progress.step = step
        if loss is not None:
            core.progress.record_loss(step, loss)
        metrics = {
            k: float(v)
            for k, v in ((op.result or {}).get("metrics") or {}).items()
            if isinstance(v, int | float)
        }
        core.emit(
            StepEvent(
                step=step,
                loss=loss,
                metrics=metrics,
                trainer_job_id=up.trainer_job_id if up else "",
            )
        )


def digest_before_answer(core: Core, op: Op) -> None:
    """An applied optimizer step's weights digest is asked for before its answer is
    released to the program (the fetch is scheduled first): asked after, a pipelining
    program's next optim_step can reach the trainer first, this step's digest is never
    taken, and a restore from this step has nothing to verify against. It costs the
    step's answer ~1 ms, only on trainers that report digests (localplane)."""
    model, up = op.model, core.up
    if (
        op.op == "optim_step"
        and core.ask_digests
        and up is not None
        and model is not None
        and core.is_followed(model)
        and op.gen == core.gen
    ):
        _want_digest(core, model, up)


def _want_digest(core: Core, model: Model, up: Upstream) -> None:
    if model.digest_busy:
        model.digest_again = True
        return
    model.digest_busy = True
    core.spawn(_fetch_digest(core, model, up), "digest")


async def _fetch_digest(core: Core, model: Model, up: Upstream) -> None:
    try:
        while True:
            model.digest_again = False
            if not core.live(up) or model.gen != core.gen:
                return
            try:
                info = await core.model_info(model, up)
            except (Detached, TrainerGone, PlatformError):
                return
            digest, steps = info.get("weights_digest"), info.get("optim_steps")
            if not isinstance(digest, str):
                core.ask_digests = False  # this trainer reports none: stop asking
                return
            if isinstance(steps, int) and model.gen == core.gen:
                # By the job's step (the trainer counts on from a checkpoint's steps).
                core.progress.record_digest(
                    steps - model.trainer_base + (model.step_base or 0), digest
                )
            if not model.digest_again:
                return
    finally:
        model.digest_busy = False
