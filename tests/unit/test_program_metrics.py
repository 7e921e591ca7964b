"""Reading a program's metrics file (shepherd/program_metrics.py) as the program writes it,
and what a status says of a best checkpoint a metric does not decide."""

from __future__ import annotations

import json
import os
from pathlib import Path

from shepherd.curves import CurvePoint
from shepherd.models import CheckpointRecord, JobStatus
from shepherd.program_metrics import MetricsTail, curve, names, parse, read_all


def test_a_record_keeps_finite_numbers_only() -> None:
    record = parse(
        json.dumps({"step": 3, "reward": 0.5, "n": 4, "ok": True, "tag": "x", "bad": None})
    )
    assert record is not None and record.step == 3 and record.values == {"reward": 0.5, "n": 4.0}
    assert parse('{"step": 1, "loss": NaN}') is None  # nothing numeric and finite
    assert parse("[1, 2]") is None and parse("not json") is None
    stepless = parse('{"loss": 1.5}')
    assert stepless is not None and stepless.step is None


def test_the_tail_reads_lines_as_they_are_completed(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.read() == []  # no file yet
    with path.open("w") as f:
        f.write('{"step": 0, "loss": 2.0}\n{"step": 1, "lo')
    assert [r.step for r in tail.read()] == [0]  # the unfinished line waits
    with path.open("a") as f:
        f.write('ss": 1.0}\nnot json\n{"step": 2, "loss": 0.5}\n')
    assert [(r.step, r.values) for r in tail.read()] == [(1, {"loss": 1.0}), (2, {"loss": 0.5})]
    assert tail.read() == []


def test_a_file_written_anew_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "loss": 2.0}\n{"step": 1, "loss": 1.0}\n')
    tail = MetricsTail(path)
    assert len(tail.read()) == 2
    replaced = tmp_path / "new.jsonl"
    replaced.write_text('{"step": 0, "loss": 3.0}\n')
    os.replace(replaced, path)  # a program started again that rewrites it
    assert [r.values["loss"] for r in tail.read()] == [3.0]


def test_a_big_file_is_read_whole_over_several_looks(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with path.open("w") as f:
        for i in range(40_000):  # ~1.3 MB: more than one look reads
            f.write(json.dumps({"step": i, "reward": i / 10}) + "\n")
    records = read_all(path)
    assert len(records) == 40_000 and names(records) == ["reward"]
    assert curve(records, "reward")[-1] == (39_999, 3999.9)


def _record(step: int, metric: float | None) -> CheckpointRecord:
    return CheckpointRecord(name=f"step-{step:08d}", step=step, trainer_job_id="t", metric=metric)


def test_a_best_is_called_best_only_where_the_metric_tells_checkpoints_apart() -> None:
    tied = JobStatus(
        checkpoints=[_record(5, 0.0), _record(10, 0.0)],
        best=_record(10, 0.0),
        eval_curve=[CurvePoint(step=5, value=0.0), CurvePoint(step=10, value=0.0)],
    )
    assert not tied.best_decided and "best checkpoint" not in tied.summary()
    apart = tied.model_copy(
        update={"eval_curve": [CurvePoint(step=5, value=1.0), CurvePoint(step=10, value=0.0)]}
    )
    assert apart.best_decided and "best checkpoint: step-00000010" in apart.summary()
    single = JobStatus(checkpoints=[_record(5, 2.0)], best=_record(5, 2.0))
    assert single.best_decided
    assert not JobStatus().best_decided


def test_the_summary_shows_the_programs_kept_metrics_tracked_first() -> None:
    status = JobStatus(
        eval_metric="env/all/reward/total",
        metrics={"env/all/reward/total": 0.75, "optim/lr": 1e-4, "time/total": 3.0},
        metrics_step=4,
        metric_curves={"optim/lr": [], "env/all/reward/total": []},
    )
    assert list(status.headline_metrics()) == ["env/all/reward/total", "optim/lr"]
    assert "program (its step 4): env/all/reward/total 0.75 · optim/lr 0.0001" in status.summary()
