"""The program's sampling sessions on a trainer: kept in a bounded table, made live on the
attached trainer when a sample needs one — from the base model, a checkpoint path, the
snapshot its model's redo log takes again, or *remade* from a recipe — and the sample
requests a lost trainer had not answered sent again.

How a snapshot that left the redo log is made again later (its kind: a path, the base
model, a recipe, or lost) is decided when the restore point passes it (:mod:`.snapshots`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import structlog

from shepherd.platform import PlatformError
from shepherd.proxy import ids, restore
from shepherd.proxy.core import NOT_HERE, Core, Refused
from shepherd.proxy.events import AttachResult
from shepherd.proxy.operations import endpoint
from shepherd.proxy.settings import MAX_SAMPLERS
from shepherd.proxy.state import Op, Sampler
from shepherd.proxy.upstream import Detached, Upstream

log = structlog.stdlib.get_logger("shepherd.proxy")


def add(core: Core, sampler: Sampler) -> None:
    """``sampler`` is the most recently used; the oldest with no sample waiting fall out
    beyond :data:`MAX_SAMPLERS`."""
    core.samplers[sampler.program_id] = sampler
    core.samplers.move_to_end(sampler.program_id)
    while len(core.samplers) > MAX_SAMPLERS:
        oldest = next(iter(core.samplers.values()))
        if oldest.pending:
            break
        del core.samplers[oldest.program_id]


async def ensure(core: Core, sampler: Sampler, up: Upstream) -> None:
    """Make ``sampler`` live on ``up``."""
    if sampler.gen == core.gen and sampler.trainer_id is not None:
        return
    if sampler.lost is not None:
        raise Refused(400, "FAILED_PRECONDITION", sampler.lost)
    if sampler.kind == "remade":
        async with sampler.lock:
            if sampler.gen != core.gen or sampler.trainer_id is None:
                await _remake(core, sampler, up)
        return
    if sampler.kind == "snapshot":
        model = sampler.model
        assert model is not None
        async with model.cond:
            await restore.ensure_model(core, model, up)
        if sampler.gen != core.gen and core.live(up):
            # The snapshot's save was refused or failed in the redo.
            raise Refused(
                400,
                "FAILED_PRECONDITION",
                f"sampling session {sampler.program_id} could not be made again",
            )
        return
    async with sampler.lock:
        if sampler.gen == core.gen and sampler.trainer_id is not None:
            return
        tsession = await restore.ensure_session(core, sampler.session, up)
        seq = sampler.session.next_sampler_seq
        sampler.session.next_sampler_seq += 1
        body: dict[str, Any] = {"session_id": tsession, "sampling_session_seq_id": seq}
        if sampler.kind == "path":
            body["model_path"] = sampler.trainer_path
        else:
            body["base_model"] = sampler.base_model
        try:
            answer = await up.call("POST", "create_sampling_session", body)
        except PlatformError as exc:
            if exc.status_code and 400 <= exc.status_code < 500:
                raise await core.refusal(up, exc) from None
            raise
        _made_live(core, sampler, up, answer, "create_sampling_session")


async def send(core: Core, op: Op, up: Upstream) -> None:
    """Send the sample request ``op`` to ``up`` (its sampler made live there first) and have
    its answer polled."""
    sampler = op.sampler
    for attempt in range(2):
        body = dict(op.body)
        if sampler is not None:
            # Live on this trainer, or made again here; a sampler that cannot be made
            # again is refused with its reason (never sent under the program's id).
            await ensure(core, sampler, up)
            body["sampling_session_id"] = sampler.trainer_id
        if isinstance(body.get("model_path"), str):
            body["model_path"] = core.ids.trainer_path(body["model_path"])
        try:
            ticket = await up.submit("asample", body)
            break
        except PlatformError as exc:
            if not (exc.status_code and 400 <= exc.status_code < 500):
                raise
            refused = await core.refusal(up, exc)
            evicted = isinstance(refused, Refused) and NOT_HERE in refused.message
            if evicted and sampler is not None and sampler.kind != "snapshot" and not attempt:
                # The trainer let the sampler go (it keeps the most recently used few):
                # made again as on a new trainer, once.
                sampler.trainer_id, sampler.gen = None, 0
                continue
            raise refused from None
    if not core.live(up):
        raise Detached("asample")
    op.trainer_sequence_ids = [str(s) for s in ticket.get("sample_sequence_ids") or []]
    core.ids.learn(str(ticket["request_id"]), op.request_id)
    core.watch(op, up, str(ticket["request_id"]))


async def resend_waiting(core: Core, up: Upstream, result: AttachResult) -> None:
    """Send again every sample request the lost trainer had not answered (the default
    seed is a function of the sampler's weights and the request: the same answer)."""
    waiting = [s for s in core.samplers.values() if s.pending]
    for sampler in waiting:
        ops = [op for op in sampler.pending.values() if op.gen != core.gen]
        if not ops:
            continue
        try:
            await ensure(core, sampler, up)
        except Refused as exc:
            for op in ops:
                op.fail(exc.message, "user")
                sampler.pending.pop(op.request_id, None)
            continue
        for op in ops:
            await send(core, op, up)
            result.samples_redone += 1
    for op in [op for op in core.oneoff.values() if op.gen != core.gen]:
        await send(core, op, up)
        result.samples_redone += 1


async def _remake(core: Core, sampler: Sampler, up: Upstream) -> None:
    """A snapshot's weights made again: its recipe's base (a Shepherd checkpoint, with
    optimizer state; or the model made as the program made it) in a scratch model, the
    recipe's operations sent again in order, saved for sampling, the scratch unloaded."""
    recipe = sampler.recipe
    if recipe is None:
        raise Refused(400, "FAILED_PRECONDITION", f"sampler {sampler.program_id}: no recipe")
    tsession = await restore.ensure_session(core, sampler.session, up)
    mseq = sampler.session.next_model_seq
    sampler.session.next_model_seq += 1
    body: dict[str, Any]
    if recipe.base is not None:
        kind, body = "load_weights", {"path": recipe.base.ref, "optimizer": True}
    else:
        kind, body = recipe.model.create.op, dict(recipe.model.create.body)
        if kind == "load_weights" and isinstance(body.get("path"), str):
            body["path"] = core.ids.trainer_path(body["path"])
    body.update({"session_id": tsession, "model_seq_id": mseq})
    try:
        scratch = await _scratch_model(core, up, kind, body, ids.model_id(tsession, mseq))
        tickets = []
        for n, op in enumerate(recipe.ops, start=1):
            sent = dict(op.body)
            sent.update({"model_id": scratch, "seq_id": n})
            if op.op == "load_weights" and isinstance(sent.get("path"), str):
                sent["path"] = core.ids.trainer_path(sent["path"])
            if op.op == "forward_backward":
                core.spans.translate(sent)
            tickets.append(await up.submit(endpoint(op), sent))
        for ticket in tickets:
            answer = await core.await_trainer(up, str(ticket["request_id"]))
            if "error" in answer:
                raise Refused(400, "FAILED_PRECONDITION", f"remaking: {answer['error']}")
        save = {
            "model_id": scratch,
            "seq_id": len(recipe.ops) + 1,
            "sampling_session_seq_id": sampler.session.next_sampler_seq,
        }
        sampler.session.next_sampler_seq += 1
        ticket = await up.submit("save_weights_for_sampler", save)
        answer = await core.await_trainer(up, str(ticket["request_id"]))
        if "error" in answer:
            raise Refused(400, "FAILED_PRECONDITION", f"remaking: {answer['error']}")
        with contextlib.suppress(PlatformError):
            await up.call("POST", "unload_model", {"model_id": scratch})
    except PlatformError as exc:
        if exc.status_code and 400 <= exc.status_code < 500:
            raise await core.refusal(up, exc) from None
        raise
    _made_live(core, sampler, up, answer, "remake a sampler")
    log.info("proxy.sampler_remade", sampler=sampler.program_id, ops=len(recipe.ops))


async def _scratch_model(
    core: Core, up: Upstream, kind: str, body: dict[str, Any], default: str
) -> str:
    """A scratch model made by ``kind`` (create_model or load_weights): its trainer id."""
    ticket = await up.submit(kind, body)
    answer = await core.await_trainer(up, str(ticket["request_id"]))
    if "error" in answer:
        raise Refused(400, "FAILED_PRECONDITION", f"remaking: {answer['error']}")
    return str(answer.get("model_id") or default)


def _made_live(
    core: Core, sampler: Sampler, up: Upstream, answer: dict[str, Any], what: str
) -> None:
    """``sampler`` is the sampling session ``answer`` names on ``up`` — unless ``up`` was
    let go meanwhile (Detached: ``what`` was under way)."""
    if not core.live(up):
        raise Detached(what)
    sampler.trainer_id = str(answer["sampling_session_id"])
    sampler.gen = core.gen
    core.ids.learn(sampler.trainer_id, sampler.program_id)
