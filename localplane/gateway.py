"""The data-plane gateway (trainer-api.md §4–5).

``{gateway}/training/v1/rlorTrainerJobs/{a}/{j}/<path>`` is forwarded to the job's current
trainer. The gateway has several replicas and requests are spread over them; each replica
learns a new route after its own lag, drawn from the configured range, so just after a job
turns RUNNING (and after every resume) some requests get ``404`` although the trainer is
healthy — the route race clients must survive. A configurable share of requests also gets
a random ``404``. A deleted, dead or unknown job's route answers ``404`` too.

Every answer a trainer gives is counted by dialect and operation (admin stats), from the
``x-localplane-op`` / ``x-localplane-dialect`` headers the trainer sets.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from starlette.requests import Request
from starlette.responses import Response

from localplane.config import PlaneConfig
from localplane.errors import error_response
from shepherd.tinker_wire.dialects import DIALECT_HEADER, OP_HEADER

#: Upstream timeout: training calls may take long with an emulated compute delay.
UPSTREAM_TIMEOUT_S = 900.0
#: Hop-by-hop headers: never passed on through the proxy.
_HOP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding"}


@dataclass
class Route:
    url: str
    generation: int
    #: Monotonic time from which each replica knows the route.
    visible_at: list[float] = field(default_factory=list)


class Gateway:
    def __init__(
        self,
        config: Callable[[], PlaneConfig],
        rng: random.Random,
        on_404: Callable[[str, str], None],
        on_data_plane: Callable[[str, str, str, str], None] = lambda *_: None,
    ) -> None:
        self._config = config
        self._rng = rng
        self._on_404 = on_404
        self._on_data_plane = on_data_plane
        self._routes: dict[tuple[str, str], Route] = {}
        self._next_replica = itertools.count()
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(UPSTREAM_TIMEOUT_S, connect=2.0))

    async def aclose(self) -> None:
        await self._http.aclose()

    def _lag(self) -> float:
        lag = self._config().route_lag_seconds
        return self._rng.uniform(lag.min, lag.max)

    def add_route(self, account: str, job: str, url: str, generation: int) -> Route:
        now = time.monotonic()
        replicas = self._config().gateway_replicas
        route = Route(url, generation, [now + self._lag() for _ in range(replicas)])
        self._routes[(account, job)] = route
        return route

    def remove_route(self, account: str, job: str) -> None:
        self._routes.pop((account, job), None)

    def route(self, account: str, job: str) -> Route | None:
        return self._routes.get((account, job))

    def _resolve(self, account: str, job: str) -> tuple[int, str | None]:
        """The replica this request lands on and the upstream it knows (None: 404)."""
        cfg = self._config()
        replica = next(self._next_replica) % cfg.gateway_replicas
        route = self._routes.get((account, job))
        if route is None:
            return replica, None
        while len(route.visible_at) <= replica:  # replicas added after the route was set up
            route.visible_at.append(time.monotonic() + self._lag())
        if time.monotonic() < route.visible_at[replica]:
            return replica, None
        if cfg.gateway_404_rate and self._rng.random() < cfg.gateway_404_rate:
            return replica, None
        return replica, route.url

    def _not_found(self, account: str, job: str, replica: int) -> Response:
        self._on_404(account, job)
        response = error_response(
            404, "NOT_FOUND", f"no route to rlorTrainerJobs/{account}/{job} on this gateway replica"
        )
        response.headers["x-localplane-replica"] = str(replica)
        return response

    async def forward(self, request: Request, account: str, job: str, path: str) -> Response:
        replica, upstream = self._resolve(account, job)
        if upstream is None:
            return self._not_found(account, job, replica)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        body = await request.body()

        async def send() -> httpx.Response:
            return await self._http.request(
                request.method,
                f"{upstream}/{path}",
                params=request.query_params,
                content=body,
                headers=headers,
            )

        try:
            try:
                answer = await send()
            except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError):
                # Often a pooled keep-alive connection to a trainer that has since died. Every
                # data-plane call is idempotent, so one retry on a fresh connection tells a
                # stale connection (it succeeds) from a dead trainer (it is refused).
                answer = await send()
        except httpx.ConnectError:
            # The trainer is gone (killed, crashed) before the plane noticed: no route.
            return self._not_found(account, job, replica)
        except (httpx.ReadError, httpx.RemoteProtocolError):
            # Died mid-request: what a real gateway says when its upstream resets.
            return error_response(502, "UNAVAILABLE", "the trainer closed the connection")
        except httpx.TimeoutException:
            return error_response(504, "DEADLINE_EXCEEDED", "the trainer did not answer in time")
        # The trainer names what it served (it cannot write the plane's storage); count it.
        op = answer.headers.get(OP_HEADER)
        if op:
            self._on_data_plane(account, job, answer.headers.get(DIALECT_HEADER, "json"), op)
        out_headers = {
            k: v
            for k, v in answer.headers.items()
            if k.lower() not in _HOP_HEADERS | {"content-encoding"}
        }
        out_headers["x-localplane-replica"] = str(replica)
        return Response(answer.content, status_code=answer.status_code, headers=out_headers)
