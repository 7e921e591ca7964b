"""The Tinker API as the program sees it: one handler per endpoint, in the program's ids.

Answered here, without a trainer: ``client/config`` (the flags the proxy supports),
telemetry, heartbeats, sessions, the sampler and session views, and every submission (a
future's ticket comes back at once; with no trainer attached the operation is logged and
sent by the restore). Futures are the proxy's own: ``retrieve_future`` waits on the proxy's
copy of the answer, ``try_again`` while the work is pending or no trainer is attached.
Forwarded with the ids mapped: ``get_info``, sampling sessions, ``weights_info``, server
capabilities and the REST surface of training runs and checkpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from dataclasses import dataclass
from typing import Any

from shepherd.platform import PlatformError
from shepherd.proxy import checkpoints, ids, operations, redo, restore, samplers
from shepherd.proxy.core import Core, NoTrainer, Refused
from shepherd.proxy.settings import SEQ_GAP_HOLD_S
from shepherd.proxy.state import Model, Op, Sampler, Session
from shepherd.proxy.upstream import Detached, TrainerGone, Upstream
from shepherd.tinker_wire.dialects import canonical_digest, retry_varying

#: Sample-request fields that name where it goes rather than what it asks (the trainer's).
_SAMPLE_ADDRESSING = ("sampling_session_id", "seq_id", "type", "model_path", "base_model")
#: get_info extras that describe the trainer's own bookkeeping, not the program's model.
_TRAINER_ONLY_INFO = ("seq_id", "generation")


class ProgramError(Exception):
    """An answer to the program that is not a result: ``{"error": {code, status, message}}``."""

    def __init__(self, code: int, status: str, message: str) -> None:
        super().__init__(message)
        self.code, self.status, self.message = code, status, message[:2000]

    @classmethod
    def of(cls, exc: PlatformError | Refused) -> ProgramError:
        if isinstance(exc, Refused):
            return cls(exc.code, exc.status, exc.message)
        code = exc.status_code or 500
        return cls(code, exc.status, exc.message)


def _bad(message: str) -> ProgramError:
    return ProgramError(400, "INVALID_ARGUMENT", message)


def _precondition(message: str) -> ProgramError:
    return ProgramError(400, "FAILED_PRECONDITION", message)


def _integer(body: dict[str, Any], name: str, *, required: bool = True) -> int | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad(f"{name}: must be a non-negative integer")
    return value


@dataclass
class Call:
    """One program request as a handler sees it."""

    body: dict[str, Any]
    params: dict[str, str]
    query: dict[str, str]


@dataclass
class Encoded:
    """A result to encode as the answer to ``op`` (protobuf when the program asks for it
    and ``op``'s results have a protobuf form)."""

    op: str
    result: dict[str, Any]


class ProgramApi:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.settings = core.settings

    # ------------------------------------------------------------------- lookups

    def _session(self, session_id: Any) -> Session:
        session = self.core.sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None or session.finished:
            raise _precondition(f"session_id: session {str(session_id)[:120]!r} is not open")
        return session

    def _model(self, model_id: Any) -> Model:
        model = self.core.models.get(model_id) if isinstance(model_id, str) else None
        if model is None or model.closed:
            raise _precondition(
                f"model_id: model {str(model_id)[:120]!r} is not known to this proxy (create "
                "a model, or load a checkpoint into a new one)"
            )
        return model

    def _check_base_model(self, body: dict[str, Any], field: str) -> None:
        """The program's base model must be the trainer's, by its name or by one the job
        gives it (``base_model_aliases``: the Hugging Face name a cookbook recipe picks its
        tokenizer by, for a trainer created as ``accounts/fireworks/models/...``); an alias is
        replaced by the trainer's name before anything else reads the body."""
        value = body.get(field)
        if value is None or value == self.settings.trainer_base_model:
            return
        if value in self.settings.base_model_aliases:
            body[field] = self.settings.trainer_base_model
            return
        known = ", ".join(repr(n) for n in self.settings.base_model_aliases)
        raise _bad(
            f"{field}: {str(value)[:120]!r} is not the base model of this job's trainer, "
            f"{self.settings.trainer_base_model!r}"
            + (f" (nor a name the job gives it: {known})" if known else "")
            + "; a job's trainer serves one base model (set trainer.base_model in the job's "
            "spec to the one the program uses)"
        )

    def _check_rank(self, body: dict[str, Any]) -> None:
        wanted = self.settings.lora_rank
        config = body.get("lora_config")
        rank = config.get("rank", 0) if isinstance(config, dict) else 0
        if wanted is not None and rank != wanted:
            raise _bad(
                f"lora_config.rank: {rank!r} is not the LoRA rank of this job's trainer, "
                f"{wanted} (set trainer.lora_rank in the job's spec to the program's)"
            )

    async def _direct(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, str] | None = None,
    ) -> Any:
        """A direct call forwarded to the attached trainer (waiting for one)."""

        async def go(up: Upstream) -> Any:
            try:
                return await up.call(method, path, body, params=query or None)
            except PlatformError as exc:
                raise ProgramError.of(exc) from None

        try:
            return await self.core.with_trainer(go, self.settings.direct_hold_s)
        except NoTrainer as exc:
            raise ProgramError(503, "UNAVAILABLE", str(exc)) from None

    # ------------------------------------------------------------ local answers

    async def client_config(self, c: Call) -> dict[str, Any]:
        # Chunks of one forward_backward in order (one sequence per model); tinker's plain
        # httpx transport; the SDK's other defaults.
        return {"parallel_fwdbwd_chunks": False, "use_pyqwest_transport": False}

    async def dynamic_config(self, c: Call) -> dict[str, Any]:
        return {}

    async def telemetry(self, c: Call) -> dict[str, Any]:
        return {"status": "accepted"}

    async def healthz(self, c: Call) -> dict[str, Any]:
        return {"status": "ok", "trainer": self.core.up is not None}

    async def cancel_future(self, c: Call) -> dict[str, Any]:
        # The SDK cancels a sample it stopped waiting for; it is cheap, so it just finishes.
        return {}

    async def create_session(self, c: Call) -> dict[str, Any]:
        session_id = f"ps-{secrets.token_hex(8)}"
        self.core.sessions[session_id] = Session(session_id, dict(c.body))
        return {"type": "create_session", "session_id": session_id}

    async def session_heartbeat(self, c: Call) -> dict[str, Any]:
        self._session(c.body.get("session_id"))
        return {"type": "session_heartbeat"}

    async def session_finish(self, c: Call) -> dict[str, Any]:
        session = self.core.sessions.get(c.params["session_id"])
        if session is None or session.finished:
            return {}
        session.finished = True
        for model in self.core.models.values():
            if model.session is session:
                model.closed = True
        for sid in [s for s, x in self.core.samplers.items() if x.session is session]:
            del self.core.samplers[sid]
        if any(
            m.session is session and self.core.is_followed(m) for m in self.core.models.values()
        ):
            # The SDK finishes its session on its way out, before the job's final checkpoint:
            # the trainer keeps the job's model (it is deleted with the trainer) so that the
            # weights the program ended with are the ones Shepherd saves and promotes.
            return {}
        up = self.core.up
        if up is not None and session.gen == self.core.gen and session.trainer_id:
            with contextlib.suppress(PlatformError, Detached, TrainerGone):
                await up.call("POST", f"sessions/{session.trainer_id}/finish", {})
        return {}

    async def list_sessions(self, c: Call) -> dict[str, Any]:
        open_ids = [s.program_id for s in self.core.sessions.values() if not s.finished]
        try:
            offset, limit = int(c.query.get("offset") or 0), int(c.query.get("limit") or 20)
        except ValueError:
            raise _bad("limit, offset: must be integers") from None
        return {"sessions": open_ids[max(0, offset) : max(0, offset) + max(0, limit)]}

    async def get_session(self, c: Call) -> dict[str, Any]:
        session = self.core.sessions.get(c.params["session_id"])
        if session is None:
            raise ProgramError(400, "NOT_FOUND", f"session {c.params['session_id']!r} not found")
        return {
            "training_run_ids": [
                m.program_id for m in self.core.models.values() if m.session is session
            ],
            "sampler_ids": [
                s.program_id for s in self.core.samplers.values() if s.session is session
            ],
            "user_metadata": session.body.get("user_metadata"),
            "display_name": session.body.get("display_name"),
        }

    async def get_sampler(self, c: Call) -> dict[str, Any]:
        sampler = self.core.samplers.get(c.params["sampler_id"])
        if sampler is None:
            raise _precondition(f"sampling session {c.params['sampler_id']!r} is not known")
        return {
            "sampler_id": sampler.program_id,
            "base_model": self.settings.trainer_base_model,
            "model_path": sampler.program_path,
        }

    # -------------------------------------------------------------------- models

    async def create_model(self, c: Call) -> dict[str, Any]:
        body = c.body
        session = self._session(body.get("session_id"))
        seq = _integer(body, "model_seq_id")
        assert seq is not None
        self._check_base_model(body, "base_model")
        self._check_rank(body)
        return self._new_model(session, seq, "create_model", body)

    def _new_model(self, session: Session, seq: int, kind: str, body: dict[str, Any]) -> Any:
        core = self.core
        program_id = ids.model_id(session.program_id, seq)
        known = core.models.get(program_id)
        if known is not None:
            if known.create.digest != canonical_digest(body, ignore=known.create.ignore):
                raise _precondition(
                    f"model_seq_id {seq} of session {session.program_id} was already used by a "
                    "different request; a new model needs a new model_seq_id"
                )
            return known.create.ticket()
        create = Op(kind, body, extra={"model_id": program_id})
        model = Model(program_id, session, index=len(core.models), create=create)
        core.models[program_id] = model
        core.made(model)
        core.futures.add(create)
        core.spawn(self._materialize(model), f"create {program_id}")
        return create.ticket()

    async def _materialize(self, model: Model) -> None:
        """Create a new model on the attached trainer (or the next one)."""
        core = self.core
        while not model.create.done and model.broken is None and not model.closed:
            up = await core.wait_serving(float("inf"))
            assert up is not None
            async with model.cond:
                try:
                    await restore.ensure_model(core, model, up)
                except Refused as exc:
                    model.create.fail(exc.message, "user")
                    model.broken = exc.message
                except TrainerGone as exc:
                    core.lose(up, exc)
                except Detached:
                    pass

    async def get_info(self, c: Call) -> dict[str, Any]:
        model = self._model(c.body.get("model_id"))

        async def go(up: Upstream) -> Any:
            async with model.cond:
                await restore.ensure_model(self.core, model, up)
            if model.broken is not None:
                raise _precondition(model.broken)
            try:
                return await up.call("POST", "get_info", {**c.body, "model_id": model.trainer_id})
            except PlatformError as exc:
                raise ProgramError.of(exc) from None

        try:
            answer = await self.core.with_trainer(go, self.settings.direct_hold_s)
        except NoTrainer as exc:
            raise ProgramError(503, "UNAVAILABLE", str(exc)) from None
        except Refused as exc:
            raise ProgramError.of(exc) from None
        answer = self.core.ids.program_value(answer)
        for key in _TRAINER_ONLY_INFO:
            answer.pop(key, None)
        answer["model_id"] = model.program_id
        return dict(answer)

    async def unload_model(self, c: Call) -> dict[str, Any]:
        model = self._model(c.body.get("model_id"))
        model.closed = True
        up = self.core.up
        keep = self.core.is_followed(model)  # the job's model: kept for its final checkpoint
        if not keep and up is not None and model.gen == self.core.gen and model.trainer_id:
            with contextlib.suppress(PlatformError, Detached, TrainerGone):
                await up.call("POST", "unload_model", {"model_id": model.trainer_id})
        op = Op("unload_model", {}, extra={"model_id": model.program_id})
        op.resolve({"type": "unload_model", "model_id": model.program_id})
        self.core.futures.add(op)
        return op.ticket()

    async def load_weights(self, c: Call) -> dict[str, Any]:
        if c.body.get("model_id") is None:
            # tinker's create_training_client_from_state: a new model whose first operation
            # is the load (the SDK derives its id from the session and number).
            body = c.body
            session = self._session(body.get("session_id"))
            seq = _integer(body, "model_seq_id")
            assert seq is not None
            self._check_base_model(body, "base_model")
            if not isinstance(body.get("path"), str):
                raise _bad("path: is required (a checkpoint's tinker:// path or name)")
            return self._new_model(session, seq, "load_weights", body)
        return await self.sequenced("load_weights", c)

    async def sequenced(self, name: str, c: Call) -> dict[str, Any]:
        """forward, forward_backward, optim_step, save_weights(_for_sampler), load_weights."""
        body = c.body
        model = self._model(body.get("model_id"))
        seq = _integer(body, "seq_id", required=False)
        anonymous = name == "save_weights_for_sampler" and body.get("path") is None
        ignore = retry_varying(name, body)
        if seq is None:  # a client that does not number its calls gets the next number
            seq = max([model.next_seq - 1, *model.ops]) + 1
        known = model.ops.get(seq)
        if known is not None:
            return self._repeat(model, known, name, seq, canonical_digest(body, ignore=ignore))
        if seq < model.next_seq:
            raise _precondition(
                f"seq_id {seq} of model {model.program_id} was applied long ago (beyond the "
                f"proxy's memory of its operations); the model is at seq_id {model.next_seq - 1}"
            )
        if model.broken is not None:
            raise _precondition(model.broken)
        op = Op(name, body, ignore, model=model, seq=seq)
        if anonymous:
            sss = _integer(body, "sampling_session_seq_id", required=False)
            # A client that does not number its samplers gets a name of the proxy's.
            number = sss if sss is not None else f"s{secrets.token_hex(4)}"
            sampler = Sampler(
                f"{model.session.program_id}:sample:{number}",
                model.session,
                "snapshot",
                model=model,
                snap_op=op,
            )
            op.sampler = sampler
        model.remember(op)
        self.core.futures.add(op)
        try:
            await self._forward(model, op)
        except ProgramError:
            model.ops.pop(seq, None)
            self.core.futures.discard(op)
            raise
        return op.ticket()

    def _repeat(self, model: Model, known: Op, name: str, seq: int, digest: str) -> dict[str, Any]:
        if known.op != name:
            raise _precondition(
                f"seq_id {seq} of model {model.program_id} was already used by a {known.op} "
                f"request; this {name} request needs the next seq_id"
            )
        if known.digest is None:
            raise _precondition(
                f"seq_id {seq} of model {model.program_id} ({name}) was applied and its answer "
                "read; its request is no longer kept, so a resend cannot be told from new work "
                "— new work needs the next seq_id"
            )
        if known.digest != digest:
            raise _precondition(
                f"seq_id {seq} of model {model.program_id} was already used by a different "
                f"{name} request (its body differs from this one's); a retry must resend the "
                "same request, and new work needs the next seq_id"
            )
        if known.dropped:
            raise _precondition(
                f"seq_id {seq} of model {model.program_id} ({name}) was applied and its result "
                "is no longer kept"
            )
        return known.ticket()

    async def _forward(self, model: Model, op: Op) -> None:
        """Log ``op`` as the model's next operation, in the program's seq_id order, and send
        it when a trainer is attached."""
        core = self.core
        assert op.seq is not None
        seq = op.seq
        async with model.cond:
            try:
                await asyncio.wait_for(
                    model.cond.wait_for(lambda: model.next_seq >= seq or model.broken is not None),
                    SEQ_GAP_HOLD_S,
                )
            except TimeoutError:
                model.broken = (
                    f"seq_id {model.next_seq} of model {model.program_id} never arrived within "
                    f"{SEQ_GAP_HOLD_S:g} s while seq_id {seq} waited for it; this model takes no "
                    "more work — load a checkpoint into a new model"
                )
                model.cond.notify_all()
            if model.broken is not None:
                op.fail(model.broken, "user")
                return
            up = core.up
            try:
                if up is not None and not up.closed:
                    await restore.ensure_model(core, model, up)
                    if model.broken is not None:
                        op.fail(model.broken, "user")
                        return
                    await operations.submit(core, model, op, up)
                # No await between the submission and the log: its answer cannot be handled
                # before the log knows it.
                redo.log_op(model, op)
                self._register_snapshot(op)
                if op.op == "optim_step":
                    core.trained(model)
                if up is not None and op.op == "optim_step":
                    await checkpoints.issue_if_due(core, model, op, up)
            except Refused as exc:
                raise ProgramError.of(exc) from None
            except (TrainerGone, Detached) as exc:
                if isinstance(exc, TrainerGone) and up is not None:
                    core.lose(up, exc)
                if op.lpos is None:  # logged unsent: the restore sends it
                    redo.log_op(model, op)
                    self._register_snapshot(op)
                    if op.op == "optim_step":
                        core.trained(model)
            finally:
                if op.lpos is not None or model.broken is not None:
                    model.next_seq = seq + 1
                    model.cond.notify_all()

    def _register_snapshot(self, op: Op) -> None:
        if op.sampler is not None and op.op == "save_weights_for_sampler":
            samplers.add(self.core, op.sampler)

    # ------------------------------------------------------------------ sampling

    async def create_sampling_session(self, c: Call) -> dict[str, Any]:
        body = c.body
        session = self._session(body.get("session_id"))
        seq = _integer(body, "sampling_session_seq_id")
        assert seq is not None
        program_id = ids.sampler_id(session.program_id, seq)
        answer = {"type": "create_sampling_session", "sampling_session_id": program_id}
        if program_id in self.core.samplers:
            return answer
        path = body.get("model_path")
        if isinstance(path, str) and path:
            sampler = Sampler(
                program_id,
                session,
                "path",
                trainer_path=self.core.ids.trainer_path(path),
                program_path=path,
            )
        else:
            self._check_base_model(body, "base_model")
            sampler = Sampler(
                program_id,
                session,
                "base",
                base_model=body.get("base_model") or self.settings.trainer_base_model,
            )
        try:
            await self.core.with_trainer(
                lambda up: samplers.ensure(self.core, sampler, up), self.settings.direct_hold_s
            )
        except NoTrainer as exc:
            raise ProgramError(503, "UNAVAILABLE", str(exc)) from None
        except (Refused, PlatformError) as exc:
            raise ProgramError.of(exc) from None
        samplers.add(self.core, sampler)
        return answer

    async def asample(self, c: Call) -> dict[str, Any]:
        core = self.core
        body = c.body
        sid = body.get("sampling_session_id")
        sampler = core.samplers.get(sid) if isinstance(sid, str) else None
        if sid is not None and sampler is None:
            raise _precondition(
                f"sampling_session_id: sampling session {str(sid)[:120]!r} is not known to this "
                "proxy (create one, or save the weights for a sampler)"
            )
        if sampler is not None:
            core.samplers.move_to_end(sampler.program_id)
        elif not (body.get("model_path") or body.get("base_model")):
            raise _bad(
                "sampling_session_id: is required (or model_path / base_model for a one-off sample)"
            )
        self._check_base_model(body, "base_model")
        seq = _integer(body, "seq_id", required=False)
        if sampler is not None and seq is not None and seq in sampler.calls:
            known = sampler.calls[seq]
            if known.digest != canonical_digest(body, ignore=_SAMPLE_ADDRESSING):
                raise _precondition(
                    f"seq_id {seq} of sampling session {sampler.program_id} was already used by a "
                    "different sample request; a new request needs a new seq_id"
                )
            return known.ticket()
        samples = body.get("num_samples") or 1
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise _bad("num_samples: must be a positive integer")
        op = Op("asample", body, _SAMPLE_ADDRESSING, sampler=sampler, seq=seq)
        op.extra["sample_sequence_ids"] = [f"{op.request_id}:{i}" for i in range(samples)]
        if sampler is not None:
            sampler.remember(op)
            sampler.pending[op.request_id] = op
        else:
            core.oneoff[op.request_id] = op
        core.futures.add(op)
        up = core.up
        if up is not None and not up.closed:
            try:
                await samplers.send(core, op, up)
            except (Refused, PlatformError) as exc:
                core.futures.discard(op)
                core.oneoff.pop(op.request_id, None)
                if sampler is not None:
                    sampler.pending.pop(op.request_id, None)
                    if seq is not None:
                        sampler.calls.pop(seq, None)
                raise ProgramError.of(exc) from None
            except TrainerGone as exc:
                core.lose(up, exc)
            except Detached:
                pass
        return op.ticket()

    # -------------------------------------------------------------------- futures

    async def retrieve_future(self, c: Call) -> Encoded:
        request_id = c.body.get("request_id")
        op = self.core.futures.get(request_id) if isinstance(request_id, str) else None
        if op is None or op.dropped:
            raise ProgramError(
                410,
                "NOT_FOUND",
                f"future {str(request_id)[:120]!r} is unknown to this proxy: it expired; "
                "submit the request again",
            )
        if not op.done:
            await self.core.hold(op.answered, self.settings.retrieve_hold_s)
        if not op.done:
            attached = self.core.up is not None
            answer: dict[str, Any] = {
                "type": "try_again",
                "request_id": op.request_id,
                "queue_state": "active" if attached else "paused_capacity",
            }
            if not attached:
                answer["queue_state_reason"] = (
                    "the trainer is being brought back (a preemption or a pause); the request "
                    "runs once it is"
                )
            return Encoded("retrieve_future", answer)
        op.first_read = op.first_read or time.monotonic()
        if op.error is not None:
            return Encoded("retrieve_future", {"error": op.error, "category": op.category})
        if op.result is None:
            raise ProgramError(410, "NOT_FOUND", f"future {op.request_id}: no longer kept")
        return Encoded(op.op, op.result)

    # ------------------------------------------------------------ the REST surface

    async def server_capabilities(self, c: Call) -> Any:
        return await self._direct("GET", "get_server_capabilities")

    async def weights_info(self, c: Call) -> Any:
        body = dict(c.body)
        for key in ("tinker_path", "path"):
            if isinstance(body.get(key), str):
                body[key] = self.core.ids.trainer_path(body[key])
        return await self._direct("POST", "weights_info", body)

    async def list_checkpoints(self, c: Call) -> Any:
        """The Fireworks fork's trainer extension: the job's resumable checkpoints, by name
        (Shepherd's own left out)."""
        answer = await self._direct("GET", "list_checkpoints")
        names = answer.get("checkpoints") if isinstance(answer, dict) else None
        if isinstance(names, list):
            answer["checkpoints"] = [
                n for n in names if not (isinstance(n, str) and self.core.is_shepherd_name(n))
            ]
        return answer

    async def training_runs(self, c: Call) -> Any:
        answer = await self._direct("GET", "training_runs", query=c.query)
        runs = answer.get("training_runs") if isinstance(answer, dict) else None
        if isinstance(runs, list):
            seen: dict[str, Any] = {}
            for run in self.core.ids.program_value(runs):
                seen[str(run.get("training_run_id"))] = run  # the newest generation wins
            answer["training_runs"] = list(seen.values())
        return answer

    def _program_run(self, run: str) -> str:
        """The program's model that ``run`` (its own id, or one of its trainer runs: the
        run a checkpoint path names) is, else ``run``."""
        program = self.core.ids.program(run)
        return program if program is not None and self.core.ids.runs(program) else run

    async def training_run(self, c: Call) -> Any:
        run = self._program_run(c.params["run_id"])
        trainer_runs = self.core.ids.runs(run)
        if not trainer_runs:
            return self.core.ids.program_value(await self._direct("GET", f"training_runs/{run}"))
        answer = self.core.ids.program_value(
            await self._direct("GET", f"training_runs/{trainer_runs[-1]}")
        )
        merged = await self._merged_checkpoints(run, trainer_runs)
        answer["last_checkpoint"] = next(
            (x for x in reversed(merged) if x.get("checkpoint_type") == "training"), None
        )
        answer["last_sampler_checkpoint"] = next(
            (x for x in reversed(merged) if x.get("checkpoint_type") == "sampler"), None
        )
        return answer

    async def run_checkpoints(self, c: Call) -> Any:
        run = self._program_run(c.params["run_id"])
        trainer_runs = self.core.ids.runs(run)
        if not trainer_runs:
            return self.core.ids.program_value(
                await self._direct("GET", f"training_runs/{run}/checkpoints")
            )
        return {"checkpoints": await self._merged_checkpoints(run, trainer_runs)}

    async def _merged_checkpoints(self, run: str, trainer_runs: list[str]) -> list[Any]:
        """A program model's checkpoints over every trainer generation it lived on (each
        generation's run lists what it saved), as the program named them."""
        merged: dict[str, Any] = {}
        for trainer_run in trainer_runs:
            try:
                listed = await self._direct("GET", f"training_runs/{trainer_run}/checkpoints")
            except ProgramError as exc:
                if exc.status == "NOT_FOUND":
                    continue
                raise
            for item in listed.get("checkpoints") or []:
                checkpoint_id = str(item.get("checkpoint_id") or "")
                if self.core.is_shepherd_name(checkpoint_id.partition("/")[2]):
                    continue
                item = self.core.ids.program_value(item)
                # The platform's path (what the save answered): it outlives this job.
                item["tinker_path"] = f"{ids.TINKER}{trainer_run}/{checkpoint_id}"
                merged[checkpoint_id] = item
        return list(merged.values())

    def _trainer_checkpoint(self, c: Call) -> tuple[str, str]:
        path = f"{ids.TINKER}{c.params['run_id']}/{c.params['checkpoint_id']}"
        parts = ids.split_path(self.core.ids.trainer_path(path))
        if parts is None:
            raise _bad(
                f"checkpoint_id: {c.params['checkpoint_id'][:120]!r} must be weights/<name> or "
                "sampler_weights/<name>"
            )
        return parts[0], f"{parts[1]}/{parts[2]}"

    async def delete_checkpoint(self, c: Call) -> Any:
        run, checkpoint = self._trainer_checkpoint(c)
        return await self._direct("DELETE", f"training_runs/{run}/checkpoints/{checkpoint}")

    async def set_checkpoint_ttl(self, c: Call) -> Any:
        run, checkpoint = self._trainer_checkpoint(c)
        return await self._direct(
            "PUT", f"training_runs/{run}/checkpoints/{checkpoint}/ttl", c.body
        )

    async def user_checkpoints(self, c: Call) -> Any:
        answer = await self._direct("GET", "checkpoints", query=c.query)
        items = answer.get("checkpoints") if isinstance(answer, dict) else None
        if isinstance(items, list):
            answer["checkpoints"] = [
                self.core.ids.program_value(x)
                for x in items
                if not self.core.is_shepherd_name(str(x.get("checkpoint_id", "")).partition("/")[2])
            ]
        return answer
