"""What every activity shares: the platform clients (by backend *name*), the translation
of platform errors into ``ApplicationError`` types the workflow and its retry policies
branch on, and the verified-404 rule (trainer-api.md §5).

Activities are thin: one platform interaction each, no retry loops — a retry is the
declared policy's job (``workflows/policies.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any, Protocol, TypeVar

import structlog
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from shepherd.models import PlatformJob
from shepherd.platform import (
    AlreadyExists,
    FailedPrecondition,
    FutureExpired,
    FutureFailed,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PlatformClient,
    PlatformError,
    RouteNotFound,
    TrainerClient,
    Unauthenticated,
)
from shepherd.platform.models import TrainerJob
from shepherd.states import JobState
from workflows import policies

T = TypeVar("T")


class ClientProvider(Protocol):
    """Gives the platform client of a backend profile (built by the worker)."""

    def client(self, backend: str) -> PlatformClient: ...

    def events(self, backend: str) -> bool:
        """Whether this worker bridges the backend's pushed events to the workflows."""
        ...

    def admits(self, backend: str) -> bool:
        """Whether Shepherd admits the backend's jobs (its profile declares its slots)."""
        ...


def log(**bound: Any) -> structlog.stdlib.BoundLogger:
    """A logger carrying the activity's workflow id, type and attempt (and ``bound``)."""
    info = activity.info()
    return structlog.stdlib.get_logger("shepherd.activity").bind(
        workflow_id=info.workflow_id,
        activity=info.activity_type,
        attempt=info.attempt,
        **bound,
    )


def snapshot(job: TrainerJob) -> PlatformJob:
    return PlatformJob(
        trainer_job_id=job.job_id,
        state=job.state.value,
        status_code=job.status.code,
        message=job.status.message,
        update_time=job.update_time,
    )


def not_ready(
    message: str, *, next_retry_delay: timedelta | None = None, details: Any = None
) -> ApplicationError:
    """Benign: the expected "not yet" of a poll; logged at DEBUG, not as a failure."""
    return ApplicationError(
        message,
        *(() if details is None else (details,)),
        type=policies.NOT_READY,
        category=ApplicationErrorCategory.BENIGN,
        next_retry_delay=next_retry_delay,
    )


def lost(job: PlatformJob, *, applied_step: int | None = None) -> ApplicationError:
    """The trainer is not serving any more: the workflow decides (recovery or failure).
    ``applied_step``: the last step this activity saw applied (for the work-lost count)."""
    kind = policies.TRAINER_GONE if JobState(job.state).is_gone() else policies.TRAINER_LOST
    return ApplicationError(
        f"trainer {job.trainer_job_id} is {job.state}: {job.message or 'no message'}",
        job.model_dump(mode="json"),
        {"applied_step": applied_step},
        type=kind,
        non_retryable=True,
        # The workflow's business (a recovery, or the end of a cancelled job whose trainer
        # it deleted), not the worker's: no warning with a traceback in its log.
        category=ApplicationErrorCategory.BENIGN,
    )


def refusal(message: str, kind: str) -> ApplicationError:
    """A permanent, expected answer (the model id is taken, the spec asks for something
    the platform does not have): the job fails with it, and the worker's log keeps no
    traceback for it (BENIGN errors are logged at DEBUG)."""
    return ApplicationError(
        message, type=kind, non_retryable=True, category=ApplicationErrorCategory.BENIGN
    )


_PERMANENT_TYPES: dict[type[PlatformError], str] = {
    # The trainer forgot a result Shepherd still needs: its progress is not knowable.
    FutureExpired: policies.TRAINER_BEHIND,
    # A future that failed with a user error: the request itself is wrong.
    FutureFailed: policies.INVALID_REQUEST,
    InvalidArgument: policies.INVALID_REQUEST,
    Unauthenticated: policies.UNAUTHENTICATED,
    PermissionDenied: policies.PERMISSION_DENIED,
    FailedPrecondition: policies.FAILED_PRECONDITION,
    NotFound: policies.NOT_FOUND,
    AlreadyExists: policies.INVALID_REQUEST,
}


def translate(exc: PlatformError, context: str = "") -> ApplicationError:
    """A platform error as the ApplicationError its retry policy expects: retryable errors
    keep their class name as type; permanent ones get a non-retryable type."""
    message = f"{context}: {exc}" if context else str(exc)
    if exc.retryable:
        return ApplicationError(message, type=type(exc).__name__)
    kind = next(
        (t for cls, t in _PERMANENT_TYPES.items() if isinstance(exc, cls)), policies.INVALID_REQUEST
    )
    return ApplicationError(message, type=kind, non_retryable=True)


async def _gone_behind_404(
    client: PlatformClient, trainer_job_id: str, context: str, applied_step: int | None = None
) -> ApplicationError | None:
    """None while the control plane says RUNNING (the 404 is the route race); else the
    error to fail with: the trainer is gone, or the control plane itself failed."""
    try:
        job = snapshot(await client.get_job(trainer_job_id))
    except PlatformError as exc:
        return translate(exc, context)
    if job.state != JobState.RUNNING.value:
        return lost(job, applied_step=applied_step)
    return None


async def verified_404(
    client: PlatformClient,
    trainer_job_id: str,
    *,
    races: int,
    retries: int,
    window: timedelta,
    applied_step: int | None = None,
) -> ApplicationError:
    """What a data-plane 404 means, asked of the control plane (trainer-api.md §5).

    RUNNING: the route race — retryable after a growing delay, within ``retries``.
    Anything else: the trainer is gone — non-retryable, no budget burned. A failing
    control-plane probe surfaces as itself (never masked as a race or a death).
    """
    gone = await _gone_behind_404(
        client, trainer_job_id, f"checking trainer {trainer_job_id} after a 404", applied_step
    )
    if gone is not None:
        return gone
    if races > retries:
        return ApplicationError(
            f"trainer {trainer_job_id} is RUNNING but its route still answers 404 after {retries} verified retries",
            type=policies.ROUTE_RACE_EXHAUSTED,
            non_retryable=True,
        )
    return ApplicationError(
        f"route race: trainer {trainer_job_id} is RUNNING but the gateway answered 404 (retry {races}/{retries})",
        {"route_races": races},
        type=policies.ROUTE_RACE,
        category=ApplicationErrorCategory.BENIGN,
        next_retry_delay=policies.route_race_delay(races, retries, window),
    )


class RouteWait:
    """The route race while a (re)started trainer's route reaches every gateway replica
    (trainer-api.md §5), inside one activity attempt: after a route 404 the control plane
    is asked whether the job is RUNNING (at most every ``WARMUP_REVERIFY_AFTER``; a 404 from
    a trainer that is gone fails at once), then the caller tries again after
    ``WARMUP_PROBE_SPACING``, for at most ``WARMUP_ATTEMPT_BUDGET`` per attempt.

    Shared by the warm-up probes and by opening the model, which runs beside them: a route
    404 means the request never reached the trainer, so re-sending it is safe.

    ``booting``: started when the trainer was placed, before it is RUNNING (its route does
    not exist yet): while the control plane says PENDING or CREATING a 404 is the boot, not a
    race nor a death; the control plane is asked after each, the next try following
    ``policies.boot_probe_spacing``, within ``BOOT_ATTEMPT_BUDGET``. From the first RUNNING
    on, the route race as above."""

    def __init__(
        self,
        client: PlatformClient,
        trainer_job_id: str,
        progress: dict[str, Any] | None = None,
        *,
        booting: bool = False,
    ) -> None:
        self.client = client
        self.trainer_job_id = trainer_job_id
        self.booting = booting
        self._boot_began = time.monotonic()
        #: The attempt's heartbeat details: each 404 adds to its ``route_races`` and
        #: heartbeats it whole (other keys, e.g. an opened model, kept).
        self.progress = progress if progress is not None else {}
        self.races = 0
        self._verified_until = 0.0
        budget = policies.BOOT_ATTEMPT_BUDGET if booting else policies.WARMUP_ATTEMPT_BUDGET
        self._end = time.monotonic() + budget.total_seconds()

    async def seen_404(self) -> None:
        """Account for one route 404; returns when it is time to try again."""
        if self.booting:
            await self._boot_404()  # (no race: the route is not there yet by design)
            return
        self.races += 1
        if time.monotonic() >= self._verified_until:
            gone = await _gone_behind_404(
                self.client, self.trainer_job_id, "checking the trainer after a route 404"
            )
            if gone is not None:
                raise gone
            self._verified_until = time.monotonic() + policies.WARMUP_REVERIFY_AFTER.total_seconds()
        if time.monotonic() >= self._end:
            raise not_ready(
                f"route to {self.trainer_job_id} not on every gateway replica yet "
                f"({self.races} route 404s in this attempt)"
            )
        self.progress["route_races"] = int(self.progress.get("route_races", 0)) + 1
        heartbeat(dict(self.progress))
        await asyncio.sleep(policies.WARMUP_PROBE_SPACING.total_seconds())

    async def _boot_404(self) -> None:
        """A 404 while the trainer may still be booting; returns when it is time to try
        again: after the boot's spacing while the control plane says it boots, at once when
        it says RUNNING (that 404 came before it: the route race from here on, this look
        counting as its verification)."""
        try:
            job = snapshot(await self.client.get_job(self.trainer_job_id))
        except PlatformError as exc:
            raise translate(exc, "checking the booting trainer after a 404") from None
        state = JobState(job.state)
        if state is JobState.RUNNING:
            self.booting = False
            now = time.monotonic()
            self._verified_until = now + policies.WARMUP_REVERIFY_AFTER.total_seconds()
            self._end = now + policies.WARMUP_ATTEMPT_BUDGET.total_seconds()
            return
        if state.is_gone() or not state.is_transitional():
            raise lost(job)
        if time.monotonic() >= self._end:
            raise not_ready(f"trainer {self.trainer_job_id} is still {job.state}")
        heartbeat(dict(self.progress))
        await asyncio.sleep(policies.boot_probe_spacing(time.monotonic() - self._boot_began))

    async def call(self, request: Callable[[], Awaitable[T]]) -> T:
        """``request()``, sent again after each verified route 404."""
        while True:
            try:
                return await request()
            except RouteNotFound:
                await self.seen_404()


async def warm_route(trainer: TrainerClient, route: RouteWait, probes: int) -> None:
    """``probes`` consecutive successful ``healthz`` calls over the training route: a route
    404 (verified, the race) starts the count again; anything else surfaces at once."""
    consecutive = 0
    while consecutive < probes:
        try:
            await trainer.healthz()
            consecutive += 1
        except RouteNotFound:
            consecutive = 0
            await route.seen_404()
        except PlatformError as exc:
            raise ApplicationError(
                f"warm-up probe failed: {exc}", type=type(exc).__name__, non_retryable=True
            ) from None


#: A route 404 on a one-shot data-plane call (open the model, save, evaluate) is verified
#: like a training call's, with this default budget (these calls are not tuned per job).
ONE_SHOT_RACES, ONE_SHOT_WINDOW = 4, timedelta(seconds=30)


async def one_shot_404(client: PlatformClient, trainer_job_id: str, races: int) -> ApplicationError:
    """The verified-404 answer for a one-shot call that has now seen ``races`` route 404s
    (recorded in the heartbeat, so the next attempt counts on)."""
    heartbeat({"route_races": races})
    return await verified_404(
        client, trainer_job_id, races=races, retries=ONE_SHOT_RACES, window=ONE_SHOT_WINDOW
    )


def heartbeat(details: dict[str, Any]) -> None:
    """Heartbeat, except in a local activity (which has no heartbeats: the server never sees
    it, and its worker's death is noticed by the workflow task instead)."""
    if not activity.info().is_local:
        activity.heartbeat(details)


def previous_details() -> dict[str, Any]:
    """The last heartbeat details of an earlier attempt of this activity, if any."""
    details = activity.info().heartbeat_details
    if details and isinstance(details[0], dict):
        return dict(details[0])
    return {}


@contextlib.asynccontextmanager
async def keepalive(progress: dict[str, Any], every: timedelta) -> AsyncIterator[None]:
    """Heartbeat ``progress`` (as it is then: the caller updates it in place) every
    ``every`` while a long call is in flight, so a dead worker is noticed within the
    heartbeat timeout however long one step takes. The first heartbeat waits for
    ``policies.heartbeat_quiet_start``: a call that ends sooner costs the server no write."""
    timeout = activity.info().heartbeat_timeout
    quiet = policies.heartbeat_quiet_start(timeout).total_seconds()
    spacing = (every if timeout is None else min(every, timeout / 4)).total_seconds()

    async def beat() -> None:
        await asyncio.sleep(quiet)
        while True:
            heartbeat(dict(progress))
            await asyncio.sleep(spacing)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
