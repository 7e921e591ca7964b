"""Every job state change, pushed (trainer-api.md §6): persisted with a sequence number,
fanned out to Server-Sent-Events subscribers and delivered to HMAC-signed webhooks.

Persisting first means a watcher that reconnects with ``Last-Event-ID`` misses nothing,
also across a plane restart. Webhooks are delivered in order per endpoint, retried with
backoff a bounded number of times while the plane runs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import structlog

from localplane.storage import Storage
from shepherd.platform import webhooks

log = structlog.stdlib.get_logger("localplane.events")

EVENT_TYPE = "rlorTrainerJob.stateChanged"
WEBHOOK_ATTEMPTS = 6
WEBHOOK_TIMEOUT_S = 5.0


@dataclass(eq=False)
class Subscriber:
    account_id: str
    job_id: str | None
    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)

    def wants(self, event: dict[str, Any]) -> bool:
        if event["_account"] != self.account_id:
            return False
        return self.job_id is None or event["_job"] == self.job_id


@dataclass(eq=False)
class _Hook:
    id: str
    account_id: str | None
    url: str
    secret: str
    queue: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    removed: bool = False


class EventBus:
    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._subscribers: set[Subscriber] = set()
        self._hooks: dict[str, _Hook] = {}
        #: Every delivery task, also of a removed hook finishing its attempt in flight.
        self._tasks: set[asyncio.Task[None]] = set()
        self._http: httpx.AsyncClient | None = None

    async def start(self) -> None:
        self._http = httpx.AsyncClient(timeout=WEBHOOK_TIMEOUT_S)
        for row in self.storage.webhooks():
            self._start_hook(row["id"], row["account_id"], row["url"], row["secret"])

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._http:
            await self._http.aclose()

    # -------------------------------------------------------------- publish

    def publish(self, account_id: str, job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Persist one event, then push it to every interested subscriber and webhook."""
        payload = {"type": EVENT_TYPE, **payload}
        payload["id"] = self.storage.append_event(account_id, job_id, payload)
        routed = {**payload, "_account": account_id, "_job": job_id}
        for sub in self._subscribers:
            if sub.wants(routed):
                sub.queue.put_nowait(payload)
        for hook in self._hooks.values():
            if hook.account_id in (None, account_id):
                hook.queue.put_nowait(payload)
        return payload

    # ------------------------------------------------------------ subscribe

    async def stream(
        self, account_id: str, job_id: str | None, after: int
    ) -> AsyncIterator[dict[str, Any]]:
        """Events after ``after`` from storage, then live ones, without gaps or repeats."""
        sub = Subscriber(account_id, job_id)
        self._subscribers.add(sub)  # subscribe before replaying: nothing falls in between
        try:
            last = after
            for event in self.storage.events_after(account_id, after, job_id):
                last = event["id"]
                yield event
            while True:
                event = await sub.queue.get()
                if event["id"] > last:
                    last = event["id"]
                    yield event
        finally:
            self._subscribers.discard(sub)

    # ------------------------------------------------------------- webhooks

    def add_webhook(
        self, hook_id: str, account_id: str | None, url: str, secret: str, now: str
    ) -> None:
        self.storage.add_webhook(hook_id, account_id, url, secret, now)
        self._start_hook(hook_id, account_id, url, secret)

    def remove_webhook(self, hook_id: str) -> bool:
        hook = self._hooks.pop(hook_id, None)
        if hook is not None:
            # No new events and no more retries, but an attempt in flight finishes (and is
            # counted): cancelling it could drop the answer of a delivery that arrived.
            hook.removed = True
            hook.queue.put_nowait(None)
        return self.storage.delete_webhook(hook_id)

    def _start_hook(self, hook_id: str, account_id: str | None, url: str, secret: str) -> None:
        hook = _Hook(hook_id, account_id, url, secret)
        task = asyncio.get_running_loop().create_task(self._deliver_loop(hook))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._hooks[hook_id] = hook

    async def _deliver_loop(self, hook: _Hook) -> None:
        while True:
            event = await hook.queue.get()
            if event is None or hook.removed:
                return
            await self._deliver(hook, event)

    async def _deliver(self, hook: _Hook, event: dict[str, Any]) -> None:
        assert self._http is not None
        body = json.dumps(event).encode()
        for attempt in range(1, WEBHOOK_ATTEMPTS + 1):
            if hook.removed and attempt > 1:
                return
            headers = {
                "Content-Type": "application/json",
                webhooks.EVENT_ID_HEADER: str(event["id"]),
                webhooks.SIGNATURE_HEADER: webhooks.sign(hook.secret, body),
            }
            try:
                response = await self._http.post(hook.url, content=body, headers=headers)
                if response.status_code < 300:
                    self.storage.incr("webhookDeliveries")
                    return
                reason = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                reason = type(exc).__name__
            log.warning(
                "webhook.retry", hook=hook.id, event_id=event["id"], attempt=attempt, reason=reason
            )
            await asyncio.sleep(min(5.0, 0.2 * 2 ** (attempt - 1)))
        self.storage.incr("webhookFailures")
        log.error("webhook.gave_up", hook=hook.id, event_id=event["id"])
