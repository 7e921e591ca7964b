"""bench/scale.py's reading of the platform's events: which slot was freed, which trainer
filled it, and how long each held it (the figures issue 8's targets are judged on)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from shepherd.platform.models import JobEvent
from shepherd.states import JobState

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
scale: Any = pytest.importorskip("scale")

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def event(seq: int, job: str, state: JobState, at: float) -> JobEvent:
    name = f"accounts/a/rlorTrainerJobs/{job}"
    return JobEvent.model_validate(
        {
            "id": seq,
            "name": name,
            "state": state.value,
            "eventTime": (T0 + timedelta(seconds=at)).isoformat(),
            "job": {"name": name, "state": state.value},
        }
    )


def life(
    job: str, placed: float, running: float, deleted: float
) -> list[tuple[str, JobState, float]]:
    return [
        (job, JobState.CREATING, placed),
        (job, JobState.RUNNING, running),
        (job, JobState.DELETING, deleted - 0.1),
        (job, JobState.DELETED, deleted),
    ]


def numbered(rows: list[tuple[str, JobState, float]]) -> list[JobEvent]:
    rows = sorted(rows, key=lambda r: r[2])
    return [event(i, job, state, at) for i, (job, state, at) in enumerate(rows, start=1)]


def test_each_freed_slot_pairs_with_the_next_placement_in_order() -> None:
    # One slot; b waits PENDING until a's trainer is deleted, c until b's.
    rows = [("b-abc123-g1", JobState.PENDING, 0.0), ("c-abc123-g1", JobState.PENDING, 0.0)]
    rows += life("a-abc123-g1", 0.0, 1.0, 5.0)
    rows += life("b-abc123-g1", 5.0, 6.0, 9.0)
    rows += life("c-abc123-g1", 9.5, 10.0, 12.0)
    slots, handovers = scale.slot_timeline(numbered(rows), T0)

    assert [(s.trainer_job_id, s.placed, s.running, s.freed) for s in slots] == [
        ("a-abc123-g1", 0.0, 1.0, 5.0),
        ("b-abc123-g1", 5.0, 6.0, 9.0),
        ("c-abc123-g1", 9.5, 10.0, 12.0),
    ]
    # a's slot went to b, b's to c; the first placement and the last free pair with nothing.
    assert [(h.freed, h.slot.trainer_job_id) for h in handovers] == [
        (5.0, "b-abc123-g1"),
        (9.0, "c-abc123-g1"),
    ]


def test_a_trainer_that_dies_frees_its_slot_without_a_delete() -> None:
    rows = [
        ("a-abc123-g1", JobState.CREATING, 0.0),
        ("a-abc123-g1", JobState.RUNNING, 1.0),
        ("a-abc123-g1", JobState.FAILED, 3.0),
        ("b-abc123-g1", JobState.CREATING, 3.0),
    ]
    slots, handovers = scale.slot_timeline(numbered(rows), T0)
    assert slots[0].freed == 3.0
    assert [(h.freed, h.slot.trainer_job_id) for h in handovers] == [(3.0, "b-abc123-g1")]


def test_first_training_is_the_first_training_start_after_the_placement() -> None:
    slot = scale.Slot("job-x-1--abcd-g2", placed=10.0)
    history = scale.History("job-x-1")
    history.training_starts = [T0 + timedelta(seconds=s) for s in (2.0, 12.5, 20.0)]
    assert scale.first_training(slot, history, T0) == 12.5
    assert scale.first_training(slot, None, T0) is None


def test_model_open_is_the_last_open_of_this_trainer_before_its_first_training_after_running() -> (
    None
):
    slot = scale.Slot("job-x-1--abcd-g2", placed=10.0, running=10.5)
    history = scale.History("job-x-1")
    at = [T0 + timedelta(seconds=s) for s in (2.0, 2.4, 10.6, 10.9, 11.0, 11.3, 30.0, 30.2)]
    # An earlier trainer's open, a first attempt, the one that counts, a later one.
    history.opens = [(at[0], at[1]), (at[2], at[3]), (at[4], at[5]), (at[6], at[7])]
    assert scale.model_open(slot, history, 11.4, T0) == pytest.approx(0.3)
    assert scale.model_open(slot, history, 10.95, T0) == pytest.approx(0.3)  # (10.6 -> 10.9)
    assert scale.model_open(slot, history, 10.7, T0) is None  # none ended before training
    assert scale.model_open(scale.Slot("j", placed=10.0), history, 11.4, T0) is None
    assert scale.model_open(slot, None, 11.4, T0) is None
    # Opened from the placement on (it waits out the boot): only its time after RUNNING.
    history.opens = [(T0 + timedelta(seconds=10.1), T0 + timedelta(seconds=10.8))]
    assert scale.model_open(slot, history, 11.0, T0) == pytest.approx(0.3)
    history.opens = [(T0 + timedelta(seconds=10.1), T0 + timedelta(seconds=10.4))]
    assert scale.model_open(slot, history, 11.0, T0) == 0.0  # ready before RUNNING was said


def test_a_trainer_belongs_to_the_workflow_that_recorded_it_else_the_longest_prefix() -> None:
    a, b, c = scale.History("job-a-1"), scale.History("job-a-12"), scale.History("job-c")
    a.trainers = {"a-0123ab-g0"}  # recorded, in a scheme without the workflow id
    histories = {h.workflow_id: h for h in (a, b, c)}
    assert scale.owners(histories.values()) == {"a-0123ab-g0": a}
    names = {"job-a-1": "a", "job-a-12": "a12", "job-c": "c"}
    assert scale.owner_by_prefix("job-a-12--ffff-g1", histories, names) is b
    assert scale.owner_by_prefix("c-0123ab-g1", histories, names) is c
    assert scale.owner_by_prefix("zzz-0123ab-g1", histories, names) is None


def test_jobs_per_minute_steady_leaves_out_the_first_jobs_latency() -> None:
    # One slot: the first job done at 10 s, then one every 2 s: 4 jobs in 8 s after the first.
    rates = scale.jobs_per_minute([10.0, 12.0, 14.0, 16.0, 18.0], end_s=20.0, slots=1)
    assert rates == {
        "steady": 30.0,
        "full_pipeline": 30.0,
        "first_to_last": 30.0,
        "overall": 15.0,
    }
    single = scale.jobs_per_minute([10.0], end_s=20.0, slots=1)
    assert single == {
        "steady": None,
        "full_pipeline": None,
        "first_to_last": None,
        "overall": 3.0,
    }


def test_jobs_per_minute_steady_starts_after_the_first_wave() -> None:
    # Two slots started together at t0, each finishing a job every 10 s (12 jobs/min in
    # all), the second slot 1 s behind the first. Counting from the first completion takes
    # in the second slot's first job without its cycle and overstates the rate.
    closes = [10.0, 11.0, 20.0, 21.0, 30.0, 31.0]
    rates = scale.jobs_per_minute(closes, end_s=31.0, slots=2)
    assert rates["steady"] == 12.0  # 4 completions from 11 s to 31 s
    assert rates["first_to_last"] == 14.3  # 5 completions from 10 s to 31 s
    assert rates["full_pipeline"] == 12.0  # 2 completions from 11 s to 21 s
    # No completion after the first wave: no steady rate.
    assert scale.jobs_per_minute([10.0, 11.0], end_s=11.0, slots=2)["steady"] is None


def test_full_pipeline_leaves_out_the_last_wave_on_an_emptying_machine() -> None:
    # Two slots, a job every 10 s each while all are busy; the last two jobs run alone on
    # the machine and take 3 s and 4 s (no handover, no new job starting beside them).
    closes = [10.0, 11.0, 20.0, 21.0, 30.0, 31.0, 34.0, 35.0]
    rates = scale.jobs_per_minute(closes, end_s=35.0, slots=2)
    assert rates["steady"] == 15.0  # 6 completions from 11 s to 35 s: the last wave's speed
    assert rates["full_pipeline"] == 12.0  # 4 completions from 11 s to 31 s
    # Too few jobs for a full pipeline (no completion between the two waves).
    assert scale.jobs_per_minute([10.0, 11.0, 14.0], end_s=14.0, slots=2)["full_pipeline"] is None


def test_cpu_steal_is_the_share_of_all_cpu_time_the_hypervisor_took() -> None:
    common: Any = pytest.importorskip("common")
    # user nice system idle iowait irq softirq steal (ticks)
    before = [100, 0, 50, 800, 10, 0, 0, 40]
    after = [400, 0, 150, 1000, 10, 0, 0, 340]
    assert common.steal_pct(before, after) == 33.3  # 300 of 900 ticks
    assert common.steal_pct(None, after) is None
    assert common.steal_pct(before, before) is None
    ticks = common.cpu_times()
    assert ticks is None or len(ticks) >= 8
    assert common.pace_ms(rounds=1) > 0


def test_repeated_runs_report_the_one_with_the_median_throughput() -> None:
    def run(steady: float | None, drained: float | None = 10.0) -> dict[str, Any]:
        return {
            "jobs_per_min": {"steady": steady},
            "drained": drained is not None,
            "drained_s": drained,
            "ok": {"all": True},
        }

    a, b, c = run(80.0), run(60.0), run(None, None)
    chosen = scale.median_run([a, b, c])
    assert chosen["jobs_per_min"]["steady"] == 60.0
    assert [r["chosen"] for r in chosen["repeats"]] == [False, True, False]
    # An even count takes the lower middle; a single run is reported as it is.
    assert scale.median_run([a, b])["jobs_per_min"]["steady"] == 60.0
    assert scale.median_run([a]) == a


def test_throughput_is_split_at_the_intake_and_counted_by_minute() -> None:
    closes = [10.0, 50.0, 70.0, 80.0, 90.0, 130.0]
    assert scale.window_rate(closes, 0.0, 60.0) == 2.0  # two in the first minute
    assert scale.window_rate(closes, 60.0, None) == 3.4  # four in the 70 s from 60 s to 130 s
    assert scale.window_rate(closes, None, None) is None  # no intake measured
    assert scale.window_rate([], 0.0, None) is None
    assert scale.by_minute(closes) == [2, 3, 1]
    assert scale.by_minute([]) == []


def test_a_sandwich_runs_the_small_n_on_both_sides_of_the_large() -> None:
    assert scale.run_order([20, 1000], [6, 1], sandwich=True) == [20] * 3 + [1000] + [20] * 3
    assert scale.run_order([1000, 20], [1, 5], sandwich=True) == [20] * 3 + [1000] + [20] * 2
    assert scale.run_order([20, 1000], [2, 2], sandwich=False) == [20, 20, 1000, 1000]
    assert scale.run_order([20], [3], sandwich=True) == [20, 20, 20]

    def run(steady: float) -> dict[str, Any]:
        return {"jobs_per_min": {"steady": steady}}

    order = [20, 20, 20, 1000, 20, 20, 20]
    tries = [run(v) for v in (90.0, 80.0, 85.0, 70.0, 70.0, 75.0, 72.0)]
    assert scale.drift(tries, [20, 1000], order) == {
        "n": 20,
        "steady_before": 85.0,
        "steady_after": 72.0,
    }
    assert scale.drift(tries[:4], [20, 1000], order[:4]) is None  # nothing after


def test_repeat_and_timeout_take_one_value_or_one_per_n() -> None:
    args = scale.parse_args(["--n", "20,1000", "--repeat", "6,1", "--timeout", "300"])
    assert args.repeat == [6, 1] and args.timeout == [300.0, 300.0]
    assert scale.parse_args(["--n", "20,1000"]).repeat == [1, 1]
    for bad in (["--repeat", "6,1,2"], ["--repeat", "0"], ["--repeat", "x"], ["--timeout", "-1"]):
        with pytest.raises(SystemExit):
            scale.parse_args(["--n", "20,1000", *bad])
