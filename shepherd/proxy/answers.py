"""The trainer's answer to an operation, settled: the program's future is answered in its
own ids and paths (once: a redo's answer never changes it), and what the answer means for
the rest follows — a Shepherd checkpoint saved (:mod:`.checkpoints`), an optimizer step to
report (:mod:`.steps`), sampled sequences kept for provenance spans (:mod:`.spans`).

The generation's pollers hand every answer here (:meth:`.core.Core.watch`).
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from shepherd.proxy import checkpoints, ids, steps
from shepherd.proxy.core import Core
from shepherd.proxy.state import Model, Op

log = structlog.stdlib.get_logger("shepherd.proxy")

#: Results that name no id (metrics, per-token outputs, samples): passed on as they are,
#: without a walk through every number in them.
_NO_IDS = frozenset({"forward", "forward_backward", "optim_step", "asample"})


def settle(core: Core, op: Op, answer: dict[str, Any]) -> None:
    """The trainer's outcome of ``op`` in this generation."""
    ok = "error" not in answer
    op.outcome_ok = ok
    op.trainer_result = answer if ok else None
    first = not op.done
    if first and not op.internal:
        core.progress.answered_at = time.monotonic()
    if ok:
        program = program_result(core, op, answer)
        if first:
            steps.digest_before_answer(core, op)
            op.resolve(program)
        elif op.op == "forward_backward" and steps.loss_of(op) is not None:
            redone = (answer.get("metrics") or {}).get("loss:sum")
            if op.result is not None and redone != (op.result.get("metrics") or {}).get("loss:sum"):
                log.error("proxy.redo_diverged", op=op.op, seq=op.seq, loss=redone)
    else:
        category = str(answer.get("category") or "unknown")
        op.fail(str(answer.get("error")), category)
        if op.internal or op.op == "optim_step":
            log.error("proxy.operation_failed", op=op.op, error=str(answer.get("error"))[:500])
    op.executed.set()
    if op.op == "asample":
        if ok and first and op.body.get("record_stability_info"):
            core.spans.keep(op, answer)
        core.oneoff.pop(op.request_id, None)
        if op.sampler is not None:
            op.sampler.pending.pop(op.request_id, None)
    model = op.model
    if model is not None:
        _after_settled(core, model, op)


def program_result(core: Core, op: Op, answer: dict[str, Any]) -> dict[str, Any]:
    """The trainer's answer as the program must see it (its own ids and paths)."""
    if op.op in _NO_IDS:
        return answer
    model = op.model
    if op.op in ("save_weights", "save_weights_for_sampler") and model is not None:
        trainer_path = answer.get("path")
        name = op.body.get("path")
        if isinstance(trainer_path, str) and isinstance(name, str):
            parts = ids.split_path(trainer_path)
            kind = parts[1] if parts else "weights"
            # A path the program may also build from its model id resolves too.
            core.ids.learn_path(f"{ids.TINKER}{model.program_id}/{kind}/{name}", trainer_path)
            core.ids.learn_path(name, trainer_path)  # a bare name, across trainer jobs
            # The program gets the platform's own path: a checkpoint outlives its trainer
            # and its job, so the path works in any job of the account (a teacher, a
            # reference, a resume_from), after this one ended, with or without Shepherd.
            return {**core.ids.program_value(answer), "path": trainer_path}
        tsampler = answer.get("sampling_session_id")
        if isinstance(tsampler, str) and op.sampler is not None:
            core.ids.learn(tsampler, op.sampler.program_id)
            op.sampler.trainer_id, op.sampler.gen = tsampler, core.gen
            return {**answer, "path": None, "sampling_session_id": op.sampler.program_id}
    if op.op == "load_weights":
        return {**core.ids.program_value(answer), "path": op.body.get("path")}
    return core.ids.program_value(answer)


def _after_settled(core: Core, model: Model, op: Op) -> None:
    """What the answer means for its model: a checkpoint's save may complete the
    checkpoint, a step's answers the step to report."""
    if op.internal:
        checkpoints.settled(core, model)
    elif op.op in ("optim_step", "forward_backward"):
        steps.flush(core, model)
