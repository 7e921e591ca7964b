"""Shepherd's admission decision (shepherd/scheduling.py), on its own: who gets a free slot,
who makes way for whom, and what a waiting job is told."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from shepherd.scheduling import (
    PREEMPT_MIN_INTERVAL,
    Ask,
    Capacity,
    Holder,
    QueueConfig,
    SchedulerState,
    Yielding,
    plan,
    position,
    waits_for,
)

NOW = datetime(2026, 11, 28, tzinfo=UTC)


def state(slots: int, *queues: QueueConfig, caps: list[str] | None = None) -> SchedulerState:
    return SchedulerState(
        backend="local",
        capacity=Capacity(slots=slots, capabilities=caps or []),
        queues={q.name: q for q in queues},
    )


def ask(job: str, arrival: int, priority: int = 0, queue: str = "default", **kw: object) -> Ask:
    return Ask(job=job, seq=1, queue=queue, priority=priority, arrival=arrival, **kw)  # type: ignore[arg-type]


def hold(
    s: SchedulerState, job: str, queue: str = "default", priority: int = 0, **kw: object
) -> None:
    defaults: dict[str, object] = {"preemptible": True, "checkpointed": True}
    defaults.update(kw)
    s.holders[job] = Holder(
        job=job,
        seq=1,
        queue=queue,
        priority=priority,
        arrival=0,
        granted_at=NOW - timedelta(minutes=100 - len(s.holders)),  # later ones later
        **defaults,  # type: ignore[arg-type]
    )


def granted(s: SchedulerState) -> list[str]:
    return [a.job for a in plan(s, NOW).grants]


def test_the_most_urgent_job_gets_the_next_slot_whatever_its_arrival() -> None:
    s = state(2, QueueConfig(name="default", quota=2))
    hold(s, "a", preemptible=False)
    hold(s, "b", preemptible=False)
    s.waiting = [ask(f"low{i}", i) for i in range(50)] + [ask("urgent", 99, priority=10)]
    assert granted(s) == []  # no slot, and nothing may be preempted
    del s.holders["a"]
    assert granted(s) == ["urgent"]
    del s.holders["b"]
    assert granted(s) == ["urgent", "low0"]  # then arrival order among equals


def test_a_queue_is_served_its_quota_before_another_borrows() -> None:
    a = QueueConfig(name="a", quota=1, borrow_limit=2)
    b = QueueConfig(name="b", quota=2)
    s = state(3, a, b)
    s.waiting = [ask("a1", 1, queue="a"), ask("a2", 2, queue="a"), ask("a3", 3, queue="a")]
    s.waiting += [ask("b1", 4, queue="b")]
    # a's first is within its quota, as is b's; a's next two would borrow: b's comes first.
    assert granted(s) == ["a1", "b1", "a2"]
    s.waiting = [ask("a1", 1, queue="a"), ask("a2", 2, queue="a"), ask("a3", 3, queue="a")]
    assert granted(s) == ["a1", "a2", "a3"]  # b idle: a borrows its whole limit


def test_borrowed_capacity_is_reclaimed_when_its_owner_needs_it() -> None:
    s = state(3, QueueConfig(name="a", quota=1, borrow_limit=2), QueueConfig(name="b", quota=2))
    hold(s, "a1", "a")
    hold(s, "a2", "a")  # borrowed
    hold(s, "a3", "a")  # borrowed
    s.waiting = [ask("b1", 1, queue="b")]
    result = plan(s, NOW)
    assert result.grants == [] and [(y.victim, y.for_job) for y in result.yields] == [("a3", "b1")]
    assert "reclaim" in result.yields[0].reason
    # Its owner's holder is never taken for that (a is within its quota with one).
    s.holders = {}
    hold(s, "a1", "a")
    hold(s, "x", "b", preemptible=False)
    hold(s, "y", "b", preemptible=False)
    assert plan(s, NOW).yields == []


def test_only_a_preemptible_job_that_checkpointed_not_lately_preempted_makes_way() -> None:
    s = state(1, QueueConfig(name="default", quota=1))
    s.waiting = [ask("urgent", 1, priority=9)]
    for held in (
        {"preemptible": False},
        {"checkpointed": False},
        {"priority": 9},  # not lower
    ):
        s.holders = {}
        hold(s, "old", **held)  # type: ignore[arg-type]
        assert plan(s, NOW).yields == [], held
    s.holders = {}
    hold(s, "old")
    s.preempted_at["old"] = NOW - PREEMPT_MIN_INTERVAL / 2
    assert plan(s, NOW).yields == []  # taken from too lately
    s.preempted_at["old"] = NOW - PREEMPT_MIN_INTERVAL
    assert [y.victim for y in plan(s, NOW).yields] == ["old"]


def test_the_lowest_priority_latest_admitted_makes_way_once_per_waiting_job() -> None:
    s = state(3, QueueConfig(name="default", quota=3))
    hold(s, "p3", priority=3)
    hold(s, "p1-old", priority=1)
    hold(s, "p1-new", priority=1)
    s.holders["p1-new"].granted_at = NOW
    s.waiting = [ask("urgent", 1, priority=8), ask("next", 2, priority=8)]
    yields = plan(s, NOW).yields
    # One preemption for the first; the next waits its turn (no head of its own queue).
    assert [(y.victim, y.for_job) for y in yields] == [("p1-new", "urgent")]
    s.yielding["p1-new"] = yields[0]
    assert plan(s, NOW).yields == []  # already under way: nothing more for "urgent"


def test_a_freed_slot_goes_to_the_job_it_was_freed_for() -> None:
    s = state(2, QueueConfig(name="a", quota=1), QueueConfig(name="b", quota=1, borrow_limit=1))
    hold(s, "b1", "b", preemptible=False)
    s.waiting = [ask("b2", 1, queue="b"), ask("a1", 2, queue="a", priority=0)]
    s.reserved["a1"] = "gone"  # the slot "gone" left was freed for a1
    assert granted(s) == ["a1"]  # b2 came first, but the slot is a1's


def test_a_job_needing_what_the_backend_lacks_is_never_admitted_and_says_so() -> None:
    s = state(2, QueueConfig(name="default", quota=2), caps=["a100"])
    s.waiting = [ask("big", 1, capabilities=["h100"]), ask("fits", 2, capabilities=["a100"])]
    assert granted(s) == ["fits"]
    assert "h100" in (waits_for(s, "big") or "")


def test_a_waiting_job_knows_its_place_and_what_it_waits_for() -> None:
    s = state(1, QueueConfig(name="default", quota=2), QueueConfig(name="team", quota=0))
    hold(s, "running", preemptible=False)
    s.waiting = [ask("w1", 1), ask("w2", 2), ask("w0", 3, priority=5), ask("t", 4, queue="team")]
    assert position(s, "w0") == (1, 3) and position(s, "w2") == (3, 3)
    assert position(s, "running") is None
    assert "capacity" in (waits_for(s, "w0") or "")
    assert "2 job(s) ahead" in (waits_for(s, "w2") or "")
    assert "quota" in (waits_for(s, "t") or "")
    s.yielding["running"] = Yielding(victim="running", for_job="w0", reason="x", asked_at=NOW)
    assert "being freed for it" in (waits_for(s, "w0") or "")
