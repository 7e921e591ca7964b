"""Events (watch stream, webhooks) and injected faults of localplane (trainer-api.md §5, §6).

Every test drives a real plane and real trainer processes; waits go through the event stream
or a bounded wait on the event loop, and outcomes are proven by the plane's own counters.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Self

import pytest

from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd.platform import PlatformClient
from shepherd.platform.errors import (
    AlreadyExists,
    FailedPrecondition,
    InternalError,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from shepherd.platform.models import JobEvent
from shepherd.platform.webhooks import (
    EVENT_ID_HEADER,
    SIGNATURE_HEADER,
    InvalidSignature,
    verify,
)
from shepherd.states import JobState
from tests.helpers import Account, gateway_api, job_request, running_trainer, wait_state, warm
from tests.tinker_http import TrainerHTTPError, batch

#: Bound on every wait for the plane: generous, so a slow machine never fails a test.
WAIT_S = 30.0

P, C, R = JobState.PENDING, JobState.CREATING, JobState.RUNNING
F, DG, DD = JobState.FAILED, JobState.DELETING, JobState.DELETED


def job_name(account: Account, job_id: str) -> str:
    return f"accounts/{account.id}/rlorTrainerJobs/{job_id}"


def transitions(
    events: list[JobEvent] | list[dict[str, Any]],
) -> list[tuple[JobState | None, JobState]]:
    pairs = []
    for e in events:
        if isinstance(e, dict):
            prev = e["previousState"]
            pairs.append((JobState(prev) if prev else None, JobState(e["state"])))
        else:
            pairs.append((e.previous_state, e.state))
    return pairs


async def read_events(
    client: PlatformClient,
    stop: Callable[[JobEvent], bool],
    *,
    count: int | None = None,
    **watch: Any,
) -> list[JobEvent]:
    """Read a watch stream until ``stop`` (or ``count`` events), then disconnect.

    Reads from the start of the (fresh) account's history unless told otherwise: a stream
    without a position gets live events only, and a subscription races the actions it
    watches."""
    watch.setdefault("last_event_id", 0)
    events: list[JobEvent] = []
    async with asyncio.timeout(WAIT_S), aclosing(client.watch_jobs(**watch)) as stream:
        async for event in stream:
            events.append(event)
            if stop(event) or len(events) == count:
                return events
    raise AssertionError(f"the watch stream ended after {len(events)} events")


class Watcher:
    """A watch stream read in the background, so a test can act while it listens."""

    def __init__(self, client: PlatformClient, **watch: Any) -> None:
        watch.setdefault("last_event_id", 0)  # see read_events
        self.events: list[JobEvent] = []
        self._queue: asyncio.Queue[JobEvent] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._read(client, watch))

    async def _read(self, client: PlatformClient, watch: dict[str, Any]) -> None:
        async for event in client.watch_jobs(**watch):
            self.events.append(event)
            self._queue.put_nowait(event)

    async def next(self) -> JobEvent:
        getter = asyncio.ensure_future(self._queue.get())
        try:
            async with asyncio.timeout(WAIT_S):
                await asyncio.wait({getter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            return getter.result()
        self._task.result()  # surfaces the stream's error, if it failed
        raise AssertionError("the watch stream ended")

    async def until(self, state: JobState) -> JobEvent:
        while (event := await self.next()).state is not state:
            pass
        return event

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        # Cancelling the reader unwinds the generator, which closes the HTTP stream.
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


@dataclass
class Delivery:
    headers: dict[str, str]
    body: bytes
    answered: int

    @property
    def event(self) -> dict[str, Any]:
        return json.loads(self.body)


@dataclass
class WebhookReceiver:
    """A minimal HTTP/1.1 endpoint on an ephemeral port that records every delivery and
    answers with the scripted status codes first, then 200."""

    answers: list[int] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    url: str = ""

    async def __aenter__(self) -> Self:
        self._changed = asyncio.Condition()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/hook"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for writer in list(self._writers):  # the plane keeps its connection alive
            writer.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                headers = {}
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    if ":" in line:
                        name, value = line.split(":", 1)
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                status = self.answers.pop(0) if self.answers else 200
                async with self._changed:
                    self.deliveries.append(Delivery(headers, body, status))
                    self._changed.notify_all()
                reason = "OK" if status < 300 else "Error"
                writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\n\r\n".encode())
                await writer.drain()
        finally:
            self._writers.discard(writer)
            writer.close()

    def accepted(self) -> list[Delivery]:
        return [d for d in self.deliveries if d.answered < 300]

    async def wait_for_state(self, name: str, state: JobState) -> None:
        """Until a delivery of ``name`` reaching ``state`` was accepted."""

        def arrived() -> bool:
            return any(
                d.event["name"] == name and d.event["state"] == state.value for d in self.accepted()
            )

        async with asyncio.timeout(WAIT_S), self._changed:
            await self._changed.wait_for(arrived)


# ------------------------------------------------------------------------------ events


async def test_watch_sees_every_transition_in_order(account: Account, admin: PlaneAdmin) -> None:
    client, job = account.client, "watched"
    async with Watcher(client, job_id=job) as watcher:  # opened before the job exists
        await client.create_job(job, job_request())
        await watcher.until(R)
        await admin.preempt(job, account=account.id)
        failed = await watcher.until(F)
        resumed = await client.resume_job(job)
        assert resumed.state in (P, C)  # the resume is synchronous
        await watcher.until(R)
        await client.delete_job(job)
        await watcher.until(DD)
        events = list(watcher.events)

    assert transitions(events) == [
        (None, P), (P, C), (C, R),
        (R, F),
        (F, P), (P, C), (C, R),
        (R, DG), (DG, DD),
    ]  # fmt: skip
    ids = [e.id for e in events]
    assert all(a < b for a, b in zip(ids, ids[1:], strict=False)), ids
    assert {e.name for e in events} == {job_name(account, job)}
    assert "preempt" in failed.job.status.message.lower()
    assert failed.job.state is F


async def test_watch_resumes_after_last_event_id(account: Account) -> None:
    client, job = account.client, "reconnect"
    await client.create_job(job, job_request())
    # Read the first two events (PENDING, CREATING), then drop the connection.
    first = await read_events(client, lambda e: False, count=2, job_id=job)
    # The job moves on while nobody listens.
    await wait_state(client, job, R)
    await client.delete_job(job)
    await wait_state(client, job, DD)

    rest = await read_events(
        client, lambda e: e.state is DD, job_id=job, last_event_id=first[-1].id
    )
    everything = await read_events(client, lambda e: e.state is DD, job_id=job)

    assert transitions(first) == [(None, P), (P, C)]
    assert rest[0].id > first[-1].id
    assert [e.id for e in first + rest] == [e.id for e in everything]  # no gap, no repeat
    assert transitions(rest) == [(C, R), (R, DG), (DG, DD)]


async def test_account_stream_shows_only_its_own_jobs(
    plane: PlaneProcess, admin: PlaneAdmin, account: Account
) -> None:
    other_id, other_key = await admin.create_account()
    async with PlatformClient(plane.url, other_key) as other:
        # The other account's events come first, so they sit between this account's ids.
        for client in (other, account.client):
            await client.create_job("neighbour", job_request())
            await client.delete_job("neighbour")
            await wait_state(client, "neighbour", DD)

        mine = await read_events(account.client, lambda e: e.state is DD)
        theirs = await read_events(other, lambda e: e.state is DD)

    assert {e.name for e in mine} == {job_name(account, "neighbour")}
    assert {e.name for e in theirs} == {f"accounts/{other_id}/rlorTrainerJobs/neighbour"}
    assert max(e.id for e in theirs) < min(e.id for e in mine)


async def test_webhook_delivers_signed_events_in_order(account: Account, admin: PlaneAdmin) -> None:
    client, job = account.client, "hooked"
    secret = "whsec-" + secrets.token_hex(16)
    async with WebhookReceiver() as receiver:
        hook = await admin.add_webhook(receiver.url, secret, account_id=account.id)
        try:
            await client.create_job(job, job_request())
            await wait_state(client, job, R)
            await client.delete_job(job)
            await receiver.wait_for_state(job_name(account, job), DD)
        finally:
            await admin.delete_webhook(hook)
    assert hook not in {h["id"] for h in await admin.webhooks()}

    deliveries = receiver.deliveries
    assert all(d.answered == 200 for d in deliveries)
    events = [d.event for d in deliveries]
    assert transitions(events) == [(None, P), (P, C), (C, R), (R, DG), (DG, DD)]
    for d in deliveries:
        verify(secret, d.headers[SIGNATURE_HEADER.lower()], d.body)
        assert d.headers[EVENT_ID_HEADER.lower()] == str(d.event["id"])
    streamed = await read_events(client, lambda e: e.state is DD, job_id=job)
    assert [e["id"] for e in events] == [e.id for e in streamed]

    first = deliveries[0]
    tampered = first.body.replace(b"JOB_STATE_PENDING", b"JOB_STATE_RUNNING", 1)
    assert tampered != first.body
    with pytest.raises(InvalidSignature, match="does not match"):
        verify(secret, first.headers[SIGNATURE_HEADER.lower()], tampered)
    with pytest.raises(InvalidSignature, match="does not match"):
        verify(
            "not-the-secret-" + secrets.token_hex(8),
            first.headers[SIGNATURE_HEADER.lower()],
            first.body,
        )


async def test_webhook_is_retried_until_accepted(account: Account, admin: PlaneAdmin) -> None:
    client, job = account.client, "hook-retried"
    secret = "whsec-" + secrets.token_hex(16)
    before = await admin.stats()
    async with WebhookReceiver(answers=[500, 500]) as receiver:
        hook = await admin.add_webhook(receiver.url, secret, account_id=account.id)
        try:
            await client.create_job(job, job_request())
            await client.delete_job(job)
            await receiver.wait_for_state(job_name(account, job), DD)
        finally:
            await admin.delete_webhook(hook)

    # The first event was refused twice and then accepted: same event, same id, re-signed.
    first_three = receiver.deliveries[:3]
    assert [d.answered for d in first_three] == [500, 500, 200]
    assert len({d.headers[EVENT_ID_HEADER.lower()] for d in first_three}) == 1
    for d in receiver.deliveries:
        verify(secret, d.headers[SIGNATURE_HEADER.lower()], d.body)
    accepted = [d.event["id"] for d in receiver.accepted()]
    streamed = await read_events(client, lambda e: e.state is DD, job_id=job)
    assert accepted == [e.id for e in streamed]  # every event, once, in order
    # The plane counts a delivery once it has read the answer, just after the receiver
    # saw it: wait (bounded) for the count rather than race it.
    async with asyncio.timeout(10):
        while (await admin.stats())["webhookDeliveries"] - before["webhookDeliveries"] < len(
            accepted
        ):
            await asyncio.sleep(0.05)


# ------------------------------------------------------------------------------ faults


async def test_control_plane_5xx_is_retryable_and_counted(
    account: Account, faults: PlaneAdmin
) -> None:
    client = account.client
    await client.account_id()  # resolve the account before every /v1 call starts failing
    await faults.set_faults(controlPlane5xxRate=1.0, controlPlane5xxMode="before")
    before = await faults.stats()

    calls: list[Callable[[], Awaitable[Any]]] = [
        client.list_accounts,
        client.list_jobs,
        lambda: client.get_job("never-created"),
        lambda: client.create_job("lost", job_request()),
        lambda: client.resume_job("never-created"),
        lambda: client.delete_job("never-created"),
        lambda: read_events(client, lambda e: True),
    ]
    for call in calls:
        with pytest.raises((InternalError, Unavailable)) as caught:
            await call()
        assert caught.value.retryable is True
        assert caught.value.status_code in (500, 503)
        assert caught.value.status in ("INTERNAL", "UNAVAILABLE")

    after = await faults.stats()
    assert after["injected5xx"] - before["injected5xx"] == len(calls)
    # "before" mode: the create never reached the plane.
    assert await faults.job_stats(job_name(account, "lost")) == {}

    await faults.set_faults(controlPlane5xxRate=0.0)
    assert (await client.list_jobs()).rlor_trainer_jobs == []
    with pytest.raises(NotFound):
        await client.get_job("lost")


async def test_lost_create_response_then_conflict(account: Account, faults: PlaneAdmin) -> None:
    client, job = account.client, "lost-response"
    await client.account_id()
    await faults.set_faults(controlPlane5xxRate=1.0, controlPlane5xxMode="after")
    with pytest.raises((InternalError, Unavailable)) as caught:
        await client.create_job(job, job_request())
    assert caught.value.retryable is True

    await faults.set_faults(controlPlane5xxRate=0.0)
    with pytest.raises(AlreadyExists) as conflict:
        await client.create_job(job, job_request())
    assert conflict.value.status_code == 409
    assert conflict.value.status == "ALREADY_EXISTS"
    # The create took effect exactly once; the retry only conflicted.
    stats = await faults.job_stats(job_name(account, job))
    assert stats["creates"] == 1
    assert stats["createConflicts"] == 1
    assert (await client.get_job(job)).state in (P, C, R)

    await client.delete_job(job)
    await wait_state(client, job, DD)


async def test_outage_window_answers_503_then_recovers(
    account: Account, faults: PlaneAdmin
) -> None:
    client = account.client
    await client.account_id()
    config = await faults.set_faults(outage={"durationSeconds": 1.5})
    with pytest.raises(Unavailable) as caught:
        await client.list_jobs()
    assert caught.value.status_code == 503
    assert caught.value.status == "UNAVAILABLE"
    assert caught.value.retryable is True

    # Let the window pass on the event loop, bounded.
    end = datetime.fromisoformat(config["outage"]["end"])
    async with asyncio.timeout(5):
        await asyncio.sleep(max(0.0, (end - datetime.now(UTC)).total_seconds()) + 0.05)
    assert (await client.list_jobs()).rlor_trainer_jobs == []


async def test_gateway_404_rate_on_a_warm_route(account: Account, faults: PlaneAdmin) -> None:
    client, job = account.client, "flaky-gateway"
    trainer = await running_trainer(account, job)
    model = trainer.model
    before = await faults.job_stats(job_name(account, job))

    await faults.set_faults(gateway404Rate=1.0)
    calls: list[Callable[[], Awaitable[Any]]] = [
        model.info,
        trainer.api.healthz,
        lambda: model.submit("forward_backward", model.fwdbwd_body(batch(1)), seq_id=1),
    ]
    for call in calls:
        with pytest.raises(TrainerHTTPError) as caught:
            await call()
        assert caught.value.status == 404
    # The control plane still says RUNNING: this 404 is the gateway's, not a gone job.
    assert (await client.get_job(job)).state is R
    after = await faults.job_stats(job_name(account, job))
    assert after.get("route404s", 0) - before.get("route404s", 0) == len(calls)

    await faults.set_faults(gateway404Rate=0.0)
    for _ in range(3):
        assert (await model.info())["optim_steps"] == 0  # nothing reached the trainer
    await trainer.api.aclose()

    await client.delete_job(job)
    await wait_state(client, job, DD)


async def test_route_race_after_running(account: Account, faults: PlaneAdmin) -> None:
    client, job = account.client, "route-race"
    # Set before the job turns RUNNING: the route reaches every replica 1-2 s late.
    await faults.set_faults(routeLagSeconds={"min": 1.0, "max": 2.0})
    await client.create_job(job, job_request())
    await wait_state(client, job, R)
    api = gateway_api(account, job)

    assert (await api.raw("healthz", method="GET")).status_code == 404
    assert (await client.get_job(job)).state is R  # healthy job, unknown route: the race
    seen = 1 + await warm(api, probes=3, timeout=10)  # bounded, not a timing assertion
    for _ in range(5):  # once every replica knows the route, it stays known
        await api.healthz()
    await api.aclose()

    stats = await faults.job_stats(job_name(account, job))
    assert stats["route404s"] == seen > 0

    await client.delete_job(job)
    await wait_state(client, job, DD)


async def test_latency_is_reported_and_calls_succeed(account: Account, faults: PlaneAdmin) -> None:
    client = account.client
    await client.account_id()
    await faults.set_faults(latencyMs={"min": 200, "max": 200})
    assert (await faults.faults())["latencyMs"] == {"min": 200.0, "max": 200.0}
    assert (await client.list_jobs()).rlor_trainer_jobs == []
    assert [a.account_id for a in await client.list_accounts()] == [account.id]
    with pytest.raises(NotFound):  # a real answer, only later
        await client.get_job("nothing-here")


async def test_capacity_is_first_come_first_served(account: Account, faults: PlaneAdmin) -> None:
    client = account.client
    stats = await faults.stats()
    live, pending = stats["liveTrainers"], stats["pendingJobs"]
    await faults.set_faults(capacity=live)  # no free slot

    await client.create_job("first", job_request())
    await client.create_job("second", job_request())
    assert (await client.get_job("first")).state is P
    assert (await client.get_job("second")).state is P
    stats = await faults.stats()
    assert stats["pendingJobs"] == pending + 2
    assert stats["jobs"][job_name(account, "first")].get("trainersStarted", 0) == 0
    assert stats["jobs"][job_name(account, "second")].get("trainersStarted", 0) == 0

    await faults.set_faults(capacity=live + 1)  # scheduling is synchronous with the change
    assert (await client.get_job("first")).state in (C, R)
    await wait_state(client, "first", R)
    assert (await client.get_job("second")).state is P
    assert (await faults.stats())["pendingJobs"] == pending + 1

    await faults.set_faults(capacity=live + 2)
    await wait_state(client, "second", R)
    assert (await faults.stats())["pendingJobs"] == pending

    for job in ("first", "second"):
        await client.delete_job(job)
        await wait_state(client, job, DD)
        assert (await faults.job_stats(job_name(account, job)))["trainersStarted"] == 1


async def test_death_settles_through_creating(account: Account, faults: PlaneAdmin) -> None:
    client, job = account.client, "settling"
    await faults.set_faults(deathSettleSeconds=1.0)
    async with Watcher(client, job_id=job) as watcher:
        await client.create_job(job, job_request())
        await watcher.until(R)
        await faults.preempt(job, account=account.id)
        lost = await watcher.next()
        assert (lost.previous_state, lost.state) == (R, C)
        # The platform is still catching up: not resumable yet.
        with pytest.raises(FailedPrecondition) as caught:
            await client.resume_job(job)
        assert caught.value.status == "FAILED_PRECONDITION"
        assert caught.value.status_code in (400, 409)
        failed = await watcher.next()
        assert (failed.previous_state, failed.state) == (C, F)
        assert "preempt" in failed.job.status.message.lower()

    stats = await faults.job_stats(job_name(account, job))
    assert stats.get("resumes", 0) == 0
    assert stats["liveTrainer"] is False
    await client.delete_job(job)
    await wait_state(client, job, DD)


@pytest.mark.parametrize(
    ("patch", "field_name"),
    [
        ({"capacity": -1}, "capacity"),
        ({"bogus": 1}, "bogus"),
        ({"routeLagSeconds": {"min": 3, "max": 1}}, "routeLagSeconds"),
        ({"gateway404Rate": 1.5}, "gateway404Rate"),
        ({"controlPlane5xxMode": "sometimes"}, "controlPlane5xxMode"),
        ({"outage": {"durationSeconds": 0}}, "outage.durationSeconds"),
        ({"outage": 5}, "outage"),
        ({"outage": {"durationSeconds": 1, "bogus": 2}}, "outage.bogus"),
    ],
)
async def test_invalid_fault_config_is_rejected(
    faults: PlaneAdmin, patch: dict[str, Any], field_name: str
) -> None:
    before = await faults.faults()
    with pytest.raises(InvalidArgument) as caught:
        await faults.set_faults(patch)
    assert caught.value.status_code == 400
    assert caught.value.status == "INVALID_ARGUMENT"
    assert field_name in caught.value.message
    assert await faults.faults() == before  # nothing applied
