"""Shepherd's admission decision (shepherd/scheduling.py), on its own: who gets a free slot,
who makes way for whom, and what a waiting job is told."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

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


H100, A100 = "NVIDIA_H100_80GB", "NVIDIA_A100_80GB"


def pooled(slots: int, pools: dict[str, int], *queues: QueueConfig) -> SchedulerState:
    s = state(slots, *queues)
    s.capacity.pools = pools
    return s


def test_a_job_takes_a_slot_of_its_own_pool_and_waits_for_one_without_holding_up_others() -> None:
    s = pooled(3, {H100: 1, A100: 2}, QueueConfig(name="default", quota=3))
    hold(s, "h-running", pool=H100, preemptible=False)
    # The first in line waits for an H100; the A100 jobs behind it in its queue go first.
    s.waiting = [ask("h", 1, pool=H100), ask("a1", 2, pool=A100), ask("a2", 3, pool=A100)]
    assert granted(s) == ["a1", "a2"]
    assert position(s, "h") == (1, 3)
    assert f"capacity for {H100}: all 1 of its slots" in (waits_for(s, "h") or "")
    # Behind it for an A100 (pool full): one ahead of it there, not the H100 job.
    hold(s, "a-running", pool=A100, preemptible=False)
    hold(s, "a-running-2", pool=A100, preemptible=False)
    s.capacity.slots = 4
    s.waiting = [ask("h", 1, pool=H100), ask("a2", 3, pool=A100), ask("a3", 4, pool=A100)]
    assert granted(s) == []
    assert position(s, "a3") == (3, 3)
    assert "1 job(s) ahead" in (waits_for(s, "a3") or "")


def test_the_backends_slots_cap_its_pools_together() -> None:
    s = pooled(2, {H100: 2, A100: 2}, QueueConfig(name="default", quota=2))
    hold(s, "h", pool=H100, preemptible=False)
    hold(s, "a", pool=A100, preemptible=False)
    s.waiting = [ask("h2", 1, pool=H100)]
    assert granted(s) == []
    assert "all 2 slots" in (waits_for(s, "h2") or "")


def test_a_job_of_no_declared_pool_is_never_admitted_and_says_so() -> None:
    s = pooled(2, {H100: 2}, QueueConfig(name="default", quota=2))
    s.waiting = [ask("a", 1, pool=A100), ask("none", 2), ask("h", 3, pool=H100)]
    assert granted(s) == ["h"]
    assert f"slots for {H100} only, the job names pool '{A100}'" in (waits_for(s, "a") or "")
    assert "names no accelerator type or training shape" in (waits_for(s, "none") or "")
    # Without pools, a job's pool does not matter.
    s.capacity.pools = {}
    assert granted(s) == ["a", "none"]


def test_a_preemption_takes_from_the_urgent_jobs_own_pool() -> None:
    s = pooled(2, {H100: 1, A100: 1}, QueueConfig(name="default", quota=2))
    hold(s, "h-low", priority=2, pool=H100)
    hold(s, "a-lowest", priority=0, pool=A100)  # lower, but freeing an A100 helps nobody
    s.waiting = [ask("urgent", 1, priority=9, pool=H100)]
    yields = plan(s, NOW).yields
    assert [(y.victim, y.for_job) for y in yields] == [("h-low", "urgent")]
    # Once it made way, its slot is the urgent job's: counted in its pool, granted to it.
    del s.holders["h-low"]
    s.reserved["urgent"] = "h-low"
    s.waiting.append(ask("other-h", 2, priority=9, pool=H100))
    assert granted(s) == ["urgent"]
    # Where the pool has room and the backend's slots are what it lacks, any pool's helps.
    s = pooled(2, {H100: 2, A100: 2}, QueueConfig(name="default", quota=2))
    hold(s, "h-low", priority=2, pool=H100)
    hold(s, "a-lowest", priority=0, pool=A100)
    s.waiting = [ask("urgent", 1, priority=9, pool=H100)]
    assert [y.victim for y in plan(s, NOW).yields] == ["a-lowest"]


def test_a_jobs_pool_is_its_shape_without_version_else_its_accelerator() -> None:
    from shepherd.scheduling import Capacity, pool_of

    shape = "accounts/acme/trainingShapes/qwen-8b"
    assert pool_of(f"{shape}/versions/3", None) == shape
    assert pool_of(shape, None) == shape
    assert pool_of(None, H100) == H100
    assert pool_of(None, None) is None
    with pytest.raises(ValueError, match="pools: 'two words' is not an accelerator type"):
        Capacity(slots=1, pools={"two words": 1})
    with pytest.raises(ValueError, match="has -1 slots"):
        Capacity(slots=1, pools={H100: -1})


def test_a_profile_declares_pools_and_its_slots_default_to_their_sum() -> None:
    from workers.config import BackendConfigError, profiles_from_env

    env = {
        "SHEPHERD_BACKENDS": "local",
        "SHEPHERD_BACKEND_LOCAL_POOLS": f'{{"{H100}": 2, "{A100}": 6}}',
    }
    local = profiles_from_env(env)["local"]
    assert local.pools == {H100: 2, A100: 6} and local.slots == 8
    capped = profiles_from_env({**env, "SHEPHERD_BACKEND_LOCAL_SLOTS": "4"})["local"]
    assert capped.slots == 4 and capped.pools == local.pools
    for raw, said in (
        ("[1, 2]", "an object of accelerator type or training shape -> slots"),
        ('{"H100": "two"}', "'H100' has 'two' slots"),
        ('{"a b": 1}', "'a b' is not an accelerator type"),
        ("{", "Expecting"),
    ):
        with pytest.raises(BackendConfigError, match=said) as err:
            profiles_from_env({**env, "SHEPHERD_BACKEND_LOCAL_POOLS": raw})
        assert "SHEPHERD_BACKEND_LOCAL_POOLS" in str(err.value)


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


def test_a_waiting_jobs_start_is_the_slot_that_frees_for_it() -> None:
    from shepherd.client import starts_in

    # Each slot freed goes to the next in line: the (ahead+1)-th soonest end.
    assert starts_in([30.0, 10.0, 20.0], ahead=0) == 10.0
    assert starts_in([30.0, 10.0, 20.0], ahead=2) == 30.0
    # More ahead than run now, or a running job that cannot tell: no guess.
    assert starts_in([30.0, 10.0], ahead=2) is None
    assert starts_in([30.0, None], ahead=0) is None
    assert starts_in([], ahead=0) is None


def test_a_running_jobs_remaining_time_is_at_its_own_pace() -> None:
    from shepherd.models import JobStatus

    running = JobStatus(step=10, total_steps=40, timings={"TRAINING": 20.0, "QUEUED": 99.0})
    assert running.remaining_s() == 60.0  # 30 steps at 2 s each (waiting does not count)
    assert JobStatus(step=0, total_steps=40).remaining_s() is None
    assert JobStatus(step=5, total_steps=0, timings={"TRAINING": 5.0}).remaining_s() is None
    assert JobStatus(step=40, total_steps=40, timings={"TRAINING": 5.0}).remaining_s() == 0.0


def test_ten_thousand_waiting_jobs_carry_across_continue_as_new_well_under_the_payload_limit() -> (
    None
):
    from datetime import UTC, datetime

    from shepherd.scheduling import Ask, Capacity, SchedulerInput, SchedulerState

    at = datetime(2026, 11, 28, tzinfo=UTC)
    state = SchedulerState(backend="b", capacity=Capacity(slots=4))
    state.waiting = [
        Ask(
            job=f"job-sweep-team-{i % 7}-{i:05d}-3f2a9c",
            seq=1,
            queue=f"team-{i % 7}",
            priority=i % 11,
            preemptible=bool(i % 2),
            arrival=i,
            asked_at=at,
        )
        for i in range(10_000)
    ]
    carried = SchedulerInput.carry(state)
    size = len(carried.model_dump_json())
    assert size < 512 * 1024, size  # under the server's warning (512 KB), let alone 2 MB
    assert carried.unpacked() == state
    assert SchedulerInput(state=state).unpacked() == state  # an input from before packing


def test_a_profile_declares_capacity_and_queues_and_is_refused_naming_the_variable() -> None:
    from workers.config import BackendConfigError, profiles_from_env

    env = {
        "SHEPHERD_BACKENDS": "local",
        "SHEPHERD_BACKEND_LOCAL_SLOTS": "4",
        "SHEPHERD_BACKEND_LOCAL_CAPABILITIES": "h100, eu",
        "SHEPHERD_BACKEND_LOCAL_QUEUES": '{"a": {"quota": 3, "borrow_limit": 1}, "b": {"quota": 1}}',
    }
    local = profiles_from_env(env)["local"]
    assert local.slots == 4 and local.capabilities == ["h100", "eu"]
    assert (local.holder_check_s, local.places_every_s, local.places_first) == (30.0, 30.0, 10)
    tuned = {
        **env,
        "SHEPHERD_BACKEND_LOCAL_PLACES_FIRST": "0",
        "SHEPHERD_BACKEND_LOCAL_PLACES_EVERY": "5",
    }
    assert profiles_from_env(tuned)["local"].places_first == 0
    assert profiles_from_env(tuned)["local"].places_every_s == 5.0
    assert local.queues["a"].quota == 3 and local.queues["a"].borrow_limit == 1
    assert profiles_from_env({"SHEPHERD_BACKENDS": "local"})["local"].slots is None
    refused = {
        "SHEPHERD_BACKEND_LOCAL_SLOTS": ("many", "SLOTS: 'many' is not a whole number"),
        "SHEPHERD_BACKEND_LOCAL_QUEUES": ('{"a": {"quota": 5}}', "add up to 5, more than"),
        "SHEPHERD_BACKEND_LOCAL_HOLDER_CHECK": ("soon", "HOLDER_CHECK: 'soon' is not a number"),
        "SHEPHERD_BACKEND_LOCAL_PLACES_EVERY": ("0", "PLACES_EVERY: must be > 0"),
        "SHEPHERD_BACKEND_LOCAL_PLACES_FIRST": ("2.5", "PLACES_FIRST: '2.5' is not a whole"),
        "SHEPHERD_BACKEND_LOCAL_TIMEOUT": ("-1", "TIMEOUT: must be > 0"),
    }
    for key, (value, said) in refused.items():
        with pytest.raises(BackendConfigError, match=said) as err:
            profiles_from_env({**env, key: value})
        assert key in str(err.value)
    with pytest.raises(BackendConfigError, match="declare SHEPHERD_BACKEND_LOCAL_SLOTS"):
        profiles_from_env({"SHEPHERD_BACKEND_LOCAL_QUEUES": '{"a": {"quota": 1}}'})


def test_a_summary_lists_the_head_of_each_line_and_counts_the_rest() -> None:
    from shepherd.scheduling import Ask, Capacity, SchedulerState, lines, summarised

    state = SchedulerState(backend="b", capacity=Capacity(slots=2))
    state.waiting = [
        Ask(job=f"j{i}", seq=1, queue="ab"[i % 2], priority=i % 3, preemptible=False, arrival=i)
        for i in range(1, 31)
    ]
    short = summarised(state, 5)
    assert short.waiting_in() == state.waiting_in() == {"a": 15, "b": 15}
    for queue, line in lines(state).items():
        assert [a.job for a in short.waiting if a.queue == queue] == [a.job for a in line[:5]]
    assert summarised(state, 0).waiting == [] and summarised(state, 0).waiting_count["a"] == 15


def test_the_most_urgent_jobs_tasks_run_first_on_a_busy_worker_pool() -> None:
    from shepherd.scheduling import task_priority

    keys = [task_priority(p).priority_key for p in range(11)]
    assert keys[10] == 1 and keys[0] == 5 and keys[5] == 3  # 3: Temporal's default
    assert keys == sorted(keys, reverse=True)


def test_the_metrics_give_each_pools_slots_and_use() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from workers.metrics import AdmissionCollector

    s = pooled(3, {H100: 1, A100: 2})
    hold(s, "h", pool=H100)
    collector = AdmissionCollector()
    collector.states = [s]
    registry = CollectorRegistry()
    registry.register(collector)
    page = generate_latest(registry).decode()
    assert f'shepherd_pool_slots{{backend="local",pool="{A100}"}} 2.0' in page
    assert f'shepherd_pool_slots_held{{backend="local",pool="{H100}"}} 1.0' in page
    assert f'shepherd_pool_slots_held{{backend="local",pool="{A100}"}} 0.0' in page


def test_the_first_of_each_line_are_told_their_place_as_it_changes_the_rest_their_range() -> None:
    from shepherd.scheduling import FINE_PLACE_RANGES, place_range, places_to_tell

    def told(s: SchedulerState, further: int = 100) -> dict[str, tuple[int, int | None]]:
        return {
            n.job: (n.place.placement.position, n.place.within)
            for n in places_to_tell(s, 2, NOW, further=further)
            if n.place
        }

    s = state(1, QueueConfig(name="a", quota=1), QueueConfig(name="b", quota=0, borrow_limit=1))
    hold(s, "running", "a", preemptible=False)
    s.waiting = [ask(f"a{i}", i, queue="a") for i in range(1, 6)] + [ask("b1", 9, queue="b")]
    # The first two of each line their place; the rest the range they stand in.
    assert told(s) == {
        "a1": (1, None),
        "a2": (2, None),
        "b1": (1, None),
        **{f"a{i}": (3, 100) for i in (3, 4, 5)},
    }
    # Nothing changed: nothing to say. A longer line alone is not news.
    s.waiting.append(ask("a6", 6, queue="a"))
    assert told(s) == {"a6": (3, 100)}
    assert told(s) == {}
    # An urgent job goes first: the two behind it hear their new place, and a2, now third,
    # its range once.
    s.waiting.append(ask("urgent", 7, priority=9, queue="a"))
    assert told(s) == {"urgent": (1, None), "a1": (2, None), "a2": (3, 100)}
    assert told(s) == {}
    # Far back, a job hears of its range as it moves into another: a few notices for the
    # line's movement, and at most ``further`` a round (the nearest first).
    s.waiting = [ask(f"f{i}", i, queue="a") for i in range(1, 251)]
    assert len(told(s, further=1000)) == 250
    del s.waiting[0]  # one admitted: three notices for the 249 that moved up
    assert told(s) == {"f2": (1, None), "f3": (2, None), "f101": (3, 100)}
    s.waiting = [ask(f"g{i}", i, queue="a") for i in range(1, 11)]
    assert list(told(s, further=3)) == ["g1", "g2", "g3", "g4", "g5"]  # the nearest first
    assert list(told(s, further=3)) == ["g6", "g7", "g8"]
    assert place_range(51, 50) == (51, 100) and place_range(101, 50) == (101, 1_000)
    # A scheduler whose history told the finer ranges of before replays with them.
    assert place_range(101, 50, FINE_PLACE_RANGES) == (101, 200)
    assert place_range(151, 150) == (151, 1_000) and place_range(2_000_001, 50) == (
        1_000_001,
        2_000_001,
    )
