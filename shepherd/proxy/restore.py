"""A model made live on the attached trainer: created as the program asked the first time,
and on every later trainer *restored* — loaded from its restore point (its last Shepherd
checkpoint, with optimizer state) into a new model, or created again exactly as the program
created it before the first checkpoint — then its redo log sent again in order and answered.
For the job's model the restore is verified against the weights digests the lost trainer
reported, when trainers report them.

Sessions are made live the same way, on the first model or sampler that needs one.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from shepherd.platform import PlatformError
from shepherd.proxy import ids, redo
from shepherd.proxy.core import Core, Refused
from shepherd.proxy.events import AttachResult
from shepherd.proxy.state import Model, Session
from shepherd.proxy.steps import job_step
from shepherd.proxy.upstream import Detached, Upstream

log = structlog.stdlib.get_logger("shepherd.proxy")


async def restore_models(
    core: Core, up: Upstream, models: list[Model], result: AttachResult
) -> None:
    """Materialize ``models`` on ``up`` (the caller holds each one's ``cond``). A model
    the trainer refuses to make again (its checkpoint was deleted meanwhile, say) is
    broken: the program's next request for it is answered with the reason."""
    for model in models:
        try:
            await ensure_model(core, model, up, result)
        except Refused as exc:
            model.broken = f"model {model.program_id} could not be restored: {exc.message}"
            log.error("proxy.restore_refused", model=model.program_id, error=exc.message[:500])


async def ensure_model(
    core: Core, model: Model, up: Upstream, result: AttachResult | None = None
) -> None:
    """Make ``model`` live on ``up`` (caller holds ``model.cond``): from its restore
    point, or as the program created it; then its redo log, in order, answered."""
    if model.gen == core.gen and model.trainer_id is not None:
        return
    if model.broken is not None or not core.live_model(model):
        return
    started = time.monotonic()
    restoring = model.trainer_id is not None
    tsession = await ensure_session(core, model.session, up)
    mseq = model.session.next_model_seq
    model.session.next_model_seq += 1
    create = model.create
    ckpt = model.checkpoint
    body: dict[str, Any]
    if ckpt is not None:
        kind, body = "load_weights", {"path": ckpt.ref, "optimizer": True}
        metadata = create.body.get("user_metadata")
        if metadata:
            body["user_metadata"] = metadata
    else:
        kind, body = create.op, dict(create.body)
        path = body.get("path")
        if kind == "load_weights" and isinstance(path, str):
            body["path"] = core.ids.trainer_path(path)
    body.update({"session_id": tsession, "model_seq_id": mseq})
    try:
        ticket = await up.submit(kind, body)
    except PlatformError as exc:
        if exc.status_code and 400 <= exc.status_code < 500:
            raise await core.refusal(up, exc) from None
        raise
    answer = await core.await_trainer(up, str(ticket["request_id"]))
    if "error" in answer:
        message = f"{kind} on the trainer failed: {answer['error']}"
        if ckpt is None:
            create.fail(str(answer["error"]), str(answer.get("category") or "user"))
        model.broken = message
        log.error("proxy.model_failed", model=model.program_id, error=message[:500])
        return
    model.trainer_id = str(answer.get("model_id") or ids.model_id(tsession, mseq))
    model.gen = core.gen
    model.next_tseq = 1
    core.ids.learn_run(model.trainer_id, model.program_id)
    info = await core.model_info(model, up)
    if model.step_base is None:
        # A model the program resumed (a checkpoint's weights *and* optimizer state: its
        # own, after its worker died, or the job's it retries) counts on from the
        # checkpoint's step, when the trainer says which (localplane's get_info does). One
        # it only started from another run's weights (the cookbook's load_checkpoint_path)
        # counts the steps the program applies, from 0: what the program itself sees.
        steps = info.get("optim_steps")
        resumed = create.op == "load_weights" and bool(create.body.get("optimizer"))
        model.trainer_base = steps if isinstance(steps, int) else 0
        model.step_base = model.trainer_base if resumed else 0
    create.resolve(
        {"type": create.op, "model_id": model.program_id, "path": create.body.get("path")}
        if create.op == "load_weights"
        else {"type": "create_model", "model_id": model.program_id}
    )
    if not restoring or result is None:
        await redo.resend(core, model, up, None)
        return
    result.models_restored += 1
    digests: list[bool] = []
    if ckpt is not None and core.is_followed(model):
        result.restored_from = ckpt.record
        result.checkpoint_digest = info.get("weights_digest")
        digests += _digest_matches(core, ckpt.step, result.checkpoint_digest)
    redo_started = time.monotonic()
    await redo.resend(core, model, up, result)
    result.redo_seconds += time.monotonic() - redo_started
    if core.is_followed(model):
        after = await core.model_info(model, up)
        result.weights_digest = after.get("weights_digest")
        digests += _digest_matches(core, job_step(model), result.weights_digest)
        result.digests_match = all(digests) if digests else None
    log.info(
        "proxy.model_restored",
        model=model.program_id,
        trainer_model=model.trainer_id,
        checkpoint=ckpt.name if ckpt else None,
        redo=len(model.redo),
        step=job_step(model),
        seconds=round(time.monotonic() - started, 3),
        digests_match=result.digests_match,
    )


async def ensure_session(core: Core, session: Session, up: Upstream) -> str:
    """The trainer session of ``session`` on ``up`` (made there the first time): its id."""
    async with session.lock:
        if session.gen == core.gen and session.trainer_id is not None:
            return session.trainer_id
        body = {
            k: v
            for k, v in session.body.items()
            if k in ("tags", "user_metadata", "sdk_version", "display_name", "type")
        }
        answer = await up.call("POST", "create_session", body)
        if not core.live(up):
            raise Detached("create_session")
        session.trainer_id = str(answer["session_id"])
        session.gen = core.gen
        session.next_model_seq = session.next_sampler_seq = 0
        core.ids.learn(session.trainer_id, session.program_id)
        return session.trainer_id


def _digest_matches(core: Core, step: int, digest: str | None) -> list[bool]:
    """Whether ``digest`` is the one the job's model had at ``step`` (empty: not known)."""
    known = core.progress.digests.get(step)
    if digest is None or known is None:
        return []
    if digest != known:
        log.error("proxy.digest_mismatch", step=step, expected=known, got=digest)
    return [digest == known]
