"""The curves a job keeps in its status: bounded and evenly thinned, rolled
back when training goes back to an earlier step, and drawn by the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from shepherd.cli import plots
from shepherd.curves import MAX_CURVE_POINTS, CurvePoint, add_point
from shepherd.models import CheckpointRecord, JobStatus
from shepherd.phases import Phase


def steps(curve: list[CurvePoint]) -> list[int]:
    return [p.step for p in curve]


def test_points_append_in_order() -> None:
    curve: list[CurvePoint] = []
    for step in (5, 10, 15):
        add_point(curve, step, step / 10)
    assert [(p.step, p.value) for p in curve] == [(5, 0.5), (10, 1.0), (15, 1.5)]


def test_a_full_curve_drops_every_other_point_from_its_start() -> None:
    curve: list[CurvePoint] = []
    extra = 50
    for step in range(1, MAX_CURVE_POINTS + extra + 1):
        add_point(curve, step, float(step))
    assert len(curve) == MAX_CURVE_POINTS
    # Steps 2, 4, ..., 100 went: the start stays, the older part is thinned evenly first.
    assert steps(curve) == list(range(1, 2 * extra + 2, 2)) + list(
        range(2 * extra + 2, MAX_CURVE_POINTS + extra + 1)
    )


def test_a_long_run_stays_bounded_and_evenly_spread() -> None:
    curve: list[CurvePoint] = []
    last = 3 * MAX_CURVE_POINTS
    for step in range(1, last + 1):
        add_point(curve, step, 1.0 / step)
        assert len(curve) <= MAX_CURVE_POINTS
    assert curve[0].step == 1 and curve[-1].step == last
    assert steps(curve) == sorted(set(steps(curve)))
    # No stretch of the run is left bare: gaps stay within twice the even spacing.
    gaps = [b - a for a, b in zip(steps(curve), steps(curve)[1:], strict=False)]
    assert max(gaps) <= 2 * last / MAX_CURVE_POINTS + 1


def test_going_back_to_an_earlier_step_replaces_the_points_after_it() -> None:
    curve: list[CurvePoint] = []
    for step in (10, 20, 30, 40):
        add_point(curve, step, 1.0)
    add_point(curve, 30, 0.5)  # a recovery from the checkpoint at 20 redid 21-30
    assert [(p.step, p.value) for p in curve] == [(10, 1.0), (20, 1.0), (30, 0.5)]
    add_point(curve, 15, 0.7)  # a resume from the checkpoint at 10
    assert [(p.step, p.value) for p in curve] == [(10, 1.0), (15, 0.7)]


def test_the_curves_travel_in_the_status_as_json() -> None:
    status = JobStatus()
    add_point(status.loss_curve, 5, 2.5)
    add_point(status.eval_curve, 10, 1.25)
    again = JobStatus.model_validate_json(status.model_dump_json())
    assert again.loss_curve == [CurvePoint(step=5, value=2.5)]
    assert again.eval_curve == [CurvePoint(step=10, value=1.25)]
    # A status from before the curves existed (e.g. a carried one) reads as empty curves.
    assert JobStatus.model_validate({"step": 3}).loss_curve == []


def test_empty_curves_are_said_not_drawn() -> None:
    text = plots.terminal_text(plots.job_panels(JobStatus()), width=80, color=False)
    assert text.splitlines() == ["no loss recorded yet", "no eval_loss recorded yet"]


def test_a_curve_is_drawn_as_plain_text_with_whole_steps() -> None:
    status = JobStatus()
    for step in range(3, 31, 3):
        add_point(status.loss_curve, step, 3.0 / step)
    text = plots.terminal_text(plots.job_panels(status), width=90, color=False)
    assert "\x1b[" not in text
    lines = text.splitlines()
    assert "training loss" in lines[0] and lines[-1] == "no eval_loss recorded yet"
    assert max(len(line) for line in lines) <= 90
    ticks = next(line for line in lines if line.lstrip().startswith("3 "))
    assert ticks.split() == ["3", "8", "12", "16", "21", "26", "30"]  # no "7.50"


def test_plot_options_are_refused_before_connecting(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from shepherd.cli.main import app

    runner = CliRunner()
    # Nothing listens at this address: a refusal must come before any connection.
    env = {"TEMPORAL_ADDRESS": "127.0.0.1:1"}
    both = runner.invoke(app, ["status", "job-x", "--plot", "--json"], env=env)
    assert both.exit_code == 2 and "--json" in both.output
    nowhere = tmp_path / "missing" / "c.png"
    bad_dir = runner.invoke(app, ["sweep", "status", "s", "--png", str(nowhere)], env=env)
    assert bad_dir.exit_code == 2 and "no directory" in bad_dir.output


def test_a_non_finite_value_is_not_kept() -> None:
    curve: list[CurvePoint] = []
    add_point(curve, 1, 0.5)
    add_point(curve, 2, float("nan"))
    add_point(curve, 3, float("inf"))
    assert [(p.step, p.value) for p in curve] == [(1, 0.5)]


def _program_job(*, phase: Phase = Phase.COMPLETED, checkpoints: int = 2) -> JobStatus:
    """A program's job as its status reads: the tracked metric is the training loss, its
    checkpoints carry it, and (as before the workflow filled it) no eval curve."""
    status = JobStatus(phase=phase, eval_metric="train_loss")
    for step in range(1, 21):
        add_point(status.loss_curve, step, 3.0 / step)
    status.checkpoints = [
        CheckpointRecord(name=f"c/step-{s:08d}", step=s, trainer_job_id="t", metric=3.0 / s)
        for s in (10, 20)[:checkpoints]
    ]
    return status


def _said(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("no ")]


def test_a_program_jobs_loss_is_never_said_missing_after_it_was_drawn() -> None:
    text = plots.terminal_text(plots.job_panels(_program_job()), width=90, color=False)
    assert _said(text) == [], text
    # Both drawn: the loss of each step, and train_loss at each checkpoint (from the
    # checkpoints, where the status keeps no eval curve).
    assert "training loss (train_loss, each step)" in text
    assert "train_loss at each checkpoint" in text
    panels = plots.job_panels(_program_job())
    assert [(p.step, p.value) for p in panels[1].drawn[0].points] == [(10, 0.3), (20, 0.15)]


def test_a_program_job_without_checkpoints_draws_its_loss_once() -> None:
    status = _program_job(phase=Phase.TRAINING, checkpoints=0)
    text = plots.terminal_text(plots.job_panels(status), width=90, color=False)
    assert _said(text) == [] and text.count("train_loss") == 1, text


def test_an_empty_curve_is_said_once_by_its_metric() -> None:
    program = JobStatus(eval_metric="train_loss", phase=Phase.TRAINING)
    text = plots.terminal_text(plots.job_panels(program), width=80, color=False)
    assert text.splitlines() == ["no train_loss recorded yet"]
    # A loop's job: the loss drawn, its evaluations not yet.
    loop = JobStatus(phase=Phase.TRAINING)
    for step in range(3, 31, 3):
        add_point(loop.loss_curve, step, 3.0 / step)
    said = _said(plots.terminal_text(plots.job_panels(loop), width=90, color=False))
    assert said == ["no eval_loss recorded yet"]
    # An ended job will record nothing more: no "yet".
    ended = JobStatus(phase=Phase.FAILED, eval_metric="reward")
    text = plots.terminal_text(plots.job_panels(ended), width=80, color=False)
    assert text.splitlines() == ["no loss recorded", "no reward recorded"]


def test_a_png_of_a_program_job_says_nothing_is_missing(tmp_path: Path) -> None:
    if not plots.png_supported():
        pytest.skip("matplotlib (the plots extra) is not installed")
    panels = plots.job_panels(_program_job())
    assert all(p.drawn for p in panels)
    plots.write_png(panels, tmp_path / "c.png", title="job")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
