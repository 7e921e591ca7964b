"""The examples a new user runs as they are must stay valid."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from shepherd.schedules import prepare_template
from shepherd.spec import load_spec, resolve_templates
from shepherd.sweep import load_sweep

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["quickstart.yaml", "full.yaml", "rl.yaml"])
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
