"""The HTTP face of one trainer process (the Tinker-style data plane, trainer-api.md §4).

One process per running job, like a pod: it binds its own port on loopback, announces it on
stdout, serves until it is killed — or exits by itself with :data:`EXIT_IDLE` once nobody
has called it for the job's inactivity timeout.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import structlog
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from localplane.errors import (
    InvalidArgument,
    PlaneError,
    describe_validation_error,
    error_response,
    install_error_handlers,
)
from localplane.serving import ReadyServer, bind
from localplane.trainer.core import TrainerConfig, TrainerCore

#: Exit code of a trainer that stopped itself after the inactivity timeout.
EXIT_IDLE = 75
#: The line prefix a trainer prints on stdout once it serves; the plane waits for it.
READY_PREFIX = "LOCALPLANE_TRAINER_READY "

log = structlog.stdlib.get_logger("localplane.trainer")


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _ForwardBackward(_Body):
    step: int = Field(ge=1)
    micro_batch: int = Field(default=0, ge=0)
    batch: Any = Field(default_factory=dict)


class _Adam(_Body):
    learning_rate: float | None = None
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    beta2: float = Field(default=0.95, ge=0.0, lt=1.0)
    eps: float = Field(default=1e-8, gt=0.0)


class _OptimStep(_Body):
    step: int = Field(ge=1)
    adam_params: _Adam = Field(default_factory=_Adam)


class _Save(_Body):
    name: str
    kind: str = "both"


class _Load(_Body):
    name: str


class _Evaluate(_Body):
    max_examples: int = 1024
    dataset: str | None = None


async def _parse(request: Request, model: type[BaseModel]) -> Any:
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidArgument("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidArgument("request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise InvalidArgument(describe_validation_error(exc)) from None


class _KeyRing:
    """The account's API keys, as sha256 hashes in a file the plane rewrites on change."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._mtime = -1.0
        self._hashes: frozenset[str] = frozenset()

    def allows(self, header: str | None) -> bool:
        if self.path is None:
            return True
        if not header or not header.startswith("Bearer "):
            return False
        digest = hashlib.sha256(header.removeprefix("Bearer ").strip().encode()).hexdigest()
        if digest not in self._hashes:
            self._reload()
        return digest in self._hashes

    def _reload(self) -> None:
        assert self.path is not None
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return
        if mtime != self._mtime:
            self._mtime = mtime
            self._hashes = frozenset(self.path.read_text().split())


def create_app(core: TrainerCore) -> FastAPI:
    cfg = core.cfg
    app = FastAPI(title="localplane trainer", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    keys = _KeyRing(cfg.keys_file)
    # One trainer, one model: calls are applied one at a time, as on one GPU.
    lock = asyncio.Lock()
    app.state.last_activity = time.monotonic()
    app.state.lock = lock

    @app.middleware("http")
    async def _auth_and_activity(request: Request, call_next: Any) -> Any:
        if not keys.allows(request.headers.get("authorization")):
            return error_response(401, "UNAUTHENTICATED", "missing or unknown API key")
        # Health probes do not keep a trainer alive; any real call does, start and end.
        tracked = not request.url.path.endswith("/healthz")
        if tracked:
            app.state.last_activity = time.monotonic()
        try:
            return await call_next(request)
        finally:
            if tracked:
                app.state.last_activity = time.monotonic()

    @app.get("/api/v1/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "step": core.step}

    @app.post("/api/v1/get_info")
    async def get_info() -> dict[str, Any]:
        return core.info()

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> dict[str, Any]:
        body = await _parse(request, _ForwardBackward)
        async with lock:
            answer, computed = core.forward_backward(body.step, body.micro_batch, body.batch)
            if computed and cfg.compute_delay_s > 0:
                await asyncio.sleep(cfg.compute_delay_s)  # emulated GPU time for one micro-batch
        return answer

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request) -> dict[str, Any]:
        body = await _parse(request, _OptimStep)
        async with lock:
            return core.optim_step(body.step, body.adam_params.model_dump())

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request) -> dict[str, Any]:
        body = await _parse(request, _Save)
        async with lock:
            answer = core.save(body.name, body.kind)
        log.info("checkpoint.saved", name=answer["name"], step=answer["step"])
        return answer

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        body = await _parse(request, _Load)
        async with lock:
            answer = core.load(body.name)
        log.info("checkpoint.loaded", name=answer["name"], step=answer["step"])
        return answer

    @app.post("/api/v1/list_checkpoints")
    async def list_checkpoints() -> dict[str, Any]:
        return core.list_checkpoints()

    @app.post("/api/v1/evaluate")
    async def evaluate(request: Request) -> dict[str, Any]:
        body = await _parse(request, _Evaluate)
        async with lock:
            return core.evaluate(body.model_dump(exclude_none=True))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, PlaneError):
            return JSONResponse(exc.body(), status_code=exc.code)
        log.exception("trainer.error")
        return error_response(500, "INTERNAL", f"trainer error: {type(exc).__name__}: {exc}")

    return app


async def _watch_inactivity(app: FastAPI, timeout_s: float) -> None:
    """Exit with EXIT_IDLE after ``timeout_s`` without a (non-health) call."""
    interval = min(1.0, max(0.05, timeout_s / 5))
    while True:
        await asyncio.sleep(interval)
        if time.monotonic() - app.state.last_activity > timeout_s and not app.state.lock.locked():
            log.info("trainer.idle", timeout_s=timeout_s)
            sys.stdout.flush()
            os._exit(EXIT_IDLE)


def serve(cfg: TrainerConfig, host: str = "127.0.0.1") -> None:
    core = TrainerCore(cfg)
    app = create_app(core)
    sock = bind(host, 0)
    port = sock.getsockname()[1]

    def announce() -> None:
        loop = asyncio.get_running_loop()
        if cfg.inactivity_timeout_s > 0:
            app.state.idle_task = loop.create_task(_watch_inactivity(app, cfg.inactivity_timeout_s))
        log.info(
            "trainer.ready",
            port=port,
            job=cfg.job_name,
            generation=cfg.generation,
            stand_in=core.arch.stand_in,
        )
        # The plane reads this line from our stdout: the trainer's "I serve on this port".
        print(READY_PREFIX + json.dumps({"port": port, "pid": os.getpid()}), flush=True)  # noqa: T201

    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", log_config=None
    )
    ReadyServer(config, announce).run(sockets=[sock])
