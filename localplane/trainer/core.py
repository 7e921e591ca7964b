"""The Tinker service of one trainer process, free of HTTP (trainer-api.md §4).

It holds sessions, models and sampling sessions. Every model has one ordered stream of
operations (:class:`~localplane.trainer.futures.Sequencer`): a submission is answered at
once with a future, and one driver task per model applies the operations strictly in
``seq_id`` order, each exactly once. The arithmetic runs on one compute thread — the
trainer's "GPU" — so the event loop keeps answering ``retrieve_future``, ``healthz`` and new
submissions while a step computes, and so results are bit-reproducible.

Errors: a request that cannot even be routed (no model id, unknown model or session) is an
HTTP error raised as :class:`~localplane.errors.PlaneError`; anything wrong with the work
itself fails its future with category ``user`` (bad input, missing checkpoint) or ``server``
(a bug). Never a 404: on the data plane a 404 means "no route" (§5).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
import secrets
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from localplane import checkpoints as ckpt
from localplane.errors import FailedPrecondition, InvalidArgument, PlaneError
from localplane.trainer import lm, weights, wire
from localplane.trainer.futures import Future, FutureStore, SequenceError, Sequencer
from localplane.trainer.wire import UserError

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
DEFAULT_MAX_TOKENS = 64


@dataclass
class TrainerConfig:
    account: str
    job: str
    generation: int
    data_dir: Path
    base_model: str
    lora_rank: int = 0
    #: Adam's learning rate when a client's adam_params leave it out.
    learning_rate: float = 1e-4
    max_context_length: int = 8192
    #: Seeds LoRA adapters (a create_model's lora_config.seed wins) and sampling defaults.
    seed: int = 0
    #: Emulated GPU time per forward/forward_backward call.
    compute_delay_s: float = 0.0
    inactivity_timeout_s: float = 3600.0
    forward_only: bool = False
    keys_file: Path | None = None
    #: How long retrieve_future holds a request open before answering try_again. Clients
    #: time out at 45 s, so 20 s leaves room for a slow network.
    retrieve_hold_s: float = 20.0
    #: How long a later seq_id waits for a missing earlier one before the model breaks.
    #: Clients retry a lost submission within seconds (backoff capped at 30 s), so two
    #: minutes only fires for a submission that is really gone.
    seq_gap_timeout_s: float = 120.0

    @property
    def job_name(self) -> str:
        return f"accounts/{self.account}/rlorTrainerJobs/{self.job}"

    @classmethod
    def from_json(cls, text: str) -> TrainerConfig:
        raw = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        raw = {k: v for k, v in raw.items() if k in known}
        raw["data_dir"] = Path(raw["data_dir"])
        if raw.get("keys_file"):
            raw["keys_file"] = Path(raw["keys_file"])
        return cls(**raw)

    def to_json(self) -> str:
        raw = dataclasses.asdict(self)
        raw["data_dir"] = str(self.data_dir)
        raw["keys_file"] = str(self.keys_file) if self.keys_file else None
        return json.dumps(raw)


@dataclass
class Session:
    session_id: str
    created: float = field(default_factory=time.monotonic)
    finished: bool = False


@dataclass(eq=False)
class Model:
    model_id: str
    session_id: str
    seq: Sequencer
    net: lm.CausalLM | None = None
    adam: lm.Adam | None = None
    #: Optimizer steps in this model's life, counted on from a loaded checkpoint's step.
    optim_steps: int = 0
    #: Gradients summed since the last optim_step, and what they were summed over.
    grads: dict[str, np.ndarray] | None = None
    grad_tokens: int = 0
    grad_sequences: int = 0
    #: The last seq_id whose operation finished (applied or failed).
    last_seq: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


@dataclass(eq=False)
class Sampler:
    sampler_id: str
    base_model: str
    model_path: str | None
    net: lm.CausalLM


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UserError(f"{name}: must be a finite number")
    return float(value)


def _loss_tokens(inputs: dict[str, np.ndarray]) -> int:
    """Positions that carry loss: non-zero weights, or every target when there are none."""
    weights = inputs.get("weights")
    if weights is not None:
        return int(np.count_nonzero(weights))
    target = inputs.get("target_tokens")
    return int(target.size) if target is not None else 0


def _normalized(model: Model, mode: Any) -> dict[str, np.ndarray] | None:
    """The accumulated gradients, divided as the Fireworks SDK's
    ``grad_accumulation_normalization`` asks (its hosted trainers do this before clipping)."""
    if model.grads is None or mode in (None, "none"):
        return model.grads
    if mode == "num_loss_tokens":
        n = model.grad_tokens
    elif mode == "num_sequences":
        n = model.grad_sequences
    else:
        raise UserError(
            "grad_accumulation_normalization: must be num_loss_tokens, num_sequences or none"
        )
    return model.grads if n <= 0 else {k: g / n for k, g in model.grads.items()}


def _int_field(body: dict[str, Any], name: str, *, required: bool = False) -> int | None:
    value = body.get(name)
    if value is None:
        if required:
            raise InvalidArgument(f"{name}: is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name}: must be an integer")
    return value


def _str_field(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{name}: is required")
    return value


class TrainerService:
    def __init__(self, cfg: TrainerConfig) -> None:
        self.cfg = cfg
        self.futures = FutureStore()
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, Model] = {}
        #: (session_id, model_seq_id) -> the future of the call that created the model.
        self._model_calls: dict[tuple[str, int], Future] = {}
        self.samplers: dict[str, Sampler] = {}
        self._sample_calls: dict[tuple[str, int], Future] = {}
        self._gpu = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compute")
        self._tasks: set[asyncio.Task[None]] = set()
        #: Operations executing right now (see :meth:`busy`).
        self._running = 0
        self.tokenizer_dir = lm.write_tokenizer_dir(cfg.data_dir / "tokenizers" / "bytes").resolve()

    # ---------------------------------------------------------------- plumbing

    async def _compute(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._gpu, fn)

    async def _run(self, fut: Future, fn: Callable[[], dict[str, Any]], delay: float = 0.0) -> None:
        """Run ``fn`` on the compute thread and settle ``fut`` with its outcome."""
        self._running += 1
        try:
            result = await self._compute(fn)
            if delay > 0:
                await asyncio.sleep(delay)  # emulated GPU time
            fut.resolve(result)
        except UserError as exc:
            fut.fail(str(exc), "user")
        except Exception as exc:
            log.exception("operation.crashed", op=fut.op, request_id=fut.request_id)
            fut.fail(f"trainer error in {fut.op}: {type(exc).__name__}: {exc}", "server")
        finally:
            self._running -= 1

    def busy(self) -> bool:
        """Work is executing or waiting its turn: an idle timeout must not stop the trainer."""
        return self._running > 0 or any(m.seq.pending for m in self.models.values())

    def _spawn(self, fut: Future, fn: Callable[[], dict[str, Any]]) -> None:
        task = asyncio.get_running_loop().create_task(self._run(fut, fn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _session(self, body: dict[str, Any]) -> Session:
        session_id = _str_field(body, "session_id")
        session = self.sessions.get(session_id)
        if session is None:
            raise FailedPrecondition(
                f"session {session_id} is not on this trainer (sessions do not survive a "
                "trainer restart); call create_session first"
            )
        return session

    def _model(self, body: dict[str, Any]) -> Model:
        model_id = _str_field(body, "model_id")
        model = self.models.get(model_id)
        if model is None:
            raise FailedPrecondition(
                f"model {model_id} is not on this trainer (models do not survive a trainer "
                "restart); create a model, or load a checkpoint into a new one"
            )
        return model

    # ------------------------------------------------------------------ direct

    def client_config(self, body: dict[str, Any]) -> dict[str, Any]:
        # Chunks of one forward_backward must arrive in order: the sequence is per model. Plain
        # httpx (not tinker's Rust transport) keeps the SDK's network behaviour the documented one.
        return {"parallel_fwdbwd_chunks": False, "use_pyqwest_transport": False}

    def create_session(self, body: dict[str, Any]) -> dict[str, Any]:
        session_id = f"sess-{secrets.token_hex(8)}"
        self.sessions[session_id] = Session(session_id)
        log.info("session.created", session_id=session_id, sdk=body.get("sdk_version"))
        return {"type": "create_session", "session_id": session_id}

    def session_heartbeat(self, body: dict[str, Any]) -> dict[str, Any]:
        self._session(body)
        return {"type": "session_heartbeat"}

    def finish_session(self, session_id: str, body: dict[str, Any]) -> dict[str, Any]:
        session = self.sessions.get(session_id)
        if session is not None:
            session.finished = True
        return {}

    async def get_info(self, body: dict[str, Any]) -> dict[str, Any]:
        model = self._model(body)
        await model.ready.wait()
        net = model.net
        if net is None:
            raise FailedPrecondition(f"model {model.model_id} failed to start: {model.seq.broken}")
        # On the compute thread: the digest must not see a half-applied step.
        digest = await self._compute(net.digest)
        return {
            "type": "get_info",
            "model_id": model.model_id,
            "model_data": {
                "arch": net.cfg.stand_in,
                "model_name": net.cfg.base_model,
                "tokenizer_id": str(self.tokenizer_dir),
            },
            "is_lora": net.cfg.lora_rank > 0,
            "lora_rank": net.cfg.lora_rank,
            "model_name": net.cfg.base_model,
            # localplane extensions for tests; clients ignore fields they do not know.
            "weights_digest": digest,
            "optim_steps": model.optim_steps,
            "seq_id": model.last_seq,
            "max_context_length": self.cfg.max_context_length,
            "trainable_parameters": net.n_trainable(),
            "generation": self.cfg.generation,
        }

    def list_checkpoints(self) -> dict[str, Any]:
        metas = ckpt.list_meta(self.cfg.data_dir, self.cfg.account, self.cfg.job)
        return {"checkpoints": [m.checkpoint for m in metas if m.resumable]}

    def weights_info(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            ref = weights.parse_ref(
                body.get("tinker_path") or body.get("path"), self.cfg.account, self.cfg.job
            )
            meta = ckpt.read_meta(self.cfg.data_dir, ref.account, ref.job, ref.checkpoint)
        except UserError as exc:
            raise InvalidArgument(str(exc)) from None
        if meta is None:
            raise InvalidArgument(f"checkpoint {ref.checkpoint} of job {ref.job} does not exist")
        return {
            "base_model": meta.base_model,
            "is_lora": meta.lora_rank > 0,
            "lora_rank": meta.lora_rank or None,
        }

    def get_sampler(self, sampler_id: str) -> dict[str, Any]:
        sampler = self.samplers.get(sampler_id)
        if sampler is None:
            raise FailedPrecondition(f"sampler {sampler_id} is not on this trainer")
        return {
            "sampler_id": sampler.sampler_id,
            "base_model": sampler.base_model,
            "model_path": sampler.model_path,
        }

    # ------------------------------------------------------------------ models

    def _register(self, session_id: str, model_seq_id: int, op: str) -> tuple[Model, Future]:
        model_id = f"{session_id}:train:{model_seq_id}"
        model = Model(model_id, session_id, Sequencer(self.futures, self.cfg.seq_gap_timeout_s))
        self.models[model_id] = model
        fut = self.futures.add(Future(op, model_id), loose=True)
        self._model_calls[(session_id, model_seq_id)] = fut
        return model, fut

    def create_model(self, body: dict[str, Any]) -> dict[str, Any]:
        session = self._session(body)
        model_seq_id = _int_field(body, "model_seq_id", required=True)
        assert model_seq_id is not None
        known = self._model_calls.get((session.session_id, model_seq_id))
        if known is not None:
            return known.ticket()
        model, fut = self._register(session.session_id, model_seq_id, "create_model")
        base_model = body.get("base_model")
        lora = body.get("lora_config") or {}

        def build() -> dict[str, Any]:
            if base_model != self.cfg.base_model:
                raise UserError(
                    f"base_model: this trainer serves {self.cfg.base_model!r}, not {base_model!r}"
                )
            if not isinstance(lora, dict):
                raise UserError("lora_config: must be an object {rank, ...}")
            rank = lora.get("rank", 0)  # no lora_config: full-parameter training
            if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
                raise UserError("lora_config.rank: must be an integer >= 0 (0 = full-parameter)")
            seed = lora.get("seed")
            seed = self.cfg.seed if seed is None else seed
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise UserError("lora_config.seed: must be an integer")
            net = lm.CausalLM(lm.LMConfig(self.cfg.base_model, lora_rank=rank), seed=seed)
            self._start(model, net, lm.Adam(net.params), optim_steps=0)
            log.info("model.created", model_id=model.model_id, lora_rank=rank)
            return {"type": "create_model", "model_id": model.model_id}

        self._spawn_model_start(model, fut, build)
        return fut.ticket()

    def _start(self, model: Model, net: lm.CausalLM, adam: lm.Adam, optim_steps: int) -> None:
        model.net, model.adam, model.optim_steps = net, adam, optim_steps

    def _spawn_model_start(
        self, model: Model, fut: Future, build: Callable[[], dict[str, Any]]
    ) -> None:
        async def start() -> None:
            await self._run(fut, build)
            if fut.error is not None:
                model.seq.broken = f"the model failed to start: {fut.error}"
            model.ready.set()
            await self._drive(model)

        model.task = asyncio.get_running_loop().create_task(start())

    async def _drive(self, model: Model) -> None:
        """Apply the model's operations in seq_id order, one at a time, forever."""
        while True:
            sub = await model.seq.next()
            op = sub.future.op
            delay = self.cfg.compute_delay_s if op in ("forward", "forward_backward") else 0.0
            try:
                if model.net is None:
                    sub.future.fail(model.seq.broken or "the model failed to start", "user")
                else:
                    call = functools.partial(self._handlers[op], self, model, sub.body)
                    await self._run(sub.future, call, delay)
            finally:
                model.last_seq = sub.seq_id
            log.debug("operation.done", model_id=model.model_id, seq_id=sub.seq_id, op=op)

    def submit(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        """Accept a sequenced operation; its future's ticket comes back at once."""
        if op == "load_weights" and body.get("model_id") is None:
            return self._create_via_load(body)
        model = self._model(body)
        seq_id = _int_field(body, "seq_id")
        try:
            fut = model.seq.submit(op, model.model_id, seq_id, body)
        except SequenceError as exc:
            # 400, not 409: the tinker SDK retries a 409 as if it were transient.
            raise FailedPrecondition(str(exc)) from None
        return fut.ticket()

    def _create_via_load(self, body: dict[str, Any]) -> dict[str, Any]:
        """``load_weights`` with ``session_id`` + ``model_seq_id``: a new model whose first
        operation is the load (tinker derives the same model id client-side)."""
        session = self._session(body)
        model_seq_id = _int_field(body, "model_seq_id", required=True)
        assert model_seq_id is not None
        known = self._model_calls.get((session.session_id, model_seq_id))
        if known is not None:
            return known.ticket()
        model, fut = self._register(session.session_id, model_seq_id, "load_weights")
        path, with_optimizer = body.get("path"), bool(body.get("optimizer"))
        base_model = body.get("base_model")

        def build() -> dict[str, Any]:
            ref = weights.parse_ref(path, self.cfg.account, self.cfg.job)
            loaded = weights.read(self.cfg.data_dir, ref)
            if base_model not in (None, loaded.lm_config.base_model):
                raise UserError(
                    f"base_model: {base_model!r} differs from the checkpoint's base model "
                    f"{loaded.lm_config.base_model!r}"
                )
            if loaded.lm_config.base_model != self.cfg.base_model:
                raise UserError(
                    f"checkpoint {ref.checkpoint} was trained from {loaded.lm_config.base_model!r}; "
                    f"this trainer serves {self.cfg.base_model!r}"
                )
            net = lm.CausalLM(loaded.lm_config, seed=self.cfg.seed)
            adam = lm.Adam(net.params)
            self._restore(net, adam, loaded, with_optimizer, ref)
            self._start(model, net, adam, optim_steps=loaded.meta.step)
            log.info("model.loaded", model_id=model.model_id, checkpoint=loaded.meta.name)
            return {"type": "load_weights", "path": path, "model_id": model.model_id}

        self._spawn_model_start(model, fut, build)
        return fut.ticket()

    @staticmethod
    def _restore(
        net: lm.CausalLM, adam: lm.Adam, loaded: weights.Loaded, with_optimizer: bool, ref: Any
    ) -> None:
        try:
            net.load_state(loaded.params)
            if with_optimizer:
                if loaded.optimizer is None:
                    raise UserError(
                        f"checkpoint {ref.checkpoint} holds sampler weights only (no optimizer "
                        "state); load it with optimizer=false, or load a save_weights checkpoint"
                    )
                adam.load_state(loaded.optimizer)
        except ValueError as exc:
            raise UserError(str(exc)) from None

    # ------------------------------------------------------ sequenced handlers

    def _forward_backward(
        self, model: Model, body: dict[str, Any], backward: bool
    ) -> dict[str, Any]:
        assert model.net is not None
        key = "forward_backward_input" if "forward_backward_input" in body else "forward_input"
        inp = body.get(key, body)
        if not isinstance(inp, dict):
            raise UserError(f"{key}: must be an object {{data, loss_fn, loss_fn_config}}")
        if body.get("forward_only"):
            backward = False
        if backward and self.cfg.forward_only:
            raise UserError("this trainer job is forward-only: use forward, not forward_backward")
        data = wire.datums(
            inp.get("data"),
            f"{key}.data",
            vocab=lm.VOCAB_SIZE,
            max_len=self.cfg.max_context_length,
        )
        loss_fn = inp.get("loss_fn", "cross_entropy")
        config = inp.get("loss_fn_config")
        if config is not None and not isinstance(config, dict):
            raise UserError(f"{key}.loss_fn_config: must be an object")
        try:
            outputs, metrics, grads = model.net.forward_backward(
                data, str(loss_fn), config, backward=backward
            )
        except ValueError as exc:
            raise UserError(f"{key}: {exc}") from None
        if grads is not None:
            if model.grads is None:
                model.grads = grads
            else:
                model.grads = {k: model.grads[k] + g for k, g in grads.items()}
            model.grad_sequences += len(data)
            model.grad_tokens += sum(_loss_tokens(inputs) for _, inputs in data)
        return {
            "loss_fn_output_type": "ArrayRecord",
            "loss_fn_outputs": [
                {name: wire.tensor_data(arr) for name, arr in out.items()} for out in outputs
            ],
            # The client splits every key into name:reduction.
            "metrics": {(k if ":" in k else f"{k}:sum"): float(v) for k, v in metrics.items()},
        }

    def _optim_step(self, model: Model, body: dict[str, Any]) -> dict[str, Any]:
        assert model.net is not None and model.adam is not None
        if self.cfg.forward_only:
            raise UserError("this trainer job is forward-only: optim_step is not available")
        params = body.get("adam_params")
        if params is None:
            params = body.get("optim_params") or body.get("optimizer_params") or {}
        if not isinstance(params, dict):
            raise UserError("adam_params: must be an object")
        if params.get("type") not in (None, "adam", "adamw"):
            raise UserError(
                f"adam_params.type: this trainer runs Adam only, not {params['type']!r}"
            )
        grads = _normalized(model, body.get("grad_accumulation_normalization"))
        try:
            metrics = model.adam.apply(
                model.net.params,
                grads,
                learning_rate=_number(params, "learning_rate", self.cfg.learning_rate),
                beta1=_number(params, "beta1", 0.9),
                beta2=_number(params, "beta2", 0.95),
                eps=_number(params, "eps", 1e-12),
                weight_decay=_number(params, "weight_decay", 0.0),
                grad_clip_norm=_number(params, "grad_clip_norm", 0.0),
            )
        except ValueError as exc:
            raise UserError(str(exc)) from None
        model.grads, model.grad_tokens, model.grad_sequences = None, 0, 0
        model.optim_steps += 1
        return {"metrics": {k: float(v) for k, v in metrics.items()}}

    def _save(self, model: Model, body: dict[str, Any], kind: str) -> dict[str, Any]:
        assert model.net is not None and model.adam is not None
        name = body.get("path")
        if name is None and kind == "sampler":
            return self._anonymous_sampler(model, body)
        if name is None:
            name = f"seq-{model.seq.applied}"
        ref = weights.parse_ref(name, self.cfg.account, self.cfg.job)
        if (ref.account, ref.job) != (self.cfg.account, self.cfg.job):
            raise UserError(f"path: a trainer saves only under its own job {self.cfg.job}")
        meta = weights.save(
            self.cfg.data_dir,
            ref,
            kind=kind,
            lm=model.net,
            adam=model.adam,
            step=model.optim_steps,
            generation=self.cfg.generation,
            overwrite=bool(body.get("overwrite")),
        )
        log.info("checkpoint.saved", name=meta.name, kind=meta.kind, step=meta.step)
        op = "save_weights_for_sampler" if kind == "sampler" else "save_weights"
        return {"type": op, "path": ref.tinker_path(kind)}

    def _anonymous_sampler(self, model: Model, body: dict[str, Any]) -> dict[str, Any]:
        assert model.net is not None
        seq = body.get("sampling_session_seq_id")
        suffix = seq if isinstance(seq, int) else f"m{model.seq.applied}"
        sampler_id = f"{model.session_id}:sample:{suffix}"
        if sampler_id not in self.samplers:
            self.samplers[sampler_id] = Sampler(
                sampler_id, model.net.cfg.base_model, None, self._snapshot(model.net)
            )
        return {"type": "save_weights_for_sampler", "path": None, "sampling_session_id": sampler_id}

    @staticmethod
    def _snapshot(net: lm.CausalLM) -> lm.CausalLM:
        copy = lm.CausalLM(net.cfg)
        copy.load_state(net.state())
        return copy

    def _load(self, model: Model, body: dict[str, Any]) -> dict[str, Any]:
        assert model.net is not None
        ref = weights.parse_ref(body.get("path"), self.cfg.account, self.cfg.job)
        loaded = weights.read(self.cfg.data_dir, ref)
        if loaded.lm_config != model.net.cfg:
            raise UserError(
                f"checkpoint {ref.checkpoint} was saved by a different model "
                f"({loaded.lm_config.stand_in} from {loaded.lm_config.base_model!r}); this model "
                f"is {model.net.cfg.stand_in} from {model.net.cfg.base_model!r}"
            )
        adam = lm.Adam(model.net.params)
        self._restore(model.net, adam, loaded, bool(body.get("optimizer")), ref)
        model.adam, model.optim_steps = adam, loaded.meta.step
        model.grads, model.grad_tokens, model.grad_sequences = None, 0, 0
        log.info("checkpoint.loaded", model_id=model.model_id, name=loaded.meta.name)
        return {"type": "load_weights", "path": body.get("path"), "model_id": model.model_id}

    _handlers: dict[str, Callable[[TrainerService, Model, dict[str, Any]], dict[str, Any]]] = {
        "forward": lambda s, m, b: s._forward_backward(m, b, backward=False),
        "forward_backward": lambda s, m, b: s._forward_backward(m, b, backward=True),
        "optim_step": lambda s, m, b: s._optim_step(m, b),
        "save_weights": lambda s, m, b: s._save(m, b, "state"),
        "save_weights_for_sampler": lambda s, m, b: s._save(m, b, "sampler"),
        "load_weights": lambda s, m, b: s._load(m, b),
    }

    # ---------------------------------------------------------------- sampling

    def _sampler_from(self, model_path: Any, base_model: Any) -> Sampler:
        """A sampler over a checkpoint (any kind) or, without a path, the base model."""
        if model_path:
            ref = weights.parse_ref(model_path, self.cfg.account, self.cfg.job)
            loaded = weights.read(self.cfg.data_dir, ref)
            net = lm.CausalLM(loaded.lm_config, seed=self.cfg.seed)
            try:
                net.load_state(loaded.params)
            except ValueError as exc:
                raise UserError(str(exc)) from None
            return Sampler("", loaded.lm_config.base_model, str(model_path), net)
        name = base_model or self.cfg.base_model
        if name != self.cfg.base_model:
            raise UserError(
                f"base_model: this trainer serves {self.cfg.base_model!r}, not {name!r}"
            )
        return Sampler("", name, None, lm.CausalLM(lm.LMConfig(name), seed=self.cfg.seed))

    async def create_sampling_session(self, body: dict[str, Any]) -> dict[str, Any]:
        session = self._session(body)
        seq = _int_field(body, "sampling_session_seq_id", required=True)
        sampler_id = f"{session.session_id}:sample:{seq}"
        if sampler_id not in self.samplers:
            try:
                sampler = await self._compute(
                    lambda: self._sampler_from(body.get("model_path"), body.get("base_model"))
                )
            except UserError as exc:
                raise InvalidArgument(str(exc)) from None
            sampler.sampler_id = sampler_id
            self.samplers[sampler_id] = sampler
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    def asample(self, body: dict[str, Any]) -> dict[str, Any]:
        sampler_id = body.get("sampling_session_id")
        seq_id = body.get("seq_id")
        key = (
            (sampler_id, seq_id)
            if isinstance(sampler_id, str) and isinstance(seq_id, int)
            else None
        )
        if key is not None and key in self._sample_calls:
            return self._sample_calls[key].ticket()
        if sampler_id is not None and sampler_id not in self.samplers:
            raise FailedPrecondition(
                f"sampling session {sampler_id} is not on this trainer (sampling sessions do not "
                "survive a trainer restart); create a new one"
            )
        n = body.get("num_samples", 1)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1024:
            raise InvalidArgument("num_samples: must be an integer in [1, 1024]")
        fut = Future("asample")
        fut.extra["sample_sequence_ids"] = [f"{fut.request_id}:{i}" for i in range(n)]
        self.futures.add(fut, loose=True)
        if key is not None:
            self._sample_calls[key] = fut
        self._spawn(fut, lambda: self._sample(body, n, fut.request_id))
        return fut.ticket()

    def _sample(self, body: dict[str, Any], n: int, request_id: str) -> dict[str, Any]:
        sampler_id = body.get("sampling_session_id")
        if sampler_id is not None:
            sampler = self.samplers[sampler_id]
        else:
            sampler = self._sampler_from(body.get("model_path"), body.get("base_model"))
        prompt = wire.model_input_tokens(body.get("prompt"), "prompt")
        if not prompt or min(prompt) < 0 or max(prompt) >= lm.VOCAB_SIZE:
            raise UserError(f"prompt: needs tokens in [0, {lm.VOCAB_SIZE})")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise UserError("sampling_params: must be an object")
        room = self.cfg.max_context_length - len(prompt)
        max_tokens = params.get("max_tokens")
        max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise UserError("sampling_params.max_tokens: must be an integer >= 0")
        if max_tokens > room:
            raise UserError(
                f"sampling_params.max_tokens: {len(prompt)} prompt tokens + {max_tokens} exceed "
                f"max_context_length {self.cfg.max_context_length}"
            )
        seed = params.get("seed")
        if seed is None:
            # Deterministic per request: a retried sample gives the same tokens.
            seed = zlib.crc32(f"{sampler_id}/{body.get('seq_id')}/{request_id}".encode())
        stop = wire.stop_sequences(params.get("stop"), lm.encode, "sampling_params.stop")
        top_k = params.get("top_k", -1)
        sequences = []
        for i in range(n):
            try:
                tokens, logprobs, reason = sampler.net.sample(
                    prompt,
                    max_tokens=max_tokens,
                    temperature=_number(params, "temperature", 1.0),
                    top_k=-1 if top_k is None else int(top_k),
                    top_p=_number(params, "top_p", 1.0),
                    stop=stop,
                    seed=int(seed) + i,
                )
            except ValueError as exc:
                raise UserError(f"sampling_params: {exc}") from None
            sequences.append({"tokens": tokens, "logprobs": logprobs, "stop_reason": reason})
        result: dict[str, Any] = {"type": "sample", "sequences": sequences, "prompt_logprobs": None}
        if body.get("prompt_logprobs"):
            result["prompt_logprobs"] = sampler.net.prompt_logprobs(prompt)
        return result

    # -------------------------------------------------------------- retrieval

    async def retrieve(self, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """``(op, answer)``: the result, a try_again, or an error; ``PlaneError(410)`` when the
        future is unknown (expired, or from a previous trainer generation)."""
        request_id = _str_field(body, "request_id")
        fut = self.futures.get(request_id)
        if fut is None:
            raise Gone(
                f"future {request_id} is unknown to this trainer: it expired or was made by a "
                "previous trainer; submit the request again"
            )
        if not fut.done and not await fut.wait(self.cfg.retrieve_hold_s):
            return fut.op, {"type": "try_again", "request_id": request_id, "queue_state": "active"}
        if fut.error is not None:
            return fut.op, {"error": fut.error, "category": fut.category or "unknown"}
        assert fut.result is not None
        return fut.op, fut.result


class Gone(PlaneError):
    code, status = 410, "NOT_FOUND"
