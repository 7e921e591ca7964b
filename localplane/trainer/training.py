"""Models and their training operations (trainer-api.md §4).

Every model has one ordered stream of operations (:class:`~localplane.trainer.futures.Sequencer`):
a submission is checked and answered at once with a future, and one driver task per model
applies the operations strictly in ``seq_id`` order, each exactly once, on the compute thread.

What a request asks for that this trainer does not support is refused at submission with a
400 naming the field (the ``seq_id`` is not consumed); what can only be checked against the
model (datum contents, a checkpoint's existence) fails the operation's future with category
``user``. A model's memory is reserved against the trainer's budget before it is built.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from localplane import checkpoints as ckpt
from localplane import limits
from localplane.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, shorten
from localplane.trainer import checkpoints as ckpts
from localplane.trainer import losses, runs, validate
from localplane.trainer.backend import Trainable
from localplane.trainer.context import TrainerContext
from localplane.trainer.errors import UserError
from localplane.trainer.futures import Future, SequenceError, Sequencer
from localplane.trainer.sampling import Samplers
from localplane.trainer.sessions import Session
from shepherd.tinker_wire.dialects import canonical_digest, retry_varying
from shepherd.tinker_wire.values import tensor_data

log = structlog.stdlib.get_logger("localplane.trainer")

#: Operations that take a model's next seq_id.
SEQUENCED = frozenset(
    {
        "forward",
        "forward_backward",
        "optim_step",
        "save_weights",
        "save_weights_for_sampler",
        "load_weights",
    }
)
#: Operations that change nothing when they fail on the trainer's side (a checkpoint is
#: written to a temporary name and renamed): a repeat of a failed one is done again.
REDOABLE = frozenset({"save_weights", "save_weights_for_sampler"})
#: Request fields that identify a request rather than say what it asks (ignored by dedupe).
_ADDRESSING = ("type",)
#: Parsed datums a submission carries to its operation (stable_reinforce, checked at once).
_PARSED = "__parsed_datums__"
#: create_model fields of the Fireworks fork this trainer cannot honour.
_CREATE_REFUSED = {
    "projection_head_dim": "a projection head is not supported by this trainer",
}


@dataclass(eq=False)
class Model:
    model_id: str
    session_id: str
    run: runs.RunRecord
    seq: Sequencer
    nbytes: int = 0
    state: Trainable | None = None
    #: Optimizer steps in this model's life, counted on from a loaded checkpoint's step.
    optim_steps: int = 0
    #: The last seq_id whose operation finished (applied or failed).
    last_seq: int = 0
    #: Counts what changed the weights (optimizer steps, loads): a failed save is done again
    #: only on the weights it failed to save.
    weights_version: int = 0
    last_used: float = field(default_factory=time.monotonic)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class Models:
    def __init__(self, ctx: TrainerContext, samplers: Samplers) -> None:
        self.ctx = ctx
        #: Where a model's snapshots go, what makes room for a model, and the recorded
        #: sequences a provenance span names.
        self.samplers = samplers
        self._models: dict[str, Model] = {}
        #: (session_id, model_seq_id) -> the future of the call that created the model.
        self._creates: dict[tuple[str, int], Future] = {}
        #: forward/forward_backward calls applied, by loss (healthz, for tests and operators).
        self.loss_calls: Counter[str] = Counter()
        self._handlers: dict[str, Callable[[Model, dict[str, Any]], Any]] = {
            "forward": lambda m, b: self._forward_backward(m, b, backward=False),
            "forward_backward": lambda m, b: self._forward_backward(m, b, backward=True),
            "optim_step": self._optim_step,
            "save_weights": lambda m, b: self._save(m, b, "state"),
            "save_weights_for_sampler": lambda m, b: self._save(m, b, "sampler"),
            "load_weights": self._load,
        }

    def __len__(self) -> int:
        return len(self._models)

    def nbytes(self) -> int:
        return sum(m.nbytes for m in self._models.values())

    def pending(self) -> bool:
        return any(m.seq.pending for m in self._models.values())

    def busy(self, session: Session) -> bool:
        return any(self._models[mid].seq.pending for mid in session.models if mid in self._models)

    def find(self, model_id: str) -> Model | None:
        return self._models.get(model_id)

    def model(self, body: dict[str, Any]) -> Model:
        model_id = body.get("model_id")
        if not isinstance(model_id, str) or not model_id:
            raise InvalidArgument("model_id: is required")
        model = self._models.get(model_id)
        if model is None:
            raise FailedPrecondition(
                f"model {shorten(model_id)} is not on this trainer (models do not survive a "
                "trainer restart, or an idle session's end); create a model, or load a "
                "checkpoint into a new one"
            )
        model.last_used = time.monotonic()
        self.ctx.sessions.touch(model.session_id)
        return model

    def caller(self, model: Model) -> ckpts.Caller:
        return self.ctx.caller(lineage=model.run.lineage, run=model.model_id)

    # -------------------------------------------------------------------- creation

    def _new_model_request(
        self, body: dict[str, Any]
    ) -> tuple[Session, int, str, dict[str, Any] | None]:
        """A request that makes a model (``create_model``, or ``load_weights`` with a session):
        its session, ``model_seq_id`` and body digest, and the answer already given to the
        same request (None: a new one)."""
        digest = canonical_digest(body, ignore=_ADDRESSING)
        with validate.as_http():
            session = self.ctx.sessions.get(validate.text(body, "session_id"))
            seq = validate.integer(body, "model_seq_id", required=True, low=0)
            assert seq is not None
            return session, seq, digest, self._dedupe_create(session, seq, digest)

    def _dedupe_create(self, session: Session, seq: int, digest: str) -> dict[str, Any] | None:
        known = self._creates.get((session.session_id, seq))
        if known is not None:
            if known.digest != digest:
                raise FailedPrecondition(
                    f"model_seq_id {seq} of session {session.session_id} was already used by a "
                    "different request (its body differs from this one's); a retry must resend "
                    "the same request, and a new model needs a new model_seq_id"
                )
            return known.ticket()
        model = self._models.get(f"{session.session_id}:train:{seq}")
        if model is not None:
            # Its creation future was forgotten (old): the model stands; say so again.
            fut = self.ctx.futures.add(Future("create_model", model.model_id, digest), loose=True)
            fut.resolve({"type": "create_model", "model_id": model.model_id})
            return fut.ticket()
        return None

    def _reserve(self, nbytes: int, where: str) -> None:
        """Make room for a model of ``nbytes`` in the memory budget, or refuse it."""
        if nbytes > limits.TRAINER_MEMORY_BUDGET_BYTES:
            raise InvalidArgument(
                f"{where}: this model needs {nbytes / 2**30:.1f} GiB of trainer memory; this "
                f"trainer's budget is {limits.TRAINER_MEMORY_BUDGET_BYTES / 2**30:.1f} GiB"
            )
        if len(self._models) >= limits.MAX_MODELS:
            raise ResourceExhausted(
                f"this trainer holds {limits.MAX_MODELS} models (its limit); unload a model or "
                "finish a session first"
            )
        self.samplers.make_room(nbytes)
        if self.ctx.bytes_in_use() + nbytes > limits.TRAINER_MEMORY_BUDGET_BYTES:
            raise ResourceExhausted(
                f"this trainer's memory budget ({limits.TRAINER_MEMORY_BUDGET_BYTES / 2**30:.1f} "
                "GiB) is taken by its other models; unload a model first"
            )

    def _register(
        self,
        session: Session,
        seq: int,
        op: str,
        digest: str,
        nbytes: int,
        metadata: dict[str, str],
    ) -> tuple[Model, Future]:
        ctx = self.ctx
        model_id = f"{session.session_id}:train:{seq}"
        now = ckpt.now_rfc3339()
        run = runs.RunRecord(
            run_id=model_id,
            account=ctx.cfg.account,
            job=ctx.cfg.job,
            generation=ctx.cfg.generation,
            base_model=ctx.cfg.base_model,
            lora_rank=0,
            lineage=model_id,
            created=now,
            updated=now,
            user_metadata=metadata,
        )
        model = Model(
            model_id,
            session.session_id,
            run,
            Sequencer(ctx.futures, ctx.cfg.seq_gap_timeout_s),
            nbytes,
        )
        self._models[model_id] = model
        session.models.add(model_id)
        fut = ctx.futures.add(Future(op, model_id, digest), loose=True)
        key = (session.session_id, seq)
        self._creates[key] = fut
        fut.on_forget.append(lambda _: self._drop_create(key))
        return model, fut

    def _drop_create(self, key: tuple[str, int]) -> None:
        self._creates.pop(key, None)

    def create_model(self, body: dict[str, Any]) -> dict[str, Any]:
        ctx = self.ctx
        session, seq, digest, known = self._new_model_request(body)
        if known is not None:
            return known
        with validate.as_http():
            validate.base_model(body.get("base_model"), ctx.cfg.base_model)
            lora_raw = body.get("lora_config")
            lora = validate.lora(lora_raw)
            validate.optimizer_config(body.get("optimizer_config"))
            validate.refuse_set(body, _CREATE_REFUSED)
            metadata = validate.user_metadata(body.get("user_metadata"))
            seed = validate.seed(lora_raw or {}, ctx.cfg.seed)
            try:
                config = ctx.backend.describe(ctx.cfg.base_model, lora)
            except ValueError as exc:
                raise UserError(str(exc)) from None
        nbytes = ctx.backend.estimate_bytes(config, trainable=True)
        self._reserve(nbytes, "lora_config.rank")
        model, fut = self._register(session, seq, "create_model", digest, nbytes, metadata)

        def build() -> dict[str, Any]:
            state = ctx.backend.create(config, seed)
            self._started(model, state, optim_steps=0)
            log.info("model.created", model_id=model.model_id, lora_rank=lora.rank)
            return {"type": "create_model", "model_id": model.model_id}

        self._start(model, fut, build)
        return fut.ticket()

    def _create_via_load(self, body: dict[str, Any]) -> dict[str, Any]:
        """``load_weights`` with ``session_id`` + ``model_seq_id``: a new model whose first
        operation is the load (tinker derives the same model id client-side)."""
        ctx = self.ctx
        session, seq, digest, known = self._new_model_request(body)
        if known is not None:
            return known
        with validate.as_http():
            metadata = validate.user_metadata(body.get("user_metadata"))
            with_optimizer = validate.flag(body, "optimizer")
        path, base_model = body.get("path"), body.get("base_model")
        try:
            meta: ckpt.CheckpointMeta | None = ckpts.resolve(path, ctx.caller())
        except UserError:
            meta = None  # the load's future says why
        nbytes = 0
        if meta is not None and meta.model_config:
            nbytes = ctx.backend.estimate_bytes(meta.model_config, trainable=True)
            self._reserve(nbytes, "path")
        model, fut = self._register(session, seq, "load_weights", digest, nbytes, metadata)

        def build() -> dict[str, Any]:
            found = meta or ckpts.resolve(path, ctx.caller())
            exported = ckpts.read(ctx.cfg.data_dir, found)
            if base_model not in (None, exported.base_model):
                raise UserError(
                    f"base_model: {shorten(base_model)!r} differs from the checkpoint's base "
                    f"model {exported.base_model!r}"
                )
            if exported.base_model != ctx.cfg.base_model:
                raise UserError(
                    f"path: checkpoint {found.checkpoint} was trained from "
                    f"{exported.base_model!r}; this trainer serves {ctx.cfg.base_model!r}"
                )
            state = ctx.backend.restore(exported, with_optimizer=with_optimizer, seed=ctx.cfg.seed)
            self._continue_lineage(model, found, with_optimizer)
            self._started(model, state, optim_steps=found.step)
            log.info("model.loaded", model_id=model.model_id, checkpoint=found.checkpoint)
            return {"type": "load_weights", "path": path, "model_id": model.model_id}

        self._start(model, fut, build)
        return fut.ticket()

    def _continue_lineage(
        self, model: Model, meta: ckpt.CheckpointMeta, with_optimizer: bool
    ) -> None:
        """A load with optimizer state is a resume: the model continues the checkpoint's
        training lineage (its names, so a replay that diverged is refused). A weights-only
        load starts training anew from those weights, as hosted Tinker's
        ``create_training_client_from_state`` starts a new run: the model keeps its own
        lineage (itself, when new), so its names are its own — an SFT -> RL pipeline on one
        trainer saves "000002" twice, once per run."""
        if not with_optimizer:
            return
        model.run.lineage = meta.lineage or (
            meta.runs[0] if meta.runs else f"{meta.job}/{meta.checkpoint}"
        )

    def _started(self, model: Model, state: Trainable, optim_steps: int) -> None:
        model.state, model.optim_steps = state, optim_steps
        model.run.lora_rank = state.lora_rank
        model.run.model_config = state.config
        runs.write(self.ctx.cfg.data_dir, model.run)

    def _start(self, model: Model, fut: Future, build: Callable[[], dict[str, Any]]) -> None:
        async def start() -> None:
            await self.ctx.compute.run(fut, build)
            if fut.error is not None:
                model.seq.broken = f"the model failed to start: {fut.error}"
            model.ready.set()
            await self._drive(model)

        model.task = asyncio.get_running_loop().create_task(start())

    # ------------------------------------------------------------------ operations

    def submit(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        """Accept a sequenced operation; its future's ticket comes back at once."""
        if op == "load_weights" and body.get("model_id") is None:
            return self._create_via_load(body)
        model = self.model(body)
        with validate.as_http():
            seq_id = validate.integer(body, "seq_id")
        digest = canonical_digest(body, ignore=retry_varying(op, body))
        known = model.seq.window.get(seq_id) if seq_id is not None else None
        if known is None:
            # New work: refuse what this trainer cannot do before it takes a seq_id.
            with validate.as_http():
                body = self._check(model, op, body)
        try:
            fut = model.seq.submit(op, model.model_id, seq_id, body, digest)
        except SequenceError as exc:
            # 400, not 409: the tinker SDK retries a 409 as if it were transient.
            raise FailedPrecondition(str(exc)) from None
        return fut.ticket()

    def _check(self, model: Model, op: str, body: dict[str, Any]) -> dict[str, Any]:
        cfg = self.ctx.cfg
        if op in ("forward", "forward_backward"):
            if body.get("forward_only"):
                op = "forward"
            key, inp = validate.forward_input(body)
            spec, _ = validate.loss(inp, key)
            if op == "forward_backward" and cfg.forward_only:
                raise UserError(
                    "this trainer job is forward-only: use forward, not forward_backward"
                )
            if spec.uses_provenance and any(
                isinstance(d, dict) and d.get("loss_fn_input_spans") for d in inp.get("data") or []
            ):
                # Provenance is checked against the recorded sequences now, on the event loop
                # that owns them; the operation gets the resolved datums.
                parsed = validate.datums(
                    inp, key, vocab=self.ctx.backend.vocab_size, max_len=cfg.max_context_length
                )
                return {
                    **body,
                    _PARSED: self.samplers.resolve_provenance(parsed, model.session_id),
                }
        elif op == "optim_step":
            if cfg.forward_only:
                raise UserError("this trainer job is forward-only: optim_step is not available")
            validate.adam(body, cfg.learning_rate)
            validate.normalization(body)
        elif op in ("save_weights", "save_weights_for_sampler"):
            name = validate.text(body, "path", required=False)
            if name is not None:
                ckpts.validate_name(name)
            validate.ttl_seconds(body)
            validate.flag(body, "overwrite")
            validate.user_metadata(body.get("user_metadata"))
            if op == "save_weights_for_sampler":
                validate.sampler_save(body)
        elif op == "load_weights":
            validate.text(body, "path")
            validate.flag(body, "optimizer")
        return body

    async def _drive(self, model: Model) -> None:
        """Apply the model's operations in seq_id order, one at a time, forever."""
        ctx = self.ctx
        while True:
            sub = await model.seq.next()
            op = sub.future.op
            delay = ctx.cfg.compute_delay_s if op in ("forward", "forward_backward") else 0.0
            try:
                if model.state is None:
                    sub.future.fail(model.seq.broken or "the model failed to start", "user")
                elif sub.future.redo_at not in (None, model.weights_version):
                    sub.future.fail(
                        f"seq_id {sub.seq_id} ({op}) failed on the trainer and the model has "
                        "trained since: it cannot be saved at its place again; save under a new "
                        "seq_id",
                        "user",
                    )
                else:
                    handler = self._handlers[op]
                    call = functools.partial(handler, model, sub.body)
                    await ctx.compute.run(sub.future, call, delay)
                    if op in REDOABLE and sub.future.category == "server":
                        sub.future.redo_at = model.weights_version
            finally:
                model.last_seq = max(model.last_seq, sub.seq_id)
            log.debug("operation.done", model_id=model.model_id, seq_id=sub.seq_id, op=op)

    def _forward_backward(
        self, model: Model, body: dict[str, Any], backward: bool
    ) -> dict[str, Any]:
        ctx = self.ctx
        assert model.state is not None
        if body.get("forward_only"):
            backward = False
        key, inp = validate.forward_input(body)
        loss_fn = inp.get("loss_fn", "cross_entropy")
        datums = body.get(_PARSED) or validate.datums(
            inp, key, vocab=ctx.backend.vocab_size, max_len=ctx.cfg.max_context_length
        )
        try:
            result = ctx.backend.forward_backward(
                model.state, datums, loss_fn, inp.get("loss_fn_config"), backward=backward
            )
        except (ValueError, losses.LossError) as exc:
            raise UserError(f"{key}: {exc}") from None
        self.loss_calls[f"{'forward_backward' if backward else 'forward'}:{loss_fn}"] += 1
        return {
            "loss_fn_output_type": "ArrayRecord",
            "loss_fn_outputs": [
                {name: tensor_data(arr) for name, arr in out.items()} for out in result.outputs
            ],
            # The client splits every key into name:reduction.
            "metrics": {
                (k if ":" in k else f"{k}:sum"): float(v) for k, v in result.metrics.items()
            },
        }

    def _optim_step(self, model: Model, body: dict[str, Any]) -> dict[str, Any]:
        ctx = self.ctx
        assert model.state is not None
        adam = validate.adam(body, ctx.cfg.learning_rate)
        mode = validate.normalization(body)
        try:
            metrics = ctx.backend.optim_step(model.state, adam, None if mode == "none" else mode)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        model.optim_steps += 1
        model.weights_version += 1
        return {"type": "optim_step", "metrics": {k: float(v) for k, v in metrics.items()}}

    def _save(self, model: Model, body: dict[str, Any], segment: str) -> dict[str, Any]:
        ctx = self.ctx
        assert model.state is not None
        name = body.get("path")
        if name is None and segment == "sampler":
            return self._anonymous_sampler(model, body)
        if name is None:
            name = f"seq-{model.seq.applied}"
        exported = ctx.backend.export(model.state, with_optimizer=segment == "state")
        meta = ckpts.save(
            self.caller(model),
            name,
            segment=segment,
            exported=exported,
            step=model.optim_steps,
            generation=ctx.cfg.generation,
            ttl_seconds=validate.ttl_seconds(body),
            overwrite=validate.flag(body, "overwrite"),
            user_metadata=validate.user_metadata(body.get("user_metadata")),
        )
        model.run.updated = ckpt.now_rfc3339()
        runs.write(ctx.cfg.data_dir, model.run)
        log.info("checkpoint.saved", name=meta.checkpoint, kind=meta.kind, step=meta.step)
        op = "save_weights_for_sampler" if segment == "sampler" else "save_weights"
        return {"type": op, "path": ckpts.tinker_path(model.model_id, segment, name)}

    def _anonymous_sampler(self, model: Model, body: dict[str, Any]) -> dict[str, Any]:
        ctx = self.ctx
        assert model.state is not None
        seq = body.get("sampling_session_seq_id")
        suffix = (
            seq if isinstance(seq, int) and not isinstance(seq, bool) else f"m{model.seq.applied}"
        )
        sampler_id = f"{model.session_id}:sample:{suffix}"
        snapshot = ctx.backend.snapshot(model.state)
        # Registered on the event loop (which owns the table) before the future resolves.
        session_id = model.session_id

        def register() -> None:
            self.samplers.register(sampler_id, session_id, None, snapshot)

        ctx.after(register)
        return {"type": "save_weights_for_sampler", "path": None, "sampling_session_id": sampler_id}

    def _load(self, model: Model, body: dict[str, Any]) -> dict[str, Any]:
        ctx = self.ctx
        assert model.state is not None
        meta = ckpts.resolve(body.get("path"), self.caller(model))
        exported = ckpts.read(ctx.cfg.data_dir, meta)
        with_optimizer = validate.flag(body, "optimizer")
        try:
            ctx.backend.load_into(model.state, exported, with_optimizer=with_optimizer)
        except ValueError as exc:
            raise UserError(f"path: checkpoint {meta.checkpoint}: {exc}") from None
        model.optim_steps = meta.step
        model.weights_version += 1
        self._continue_lineage(model, meta, with_optimizer)
        runs.write(ctx.cfg.data_dir, model.run)
        log.info("checkpoint.loaded", model_id=model.model_id, name=meta.checkpoint)
        return {"type": "load_weights", "path": body.get("path"), "model_id": model.model_id}

    # -------------------------------------------------------------------- queries

    async def get_info(self, body: dict[str, Any]) -> dict[str, Any]:
        ctx = self.ctx
        model = self.model(body)
        await model.ready.wait()
        state = model.state
        if state is None:
            raise FailedPrecondition(f"model {model.model_id} failed to start: {model.seq.broken}")
        # On the compute thread: the digest must not see a half-applied step.
        digest, info = await ctx.compute.call(
            lambda: (ctx.backend.digest(state), ctx.backend.info(state))
        )
        return {
            "type": "get_info",
            "model_id": model.model_id,
            "model_data": {
                "arch": info["arch"],
                "model_name": state.base_model,
                "tokenizer_id": str(ctx.tokenizer_dir),
            },
            "is_lora": state.lora_rank > 0,
            "lora_rank": state.lora_rank,
            "model_name": state.base_model,
            # localplane extensions for tests; clients ignore fields they do not know.
            "weights_digest": digest,
            "optim_steps": model.optim_steps,
            "seq_id": model.last_seq,
            "max_context_length": ctx.cfg.max_context_length,
            "trainable_parameters": info["trainable_parameters"],
            "generation": ctx.cfg.generation,
        }

    def unload(self, body: dict[str, Any]) -> dict[str, Any]:
        """The Fireworks fork's ``unload_model``: the model and its memory are released."""
        model = self.model(body)
        self.forget(model, "unloaded by the client")
        fut = self.ctx.futures.add(Future("unload_model", model.model_id), loose=True)
        fut.resolve({"type": "unload_model", "model_id": model.model_id})
        return fut.ticket()

    def forget(self, model: Model, why: str) -> None:
        if self._models.pop(model.model_id, None) is None:
            return
        model.seq.close(f"model {model.model_id} is gone: {why}")
        if model.task is not None:
            model.task.cancel()
        session = self.ctx.sessions.find(model.session_id)
        if session is not None:
            session.models.discard(model.model_id)
        log.info("model.forgotten", model_id=model.model_id, reason=why)

    def forget_session(self, session: Session) -> None:
        for model_id in list(session.models):
            model = self._models.get(model_id)
            if model is not None:
                self.forget(model, "its session ended")

    def sweep(self, now: float) -> None:
        for model in self._models.values():
            model.seq.sweep(now)
