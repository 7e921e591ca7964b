"""Issue 17's wrongly accepted specs, each refused before anything is provisioned, naming the
field and the rule — the checks a spec carries (validate, submit, the Python API) and the
ones only a worker can make (its dataset, its loops), as pure functions."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from shepherd import datasets, loops
from shepherd.client import load_job_spec
from shepherd.preflight import parse_identity, worker_identity
from shepherd.spec import SpecError, load_spec, parse_duration, validate_spec
from tests.helpers import spec_data


def _spec(**sections: Any) -> dict[str, Any]:
    return spec_data("pre", **sections)


def _refused(data: Any) -> dict[str, str]:
    with pytest.raises(SpecError) as refused:
        validate_spec(data)
    return {p.field: p.rule for p in refused.value.problems}


CASES: list[tuple[str, dict[str, Any], str, str]] = [
    # (case, spec, field, a word of the rule)
    (
        "pending_timeout .inf",
        _spec(policies={"pending_timeout": float("inf")}),
        "policies.pending_timeout",
        "finite",
    ),
    (
        "pending_timeout 1e20 days",
        _spec(policies={"pending_timeout": "99999999999999999999d"}),
        "policies.pending_timeout",
        "finite",
    ),
    (
        "pending_timeout 100000000d",
        _spec(policies={"pending_timeout": "100000000d"}),
        "policies.pending_timeout",
        "365d",
    ),
    (
        "step_timeout 1ms",
        _spec(policies={"step_timeout": "1ms"}),
        "policies.step_timeout",
        "at least",
    ),
    (
        "ready_timeout 1ms",
        _spec(policies={"ready_timeout": "1ms"}),
        "policies.ready_timeout",
        "at least",
    ),
    (
        "max_runtime 1ms",
        _spec(scheduling={"max_runtime": "1ms"}),
        "scheduling.max_runtime",
        "at least",
    ),
    (
        "micro_batches > batch_size",
        _spec(training={"batch_size": 4, "micro_batches": 8}),
        "training.micro_batches",
        "batch_size",
    ),
    ("metric empty", _spec(checkpoint={"metric": ""}), "checkpoint.metric", "metric"),
    (
        "metric reward on the built-in loop",
        _spec(checkpoint={"metric": "reward"}),
        "checkpoint.metric",
        "eval_loss",
    ),
    (
        "extra_args out of range",
        _spec(trainer={"extra_args": ["--compute-delay-ms=-5"]}),
        "trainer.extra_args[0]",
        "[0, 600000]",
    ),
    (
        "extra_args unknown",
        _spec(trainer={"extra_args": ["--gpus=1000"]}),
        "trainer.extra_args[0]",
        "not an accepted",
    ),
    (
        "extra_args no value",
        _spec(trainer={"extra_args": ["--seed"]}),
        "trainer.extra_args[0]",
        "--seed=N",
    ),
    (
        "base_model upper-case",
        _spec(trainer={"base_model": "accounts/fireworks/models/Qwen3-8B"}),
        "trainer.base_model",
        "lower-case",
    ),
    (
        "dataset ../ escape",
        _spec(training={"dataset": "/data/../../etc/shadow.jsonl"}),
        "training.dataset",
        "..",
    ),
    (
        "dataset file:///../",
        _spec(training={"dataset": "file:///../etc/x.jsonl"}),
        "training.dataset",
        "..",
    ),
    (
        "queue with a space",
        _spec(scheduling={"queue": "bogus q"}),
        "scheduling.queue",
        "queue name",
    ),
    (
        "task queue with a space",
        _spec(scheduling={"task_queue": "bogus q"}),
        "scheduling.task_queue",
        "queue name",
    ),
    (
        "capability tag in capitals",
        _spec(scheduling={"required_capabilities": ["H100"]}),
        "scheduling.required_capabilities[0]",
        "capability tag",
    ),
    ('label value with "', _spec(labels={"a": 'x" OR "1'}), "labels", "without"),
]


@pytest.mark.parametrize(("case", "data", "field", "word"), CASES, ids=[c[0] for c in CASES])
def test_refused_with_the_field_and_the_rule(
    case: str, data: dict[str, Any], field: str, word: str
) -> None:
    problems = _refused(data)
    assert field in problems, problems
    assert word in problems[field], problems[field]


@pytest.mark.parametrize("value", [".inf", "99999999999999999999d", "1e400", "-.inf"])
def test_an_infinite_duration_is_a_spec_error_not_a_traceback(value: str) -> None:
    # From the CLI's --set and the Python API's overrides alike (an OverflowError before).
    with pytest.raises(SpecError) as refused:
        load_job_spec(_spec(), [f"policies.pending_timeout={value}"])
    assert refused.value.problems[0].field == "policies.pending_timeout"
    with pytest.raises(SpecError):
        load_job_spec(_spec(), {"policies.ready_timeout": float("inf")})
    with pytest.raises(Exception) as bare:
        parse_duration(value)
    assert not isinstance(bare.value, OverflowError)


def test_a_repeated_key_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(
        "name: dup\ntrainer:\n  base_model: accounts/fireworks/models/qwen3-8b\n"
        "training:\n  total_steps: 20\ntraining:\n  total_steps: 40\n"
    )
    with pytest.raises(SpecError) as refused:
        load_spec(path)
    assert "duplicate key 'training'" in str(refused.value) and "line" in str(refused.value)
    as_json = tmp_path / "dup.json"
    as_json.write_text('{"name": "dup", "name": "again"}')
    with pytest.raises(SpecError, match="duplicate key 'name'"):
        load_spec(as_json)
    with pytest.raises(SpecError, match="duplicate key"):
        load_job_spec(_spec(), ["labels={a: x, a: y}"])


def test_the_accepted_values_pass() -> None:
    spec = validate_spec(
        _spec(
            trainer={"extra_args": ["--compute-delay-ms=50", "--seed=3"]},
            training={"batch_size": 8, "micro_batches": 8, "dataset": "file:///data/x.jsonl"},
            policies={"step_timeout": "1s", "pending_timeout": "365d"},
            scheduling={
                "queue": "team-a",
                "task_queue": "gpu-queue.eu/1",
                "required_capabilities": ["h100", "region-eu"],
            },
        )
    )
    assert spec.training.micro_batches == 8


# ------------------------------------------------------------- what a worker checks


@pytest.fixture
def data_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    allowed = tmp_path / "data"
    allowed.mkdir()
    monkeypatch.setenv(datasets.DIRS_ENV, str(allowed))
    return allowed


def test_a_dataset_is_read_only_inside_the_allowed_directories(
    data_dirs: Path, tmp_path: Path
) -> None:
    good = data_dirs / "good.jsonl"
    good.write_text("".join(f'{{"text": "record {i}"}}\n' for i in range(10)))
    assert datasets.check_readable(str(good), 0.1) is None
    assert datasets.check_readable(f"file://{good}", 0.1) is None

    outside = tmp_path / "outside.jsonl"
    outside.write_text(good.read_text())
    link = data_dirs / "link.jsonl"
    os.symlink(outside, link)
    for name in (str(outside), str(link), str(data_dirs / "missing.jsonl")):
        problem = datasets.check_readable(name, 0.1)
        assert problem is not None and datasets.DIRS_ENV in problem, name

    bad = data_dirs / "bad.jsonl"
    bad.write_text('{"text": "ok"}\nnot json\n')
    assert "line 2: not JSON" in (datasets.check_readable(str(bad), 0.1) or "")
    wrong = data_dirs / "wrong.jsonl"
    wrong.write_text('{"question": "no"}\n{"question": "no"}\n')
    assert "'text'" in (datasets.check_readable(str(wrong), 0.1) or "")
    one = data_dirs / "one.jsonl"
    one.write_text('{"text": "alone"}\n')
    assert "at least 2" in (datasets.check_readable(str(one), 0.1) or "")
    assert datasets.check_readable("synthetic:text", 0.1) is None


def test_loops_declare_the_metrics_they_report() -> None:
    assert loops.declared_metrics(loops.resolve("supervised")) == ("eval_loss",)

    async def bare(ctx: Any, step: int) -> float:
        return 0.0

    assert loops.declared_metrics(loops._as_loop(bare, "bare")) == ("eval_loss",)

    class Silent:
        async def step(self, ctx: Any, step: int) -> float:
            return 0.0

        async def evaluate(self, ctx: Any) -> dict[str, float]:
            return {}

    assert loops.declared_metrics(Silent()) is None  # says nothing: checked when it evaluates


def test_workers_advertise_backends_and_loops() -> None:
    identity = worker_identity(["local"], loops=["supervised", "rl-example"])
    assert parse_identity(identity) == {
        "backends": {"local"},
        "loops": {"rl-example", "supervised"},
    }
    assert parse_identity(worker_identity(["local"])) == {"backends": {"local"}}
    crowded = worker_identity(["local"], loops=[f"loop-{i:04d}" for i in range(200)])
    assert len(crowded) < 1000 and parse_identity(crowded)["loops"] is None


def test_a_recorded_spec_stays_readable_when_the_rules_grow() -> None:
    # A running job's input (or a schedule's template) was accepted under older rules: a
    # worker must still decode it, and mean the same by it; a new submission is refused.
    old = _spec(
        trainer={"base_model": "Qwen/Qwen3-8B", "extra_args": ["--my-flag"]},
        policies={"pending_timeout": "400d", "step_timeout": "1ms"},
        labels={"note": 'said "hi"'},
    )
    from shepherd.models import JobInput

    decoded = JobInput.model_validate({"spec": old})
    assert decoded.spec.trainer.extra_args == ["--my-flag"]
    assert validate_spec(old, strict=False).policies.step_timeout.total_seconds() == 0.001
    assert set(_refused(old)) == {
        "trainer.base_model",
        "trainer.extra_args[0]",
        "policies.pending_timeout",
        "policies.step_timeout",
        "labels",
    }
