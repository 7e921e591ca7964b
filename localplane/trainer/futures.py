"""Futures and per-model ordering: how a trainer accepts work quickly and applies it exactly
once, strictly in ``seq_id`` order (trainer-api.md §4 "Ordering and exactly-once").

* A submission returns a :class:`Future` at once; ``retrieve_future`` waits on it.
* :class:`Sequencer` holds one model's submissions and hands them out in ``seq_id`` order.
  A repeat of a ``seq_id`` it still remembers returns the *same* future and applies nothing.
  A later ``seq_id`` waits for the earlier ones; a gap that stays open for
  ``gap_timeout_s`` breaks the model (see :meth:`Sequencer.next`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

#: Operations a model remembers (with their results) for dedupe and retrieval.
WINDOW = 4096
#: Futures not tied to a model's window (create_model, sampling) kept for retrieval.
LOOSE_FUTURES = 4096


@dataclass(eq=False)
class Future:
    op: str
    model_id: str | None = None
    request_id: str = field(default_factory=lambda: f"req-{secrets.token_hex(10)}")
    result: dict[str, Any] | None = None
    error: str | None = None
    category: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.monotonic)
    _done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def ticket(self) -> dict[str, Any]:
        """The submission's answer: what a client later passes to ``retrieve_future``."""
        out: dict[str, Any] = {"request_id": self.request_id}
        if self.model_id is not None:
            out["model_id"] = self.model_id
        out.update(self.extra)
        return out

    def resolve(self, result: dict[str, Any]) -> None:
        self.result = result
        self._done.set()

    def fail(self, message: str, category: str) -> None:
        self.error, self.category = message, category
        self._done.set()

    async def wait(self, timeout: float) -> bool:
        """Whether it finished within ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._done.wait(), timeout)
        except TimeoutError:
            return False
        return True


class FutureStore:
    """Every retrievable future by request id. Model futures live as long as their model's
    window remembers them; the others in a bounded LRU. Forgotten ids answer 410."""

    def __init__(self) -> None:
        self._all: dict[str, Future] = {}
        self._loose: OrderedDict[str, None] = OrderedDict()

    def get(self, request_id: str) -> Future | None:
        return self._all.get(request_id)

    def add(self, fut: Future, *, loose: bool = False) -> Future:
        self._all[fut.request_id] = fut
        if loose:
            self._loose[fut.request_id] = None
            while len(self._loose) > LOOSE_FUTURES:
                old, _ = self._loose.popitem(last=False)
                self._all.pop(old, None)
        return fut

    def forget(self, fut: Future) -> None:
        self._all.pop(fut.request_id, None)


@dataclass
class Submission:
    seq_id: int
    future: Future
    body: dict[str, Any]


class SequenceError(Exception):
    """A submission that cannot take its place in the sequence (answered at once)."""


class Sequencer:
    """One model's ordered stream of operations."""

    def __init__(self, store: FutureStore, gap_timeout_s: float, window: int = WINDOW) -> None:
        self.store = store
        self.gap_timeout_s = gap_timeout_s
        self.window_size = window
        #: The last seq_id taken off the queue (applied or failed); 0 right after creation.
        self.applied = 0
        #: Accepted submissions by seq_id, pending and recent; the dedupe window.
        self.window: OrderedDict[int, Future] = OrderedDict()
        self.pending: dict[int, Submission] = {}
        #: Why the model cannot take more work (a sequence gap that never closed).
        self.broken: str | None = None
        self._wake = asyncio.Event()

    def submit(self, op: str, model_id: str, seq_id: int | None, body: dict[str, Any]) -> Future:
        """The future of ``seq_id``: the one already accepted for it, or a new one."""
        if seq_id is None:
            # A client that does not number its calls gets the next free number.
            seq_id = max([self.applied, *self.window]) + 1
        known = self.window.get(seq_id)
        if known is not None:
            if known.op != op:
                raise SequenceError(
                    f"seq_id {seq_id} of model {model_id} was already used by a {known.op} "
                    f"request; this {op} request needs the next seq_id"
                )
            return known
        if seq_id <= self.applied:
            raise SequenceError(
                f"seq_id {seq_id} of model {model_id} was applied long ago (beyond the trainer's "
                f"memory of {self.window_size} operations); the model is at seq_id {self.applied}"
            )
        fut = Future(op, model_id)
        if self.broken:
            fut.fail(self.broken, "user")
        else:
            self.pending[seq_id] = Submission(seq_id, fut, body)
        self.window[seq_id] = self.store.add(fut)
        self._trim()
        self._wake.set()
        return fut

    def _trim(self) -> None:
        while len(self.window) > self.window_size:
            seq_id = next(iter(self.window))
            if seq_id in self.pending:
                break  # never forget work not yet done
            self.store.forget(self.window.pop(seq_id))

    async def next(self) -> Submission:
        """The next operation in order; waits for it. A gap (a later seq_id is here, the
        next one is not) that stays open ``gap_timeout_s`` fails every waiting operation and
        breaks the model: applying later operations without the missing one would train on
        a different sequence than the client sent."""
        gap_since: float | None = None
        while True:
            self._wake.clear()
            sub = self.pending.pop(self.applied + 1, None)
            if sub is not None:
                self.applied += 1
                return sub
            if not self.pending:
                gap_since = None
                await self._wake.wait()
                continue
            now = time.monotonic()
            gap_since = gap_since or now
            left = self.gap_timeout_s - (now - gap_since)
            if left <= 0:
                self._break()
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), left)

    def _break(self) -> None:
        missing = self.applied + 1
        waiting = sorted(self.pending)
        self.broken = (
            f"seq_id {missing} never arrived within {self.gap_timeout_s:g} s while seq_ids "
            f"{waiting[0]}..{waiting[-1]} waited for it; nothing after seq_id {self.applied} was "
            "applied and this model takes no more work — load a checkpoint into a new model"
        )
        for seq_id in waiting:
            self.pending.pop(seq_id).future.fail(self.broken, "user")
