"""The Tinker service of one trainer process, free of HTTP (trainer-api.md §4, §7).

It is the composition root of the parts, each in its own module: sessions (:mod:`.sessions`),
models and their training operations (:mod:`.training`), sampling (:mod:`.sampling`),
checkpoints and training runs (:mod:`.checkpoints`, :mod:`.runs`), futures (:mod:`.futures`),
the model math behind a :class:`~localplane.trainer.backend.Backend`, and input checks
(:mod:`.validate`). What the parts share — the compute thread, the future store, the memory
budget — is a :class:`~localplane.trainer.context.TrainerContext` built here and handed to
each; the parts never import this module. Here live the direct calls that belong to no
single part (client config, retrieval, the REST views).

The arithmetic runs on one compute thread — the trainer's "GPU" — so the event loop keeps
answering ``retrieve_future``, ``healthz`` and new submissions while a step computes, and
results are bit-reproducible. Every table is bounded (:mod:`localplane.limits`); a
housekeeping task sweeps them by age.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import structlog

from localplane import checkpoints as ckpt
from localplane import limits
from localplane.errors import Gone, InvalidArgument, MissingResource, shorten
from localplane.trainer import checkpoints as ckpts
from localplane.trainer import lm, runs, validate
from localplane.trainer.backend import Backend
from localplane.trainer.config import TrainerConfig
from localplane.trainer.context import TrainerContext
from localplane.trainer.numpy_backend import NumpyBackend
from localplane.trainer.sampling import Samplers
from localplane.trainer.sessions import Session, Sessions
from localplane.trainer.training import Models

log = structlog.stdlib.get_logger("localplane.trainer")

#: Page size of the REST listings when a client sends none (the tinker SDK's own default).
DEFAULT_LIMIT = 20
MAX_LIMIT = 1000


def _page(query: dict[str, str]) -> tuple[int, int]:
    try:
        limit = int(query.get("limit") or DEFAULT_LIMIT)
        offset = int(query.get("offset") or 0)
    except ValueError:
        raise InvalidArgument("limit, offset: must be integers") from None
    if not 0 < limit <= MAX_LIMIT or offset < 0:
        raise InvalidArgument(f"limit: must be in [1, {MAX_LIMIT}]; offset: must be >= 0")
    return limit, offset


class TrainerService:
    """The composition root: it builds the shared :class:`~.context.TrainerContext`, the
    parts that take it (models, samplers), and answers the calls no single part owns."""

    def __init__(self, cfg: TrainerConfig, backend: Backend | None = None) -> None:
        self.cfg = cfg
        self.sessions = Sessions(busy=self._session_busy, on_forget=self._forget_session)
        self.ctx = TrainerContext(
            cfg,
            backend or NumpyBackend(),
            self.sessions,
            lm.write_tokenizer_dir(cfg.data_dir / "tokenizers" / "bytes").resolve(),
        )
        self.backend: Backend = self.ctx.backend
        self.futures = self.ctx.futures
        self.compute = self.ctx.compute
        self.tokenizer_dir = self.ctx.tokenizer_dir
        self.samplers = Samplers(self.ctx)
        self.models = Models(self.ctx, self.samplers)
        self.ctx.holders += [self.models.nbytes, self.samplers.nbytes]
        self._housekeeping: asyncio.Task[None] | None = None

    # ---------------------------------------------------------------- shared parts

    def start(self) -> None:
        """Begin housekeeping (called once the event loop runs)."""
        self.ctx.loop = asyncio.get_running_loop()
        self._housekeeping = self.ctx.loop.create_task(self._sweep_forever())

    def caller(self, *, lineage: str = "", run: str = "") -> ckpts.Caller:
        return self.ctx.caller(lineage=lineage, run=run)

    def busy(self) -> bool:
        """Work is executing or waiting its turn: an idle timeout must not stop the trainer."""
        return self.compute.running > 0 or self.models.pending()

    def _session_busy(self, session: Session) -> bool:
        return self.models.busy(session)

    def _forget_session(self, session: Session) -> None:
        self.models.forget_session(session)
        self.samplers.forget_session(session.session_id)

    def sweep(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.sessions.sweep(now)
        self.models.sweep(now)
        self.samplers.sweep(now)
        self.futures.sweep(now)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(limits.TRAINER_SWEEP_S)
            try:
                self.sweep()
            except Exception:  # a sweep must never stop the trainer
                log.exception("trainer.sweep_failed")

    def stats(self) -> dict[str, Any]:
        """Table sizes and loss usage (a localplane extension of healthz, for tests and the
        memory benchmark)."""
        return {
            "losses": dict(self.models.loss_calls),
            "sessions": len(self.sessions),
            "models": len(self.models),
            "samplers": len(self.samplers),
            "futures": len(self.futures),
            "recordedSequences": self.samplers.recorded,
            "modelBytes": self.models.nbytes(),
            "samplerBytes": self.samplers.nbytes(),
        }

    # ----------------------------------------------------------------- direct calls

    def client_config(self, body: dict[str, Any]) -> dict[str, Any]:
        # Chunks of one forward_backward must arrive in order: the sequence is per model. Plain
        # httpx (not tinker's Rust transport) keeps the SDK's network behaviour the documented one.
        return {"parallel_fwdbwd_chunks": False, "use_pyqwest_transport": False}

    def create_session(self, body: dict[str, Any]) -> dict[str, Any]:
        with validate.as_http():
            session = self.sessions.create(body)
        return {"type": "create_session", "session_id": session.session_id}

    def session_heartbeat(self, body: dict[str, Any]) -> dict[str, Any]:
        with validate.as_http():
            self.sessions.get(validate.text(body, "session_id"))
        return {"type": "session_heartbeat"}

    def finish_session(self, session_id: str) -> dict[str, Any]:
        self.sessions.finish(session_id)
        return {}

    async def retrieve(self, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """``(op, answer)``: the result, a try_again, or an error; ``Gone`` (410) when the
        future is unknown (expired, or from a previous trainer generation)."""
        with validate.as_http():
            request_id = validate.text(body, "request_id")
        fut = self.futures.get(request_id or "")
        if fut is None or fut.dropped:
            raise Gone(
                f"future {shorten(request_id)} is unknown to this trainer: it expired or was "
                "made by a previous trainer; submit the request again"
            )
        if not fut.done and not await fut.wait(self.cfg.retrieve_hold_s):
            return fut.op, {"type": "try_again", "request_id": request_id, "queue_state": "active"}
        if fut.error is not None:
            return fut.op, {"error": fut.error, "category": fut.category or "unknown"}
        if fut.result is None:  # dropped while we waited
            raise Gone(f"future {shorten(request_id)}: its result is no longer kept")
        return fut.op, fut.result

    # ------------------------------------------------------------------ REST views

    def server_capabilities(self) -> dict[str, Any]:
        """What this trainer really serves: its one base model, trainable and sampleable."""
        return {
            "supported_models": [
                {
                    "model_name": self.cfg.base_model,
                    "max_context_length": self.cfg.max_context_length,
                    "trainable": not self.cfg.forward_only,
                    "sampleable": True,
                }
            ]
        }

    def get_sampler(self, sampler_id: str) -> dict[str, Any]:
        return self.samplers.get(sampler_id).wire()

    def list_checkpoints(self) -> dict[str, Any]:
        """The Fireworks extension: this job's resumable checkpoints, by name."""
        metas = ckpt.list_meta(self.cfg.data_dir, self.cfg.account, self.cfg.job)
        return {"checkpoints": [m.checkpoint for m in metas if m.resumable]}

    def weights_info(self, body: dict[str, Any]) -> dict[str, Any]:
        with validate.as_http():
            meta = ckpts.resolve(body.get("tinker_path") or body.get("path"), self.caller())
        return ckpts.weights_info(meta)

    def _run(self, run_id: str) -> runs.RunRecord:
        rec = runs.read(self.cfg.data_dir, self.cfg.account, run_id)
        if rec is None:
            raise MissingResource(
                f"training run {shorten(run_id)} not found in account {self.cfg.account}"
            )
        return rec

    def _last_request(self, rec: runs.RunRecord) -> str | None:
        return None if self.models.find(rec.run_id) is None else ckpt.now_rfc3339()

    def training_runs(self, query: dict[str, str]) -> dict[str, Any]:
        limit, offset = _page(query)
        records = runs.list_runs(self.cfg.data_dir, self.cfg.account)
        page = records[offset : offset + limit]
        return {
            "training_runs": [
                runs.run_wire(r, runs.checkpoints_of(self.cfg.data_dir, r), self._last_request(r))
                for r in page
            ],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(records)},
        }

    def training_run(self, run_id: str) -> dict[str, Any]:
        rec = self._run(run_id)
        return runs.run_wire(
            rec, runs.checkpoints_of(self.cfg.data_dir, rec), self._last_request(rec)
        )

    def run_checkpoints(self, run_id: str) -> dict[str, Any]:
        rec = self._run(run_id)
        entries = [
            runs.checkpoint_wire(m, segment, rec.run_id)
            for m in runs.checkpoints_of(self.cfg.data_dir, rec)
            for segment in m.segments()
        ]
        return {"checkpoints": entries}

    def user_checkpoints(self, query: dict[str, str]) -> dict[str, Any]:
        limit, offset = _page(query)
        entries: list[dict[str, Any]] = []
        for meta in ckpt.list_account(self.cfg.data_dir, self.cfg.account):
            owner = meta.runs[0] if meta.runs else meta.job
            entries.extend(
                runs.checkpoint_wire(meta, segment, owner) for segment in meta.segments()
            )
        return {
            "checkpoints": entries[offset : offset + limit],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(entries)},
        }

    def _run_checkpoint(self, run_id: str, checkpoint_id: str) -> tuple[ckpt.CheckpointMeta, str]:
        prefix, _, name = checkpoint_id.partition("/")
        if prefix not in ckpts.SEGMENT_OF or not name:
            raise InvalidArgument(
                f"checkpoint_id: {shorten(checkpoint_id)!r} must be weights/<name> or "
                "sampler_weights/<name>"
            )
        rec = self._run(run_id)
        segment = ckpts.SEGMENT_OF[prefix]
        for meta in runs.checkpoints_of(self.cfg.data_dir, rec):
            if meta.logical_name == name and segment in meta.segments():
                return meta, segment
        raise MissingResource(
            f"checkpoint tinker://{shorten(run_id)}/{shorten(checkpoint_id)} not found"
        )

    def delete_checkpoint(self, run_id: str, checkpoint_id: str) -> dict[str, Any]:
        meta, segment = self._run_checkpoint(run_id, checkpoint_id)
        ckpt.remove_segment(self.cfg.data_dir, meta, segment)
        log.info("checkpoint.deleted", name=meta.checkpoint, segment=segment)
        return {}

    def set_checkpoint_ttl(
        self, run_id: str, checkpoint_id: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        meta, segment = self._run_checkpoint(run_id, checkpoint_id)
        with validate.as_http():
            ttl = validate.ttl_seconds(body)
        ckpts.set_expiry(self.cfg.data_dir, meta, segment, ttl)
        return {}

    def list_sessions(self, query: dict[str, str]) -> dict[str, Any]:
        limit, offset = _page(query)
        ids = [s.session_id for s in self.sessions.all()]
        return {"sessions": ids[offset : offset + limit]}

    def get_session(self, session_id: str) -> dict[str, Any]:
        session = self.sessions.find(session_id)
        if session is None:
            raise MissingResource(f"session {shorten(session_id)} not found on this trainer")
        return session.wire()


async def stop_quietly(task: asyncio.Task[Any] | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
