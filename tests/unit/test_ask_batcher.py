"""A worker's asks to its scheduler (activities/scheduling.py, ``AskBatcher``): one signal in
flight at a time, the asks that came meanwhile together in the next; a failed signal fails
every ask it carried (their activities retry), and none is lost or sent twice."""

from __future__ import annotations

import asyncio

import pytest

from activities.scheduling import MAX_ASKS_PER_SIGNAL, AskBatcher
from shepherd.scheduling import Ask


def ask(i: int) -> Ask:
    return Ask(job=f"job-{i}", seq=1)


class Scheduler:
    """Takes signals one at a time, each after ``rtt`` seconds; fails the ones it is told to."""

    def __init__(self, rtt: float = 0.01, fail: set[int] | None = None) -> None:
        self.rtt = rtt
        self.fail = fail or set()
        self.signals: list[list[str]] = []
        self.in_flight = 0

    async def send(self, asks: list[Ask]) -> None:
        self.in_flight += 1
        try:
            assert self.in_flight == 1, "two signals in flight"
            await asyncio.sleep(self.rtt)
            number = len(self.signals)
            self.signals.append([a.job for a in asks])
            if number in self.fail:
                raise RuntimeError(f"signal {number} failed")
        finally:
            self.in_flight -= 1


async def test_a_lone_ask_is_one_signal_of_its_own() -> None:
    scheduler = Scheduler()
    batcher = AskBatcher(scheduler.send)
    await batcher.ask(ask(1))
    await batcher.ask(ask(2))
    assert scheduler.signals == [["job-1"], ["job-2"]]


@pytest.mark.parametrize("n", [2, 37, MAX_ASKS_PER_SIGNAL + 1, 3 * MAX_ASKS_PER_SIGNAL])
async def test_a_burst_goes_in_a_few_signals_each_ask_once(n: int) -> None:
    scheduler = Scheduler()
    batcher = AskBatcher(scheduler.send)
    await asyncio.gather(*(batcher.ask(ask(i)) for i in range(n)))
    sent = [job for signal in scheduler.signals for job in signal]
    assert sorted(sent) == sorted(f"job-{i}" for i in range(n))  # each once
    assert all(len(signal) <= MAX_ASKS_PER_SIGNAL for signal in scheduler.signals)
    # Asks made together go together, MAX_ASKS_PER_SIGNAL a signal.
    assert len(scheduler.signals) == -(-n // MAX_ASKS_PER_SIGNAL)
    assert batcher.calls == len(scheduler.signals)


async def test_asks_that_come_while_a_signal_is_in_flight_go_in_the_next() -> None:
    scheduler = Scheduler(rtt=0.05)
    batcher = AskBatcher(scheduler.send)
    first = asyncio.create_task(batcher.ask(ask(0)))
    await asyncio.sleep(0.01)  # the first signal is in flight
    later = [asyncio.create_task(batcher.ask(ask(i))) for i in range(1, 6)]
    await asyncio.gather(first, *later)
    assert scheduler.signals == [["job-0"], [f"job-{i}" for i in range(1, 6)]]


async def test_a_failed_signal_fails_the_asks_it_carried_and_only_those() -> None:
    scheduler = Scheduler(rtt=0.05, fail={1})
    batcher = AskBatcher(scheduler.send)
    first = asyncio.create_task(batcher.ask(ask(0)))
    await asyncio.sleep(0.01)
    carried = [asyncio.create_task(batcher.ask(ask(i))) for i in range(1, 4)]
    results = await asyncio.gather(first, *carried, return_exceptions=True)
    assert results[0] is None
    assert all(isinstance(r, RuntimeError) for r in results[1:])
    # The next asks (a retry of the failed ones, say) go on as before.
    await asyncio.gather(*(batcher.ask(ask(i)) for i in range(1, 4)))
    carried_twice = ["job-1", "job-2", "job-3"]
    assert scheduler.signals == [["job-0"], carried_twice, carried_twice]


async def test_a_cancelled_ask_leaves_the_others_alone() -> None:
    scheduler = Scheduler(rtt=0.05)
    batcher = AskBatcher(scheduler.send)
    first = asyncio.create_task(batcher.ask(ask(0)))
    await asyncio.sleep(0.01)
    gone = asyncio.create_task(batcher.ask(ask(1)))
    stays = asyncio.create_task(batcher.ask(ask(2)))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(first, stays)
    with pytest.raises(asyncio.CancelledError):
        await gone
    # (Its ask may still land, as a cancelled activity's may: the job gives its place back.)
    assert scheduler.signals[0] == ["job-0"] and "job-2" in scheduler.signals[1]
