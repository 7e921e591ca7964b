"""The HTTP face of one trainer process: the Tinker API (trainer-api.md §4).

One process per running job, like a pod: it binds its own port on loopback, announces it on
stdout, serves until it is killed — or exits by itself with :data:`EXIT_IDLE` once nobody
has called it for the job's inactivity timeout.

Any path ending in ``api/v1/<op>`` is the operation ``<op>``, whatever prefix the gateway
or a client puts before it. Bodies are decoded and results encoded by
:mod:`localplane.trainer.dialects`, so JSON and protobuf clients share one service. Every
answer names the operation and dialect in ``x-localplane-op`` / ``x-localplane-dialect``
for the plane's request counters.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localplane.auth import api_key
from localplane.errors import PlaneError, error_response
from localplane.serving import ReadyServer, bind
from localplane.trainer import dialects
from localplane.trainer.core import SEQUENCED, TrainerConfig, TrainerService
from localplane.trainer.dialects import DIALECT_HEADER, OP_HEADER

#: Exit code of a trainer that stopped itself after the inactivity timeout.
EXIT_IDLE = 75
#: The line prefix a trainer prints on stdout once it serves; the plane waits for it.
READY_PREFIX = "LOCALPLANE_TRAINER_READY "
API_MARKER = "api/v1/"

log = structlog.stdlib.get_logger("localplane.trainer")

Handler = Callable[[TrainerService, dict[str, Any], str], Any]


class _KeyRing:
    """The account's API keys, as sha256 hashes in a file the plane rewrites on change."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._mtime = -1.0
        self._hashes: frozenset[str] = frozenset()

    def allows(self, key: str | None) -> bool:
        if self.path is None:
            return True
        if not key:
            return False
        digest = hashlib.sha256(key.encode()).hexdigest()
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


def _direct(fn: Callable[[TrainerService, dict[str, Any]], Any]) -> Handler:
    return lambda svc, body, arg: fn(svc, body)


#: POST operations: op -> handler(service, body, path argument). Sequenced ones submit.
def _sequenced(op: str) -> Handler:
    def handle(svc: TrainerService, body: dict[str, Any], arg: str) -> Any:
        return svc.submit(op, body)

    return handle


_POST: dict[str, Handler] = {
    "client/config": _direct(TrainerService.client_config),
    "create_session": _direct(TrainerService.create_session),
    "session_heartbeat": _direct(TrainerService.session_heartbeat),
    "telemetry": lambda svc, body, arg: {"status": "accepted"},
    "client/dynamic_config": lambda svc, body, arg: {},
    "session_finish": lambda svc, body, arg: svc.finish_session(arg, body),
    "create_model": _direct(TrainerService.create_model),
    "get_info": _direct(TrainerService.get_info),
    "weights_info": _direct(TrainerService.weights_info),
    "create_sampling_session": _direct(TrainerService.create_sampling_session),
    "asample": _direct(TrainerService.asample),
    "list_checkpoints": lambda svc, body, arg: svc.list_checkpoints(),
    **{op: _sequenced(op) for op in SEQUENCED},
}
_GET: dict[str, Handler] = {
    "healthz": lambda svc, body, arg: {"status": "ok"},
    "list_checkpoints": lambda svc, body, arg: svc.list_checkpoints(),
    "get_sampler": lambda svc, body, arg: svc.get_sampler(arg),
}


def _operation(path: str) -> tuple[str, str]:
    """``(op, argument)`` of a request path; ``("", "")`` when it is no Tinker endpoint."""
    at = path.rfind(API_MARKER)
    if at < 0:
        return "", ""
    op = path[at + len(API_MARKER) :].strip("/")
    if op.startswith("sessions/") and op.endswith("/finish"):
        return "session_finish", op.removeprefix("sessions/").removesuffix("/finish")
    if op.startswith("samplers/"):
        return "get_sampler", op.removeprefix("samplers/")
    return op, ""


def create_app(service: TrainerService) -> Starlette:
    keys = _KeyRing(service.cfg.keys_file)
    state: dict[str, Any] = {"last_activity": time.monotonic()}

    def answer(response: Response, op: str, dialect: str) -> Response:
        response.headers[OP_HEADER] = op
        response.headers[DIALECT_HEADER] = dialect
        return response

    async def dispatch(request: Request) -> Response:
        op, arg = _operation(request.url.path)
        table = _GET if request.method == "GET" else _POST
        if op not in table and not (op == "retrieve_future" and request.method == "POST"):
            # No such endpoint is the one honest 404 a trainer gives (a client can tell it
            # from a missing route by the message; the real SDKs tolerate it for optional calls).
            return error_response(
                404, "NOT_FOUND", f"no such endpoint: {request.method} {request.url.path}"
            )
        if not keys.allows(api_key(request.headers)):
            return error_response(401, "UNAUTHENTICATED", "missing or unknown API key")
        if op != "healthz":  # health probes do not keep a trainer alive; any real call does
            state["last_activity"] = time.monotonic()
        dialect = "json"
        try:
            body, dialect = dialects.decode_request(
                op, request.headers.get("content-type"), await request.body()
            )
            if op == "forward_backward" and body.get("forward_only"):
                op = "forward"  # tinker's forward(): the same endpoint, forward_only set
            if op == "retrieve_future":
                result_op, result = await service.retrieve(body)
                if "type" in result and result["type"] == "try_again" or "error" in result:
                    return answer(JSONResponse(result), op, dialect)
            else:
                result_op, result = op, table[op](service, body, arg)
                if isinstance(result, Awaitable):
                    result = await result
            payload, media = dialects.encode_result(
                result_op, result, request.headers.get("accept")
            )
            if media == dialects.PROTOBUF:
                dialect = "protobuf"
            return answer(Response(payload, media_type=media), op, dialect)
        except PlaneError as exc:
            return answer(JSONResponse(exc.body(), status_code=exc.code), op, dialect)
        except Exception as exc:
            log.exception("trainer.error", op=op)
            return answer(
                error_response(500, "INTERNAL", f"trainer error: {type(exc).__name__}: {exc}"),
                op,
                dialect,
            )
        finally:
            if op != "healthz":
                state["last_activity"] = time.monotonic()

    app = Starlette(
        routes=[Route("/{path:path}", dispatch, methods=["GET", "POST", "PUT", "DELETE"])]
    )
    app.state.activity = state
    app.state.service = service
    return app


async def _watch_inactivity(app: Starlette, service: TrainerService, timeout_s: float) -> None:
    """Exit with EXIT_IDLE after ``timeout_s`` without a (non-health) call and no work."""
    interval = min(1.0, max(0.05, timeout_s / 5))
    while True:
        await asyncio.sleep(interval)
        idle_for = time.monotonic() - app.state.activity["last_activity"]
        if idle_for > timeout_s and not service.busy():
            log.info("trainer.idle", timeout_s=timeout_s)
            sys.stdout.flush()
            os._exit(EXIT_IDLE)


def serve(cfg: TrainerConfig, host: str = "127.0.0.1") -> None:
    service = TrainerService(cfg)
    app = create_app(service)
    sock = bind(host, 0)
    port = sock.getsockname()[1]

    def announce() -> None:
        loop = asyncio.get_running_loop()
        if cfg.inactivity_timeout_s > 0:
            app.state.idle_task = loop.create_task(
                _watch_inactivity(app, service, cfg.inactivity_timeout_s)
            )
        log.info(
            "trainer.ready",
            port=port,
            job=cfg.job_name,
            generation=cfg.generation,
            tokenizer=str(service.tokenizer_dir),
        )
        # The plane reads this line from our stdout: the trainer's "I serve on this port".
        print(READY_PREFIX + json.dumps({"port": port, "pid": os.getpid()}), flush=True)  # noqa: T201

    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", log_config=None
    )
    ReadyServer(config, announce).run(sockets=[sock])
