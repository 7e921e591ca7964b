"""One async httpx client for the whole trainer platform contract (trainer-api.md):
control plane, gateway data plane and the event stream.

It retries nothing: every failure surfaces at once as a typed
:class:`~shepherd.platform.errors.PlatformError` that says whether it is retryable, so the
caller's declared policy (a Temporal ``RetryPolicy``) owns retries and every attempt shows
in the event history. Its request timeout must stay below the calling activity's
``start_to_close_timeout``.

It speaks only the contract, so it works against ``localplane`` and the hosted service.
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, Self
from urllib.parse import quote

import httpx
from httpx_sse import EventSource, aconnect_sse

from shepherd.platform import rules
from shepherd.platform.errors import (
    FutureExpired,
    InternalError,
    PlatformError,
    RequestTimeout,
    Unreachable,
    error_from_response,
    error_from_transport,
    future_failed,
)
from shepherd.platform.models import (
    Account,
    Checkpoint,
    CheckpointList,
    CreateTrainerJobRequest,
    JobEvent,
    Model,
    Operation,
    PromoteCheckpointRequest,
    PromoteCheckpointResponse,
    TrainerJob,
    TrainerJobList,
    TrainerLogPage,
    TrainerModelInfo,
    TrainingShapeVersion,
    TrainingShapeVersionList,
)

if TYPE_CHECKING:
    from shepherd.platform.aio import AiohttpTransport

#: Default per-request timeout, seconds. Shorter than any activity's start-to-close.
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
#: How long a data-plane request of a training step may go unanswered before it is sent
#: again, on a new connection (issue 32): a connection that went dark — a partition that
#: drops packets, refusing nothing — is noticed by this bound, not by the socket's timeout,
#: and a request in flight when the link healed would otherwise wait for TCP's backed-off
#: retransmission (12-31 s idle after a 30 s cut). A submission is answered at once (the
#: trainer returns its future before the work: §4) and is sent again as it was (the trainer
#: dedupes on ``(model_id, seq_id)``); a held ``retrieve_future`` poll is asked again (it is
#: a read; trainers hold one open for up to ~20-30 s, §4). The cost: a future pending longer
#: than this is polled on a new connection every 5 s instead of once per trainer hold.
DATA_PLANE_SILENCE_S = 5.0
#: Between two sends of a request whose answer was a quick timeout (a gateway's 504 or 408,
#: not silence): no tight loop against a platform that is answering.
DATA_PLANE_RESEND_PAUSE_S = 0.5
USER_AGENT = "shepherd-platform-client/0.1"

#: Sends one request: ``await via(lambda: request())`` (see :meth:`TrainerClient.call`).
Resend = Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]


async def _pause_after_a_quick_timeout(sent: float) -> None:
    """After a timeout that came back sooner than the silence bound (the platform answered
    408/504 at once), wait ``DATA_PLANE_RESEND_PAUSE_S`` before sending again."""
    if time.monotonic() - sent < DATA_PLANE_SILENCE_S / 2:
        await asyncio.sleep(DATA_PLANE_RESEND_PAUSE_S)


async def _once(request: Callable[[], Awaitable[Any]]) -> Any:
    return await request()


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context per process for every HTTP client here: httpx builds a fresh one per
    client otherwise (loading the CA bundle: ~40 ms of CPU), and a worker makes clients per
    backend, a test stack per test."""
    return httpx.create_ssl_context()


def _q(segment: str) -> str:
    return quote(segment, safe="")


class Transport(Protocol):
    """A request path: auth headers, typed errors (:mod:`shepherd.platform.errors`), JSON
    decoding. :class:`JsonTransport` (httpx) and
    :class:`~shepherd.platform.aio.AiohttpTransport` are the two."""

    async def request(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        data_plane: bool = False,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        silence: float | None = None,
    ) -> Any:
        """``timeout``: the request's bound (None: the transport's default); ``silence``:
        how long the peer may send nothing once the request is written (an answer being
        written resets it; an upload does not count), for requests answered at once by
        contract or held by the peer (None: only ``timeout``)."""
        ...


class JsonTransport:
    """The shared request path: auth header, error mapping, JSON decoding."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def request(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        data_plane: bool = False,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        silence: float | None = None,
    ) -> Any:
        limit: httpx.Timeout | object = httpx.USE_CLIENT_DEFAULT
        if timeout is not None or silence is not None:
            # httpx's bounds are per operation: its read bound is a bound on silence.
            base = self.http.timeout if timeout is None else httpx.Timeout(timeout)
            read = base.read if silence is None else min(silence, base.read or silence)
            limit = httpx.Timeout(connect=base.connect, read=read, write=base.write, pool=base.pool)
        request = self.http.build_request(
            method,
            url,
            params={k: v for k, v in (params or {}).items() if v is not None},
            json=json_body,
            timeout=limit,  # type: ignore[arg-type]
            headers=headers,
        )
        try:
            response = await self.http.send(request)
        except httpx.TransportError as exc:
            raise error_from_transport(exc, request) from None
        if response.status_code >= 400:
            raise error_from_response(response, data_plane=data_plane)
        if not response.content:
            return {}
        try:
            return response.json()
        except json.JSONDecodeError:
            raise error_from_response(response, data_plane=data_plane) from None


class PlatformClient:
    """Client of one trainer platform account.

    ``base_url`` is the control plane; ``gateway_url`` the data-plane gateway and
    defaults to ``base_url`` (trainer-api.md §4). ``account_id`` is resolved from the key
    on first use when not given.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        gateway_url: str | None = None,
        account_id: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        max_connections: int = 100,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.gateway_url = (gateway_url or base_url).rstrip("/")
        self._account_id = account_id
        # Both headers (§1): hosted control planes read the bearer token, training APIs
        # X-Api-Key.
        self._headers = {
            "Authorization": f"Bearer {api_key}",
            "X-Api-Key": api_key,
            "User-Agent": USER_AGENT,
        }
        self._timeouts = (timeout, connect_timeout)
        self._http = httpx.AsyncClient(
            headers=self._headers,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            transport=transport,
            verify=tls_context(),
        )
        self._t = JsonTransport(self._http)
        #: Trainers' data plane (aiohttp: about half httpx's CPU per request), opened on first
        #: use: a loop job's steps are a worker's busiest requests (``bench/scale.py``: the
        #: training activities' httpx calls were 40 % of a busy worker's samples).
        self._data_plane: AiohttpTransport | None = None

    def __repr__(self) -> str:  # never the key
        return f"PlatformClient(base_url={self.base_url!r}, account_id={self._account_id!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._data_plane is not None:
            await self._data_plane.aclose()
        await self._http.aclose()

    # ---------------------------------------------------------------- accounts

    async def list_accounts(self, page_size: int = 2) -> list[Account]:
        body = await self._t.request(
            "GET", f"{self.base_url}/v1/accounts", params={"pageSize": page_size}
        )
        return [Account.model_validate(a) for a in body.get("accounts", [])]

    async def account_id(self) -> str:
        """The account the API key belongs to (resolved once, then cached)."""
        if self._account_id is None:
            accounts = await self.list_accounts()
            if not accounts:
                raise PlatformError("the API key has no account", status="NOT_FOUND")
            self._account_id = accounts[0].account_id
        return self._account_id

    async def _account_url(self, account_id: str | None = None) -> str:
        account = account_id or await self.account_id()
        return f"{self.base_url}/v1/accounts/{_q(account)}"

    async def job_name(self, job_id: str) -> str:
        if rules.JOB_NAME_RE.match(job_id):
            return job_id
        return f"accounts/{await self.account_id()}/rlorTrainerJobs/{job_id}"

    async def _job_url(self, job: str) -> str:
        m = rules.JOB_NAME_RE.match(job)
        if m:
            return f"{self.base_url}/v1/accounts/{_q(m['account'])}/rlorTrainerJobs/{_q(m['job'])}"
        return f"{await self._account_url()}/rlorTrainerJobs/{_q(job)}"

    # -------------------------------------------------------------------- jobs

    async def create_job(
        self,
        job_id: str,
        request: CreateTrainerJobRequest,
        *,
        training_shape: str | None = None,
        skip_validations: bool = False,
        deployment_id: str | None = None,
    ) -> TrainerJob:
        """Create a trainer job with a client-chosen id. A repeated id raises
        :class:`~shepherd.platform.errors.AlreadyExists`; callers then ``get_job`` it."""
        body = await self._t.request(
            "POST",
            f"{await self._account_url()}/rlorTrainerJobs",
            params={
                "rlorTrainerJobId": job_id,
                "trainingShape": training_shape,
                "skipValidations": "true" if skip_validations else None,
                "deploymentId": deployment_id,
            },
            json_body=request.wire(),
        )
        return TrainerJob.model_validate(body)

    async def get_job(self, job_id: str) -> TrainerJob:
        return TrainerJob.model_validate(await self._t.request("GET", await self._job_url(job_id)))

    async def list_jobs(
        self, *, page_size: int | None = None, page_token: str | None = None
    ) -> TrainerJobList:
        body = await self._t.request(
            "GET",
            f"{await self._account_url()}/rlorTrainerJobs",
            params={"pageSize": page_size, "pageToken": page_token or None},
        )
        return TrainerJobList.model_validate(body)

    async def iter_jobs(self, *, page_size: int | None = None) -> AsyncIterator[TrainerJob]:
        token: str | None = None
        while True:
            page = await self.list_jobs(page_size=page_size, page_token=token)
            for job in page.rlor_trainer_jobs:
                yield job
            if not page.next_page_token:
                return
            token = page.next_page_token

    async def delete_job(self, job_id: str) -> TrainerJob | None:
        """Stop the trainer and release its slot; deleting twice is fine."""
        body = await self._t.request("DELETE", await self._job_url(job_id))
        return TrainerJob.model_validate(body) if body.get("name") else None

    async def resume_job(self, job_id: str) -> TrainerJob:
        body = await self._t.request("POST", f"{await self._job_url(job_id)}:resume", json_body={})
        return TrainerJob.model_validate(body)

    async def read_log(
        self, job_id: str, *, page_token: str | None = None, page_size: int | None = None
    ) -> TrainerLogPage:
        """The trainer's output after ``page_token`` (from the start without one), across
        every run of the job, also once it is deleted. A localplane extension (trainer-api.md
        §7): a platform without it answers 404 for a job that exists."""
        body = await self._t.request(
            "GET",
            f"{await self._job_url(job_id)}:logs",
            params={"pageSize": page_size, "pageToken": page_token or None},
        )
        return TrainerLogPage.model_validate(body)

    # ------------------------------------------------------------- checkpoints

    async def list_checkpoints(
        self, job_id: str, *, page_size: int | None = None, page_token: str | None = None
    ) -> CheckpointList:
        body = await self._t.request(
            "GET",
            f"{await self._job_url(job_id)}/checkpoints",
            params={"pageSize": page_size, "pageToken": page_token or None},
        )
        return CheckpointList.model_validate(body)

    async def iter_checkpoints(
        self, job_id: str, *, page_size: int | None = None
    ) -> AsyncIterator[Checkpoint]:
        token: str | None = None
        while True:
            page = await self.list_checkpoints(job_id, page_size=page_size, page_token=token)
            for checkpoint in page.checkpoints:
                yield checkpoint
            if not page.next_page_token:
                return
            token = page.next_page_token

    async def delete_checkpoint(self, job_id: str, checkpoint_id: str) -> None:
        """``localplane`` extension: remove a checkpoint (keep-last-K housekeeping)."""
        await self._t.request(
            "DELETE", f"{await self._job_url(job_id)}/checkpoints/{_q(checkpoint_id)}"
        )

    # ------------------------------------------------------------------ shapes

    async def latest_shape_version(self, shape_ref: str) -> TrainingShapeVersion:
        """The latest validated version of ``accounts/<a>/trainingShapes/<s>``."""
        m = rules.SHAPE_REF_RE.match(shape_ref)
        if not m:
            raise ValueError(f"training shape ref {shape_ref!r} {rules.SHAPE_REF_RULE}")
        url = f"{self.base_url}/v1/accounts/{_q(m['account'])}/trainingShapes/{_q(m['shape'])}/versions"
        body = await self._t.request(
            "GET", url, params={"filter": "latest_validated=true", "pageSize": 1}
        )
        versions = TrainingShapeVersionList.model_validate(body).training_shape_versions
        if not versions:
            raise PlatformError(
                f"training shape {shape_ref} has no validated version", status="NOT_FOUND"
            )
        return versions[0]

    async def get_shape_version(self, version_ref: str) -> TrainingShapeVersion:
        m = rules.SHAPE_REF_RE.match(version_ref)
        if not m or not m["version"]:
            raise ValueError(f"{version_ref!r} is not a training shape version reference")
        body = await self._t.request("GET", f"{self.base_url}/v1/{version_ref}")
        return TrainingShapeVersion.model_validate(body)

    async def resolve_shape(self, shape_ref: str) -> TrainingShapeVersion:
        """A pinned version as given, else the shape's latest validated version."""
        m = rules.SHAPE_REF_RE.match(shape_ref)
        if m and m["version"]:
            return await self.get_shape_version(shape_ref)
        return await self.latest_shape_version(shape_ref)

    # --------------------------------------------------------------- promotion

    async def promote_checkpoint(
        self,
        checkpoint_id: str,
        *,
        job_id: str,
        output_model_id: str,
        base_model: str | None = None,
        async_promotion: bool = False,
    ) -> PromoteCheckpointResponse:
        account = await self.account_id()
        request = PromoteCheckpointRequest(
            output_model=f"accounts/{account}/models/{output_model_id}",
            trainer_job_id=await self.job_name(job_id),
            base_model=base_model,
            async_promotion=async_promotion or None,
        )
        body = await self._t.request(
            "POST",
            f"{await self._account_url()}/checkpoints/{_q(checkpoint_id)}:promote",
            json_body=request.model_dump(exclude_none=True),
        )
        return PromoteCheckpointResponse.model_validate(body)

    async def get_operation(self, operation: str) -> Operation:
        op_id = operation.rsplit("/", 1)[-1]
        body = await self._t.request("GET", f"{await self._account_url()}/operations/{_q(op_id)}")
        return Operation.model_validate(body)

    async def get_model(self, model_id: str) -> Model:
        """A model of this account by id, or any model by its resource name
        (``accounts/<a>/models/<m>``: a base model, another account's model)."""
        if m := rules.MODEL_NAME_RE.match(model_id):
            url = f"{self.base_url}/v1/accounts/{_q(m['account'])}/models/{_q(m['model'])}"
        else:
            model_id = model_id.rsplit("/", 1)[-1]
            url = f"{await self._account_url()}/models/{_q(model_id)}"
        body = await self._t.request("GET", url)
        return Model.model_validate(body)

    # ------------------------------------------------------------- deployments

    async def get_deployment(self, deployment_id: str) -> dict[str, Any]:
        deployment_id = deployment_id.rsplit("/", 1)[-1]
        url = f"{await self._account_url()}/deployments/{_q(deployment_id)}"
        body: dict[str, Any] = await self._t.request("GET", url)
        return body

    async def link_deployment(self, deployment_id: str, trainer_job: str) -> dict[str, Any]:
        """Attach the deployment to ``trainer_job`` (its snapshots are what it hot-loads)."""
        deployment_id = deployment_id.rsplit("/", 1)[-1]
        url = f"{await self._account_url()}/deployments/{_q(deployment_id)}"
        body: dict[str, Any] = await self._t.request(
            "PATCH",
            url,
            params={"updateMask": "hot_load_trainer_job"},
            json_body={"hotLoadTrainerJob": await self.job_name(trainer_job)},
        )
        return body

    async def _hot_load_headers(self, deployment_id: str, base_model: str) -> dict[str, str]:
        name = f"accounts/{await self.account_id()}/deployments/{deployment_id.rsplit('/', 1)[-1]}"
        return {"fireworks-deployment": name, "fireworks-model": base_model}

    async def hot_load(self, deployment_id: str, identity: str, base_model: str) -> dict[str, Any]:
        """Load the snapshot ``identity`` (a sampler checkpoint) onto the deployment."""
        body: dict[str, Any] = await self._t.request(
            "POST",
            f"{self.base_url}/hot_load/v1/models/hot_load",
            json_body={"identity": identity},
            headers=await self._hot_load_headers(deployment_id, base_model),
        )
        return body

    async def hot_load_status(self, deployment_id: str, base_model: str) -> dict[str, Any]:
        """Each replica's loading state (``replicas[].loading_state.stage``)."""
        body: dict[str, Any] = await self._t.request(
            "GET",
            f"{self.base_url}/hot_load/v1/models/hot_load",
            headers=await self._hot_load_headers(deployment_id, base_model),
        )
        return body

    async def delete_model(self, model_id: str) -> None:
        """Delete a model; a promotion still making it is cancelled (it never gets READY)."""
        model_id = model_id.rsplit("/", 1)[-1]
        await self._t.request("DELETE", f"{await self._account_url()}/models/{_q(model_id)}")

    # ------------------------------------------------------------------ events

    async def watch_jobs(
        self, *, last_event_id: int | None = None, job_id: str | None = None
    ) -> AsyncIterator[JobEvent]:
        """Every job state change of the account as it happens (Server-Sent Events).

        Without ``last_event_id`` only live events arrive; with it, every event after that
        id first (``0``: the whole history), so a reconnecting watcher misses nothing.
        Ends only when the server closes the stream or the caller stops.
        """
        headers = {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else {}
        url = f"{await self._account_url()}/rlorTrainerJobs:watch"
        params = {"rlorTrainerJobId": job_id} if job_id else None
        try:
            async with aconnect_sse(
                self._http,
                "GET",
                url,
                params=params,
                headers=headers,
                timeout=httpx.Timeout(None, connect=self._http.timeout.connect),
            ) as source:
                await self._check_stream(source)
                async for sse in source.aiter_sse():
                    if not sse.data:
                        continue
                    yield JobEvent.model_validate_json(sse.data)
        except httpx.TransportError as exc:
            raise error_from_transport(exc, httpx.Request("GET", url)) from None

    @staticmethod
    async def _check_stream(source: EventSource) -> None:
        response = source.response
        if response.status_code >= 400:
            await response.aread()
            raise error_from_response(response)

    # -------------------------------------------------------------- data plane

    async def trainer(self, job_id: str, via: Transport | None = None) -> TrainerClient:
        """The data plane of one job, through the gateway (on this client's data-plane
        connections, or on ``via``: a transport of :meth:`open_data_plane`)."""
        m = rules.JOB_NAME_RE.match(await self.job_name(job_id))
        assert m is not None
        base = f"{self.gateway_url}/training/v1/rlorTrainerJobs/{_q(m['account'])}/{_q(m['job'])}"
        if via is None:
            if self._data_plane is None:
                self._data_plane = self.open_data_plane()
            via = self._data_plane
        return TrainerClient(via, base)

    def open_data_plane(self) -> AiohttpTransport:
        """A connection pool of its own, with this client's credentials and timeouts, for a
        data-plane path that sends many requests (Shepherd's proxy); the caller closes it."""
        from shepherd.platform.aio import AiohttpTransport  # noqa: PLC0415 - few need aiohttp

        timeout, connect = self._timeouts
        return AiohttpTransport(
            self._headers, timeout=timeout, connect_timeout=connect, ssl_context=tls_context()
        )

    def trainer_at(self, url: str) -> TrainerClient:
        """The data plane of a trainer at a direct URL (no gateway), e.g. for benchmarks."""
        return TrainerClient(self._t, url.rstrip("/"))


class TrainerClient:
    """The Tinker API of one trainer, JSON dialect (trainer-api.md §4): what hosted
    trainers speak. Operations that go through a model's ordered sequence are submitted
    with an explicit ``seq_id`` and return a future; :meth:`result` waits for it.

    A ``404`` is raised as :class:`~shepherd.platform.errors.RouteNotFound`: ask the
    control plane what it means (§5). Nothing is retried here: a re-sent operation keeps
    its ``seq_id``, and the trainer dedupes on ``(model_id, seq_id)``.
    """

    def __init__(self, transport: Transport, base_url: str) -> None:
        self._t = transport
        self.base_url = base_url

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        silence: float | None = None,
    ) -> Any:
        """Any endpoint of the trainer's API (``path`` relative to ``api/v1/``), once
        (``timeout``, ``silence``: :meth:`Transport.request`'s)."""
        return await self._t.request(
            method,
            f"{self.base_url}/api/v1/{path}",
            params=params,
            json_body=body,
            data_plane=True,
            timeout=timeout,
            silence=silence,
        )

    async def _post(self, path: str, body: Any, *, timeout: float | None = None) -> Any:
        return await self.request("POST", path, body, timeout=timeout)

    # ------------------------------------------------------------- direct calls

    async def healthz(self, *, timeout: float | None = None) -> bool:
        await self.request("GET", "healthz", timeout=timeout)
        return True

    async def create_session(
        self, *, tags: list[str] | None = None, user_metadata: dict[str, Any] | None = None
    ) -> str:
        body = await self._post(
            "create_session",
            {
                "tags": tags or [],
                "user_metadata": user_metadata or {},
                "sdk_version": USER_AGENT,
                "type": "create_session",
            },
        )
        return str(body["session_id"])

    async def get_info(self, model_id: str) -> TrainerModelInfo:
        body = await self._post("get_info", {"model_id": model_id, "type": "get_info"})
        return TrainerModelInfo.model_validate(body)

    async def create_sampling_session(
        self,
        session_id: str,
        sampling_session_seq_id: int,
        *,
        model_path: str | None = None,
        base_model: str | None = None,
    ) -> str:
        body = await self._post(
            "create_sampling_session",
            {
                "session_id": session_id,
                "sampling_session_seq_id": sampling_session_seq_id,
                "model_path": model_path,
                "base_model": base_model,
                "type": "create_sampling_session",
            },
        )
        return str(body["sampling_session_id"])

    # ----------------------------------------------------------------- futures

    async def submit(self, op: str, body: dict[str, Any], *, deadline: float | None = None) -> str:
        """Submit one operation; returns the future's request id (accepted, not done). With
        ``deadline`` (seconds): sent again, the same body, each time it goes unanswered for
        ``DATA_PLANE_SILENCE_S``, until then (without: sent once)."""
        answer = await self._unsilenced(op, body, deadline)
        request_id = answer.get("request_id") if isinstance(answer, dict) else None
        if not isinstance(request_id, str | int):
            raise InternalError(
                f"{op}: the trainer answered without a request_id", method="POST", url=op
            )
        return str(request_id)

    async def _unsilenced(self, op: str, body: dict[str, Any], deadline: float | None) -> Any:
        if deadline is None:
            return await self._post(op, body)
        end = time.monotonic() + deadline
        while True:
            sent = time.monotonic()
            try:
                return await self._post(op, body, timeout=min(end - sent, DATA_PLANE_SILENCE_S))
            except (RequestTimeout, Unreachable):
                # Unanswered — silence, or no connection at all (a partition past the
                # host's neighbour entry answers "no route to host" at once): again.
                if time.monotonic() >= end:
                    raise
                await _pause_after_a_quick_timeout(sent)

    async def result(self, request_id: str, *, timeout: float) -> dict[str, Any]:
        """Wait for a future's result. The trainer holds each poll open and answers
        ``try_again`` (or 408) while the work is pending; this is waiting, not retrying,
        so it happens here, bounded by ``timeout`` seconds overall."""
        deadline = time.monotonic() + timeout
        while True:
            sent = time.monotonic()
            left = deadline - sent
            if left <= 0:
                raise RequestTimeout(
                    f"future {request_id} not done within {timeout:.0f}s",
                    method="POST",
                    url="retrieve_future",
                )
            try:
                body = await self._post(
                    "retrieve_future",
                    {"request_id": request_id},
                    timeout=min(left, DATA_PLANE_SILENCE_S),
                )
            except (RequestTimeout, Unreachable):
                # A held poll that ran out (408 or our silence bound), or no connection: ask
                # again, within the deadline.
                await _pause_after_a_quick_timeout(sent)
                continue
            except PlatformError as exc:
                if exc.status_code == 410:
                    raise FutureExpired(
                        f"future {request_id} expired on the trainer",
                        status_code=410,
                        method="POST",
                        url="retrieve_future",
                    ) from None
                raise
            if not isinstance(body, dict):
                raise InternalError(f"future {request_id}: unexpected answer {body!r}"[:300])
            if body.get("type") == "try_again":
                continue
            if "error" in body and "category" in body:
                raise future_failed(request_id, body)
            return body

    async def call(
        self, op: str, body: dict[str, Any], *, timeout: float, via: Resend | None = None
    ) -> dict[str, Any]:
        """Submit and wait: one sequenced operation end to end. ``via`` wraps each of the two
        requests (e.g. to send one again after a route 404, which never reached the trainer)."""
        send: Resend = via or _once
        request_id = await send(lambda: self.submit(op, body, deadline=timeout))
        return await send(lambda: self.result(request_id, timeout=timeout))

    async def create_model(
        self,
        session_id: str,
        model_seq_id: int,
        base_model: str,
        lora_rank: int,
        *,
        seed: int | None = None,
        timeout: float,
        via: Resend | None = None,
    ) -> str:
        """A new model; ``lora_rank`` 0 is full-parameter training."""
        body: dict[str, Any] = {
            "session_id": session_id,
            "model_seq_id": model_seq_id,
            "base_model": base_model,
            "type": "create_model",
        }
        if lora_rank:
            body["lora_config"] = {
                "rank": lora_rank,
                **({"seed": seed} if seed is not None else {}),
            }
        return str((await self.call("create_model", body, timeout=timeout, via=via))["model_id"])

    async def load_into_new_model(
        self,
        session_id: str,
        model_seq_id: int,
        path: str,
        *,
        optimizer: bool = True,
        timeout: float,
        via: Resend | None = None,
    ) -> dict[str, Any]:
        """Create a model from a checkpoint (``load_weights`` in session mode)."""
        return await self.call(
            "load_weights",
            {
                "session_id": session_id,
                "model_seq_id": model_seq_id,
                "path": path,
                "optimizer": optimizer,
                "type": "load_weights",
            },
            timeout=timeout,
            via=via,
        )
