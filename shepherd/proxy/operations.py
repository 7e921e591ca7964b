"""A model's operation sent to the trainer: as the model's next trainer ``seq_id`` (the
proxy owns the trainer's numbering; the program's is mapped onto it), its body translated
from the program's ids, paths and provenance spans to this trainer's, its answer then
polled by the generation and settled (:mod:`.answers`).
"""

from __future__ import annotations

from typing import Any

from shepherd.platform import PlatformError
from shepherd.proxy.core import Core
from shepherd.proxy.state import Model, Op
from shepherd.proxy.upstream import Detached, Upstream


def endpoint(op: Op) -> str:
    """The trainer's endpoint for ``op``."""
    return "forward" if op.op == "forward" else op.op


async def submit(core: Core, model: Model, op: Op, up: Upstream) -> None:
    """Send ``op`` as the model's next trainer operation and have its answer polled.
    Raises Refused (nothing taken), TrainerGone or Detached."""
    tseq = model.next_tseq
    body = _trainer_body(core, model, op, tseq)
    try:
        ticket = await up.submit(endpoint(op), body)
    except PlatformError as exc:
        if exc.status_code and 400 <= exc.status_code < 500:
            raise await core.refusal(up, exc) from None
        raise
    if not core.live(up):
        raise Detached(op.op)
    model.next_tseq = tseq + 1
    op.sends += 1
    core.watch(op, up, str(ticket["request_id"]))


def _trainer_body(core: Core, model: Model, op: Op, tseq: int) -> dict[str, Any]:
    """``op``'s body as the trainer of this generation is sent it, at its ``seq_id``
    ``tseq``."""
    body = dict(op.body)
    body["model_id"] = model.trainer_id
    body["seq_id"] = tseq
    if op.op == "load_weights" and isinstance(body.get("path"), str):
        body["path"] = core.ids.trainer_path(body["path"])
    if op.op == "save_weights_for_sampler" and body.get("path") is None:
        body["sampling_session_seq_id"] = model.session.next_sampler_seq
        model.session.next_sampler_seq += 1
    if op.op in ("forward", "forward_backward"):
        core.spans.translate(body)
    return body
