"""Futures and per-model ordering: how a trainer accepts work quickly and applies it exactly
once, strictly in ``seq_id`` order (trainer-api.md §4 "Ordering and exactly-once").

* A submission returns a :class:`Future` at once; ``retrieve_future`` waits on it.
* :class:`Sequencer` holds one model's submissions and hands them out in ``seq_id`` order.
  A repeat of a ``seq_id`` it remembers returns the *same* future and applies nothing — if
  its body is the same: a different body under a taken ``seq_id`` is refused, naming it.
  A later ``seq_id`` waits for the earlier ones; a gap that stays open for ``gap_timeout_s``
  breaks the model (see :meth:`Sequencer.next`).
* Everything here is bounded (:mod:`localplane.limits`): a model remembers its last
  ``SEQUENCE_WINDOW`` operations and keeps their results ``RESULT_TTL_S``; other futures are
  kept up to ``MAX_LOOSE_FUTURES``. A request that dedupes onto a forgotten result is refused
  at submission with a message saying so; it is never handed a ``request_id`` that then
  answers 410.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localplane import limits
from localplane.errors import bounded_message


@dataclass(eq=False)
class Future:
    op: str
    model_id: str | None = None
    #: Canonical digest of the request body (dialects.canonical_digest): what dedupe compares.
    digest: str = ""
    request_id: str = field(default_factory=lambda: f"req-{secrets.token_hex(10)}")
    result: dict[str, Any] | None = None
    error: str | None = None
    category: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.monotonic)
    finished: float | None = None
    #: Set once the result was dropped (too old): retrieval answers 410, dedupe refuses.
    dropped: bool = False
    #: A save that failed on the trainer's side (nothing written), or its repeat done again:
    #: the model's weights version it is for. A repeat of its seq_id does it again (see
    #: ``Sequencer``), refused once the weights changed.
    redo_at: int | None = None
    #: Called when the store forgets this future (dedupe tables drop their entry with it).
    on_forget: list[Callable[[Future], None]] = field(default_factory=list)
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
        self.finished = time.monotonic()
        self._done.set()

    def fail(self, message: str, category: str) -> None:
        self.error, self.category = bounded_message(message), category
        self.finished = time.monotonic()
        self._done.set()

    def drop(self) -> None:
        """Forget the result (memory); the outcome's kind stays for the dedupe record."""
        self.result = None
        self.dropped = True

    async def wait(self, timeout: float) -> bool:
        """Whether it finished within ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._done.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def stale(self, now: float) -> bool:
        return self.finished is not None and now - self.finished > limits.RESULT_TTL_S


class FutureStore:
    """Every retrievable future by request id. Model futures live as long as their model's
    sequencer keeps them; the others ("loose") in a bounded queue, oldest first out, never an
    unfinished one. A forgotten request id answers 410."""

    def __init__(self) -> None:
        self._all: dict[str, Future] = {}
        self._loose: OrderedDict[str, Future] = OrderedDict()

    def __len__(self) -> int:
        return len(self._all)

    def get(self, request_id: str) -> Future | None:
        return self._all.get(request_id)

    def add(self, fut: Future, *, loose: bool = False) -> Future:
        self._all[fut.request_id] = fut
        if loose:
            self._loose[fut.request_id] = fut
            self._trim_loose(time.monotonic())
        return fut

    def forget(self, fut: Future) -> None:
        self._all.pop(fut.request_id, None)
        self._loose.pop(fut.request_id, None)
        callbacks, fut.on_forget = fut.on_forget, []
        for callback in callbacks:
            callback(fut)

    def sweep(self, now: float) -> None:
        """Forget loose futures past their time (the service calls it periodically)."""
        self._trim_loose(now, full=True)

    def _trim_loose(self, now: float, *, full: bool = False) -> None:
        over = len(self._loose) - limits.MAX_LOOSE_FUTURES
        victims: list[Future] = []
        for fut in self._loose.values():  # oldest first
            if len(victims) >= over and not fut.stale(now):
                if fut.done and not full:
                    break  # what follows is younger; the periodic sweep looks at it all
                continue
            if fut.done:  # never forget work not yet done
                victims.append(fut)
        for fut in victims:
            self.forget(fut)


@dataclass
class Submission:
    seq_id: int
    future: Future
    body: dict[str, Any]


class SequenceError(Exception):
    """A submission that cannot take its place in the sequence (answered at once, 400)."""


class Sequencer:
    """One model's ordered stream of operations."""

    def __init__(
        self, store: FutureStore, gap_timeout_s: float, window: int = limits.SEQUENCE_WINDOW
    ) -> None:
        self.store = store
        self.gap_timeout_s = gap_timeout_s
        self.window_size = window
        #: The last seq_id taken off the queue (applied or failed); 0 right after creation.
        self.applied = 0
        #: Accepted submissions by seq_id, pending and recent; the dedupe window.
        self.window: OrderedDict[int, Future] = OrderedDict()
        self.pending: dict[int, Submission] = {}
        #: Failed saves sent again, served before the sequence goes on (they are at their
        #: place already: ``applied`` is past them).
        self.redo: list[Submission] = []
        #: Why the model cannot take more work (a sequence gap that never closed).
        self.broken: str | None = None
        self._wake = asyncio.Event()

    def submit(
        self, op: str, model_id: str, seq_id: int | None, body: dict[str, Any], digest: str
    ) -> Future:
        """The future of ``seq_id``: the one already accepted for it, or a new one."""
        if seq_id is None:
            # A client that does not number its calls gets the next free number.
            seq_id = max([self.applied, *self.window]) + 1
        known = self.window.get(seq_id)
        if known is not None:
            return self._repeat(known, op, model_id, seq_id, digest, body)
        if seq_id <= self.applied:
            raise SequenceError(
                f"seq_id {seq_id} of model {model_id} was applied long ago (beyond the trainer's "
                f"memory of {self.window_size} operations); the model is at seq_id {self.applied}"
            )
        fut = Future(op, model_id, digest)
        if self.broken:
            fut.fail(self.broken, "user")
        else:
            self.pending[seq_id] = Submission(seq_id, fut, body)
        self.window[seq_id] = self.store.add(fut)
        self._trim()
        self._wake.set()
        return fut

    def _repeat(
        self, known: Future, op: str, model_id: str, seq_id: int, digest: str, body: dict[str, Any]
    ) -> Future:
        if known.op != op:
            raise SequenceError(
                f"seq_id {seq_id} of model {model_id} was already used by a {known.op} "
                f"request; this {op} request needs the next seq_id"
            )
        if known.digest != digest:
            # A replay that is not the same request: applying it would train on something
            # else than what the first one did, answering it with the first one's result would
            # hide that. Either way the loop diverged; say so.
            raise SequenceError(
                f"seq_id {seq_id} of model {model_id} was already used by a different "
                f"{op} request (its body differs from this one's); a retry must resend the "
                "same request, and new work needs the next seq_id"
            )
        if known.dropped:
            raise SequenceError(
                f"seq_id {seq_id} of model {model_id} ({op}) was applied and its result is no "
                f"longer kept (results are kept {limits.RESULT_TTL_S}s); the model is at "
                f"seq_id {self.applied}"
            )
        if known.done and known.category == "server" and known.redo_at is not None:
            # A save that failed on our side (a full disk) wrote nothing: answering its retry
            # with the same failure would fail it forever, so it is done again.
            fut = Future(op, model_id, digest, redo_at=known.redo_at)
            self.store.forget(known)
            self.window[seq_id] = self.store.add(fut)
            self.redo.append(Submission(seq_id, fut, body))
            self._wake.set()
            return fut
        return known

    def _trim(self) -> None:
        while len(self.window) > self.window_size:
            seq_id, oldest = next(iter(self.window.items()))
            if not oldest.done:
                break  # never forget work not yet done (waiting, or running right now)
            self.store.forget(self.window.pop(seq_id))

    def sweep(self, now: float) -> None:
        """Drop results past their time; their dedupe records stay in the window."""
        for fut in self.window.values():
            if fut.stale(now) and not fut.dropped:
                self.store.forget(fut)
                fut.drop()

    async def next(self) -> Submission:
        """The next operation in order; waits for it. A gap (a later seq_id is here, the
        next one is not) that stays open ``gap_timeout_s`` fails every waiting operation and
        breaks the model: applying later operations without the missing one would train on
        a different sequence than the client sent."""
        gap_since: float | None = None
        while True:
            self._wake.clear()
            if self.redo:
                return self.redo.pop(0)
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

    def close(self, reason: str) -> None:
        """The model is gone (unloaded, its session expired): fail what waits, forget all."""
        self.broken = reason
        for seq_id in sorted(self.pending):
            self.pending.pop(seq_id).future.fail(reason, "user")
        for fut in self.window.values():
            self.store.forget(fut)
        self.window.clear()
        self._wake.set()
