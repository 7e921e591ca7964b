"""localplane's HTTP surface: the control plane (``/v1``), the gateway (``/training/v1``) and
the admin API (``/admin/v1``), on one address (trainer-api.md §2, §4, §6).

Routes parse and authorize, then call the :class:`~localplane.plane.Plane`'s services.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from sse_starlette import EventSourceResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localplane import catalog, limits
from localplane import checkpoints as ckpt
from localplane import logs as trainer_logs
from localplane.deployments import SNAPSHOT_HEADER
from localplane.errors import (
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    PlaneError,
    describe_validation_error,
    disk_full,
    error_response,
    install_error_handlers,
    shorten,
)
from localplane.events import EVENT_TYPE
from localplane.holds import HoldRequests
from localplane.plane import Plane, Principal
from localplane.storage import JobRecord
from localplane.validation import validate_create
from shepherd.platform import rules
from shepherd.states import JobState

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000
SSE_PING_S = 10
#: SQLite's largest integer: no offset or event id the plane issues is larger.
MAX_SQL_INT = 2**63 - 1


# ----------------------------------------------------------------------------- helpers


async def json_body(request: Request) -> Any:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"request body is not valid JSON: {exc}") from None
    except UnicodeDecodeError:
        raise InvalidArgument("request body is not valid JSON: it is not UTF-8 text") from None
    except RecursionError:
        raise InvalidArgument("request body: JSON nested too deeply") from None
    except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits)
        raise InvalidArgument("request body: a JSON number has too many digits") from None


async def json_object(request: Request) -> dict[str, Any]:
    body = await json_body(request)
    if not isinstance(body, dict):
        raise InvalidArgument("request body must be a JSON object")
    return body


def optional_str(body: dict[str, Any], name: str) -> str | None:
    """``body[name]`` when it is a string; None when absent or null; else a 400 naming it."""
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidArgument(f"{name}: must be a string")
    return value


def _page_size(request: Request) -> int:
    raw = request.query_params.get("pageSize")
    if raw is None or raw == "":
        return DEFAULT_PAGE_SIZE
    try:
        size = int(raw)
    except ValueError:
        raise InvalidArgument(f"pageSize: {shorten(raw)!r} must be an integer") from None
    if size < 0:
        raise InvalidArgument("pageSize: must be >= 0")
    return min(size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def _offset(request: Request) -> int:
    token = request.query_params.get("pageToken")
    if not token:
        return 0
    try:
        offset = json.loads(base64.urlsafe_b64decode(token.encode() + b"==="))["o"]
        if type(offset) is not int or not 0 <= offset <= MAX_SQL_INT:
            raise ValueError
        return offset
    # ValueError covers bad base64, non-UTF-8, non-JSON and over-long numbers.
    except (ValueError, KeyError, TypeError, RecursionError):
        raise InvalidArgument("pageToken: not a token this server issued") from None


def _http_url(url: str) -> bool:
    # Parsed as the delivery will parse it, so a URL that cannot be sent is refused here.
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return False
    return parsed.scheme in ("http", "https") and bool(parsed.host)


def _token(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset}).encode()).decode().rstrip("=")


def _log_position(request: Request) -> trainer_logs.Position:
    token = request.query_params.get("pageToken")
    if not token:
        return trainer_logs.Position()
    try:
        pos = json.loads(base64.urlsafe_b64decode(token.encode() + b"==="))
        run, offset = pos["r"], pos["o"]
        if not all(type(v) is int and 0 <= v <= MAX_SQL_INT for v in (run, offset)):
            raise ValueError
        return trainer_logs.Position(run, offset)
    except (ValueError, KeyError, TypeError, RecursionError):
        raise InvalidArgument("pageToken: not a token this server issued") from None


def _log_token(pos: trainer_logs.Position) -> str:
    raw = json.dumps({"r": pos.run, "o": pos.offset}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def paginate(request: Request, items: list[Any]) -> tuple[list[Any], str]:
    size, offset = _page_size(request), _offset(request)
    page = items[offset : offset + size]
    return page, _token(offset + size) if offset + size < len(items) else ""


# ------------------------------------------------------------------------ body limits


def body_limit(path: str) -> int:
    """The largest request body a path takes (localplane/limits.py says why)."""
    if path.startswith("/training/"):
        return limits.DATA_PLANE_MAX_BODY_BYTES
    if path.startswith(("/inference/", "/hot_load/")):
        return limits.INFERENCE_MAX_BODY_BYTES
    return limits.CONTROL_PLANE_MAX_BODY_BYTES


class BodyLimit:
    """413 for a body over its path's limit, before it is parsed: at once from its
    Content-Length, or as soon as a body without one streams past the limit (the app's
    read raises, its error handler answers)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = body_limit(scope["path"])
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await error_response(
                413,
                "INVALID_ARGUMENT",
                f"request body of {int(declared)} bytes exceeds this endpoint's limit of {limit} bytes",
            )(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise PayloadTooLarge(
                        f"request body exceeds this endpoint's limit of {limit} bytes"
                    )
            return message

        await self.app(scope, limited, send)


# ------------------------------------------------------------------------------ faults


class ControlPlaneFaults:
    """Injected latency, outages and 5xx on the control plane (``/v1``) — pure ASGI so
    streaming answers pass untouched. ``after`` mode lets the request take effect and then
    loses its answer, the nastiest failure for a client that retries."""

    def __init__(self, app: ASGIApp, plane: Callable[[], Plane]) -> None:
        self.app = app
        self.plane = plane

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        plane = self.plane()
        cfg = plane.config
        plane.storage.incr("controlPlaneRequests")
        if cfg.latency_ms.max > 0:
            await asyncio.sleep(plane.rng.uniform(cfg.latency_ms.min, cfg.latency_ms.max) / 1000.0)
        if cfg.outage is not None and cfg.outage.active(datetime.now(UTC)):
            plane.storage.incr("injected5xx")
            await error_response(503, "UNAVAILABLE", "the control plane is unavailable (outage)")(
                scope, receive, send
            )
            return
        if not cfg.control_plane_5xx_rate or plane.rng.random() >= cfg.control_plane_5xx_rate:
            await self.app(scope, receive, send)
            return
        plane.storage.incr("injected5xx")
        code = plane.rng.choice((500, 503))
        failure = error_response(
            code, "INTERNAL" if code == 500 else "UNAVAILABLE", "injected control-plane failure"
        )
        mode = cfg.control_plane_5xx_mode
        after = mode == "after" or (mode == "mixed" and plane.rng.random() < 0.5)
        if after and not scope["path"].endswith(":watch"):

            async def swallow(message: Message) -> None:
                return None

            await self.app(scope, receive, swallow)
        await failure(scope, receive, send)


# ------------------------------------------------------------------------------ the app


def create_app(plane: Plane) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await plane.start()
        try:
            yield
        finally:
            await plane.stop()

    app = FastAPI(title="localplane", version="0.1.0", lifespan=lifespan)
    app.state.plane = plane
    install_error_handlers(app)
    app.add_middleware(ControlPlaneFaults, plane=lambda: plane)
    app.add_middleware(HoldRequests, holds=plane.holds)
    # Outermost: a body over the limit is refused before anything else looks at it.
    app.add_middleware(BodyLimit)

    async def principal(request: Request) -> Principal:
        return plane.authenticate(request.headers)

    # Dependencies are async: a sync one would run in a thread and touch SQLite off the loop.
    async def account_access(a: str, who: Principal = Depends(principal)) -> str:
        plane.check_account(who, a)
        return a

    async def admin_access(who: Principal = Depends(principal)) -> Principal:
        plane.check_admin(who)
        return who

    async def job_access(a: str, j: str, who: Principal = Depends(principal)) -> JobRecord:
        plane.check_account(who, a)
        rec = plane.jobs.require(a, j)
        plane.storage.incr("controlPlaneRequests", rec.name)
        return rec

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, PlaneError):
            return JSONResponse(exc.body(), status_code=exc.code)
        if full := disk_full(exc, plane.data_dir):
            return JSONResponse(full.body(), status_code=full.code)
        return error_response(500, "INTERNAL", f"internal error: {type(exc).__name__}")

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "liveTrainers": plane.jobs.live_trainers()}

    v1 = APIRouter(prefix="/v1")

    # ------------------------------------------------------------- accounts

    @v1.get("/accounts")
    async def list_accounts(
        request: Request, who: Principal = Depends(principal)
    ) -> dict[str, Any]:
        _page_size(request)
        if who.kind != "user":
            raise PermissionDenied("the admin key is for /admin/v1 only; use an account's API key")
        return {"accounts": [{"name": f"accounts/{who.account_id}"}]}

    # ----------------------------------------------------------------- jobs

    @v1.post("/accounts/{a}/rlorTrainerJobs")
    async def create_job(request: Request, a: str = Depends(account_access)) -> dict[str, Any]:
        query = dict(request.query_params)
        valid = validate_create(query, await json_body(request), a)
        linked = valid.spec.get("hotLoadDeploymentId")
        if linked and plane.storage.get_deployment(a, linked) is None:
            raise InvalidArgument(
                f"hotLoadDeploymentId: deployment accounts/{a}/deployments/{linked} does not exist"
            )
        return plane.jobs.create(a, valid, query.get("trainingShape"))

    @v1.get("/accounts/{a}/rlorTrainerJobs")
    async def list_jobs(request: Request, a: str = Depends(account_access)) -> dict[str, Any]:
        size, offset = _page_size(request), _offset(request)
        recs = plane.storage.list_jobs(a, offset, size + 1)
        token = _token(offset + size) if len(recs) > size else ""
        return {
            "rlorTrainerJobs": [plane.jobs.payload(r) for r in recs[:size]],
            "nextPageToken": token,
        }

    @v1.get("/accounts/{a}/rlorTrainerJobs:watch")
    async def watch_jobs(request: Request, a: str = Depends(account_access)) -> EventSourceResponse:
        # Without a position a watcher gets live events only; Last-Event-ID: 0 replays all.
        raw = request.headers.get("last-event-id") or request.query_params.get("since")
        try:
            after = plane.storage.last_event_seq() if raw is None else int(raw)
            if not 0 <= after <= MAX_SQL_INT:
                raise ValueError
        except ValueError:
            raise InvalidArgument(
                f"Last-Event-ID: {shorten(raw)!r} must be an event id (an integer >= 0)"
            ) from None
        job = request.query_params.get("rlorTrainerJobId") or None

        async def events() -> AsyncIterator[dict[str, Any]]:
            async for event in plane.events.stream(a, job, after):
                yield {"id": str(event["id"]), "event": EVENT_TYPE, "data": json.dumps(event)}

        return EventSourceResponse(events(), ping=SSE_PING_S)

    # Before the job's own GET, whose {j} would otherwise take "<job>:logs" for a job id.
    @v1.get("/accounts/{a}/rlorTrainerJobs/{j}:logs")
    async def read_logs(request: Request, rec: JobRecord = Depends(job_access)) -> dict[str, Any]:
        """localplane extension (trainer-api.md §7): the trainer's output from a position."""
        start, size = _log_position(request), _page_size(request)
        trainer = plane.jobs.trainers.get((rec.account_id, rec.job_id))
        live_run = trainer.generation if trainer is not None else None
        # A file read of up to a MiB: off the event loop (it touches no SQLite).
        page = await asyncio.to_thread(
            trainer_logs.read_page,
            plane.data_dir,
            rec.account_id,
            rec.job_id,
            start,
            size,
            live_run,
        )
        return {
            "logEntries": page.entries,
            "nextPageToken": _log_token(page.next),
            "caughtUp": page.caught_up,
        }

    @v1.get("/accounts/{a}/rlorTrainerJobs/{j}")
    async def get_job(rec: JobRecord = Depends(job_access)) -> dict[str, Any]:
        return plane.jobs.payload(rec)

    @v1.delete("/accounts/{a}/rlorTrainerJobs/{j}")
    async def delete_job(rec: JobRecord = Depends(job_access)) -> dict[str, Any]:
        return plane.jobs.delete(rec.account_id, rec.job_id)

    @v1.post("/accounts/{a}/rlorTrainerJobs/{j}:resume")
    async def resume_job(rec: JobRecord = Depends(job_access)) -> dict[str, Any]:
        return plane.jobs.resume(rec.account_id, rec.job_id)

    # ---------------------------------------------------------- checkpoints

    @v1.get("/accounts/{a}/rlorTrainerJobs/{j}/checkpoints")
    async def list_checkpoints(
        request: Request, rec: JobRecord = Depends(job_access)
    ) -> dict[str, Any]:
        metas = ckpt.list_meta(plane.data_dir, rec.account_id, rec.job_id)
        page, token = paginate(request, metas)
        return {"checkpoints": [m.wire() for m in page], "nextPageToken": token}

    @v1.delete("/accounts/{a}/rlorTrainerJobs/{j}/checkpoints/{c}")
    async def delete_checkpoint(c: str, rec: JobRecord = Depends(job_access)) -> dict[str, Any]:
        if not ckpt.delete(plane.data_dir, rec.account_id, rec.job_id, c):
            raise NotFound(f"checkpoint {rec.name}/checkpoints/{c} not found")
        return {}

    # ---------------------------------------------------------- deployments

    @v1.post("/accounts/{a}/deployments")
    async def create_deployment(
        request: Request, a: str = Depends(account_access)
    ) -> dict[str, Any]:
        return plane.deployments.create(a, dict(request.query_params), await json_body(request))

    @v1.get("/accounts/{a}/deployments")
    async def list_deployments(
        request: Request, a: str = Depends(account_access)
    ) -> dict[str, Any]:
        size, offset = _page_size(request), _offset(request)
        page, more = plane.deployments.page(a, offset, size)
        return {"deployments": page, "nextPageToken": _token(offset + size) if more else ""}

    @v1.get("/accounts/{a}/deployments/{d}")
    async def get_deployment(d: str, a: str = Depends(account_access)) -> dict[str, Any]:
        return plane.deployments.get(a, d)

    @v1.patch("/accounts/{a}/deployments/{d}")
    async def update_deployment(
        d: str, request: Request, a: str = Depends(account_access)
    ) -> dict[str, Any]:
        mask = request.query_params.get("updateMask", "")
        return plane.deployments.update(a, d, await json_body(request), mask)

    @v1.delete("/accounts/{a}/deployments/{d}")
    async def delete_deployment(d: str, a: str = Depends(account_access)) -> dict[str, Any]:
        return plane.deployments.delete(a, d)

    # --------------------------------------------------------------- shapes

    def _shape_access(a: str, who: Principal) -> None:
        if a not in catalog.PUBLIC_ACCOUNTS:
            plane.check_account(who, a)

    @v1.get("/accounts/{a}/trainingShapes/{s}/versions")
    async def list_shape_versions(
        a: str, s: str, request: Request, who: Principal = Depends(principal)
    ) -> dict[str, Any]:
        _shape_access(a, who)
        versions = catalog.versions(a, s)
        if not versions:
            raise NotFound(f"training shape accounts/{a}/trainingShapes/{s} not found")
        flt = request.query_params.get("filter")
        if flt:
            if flt.replace(" ", "") != "latest_validated=true":
                raise InvalidArgument("filter: only 'latest_validated=true' is supported")
            latest = catalog.latest_validated(a, s)
            versions = [latest] if latest else []
        page, token = paginate(request, versions)
        return {"trainingShapeVersions": [v.wire() for v in page], "nextPageToken": token}

    @v1.get("/accounts/{a}/trainingShapes/{s}/versions/{v}")
    async def get_shape_version(
        a: str, s: str, v: str, who: Principal = Depends(principal)
    ) -> dict[str, Any]:
        _shape_access(a, who)
        version = catalog.get(a, s, v)
        if version is None:
            raise NotFound(
                f"training shape version accounts/{a}/trainingShapes/{s}/versions/{v} not found"
            )
        return version.wire()

    # ------------------------------------------------------------ promotion

    @v1.post("/accounts/{a}/checkpoints/{c}:promote")
    async def promote(c: str, request: Request, a: str = Depends(account_access)) -> dict[str, Any]:
        return plane.promotion.promote(a, c, await json_body(request))

    @v1.get("/accounts/{a}/operations/{o}")
    async def get_operation(o: str, a: str = Depends(account_access)) -> dict[str, Any]:
        return plane.promotion.operation(a, o)

    @v1.get("/accounts/{a}/models/{m}")
    async def get_model(a: str, m: str, who: Principal = Depends(principal)) -> dict[str, Any]:
        if a in catalog.PUBLIC_ACCOUNTS:  # the catalog's base models, readable by any key
            if (found := catalog.base_model(a, m)) is None:
                raise NotFound(f"model accounts/{a}/models/{m} not found")
            return found
        plane.check_account(who, a)
        return plane.promotion.model(a, m)

    @v1.delete("/accounts/{a}/models/{m}")
    async def delete_model(m: str, a: str = Depends(account_access)) -> dict[str, Any]:
        return plane.promotion.delete_model(a, m)

    app.include_router(v1)

    # ----------------------------------------------------- hot-load, inference

    async def caller_account(who: Principal = Depends(principal)) -> str:
        if who.kind != "user" or who.account_id is None:
            raise PermissionDenied("the admin key is for /admin/v1 only; use an account's API key")
        return who.account_id

    @app.post("/hot_load/v1/models/hot_load", include_in_schema=False)
    async def hot_load(request: Request, a: str = Depends(caller_account)) -> dict[str, Any]:
        return await plane.deployments.hotload(a, request.headers, await json_body(request))

    @app.get("/hot_load/v1/models/hot_load", include_in_schema=False)
    async def hot_load_status(request: Request, a: str = Depends(caller_account)) -> dict[str, Any]:
        return plane.deployments.hotload_status(a, request.headers)

    @app.post("/inference/v1/completions", include_in_schema=False)
    async def completions(request: Request, a: str = Depends(caller_account)) -> Any:
        answer = await plane.deployments.complete(a, await json_body(request))
        if isinstance(answer, tuple):
            body, identity = answer
            response = JSONResponse(body)
            response.headers[SNAPSHOT_HEADER] = identity or ""
            return response
        return StreamingResponse(answer, media_type="text/event-stream")

    # -------------------------------------------------------------- gateway

    @app.api_route(
        "/training/v1/rlorTrainerJobs/{a}/{j}/{path:path}",
        methods=["GET", "POST", "PUT", "DELETE", "PATCH"],
        include_in_schema=False,
    )
    async def gateway(
        a: str, j: str, path: str, request: Request, who: Principal = Depends(principal)
    ) -> Any:
        plane.check_account(who, a)
        return await plane.gateway.forward(request, a, j, path)

    # ---------------------------------------------------------------- admin

    admin = APIRouter(prefix="/admin/v1", dependencies=[Depends(admin_access)])

    def _admin_job(j: str, request: Request) -> JobRecord:
        account = request.query_params.get("account")
        m = rules.JOB_NAME_RE.match(j)
        if m:
            account, j = m["account"], m["job"]
        if account:
            return plane.jobs.require(account, j)
        found = plane.storage.find_jobs(j)
        if not found:
            raise NotFound(f"no rlorTrainerJob {j} in any account")
        if len(found) > 1:
            raise InvalidArgument(f"job id {j} exists in several accounts; pass ?account=<id>")
        return found[0]

    @admin.get("/faults")
    async def get_faults() -> dict[str, Any]:
        return plane.config.wire()

    @admin.post("/faults")
    async def set_faults(request: Request) -> dict[str, Any]:
        body = await json_object(request)
        try:
            return plane.set_config(body).wire()
        except ValidationError as exc:
            raise InvalidArgument(describe_validation_error(exc)) from None

    @admin.delete("/faults")
    async def reset_faults() -> dict[str, Any]:
        return plane.reset_config().wire()

    @admin.get("/holds")
    async def list_holds() -> dict[str, Any]:
        return {"holds": plane.holds.list()}

    @admin.post("/holds")
    async def add_hold(request: Request) -> dict[str, Any]:
        return plane.holds.add(await json_body(request)).wire()

    @admin.post("/holds/{hold_id}:release")
    async def release_hold(hold_id: str) -> dict[str, Any]:
        return plane.holds.release(hold_id)

    @admin.get("/stats")
    async def stats() -> dict[str, Any]:
        return plane.stats()

    @admin.post("/checkpoints:sweep")
    async def sweep_checkpoints() -> dict[str, Any]:
        """Delete expired checkpoints now (the plane also does it every minute)."""
        return {"changed": await asyncio.to_thread(plane.sweep_checkpoints)}

    @admin.post("/stats:reset")
    async def reset_stats() -> dict[str, Any]:
        plane.storage.reset_counters()
        return plane.stats()

    @admin.post("/rlorTrainerJobs/{j}:preempt")
    async def preempt(j: str, request: Request) -> dict[str, Any]:
        return plane.jobs.preempt(_admin_job(j, request))

    @admin.post("/rlorTrainerJobs/{j}:stop")
    async def stop(j: str, request: Request) -> dict[str, Any]:
        body = await json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("state"), str):
            raise InvalidArgument("state: is required, e.g. JOB_STATE_CANCELLED")
        state = JobState(body["state"])
        if state is JobState.UNSPECIFIED:
            raise InvalidArgument(f"state: {shorten(body['state'])!r} is not a job state")
        message = optional_str(body, "message") or ""
        return plane.jobs.stop_as(_admin_job(j, request), state, message)

    @admin.get("/rlorTrainerJobs/{j}")
    async def job_internals(j: str, request: Request) -> dict[str, Any]:
        rec = _admin_job(j, request)
        trainer = plane.jobs.trainers.get((rec.account_id, rec.job_id))
        route = plane.gateway.route(rec.account_id, rec.job_id)
        return {
            "job": plane.jobs.payload(rec),
            "generation": rec.generation,
            "trainer": None
            if trainer is None
            else {
                "pid": trainer.process.pid if trainer.process else None,
                "url": trainer.url,
                "generation": trainer.generation,
            },
            "route": None if route is None else {"url": route.url, "generation": route.generation},
        }

    @admin.post("/accounts")
    async def create_account(request: Request) -> dict[str, Any]:
        body = await json_object(request)
        account_id, key = plane.create_account(
            optional_str(body, "accountId"), optional_str(body, "keyStyle") or "tinker"
        )
        return {"account": {"name": f"accounts/{account_id}"}, "apiKey": key}

    @admin.post("/accounts/{a}/apiKeys")
    async def create_key(a: str, request: Request) -> dict[str, Any]:
        # keyStyle "tinker" (default): tml-…, accepted by both SDKs; "fireworks": fw_…, for
        # FiretitanServiceClient, which turns into a plain Tinker client on a tml- key.
        style = optional_str(await json_object(request), "keyStyle") or "tinker"
        if not plane.storage.account_exists(a):
            raise NotFound(f"account {a} not found")
        return {"apiKey": plane.add_key(a, style)}

    @admin.get("/webhooks")
    async def list_webhooks() -> dict[str, Any]:
        return {
            "webhooks": [
                {
                    "id": r["id"],
                    "accountId": r["account_id"],
                    "url": r["url"],
                    "createTime": r["create_time"],
                }
                for r in plane.storage.webhooks()
            ]
        }

    @admin.post("/webhooks")
    async def add_webhook(request: Request) -> dict[str, Any]:
        body = await json_object(request)
        url, secret = body.get("url"), body.get("secret")
        if not isinstance(url, str) or not _http_url(url):
            raise InvalidArgument("url: must be an http(s) URL with a host")
        if not isinstance(secret, str) or len(secret) < 16:
            raise InvalidArgument("secret: must be a string of at least 16 characters")
        account = optional_str(body, "accountId")
        if account is not None and not plane.storage.account_exists(account):
            raise InvalidArgument(f"accountId: account {account} does not exist")
        hook_id = f"wh-{secrets.token_hex(4)}"
        plane.events.add_webhook(hook_id, account, url, secret, datetime.now(UTC).isoformat())
        return {"id": hook_id, "accountId": account, "url": url}

    @admin.delete("/webhooks/{hook_id}")
    async def delete_webhook(hook_id: str) -> dict[str, Any]:
        if not plane.events.remove_webhook(hook_id):
            raise NotFound(f"webhook {hook_id} not found")
        return {}

    app.include_router(admin)
    return app
