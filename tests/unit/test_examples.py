"""The examples a new user runs as they are must stay valid."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from shepherd.schedules import prepare_template
from shepherd.spec import load_spec, resolve_templates
from shepherd.sweep import load_sweep

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    "name",
    [
        "quickstart.yaml",
        "full.yaml",
        "rl.yaml",
        "tinker-sft.yaml",
        "cookbook-chat-sl.yaml",
        "cookbook-math-rl.yaml",
    ],
)
def test_job_examples_validate(name: str) -> None:
    spec = load_spec(EXAMPLES / name)
    assert spec.output.promote == "none" or spec.output.model_id


def test_nightly_example_fills_its_templates() -> None:
    template = prepare_template(load_spec(EXAMPLES / "nightly.yaml"), "nightly")
    run = resolve_templates(template, datetime(2026, 11, 22, 3, tzinfo=UTC))
    assert run.output.model_id == "nightly-20261122" and run.labels["schedule"] == "nightly"


def test_sweep_example_validates() -> None:
    sweep = load_sweep(EXAMPLES / "sweep.yaml")
    assert sweep.max_trials == 6 and sweep.parallelism == 2 and len(sweep.parameters) == 3


def test_the_dev_stack_registers_the_example_program(monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/tinker-sft.yaml names a program `shepherd dev` registers (and the arguments
    it gives are ones the registration accepts); a worker's own entry wins."""
    import json

    from shepherd import programs
    from workers.devstack import example_programs

    spec = load_spec(EXAMPLES / "tinker-sft.yaml")
    env = example_programs({})
    monkeypatch.setenv("SHEPHERD_PROGRAMS", env["SHEPHERD_PROGRAMS"])
    program = programs.resolve(spec.training.program or "")
    program.check_args(spec.training.args)
    assert program.total_steps(spec.training.args) == 24
    own = {"tinker-sft": {"module": "mine"}}
    kept = example_programs({"SHEPHERD_PROGRAMS": json.dumps(own)})
    assert json.loads(kept["SHEPHERD_PROGRAMS"]) == own


def test_a_program_job_can_be_scheduled() -> None:
    """A schedule's runs of a cookbook recipe each claim their own model id."""
    template = prepare_template(load_spec(EXAMPLES / "cookbook-chat-sl.yaml"), "nightly-sft")
    run = resolve_templates(template, datetime(2026, 11, 24, 3, tzinfo=UTC))
    assert run.training.program == "cookbook-chat-sl" and run.labels["schedule"] == "nightly-sft"
    assert run.output.model_id == "cookbook-sft-20261124-030000"
