"""The proxy's HTTP face: the Tinker API under ``/api/v1/`` for one program, on loopback.

One route table (method, path) → handler of :class:`~shepherd.proxy.api.ProgramApi`. A
request must carry the job's token (``X-Api-Key`` or ``Authorization: Bearer``), compared
in constant time; bodies are bounded before they are read, decoded from either dialect
(protobuf, as the ``tinker`` SDK sends ``forward_backward``) by
:mod:`shepherd.tinker_wire.dialects`, and results encoded in the dialect the program asks for.
An unknown path is a 400 ``UNIMPLEMENTED`` naming what is served — never a 404, which the SDKs
take as final (trainer-api.md §5).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import socket
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import structlog
import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from shepherd.proxy.api import Call, Encoded, ProgramApi, ProgramError
from shepherd.proxy.settings import MAX_BODY_BYTES
from shepherd.tinker_wire import dialects, paths
from shepherd.tinker_wire.errors import WireError

log = structlog.stdlib.get_logger("shepherd.proxy")

API_MARKER = "/api/v1/"
Handler = Callable[[ProgramApi, Call], Awaitable[Any]]


def _seq(op: str) -> Handler:
    return lambda api, c: api.sequenced(op, c)


Route = paths.Route[Handler]


ROUTES = [
    Route("POST", "client/config", "client/config", ProgramApi.client_config),
    Route("POST", "client/dynamic_config", "client/dynamic_config", ProgramApi.dynamic_config),
    Route("POST", "telemetry", "telemetry", ProgramApi.telemetry),
    Route("GET", "healthz", "healthz", ProgramApi.healthz),
    Route("POST", "cancel_future", "cancel_future", ProgramApi.cancel_future),
    Route("GET", "get_server_capabilities", "caps", ProgramApi.server_capabilities),
    Route("POST", "create_session", "create_session", ProgramApi.create_session),
    Route("POST", "session_heartbeat", "session_heartbeat", ProgramApi.session_heartbeat),
    Route("POST", "sessions/{session_id}/finish", "session_finish", ProgramApi.session_finish),
    Route("GET", "sessions", "list_sessions", ProgramApi.list_sessions),
    Route("GET", "sessions/{session_id}", "get_session", ProgramApi.get_session),
    Route("POST", "create_model", "create_model", ProgramApi.create_model),
    Route("POST", "get_info", "get_info", ProgramApi.get_info),
    Route("POST", "unload_model", "unload_model", ProgramApi.unload_model),
    Route("POST", "forward", "forward", _seq("forward")),
    Route("POST", "forward_backward", "forward_backward", _seq("forward_backward")),
    Route("POST", "optim_step", "optim_step", _seq("optim_step")),
    Route("POST", "save_weights", "save_weights", _seq("save_weights")),
    Route(
        "POST",
        "save_weights_for_sampler",
        "save_weights_for_sampler",
        _seq("save_weights_for_sampler"),
    ),
    Route("POST", "load_weights", "load_weights", ProgramApi.load_weights),
    Route(
        "POST",
        "create_sampling_session",
        "create_sampling_session",
        ProgramApi.create_sampling_session,
    ),
    Route("POST", "asample", "asample", ProgramApi.asample),
    Route("GET", "samplers/{sampler_id}", "get_sampler", ProgramApi.get_sampler),
    Route("POST", "retrieve_future", "retrieve_future", ProgramApi.retrieve_future),
    Route("POST", "weights_info", "weights_info", ProgramApi.weights_info),
    Route("GET", "list_checkpoints", "list_checkpoints", ProgramApi.list_checkpoints),
    Route("POST", "list_checkpoints", "list_checkpoints", ProgramApi.list_checkpoints),
    Route("GET", "training_runs", "training_runs", ProgramApi.training_runs),
    Route("GET", "training_runs/{run_id}", "training_run", ProgramApi.training_run),
    Route(
        "GET", "training_runs/{run_id}/checkpoints", "run_checkpoints", ProgramApi.run_checkpoints
    ),
    Route(
        "PUT",
        "training_runs/{run_id}/checkpoints/{checkpoint_id:path}/ttl",
        "set_checkpoint_ttl",
        ProgramApi.set_checkpoint_ttl,
    ),
    Route(
        "DELETE",
        "training_runs/{run_id}/checkpoints/{checkpoint_id:path}",
        "delete_checkpoint",
        ProgramApi.delete_checkpoint,
    ),
    Route("GET", "checkpoints", "user_checkpoints", ProgramApi.user_checkpoints),
]
TABLE = paths.RouteTable(ROUTES)


def match(method: str, path: str) -> tuple[Route, dict[str, str]]:
    found = TABLE.find(method, path)
    if isinstance(found, tuple):
        return found
    if found:
        raise ProgramError(
            405,
            "INVALID_ARGUMENT",
            f"method {method} is not allowed on api/v1/{path[:120]}; allowed: " + ", ".join(found),
        )
    raise ProgramError(
        400,
        "UNIMPLEMENTED",
        f"no such endpoint: {method} api/v1/{path[:120]} (Shepherd's proxy serves: {TABLE.served})",
    )


def _error(code: int, status: str, message: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "status": status, "message": message}}, status_code=code
    )


def _key(request: Request) -> str:
    key = request.headers.get("x-api-key")
    if key:
        return key
    auth = request.headers.get("authorization") or ""
    return auth[7:].strip() if auth[:7].lower() == "bearer " else ""


async def _read(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ProgramError(413, "INVALID_ARGUMENT", f"request body exceeds {MAX_BODY_BYTES} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ProgramError(
                413, "INVALID_ARGUMENT", f"request body exceeds {MAX_BODY_BYTES} bytes"
            )
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(api: ProgramApi, api_key: str) -> ASGIApp:
    expected = api_key.encode()

    async def dispatch(request: Request) -> Response:
        url_path = request.url.path
        at = url_path.find(API_MARKER)
        path = url_path[at + len(API_MARKER) :].strip("/") if at >= 0 else url_path.strip("/")
        op = "unknown"
        try:
            route, params = match(request.method, path)
            op = route.op
            if not hmac.compare_digest(_key(request).encode(), expected):
                return _error(401, "UNAUTHENTICATED", "missing or unknown API key")
            raw = await _read(request)
            body, _ = dialects.decode_request(op, request.headers.get("content-type"), raw)
            if op == "forward_backward" and body.get("forward_only"):
                route, params = match("POST", "forward")  # tinker's forward(): forward_only set
                op = route.op
            call = Call(body, params, dict(request.query_params))
            answer = await route.handler(api, call)
            encoded = answer if isinstance(answer, Encoded) else Encoded(op, answer)
            payload, media = dialects.encode_result(
                encoded.op, encoded.result, request.headers.get("accept")
            )
            return Response(payload, media_type=media)
        except ProgramError as exc:
            return _error(exc.code, exc.status, exc.message)
        except WireError as exc:
            return _error(exc.code, exc.status, exc.message)
        except Exception as exc:
            log.exception("proxy.request_failed", op=op)
            return _error(500, "INTERNAL", f"proxy error in {op}: {type(exc).__name__}: {exc}")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        # A bare ASGI app: every path goes to dispatch, which routes and answers every
        # failure itself, so Starlette's router and middleware would only add to each of a
        # step's requests. Lifespan is off; nothing else than HTTP is served.
        if scope["type"] == "http":
            response = await dispatch(Request(scope, receive))
            await response(scope, receive, send)

    return app


class _Server(uvicorn.Server):
    """uvicorn inside someone else's event loop: it leaves the process's signals alone
    (the worker that runs the proxy owns SIGINT/SIGTERM)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class HttpServer:
    """The app on ``127.0.0.1``, an ephemeral port."""

    def __init__(self, app: ASGIApp) -> None:
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            log_config=None,
            # Programs pipeline a handful of requests per model; keep-alive saves a connect.
            timeout_keep_alive=60,
            # close() does not wait for a held retrieve_future (up to 20 s) to run out: the
            # program is done or being stopped when its proxy closes.
            timeout_graceful_shutdown=1,
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None
        self.port = 0

    async def start(self) -> None:
        # TCP_NODELAY: without it every answer waits ~40 ms for a delayed ACK.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
