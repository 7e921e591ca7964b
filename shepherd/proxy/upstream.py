"""One trainer generation's data plane, as the proxy calls it: the JSON dialect (what hosted
trainers speak), through the gateway, with the route race handled (trainer-api.md §5).

Every failure of the route is put to the control plane before it means anything:

* a ``404`` while the job is RUNNING is the route race — the very same request (same trainer
  ``seq_id``, same body) is sent again after a growing delay, at most
  ``route_race_retries`` times within ``route_race_window_s``; the program never sees it;
* a ``404``, connection error, 5xx or timeout while the job is *not* RUNNING means the trainer
  is gone: :class:`TrainerGone`, which the proxy turns into a ``trainer_lost`` event;
* a connection error or 5xx while the job is RUNNING is a blip: sent again shortly, within
  the call's timeout (the trainer dedupes a sequenced operation on its ``seq_id``);
* a submission (answered at once: §4) or a held ``retrieve_future`` poll that goes unanswered
  for ``DATA_PLANE_SILENCE_S`` is sent again on a new connection, as the loops' client does
  (issue 32): a connection that went dark under a partition is noticed by that bound, not left
  to TCP's backed-off retransmissions (a poll held when the link went dark otherwise waited out
  its 45 s timeout: 15 s idle after a 30 s cut).

Everything else (a 400 refusal, a 401) is raised as the platform client's typed error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import structlog

from shepherd.platform import (
    FutureExpired,
    InternalError,
    PlatformClient,
    PlatformError,
    RequestTimeout,
    RouteNotFound,
    TrainerClient,
    Unavailable,
)
from shepherd.platform.client import DATA_PLANE_SILENCE_S
from shepherd.proxy.settings import TRAINER_POLL_TIMEOUT_S, TRANSIENT_RETRY_S, ProxySettings
from shepherd.states import JobState

log = structlog.stdlib.get_logger("shepherd.proxy")

#: Failures of the route that may mean the trainer is gone (asked of the control plane).
_ROUTE_FAILURES = (Unavailable, InternalError, RequestTimeout)


class TrainerGone(Exception):
    """The trainer this generation talked to does not serve any more (or never will: the
    route race outlasted its budget)."""

    def __init__(self, reason: str, state: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.state = state


class Detached(Exception):
    """The proxy was detached from this generation while the call was under way."""


def jsonable(value: Any) -> Any:
    """A request body with NumPy arrays (how protobuf bodies decode) as lists, for JSON."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if value and type(value[0]) in (int, float):
            return list(value)  # tokens or a tensor's numbers, already plain
        return [jsonable(v) for v in value]
    return value


class Upstream:
    """The data plane of one trainer job, for one generation of the proxy."""

    def __init__(
        self,
        platform: PlatformClient,
        trainer_job_id: str,
        trainer: TrainerClient,
        settings: ProxySettings,
        on_race: Callable[[], None],
    ) -> None:
        self.platform = platform
        self.trainer_job_id = trainer_job_id
        self._trainer = trainer
        self._settings = settings
        self._on_race = on_race
        #: Set when this generation is over (detached, or the trainer was found gone): every
        #: call still under way ends with Detached at its next turn.
        self.closed = False

    async def state(self) -> JobState:
        return (await self.platform.get_job(self.trainer_job_id)).state

    async def verify(self, why: str) -> None:
        """Returns if the control plane says the job is RUNNING; raises TrainerGone if not."""
        await self._verify(why, time.monotonic() + self._settings.call_timeout_s)

    async def _verify(self, why: str, deadline: float) -> None:
        """Returns if the job is RUNNING (the failure was the race or a blip); raises
        TrainerGone otherwise. A failing control plane is asked again until ``deadline``."""
        while True:
            try:
                state = await self.state()
            except PlatformError as exc:
                if time.monotonic() >= deadline or not exc.retryable:
                    raise TrainerGone(
                        f"{why}, and the control plane could not be asked: {exc}"
                    ) from None
                await asyncio.sleep(TRANSIENT_RETRY_S)
                continue
            if state != JobState.RUNNING:
                raise TrainerGone(f"{why}; the job is {state.value}", state.value)
            return

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        silence: float | None = None,
    ) -> Any:
        """One request to the trainer (``path`` relative to ``api/v1/``), sent again through
        the route race and blips; see the module's doc (``silence``: the transport's)."""
        settings = self._settings
        deadline = time.monotonic() + settings.call_timeout_s
        races = 0
        payload = jsonable(body) if body is not None else None
        while True:
            if self.closed:
                raise Detached(path)
            try:
                return await self._trainer.request(
                    method, path, payload, params=params, timeout=timeout, silence=silence
                )
            except RouteNotFound:
                if self.closed:
                    raise Detached(path) from None
                await self._verify(f"{path}: the trainer's route answered 404", deadline)
                if self.closed:  # a generation that ended while the control plane was asked
                    raise Detached(path) from None
                races += 1
                if races > settings.route_race_retries:
                    raise TrainerGone(
                        f"{path}: the job is RUNNING but its route still answers 404 after "
                        f"{settings.route_race_retries} verified retries",
                        JobState.RUNNING.value,
                    ) from None
                self._on_race()
                log.info(
                    "proxy.route_race", trainer_job_id=self.trainer_job_id, path=path, race=races
                )
                await asyncio.sleep(settings.race_delay(races))
            except FutureExpired:
                if self.closed:
                    raise Detached(path) from None
                state = await self.state()
                raise TrainerGone(
                    f"{path}: the trainer no longer knows a request it accepted (it restarted, "
                    f"or forgot it); the job is {state.value}",
                    state.value,
                ) from None
            except _ROUTE_FAILURES as exc:
                if self.closed:
                    raise Detached(path) from None
                if isinstance(exc, RequestTimeout) and path == "retrieve_future":
                    return {"type": "try_again"}  # a held poll that ran out: ask again
                await self._verify(f"{path}: {exc}", deadline)
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(TRANSIENT_RETRY_S)

    async def submit(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Submit one operation (answered at once with its future: §4); the trainer's ticket
        (its ``request_id``, and what else it says). Sent again, the same body, each time it
        goes unanswered for the silence bound."""
        ticket = await self.call("POST", path, body, silence=DATA_PLANE_SILENCE_S)
        if not isinstance(ticket, dict) or not isinstance(ticket.get("request_id"), str | int):
            raise InternalError(f"{path}: the trainer answered without a request_id")
        return ticket

    async def poll(self, request_id: str) -> dict[str, Any]:
        """One ``retrieve_future`` poll: the result, an ``{"error", "category"}`` body, or a
        ``try_again`` (also for a held poll that timed out client-side, or went unanswered
        for the silence bound: the trainer holds a pending one ~20 s, so a pending future is
        asked again every ``DATA_PLANE_SILENCE_S``)."""
        answer = await self.call(
            "POST",
            "retrieve_future",
            {"request_id": request_id},
            timeout=TRAINER_POLL_TIMEOUT_S,
            silence=DATA_PLANE_SILENCE_S,
        )
        if not isinstance(answer, dict):
            raise InternalError(f"retrieve_future answered {answer!r}"[:300])
        return answer
