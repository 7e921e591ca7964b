"""Readiness: wait for placement, for RUNNING, for a resumable state (polling by retries:
each activity looks once and raises a benign ``NotReady`` while the platform is not there),
and warm the gateway route up with consecutive ``healthz`` probes over the training route."""

from __future__ import annotations

import random
from datetime import timedelta

from temporalio import activity

from activities.base import (
    ClientProvider,
    RouteWait,
    lost,
    not_ready,
    snapshot,
    translate,
    warm_route,
)
from shepherd.models import PlatformJob, TrainerRef, WarmUpInput, WarmUpResult
from shepherd.platform import PlatformError
from shepherd.states import JobState
from workflows import policies

_PLACED = {JobState.CREATING, JobState.RUNNING}


class ReadinessActivities:
    def __init__(self, clients: ClientProvider) -> None:
        self.clients = clients

    async def _look(self, ref: TrainerRef) -> PlatformJob:
        try:
            return snapshot(await self.clients.client(ref.backend).get_job(ref.trainer_job_id))
        except PlatformError as exc:
            raise translate(exc, f"reading trainer {ref.trainer_job_id}") from None

    def _fallback(
        self, ref: TrainerRef, cap: timedelta, first: timedelta = timedelta(0)
    ) -> timedelta | None:
        """With events the poll only covers a lost one: back off from ``first`` (or the
        retry policy's interval, if longer; policies.py, "waiting at scale"). Without,
        ``None`` keeps the retry policy's fixed poll interval."""
        info = activity.info()
        if info.is_local or not self.clients.events(ref.backend) or info.retry_policy is None:
            return None
        first = max(first, info.retry_policy.initial_interval)
        return policies.fallback_poll_delay(info.attempt, first, cap, random.random())

    def _admitted_placement(self, ref: TrainerRef) -> timedelta | None:
        """Without events, an admitted job's trainer is placed as the trainer whose slot it
        took is deleted: look again soon, backing off to the poll interval
        (``policies.ADMITTED_PLACEMENT_FIRST``). ``None``: the retry policy's poll."""
        info = activity.info()
        if info.is_local or info.retry_policy is None or not self.clients.admits(ref.backend):
            return None
        interval = info.retry_policy.initial_interval
        return policies.fallback_poll_delay(
            info.attempt, min(policies.ADMITTED_PLACEMENT_FIRST, interval), interval, 0.5
        )

    @activity.defn(name="wait_for_placement")
    async def wait_for_placement(self, ref: TrainerRef) -> PlatformJob:
        """Returns once the job holds a slot (CREATING or RUNNING)."""
        job = await self._look(ref)
        state = JobState(job.state)
        if state in _PLACED:
            return job
        if state in (JobState.PENDING, JobState.UNSPECIFIED):
            raise not_ready(
                f"trainer {ref.trainer_job_id} waits for capacity ({job.state})",
                next_retry_delay=self._fallback(
                    ref,
                    policies.EVENT_FALLBACK_PLACEMENT_CAP,
                    policies.EVENT_FALLBACK_PLACEMENT_FIRST,
                )
                if self.clients.events(ref.backend)
                else self._admitted_placement(ref),
            )
        raise lost(job)

    @activity.defn(name="wait_for_running")
    async def wait_for_running(self, ref: TrainerRef) -> PlatformJob:
        """Returns once the trainer is RUNNING; fails fast on a terminal state."""
        job = await self._look(ref)
        state = JobState(job.state)
        if state is JobState.RUNNING:
            return job
        if state.is_transitional():
            raise not_ready(
                f"trainer {ref.trainer_job_id} is {job.state}",
                next_retry_delay=self._fallback(ref, policies.EVENT_FALLBACK_RUNNING_CAP),
            )
        raise lost(job)

    @activity.defn(name="wait_for_resumable")
    async def wait_for_resumable(self, ref: TrainerRef) -> PlatformJob:
        """After a death: returns once the job is resumable (or already RUNNING again),
        tolerating the transitional states a platform shows while it catches up."""
        job = await self._look(ref)
        state = JobState(job.state)
        if state.is_resumable() or state is JobState.RUNNING:
            return job
        if state.is_gone():
            raise lost(job)
        raise not_ready(
            f"trainer {ref.trainer_job_id} is {job.state}; waiting for a resumable state"
        )

    @activity.defn(name="warm_up")
    async def warm_up(self, inp: WarmUpInput) -> WarmUpResult:
        """``probes`` consecutive successful ``healthz`` calls through the gateway, on the
        route training calls take (there is no model yet to ask ``get_info``). A 404 is the
        route race while the control plane says RUNNING (retried by the policy with bounded
        backoff); anything else surfaces at once."""
        client = self.clients.client(inp.backend)
        trainer = await client.trainer(inp.trainer_job_id)
        route = RouteWait(client, inp.trainer_job_id, booting=inp.booting)
        await warm_route(trainer, route, inp.probes)
        return WarmUpResult(probes=inp.probes, route_races=route.races)
