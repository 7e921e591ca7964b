"""A trainer's per-model and per-call tables are bounded by count and age (localplane/limits.py),
and eviction never turns a deduped request into a 410: a replay of a forgotten operation is
refused at submission, saying why, instead of being handed a request id nobody remembers."""

from __future__ import annotations

import time

import pytest

from localplane import limits
from localplane.trainer.futures import Future, FutureStore, SequenceError, Sequencer


def _finish(fut: Future) -> None:
    fut.resolve({"ok": True})


async def _apply(seq: Sequencer, count: int) -> None:
    for _ in range(count):
        sub = await seq.next()
        _finish(sub.future)


async def test_the_dedupe_window_is_bounded_and_a_replay_beyond_it_is_refused() -> None:
    store = FutureStore()
    seq = Sequencer(store, gap_timeout_s=5, window=8)
    tickets = [seq.submit("optim_step", "m", i, {"i": i}, f"d{i}") for i in range(1, 20)]
    await _apply(seq, 19)
    tickets.append(seq.submit("optim_step", "m", 20, {"i": 20}, "d20"))
    await _apply(seq, 1)
    assert len(seq.window) == 8 and len(store) == 8  # only the newest 8 are remembered
    # A replay inside the window gets the very same future, result included.
    assert seq.submit("optim_step", "m", 20, {"i": 20}, "d20") is tickets[-1]
    # A replay beyond it is refused: it is never handed a request_id that would answer 410.
    with pytest.raises(SequenceError, match="applied long ago"):
        seq.submit("optim_step", "m", 3, {"i": 3}, "d3")
    assert store.get(tickets[2].request_id) is None


async def test_pending_work_is_never_evicted_from_the_window() -> None:
    store = FutureStore()
    seq = Sequencer(store, gap_timeout_s=5, window=4)
    futures = [seq.submit("forward", "m", i, {}, f"d{i}") for i in range(1, 11)]
    # Nothing applied yet: all ten wait, so none may be forgotten.
    assert len(seq.window) == 10
    # The first one runs (taken off the queue, not finished): still not forgotten.
    running = await seq.next()
    seq.submit("forward", "m", 11, {}, "d11")
    assert store.get(running.future.request_id) is running.future
    _finish(running.future)
    await _apply(seq, 10)
    seq.submit("forward", "m", 12, {}, "d12")
    assert len(seq.window) == 4
    assert all(f.done for f in futures)


async def test_old_results_are_dropped_and_a_replay_of_one_is_refused_not_410(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = FutureStore()
    seq = Sequencer(store, gap_timeout_s=5, window=16)
    first = seq.submit("forward_backward", "m", 1, {}, "d1")
    await _apply(seq, 1)
    monkeypatch.setattr(limits, "RESULT_TTL_S", 0)
    seq.sweep(time.monotonic() + 1.0)
    assert first.dropped and first.result is None and store.get(first.request_id) is None
    # The dedupe record stays: the seq_id is not reusable, and its replay says why.
    with pytest.raises(SequenceError, match="no longer kept"):
        seq.submit("forward_backward", "m", 1, {}, "d1")
    # A replay with another body is refused as a different request, naming the seq_id.
    with pytest.raises(SequenceError, match="seq_id 1 .*different"):
        seq.submit("forward_backward", "m", 1, {"x": 1}, "other")


def test_loose_futures_are_bounded_oldest_finished_first_unfinished_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "MAX_LOOSE_FUTURES", 5)
    store = FutureStore()
    forgotten: list[str] = []
    waiting = store.add(Future("asample"), loose=True)  # never finishes
    done = []
    for _ in range(12):
        fut = Future("asample")
        fut.on_forget.append(lambda f: forgotten.append(f.request_id))
        _finish(fut)
        done.append(store.add(fut, loose=True))
    assert len(store) == 5
    assert store.get(waiting.request_id) is waiting  # unfinished work is never dropped
    assert [f.request_id for f in done[:8]] == forgotten  # the oldest finished went first
    assert all(store.get(f.request_id) is f for f in done[8:])
