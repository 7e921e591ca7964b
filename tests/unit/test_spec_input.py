"""Bad input the spec and the Python API must refuse with the field named — pure checks,
no server: trailing newlines, bools as numbers, NaN, template tricks, path segments,
workflow ids, and arguments of the wrong type."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from shepherd.client import Shepherd, load_job_spec
from shepherd.jobs import check_workflow_id
from shepherd.platform import rules
from shepherd.spec import SpecError, apply_override, resolve_templates, validate_spec
from shepherd.sweep import validate_sweep
from tests.helpers import spec_data


def _spec(**sections: Any) -> dict[str, Any]:
    return spec_data("ok", **sections)


def _refused(data: Any) -> dict[str, str]:
    with pytest.raises(SpecError) as refused:
        validate_spec(data)
    return {p.field: p.rule for p in refused.value.problems}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (_spec(name="ok\n"), "name"),
        (_spec(output={"model_id": "ok-model\n"}), "output.model_id"),
        (_spec(output={"hot_load_deployment": "dep\n"}), "output.hot_load_deployment"),
        (
            _spec(trainer={"base_model": "accounts/fireworks/models/qwen3-8b\n"}),
            "trainer.base_model",
        ),
        (_spec(trainer={"display_name": "two\nlines"}), "trainer.display_name"),
        (
            _spec(trainer={"training_shape": "accounts/fireworks/trainingShapes/s\n"}),
            "trainer.training_shape",
        ),
        (
            _spec(training={"resume_from": "accounts/a/rlorTrainerJobs/j/checkpoints/c\n"}),
            "training.resume_from",
        ),
        (_spec(labels={"team\n": "a"}), "labels"),
        (_spec(labels={"team": "a\r"}), "labels"),
        (_spec(backend="local\n"), "backend"),
    ],
)
def test_a_trailing_newline_is_refused(data: dict[str, Any], field: str) -> None:
    assert field in _refused(data)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (_spec(training={"total_steps": True}), "training.total_steps"),
        (_spec(training={"batch_size": False}), "training.batch_size"),
        (_spec(trainer={"lora_rank": True}), "trainer.lora_rank"),
        (_spec(trainer={"learning_rate": True}), "trainer.learning_rate"),
        (_spec(scheduling={"priority": True}), "scheduling.priority"),
        (_spec(checkpoint={"every_steps": True}), "checkpoint.every_steps"),
        (_spec(policies={"max_failures": False}), "policies.max_failures"),
    ],
)
def test_bools_are_not_numbers(data: dict[str, Any], field: str) -> None:
    problems = _refused(data)
    assert "true/false" in problems[field]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "nan", "-inf"])
def test_a_learning_rate_must_be_finite(value: Any) -> None:
    rule = _refused(_spec(trainer={"learning_rate": value}))["trainer.learning_rate"]
    assert "finite" in rule and "1" not in rule


def test_only_plain_scheduled_time_placeholders_expand() -> None:
    when = datetime(2026, 11, 22, 3, tzinfo=UTC)
    ok = validate_spec(_spec(output={"model_id": "n-{scheduled_time:%Y%m%d}"}))
    assert resolve_templates(ok, when).output.model_id == "n-20261122"
    plain = validate_spec(_spec(training={"dataset": "/data/{scheduled_time}.jsonl"}))
    assert resolve_templates(plain, when).training.dataset == f"/data/{when}.jsonl"
    for sneaky in (
        "{scheduled_time.__class__.__name__}",
        "{scheduled_time.year}",
        "{scheduled_time!r}",
        "{scheduled_time[0]}",
        "x-{scheduled_time:%Y}-{other}",
    ):
        spec = validate_spec(_spec(trainer={"display_name": sneaky}))
        with pytest.raises(SpecError) as refused:
            resolve_templates(spec, when)
        assert [p.field for p in refused.value.problems] == ["trainer.display_name"], sneaky


@pytest.mark.parametrize(
    "base_model",
    [
        "accounts/../models/..",
        "accounts/fireworks/models/..",
        "accounts/./models/qwen3-8b",
        "accounts//models/qwen3-8b",
        "../../etc/passwd",
        "models/../secret",
        "a//b",
    ],
)
def test_base_model_path_segments_are_checked(base_model: str) -> None:
    assert "trainer.base_model" in _refused(_spec(trainer={"base_model": base_model}))


def test_a_base_model_is_a_lower_case_model_resource_name() -> None:
    # As the platform's trainingConfig.baseModel names it; whether it exists (and may be
    # used by the account) the job's preflight asks the platform.
    for name in ("accounts/fireworks/models/qwen3-8b", "accounts/my-team/models/sft-v2"):
        assert validate_spec(_spec(trainer={"base_model": name})).trainer.base_model == name
    for name in ("qwen3-8b", "Qwen/Qwen3-8B", "accounts/fireworks/models/Qwen3-8B"):
        rule = _refused(_spec(trainer={"base_model": name}))["trainer.base_model"]
        assert "accounts/<account>/models/<model>" in rule, name


def test_platform_rules_refuse_a_trailing_newline() -> None:
    # The rules are shared with localplane: `$` would let "x\n" through there too.
    assert rules.check_resource_id("job-1\n") == rules.RESOURCE_ID_RULE
    assert rules.check_checkpoint_id("step-1\n") == rules.CHECKPOINT_ID_RULE
    assert rules.check_shape_ref("accounts/a/trainingShapes/s\n") == rules.SHAPE_REF_RULE
    assert rules.check_base_model("accounts/a/models/m\n") is not None
    for pattern, value in (
        (rules.JOB_NAME_RE, "accounts/a/rlorTrainerJobs/j\n"),
        (rules.CHECKPOINT_NAME_RE, "accounts/a/rlorTrainerJobs/j/checkpoints/c\n"),
        (rules.MODEL_NAME_RE, "accounts/a/models/m\n"),
        (rules.ACCOUNT_ID_RE, "a\n"),
    ):
        assert pattern.match(value) is None, value
    assert rules.parse_duration("3600s\n") is None


@pytest.mark.parametrize(
    "workflow_id",
    ["a/b", "../x", "job x", "job\n", "", "x" * 201, "jöb", "-leading"],
)
def test_workflow_ids_are_checked(workflow_id: str) -> None:
    with pytest.raises(SpecError) as refused:
        check_workflow_id(workflow_id)
    assert refused.value.problems[0].field == "workflow_id"
    assert "invalid job spec" not in str(refused.value)


@pytest.mark.parametrize("workflow_id", ["job-a-1", "my.job_2", "job-n-2026-11-23T03:00:00Z"])
def test_workflow_ids_accepted(workflow_id: str) -> None:
    check_workflow_id(workflow_id)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"spec": 123}, "spec"),
        ({"spec": None}, "spec"),
        ({"spec": ["not", "a", "spec"]}, "spec"),
        ({"spec": _spec(), "overrides": {"name.x": 1}}, "name.x"),
        ({"spec": _spec(), "overrides": {"": 1}}, "overrides"),
        ({"spec": _spec(), "overrides": {3: 1}}, "overrides"),
        ({"spec": _spec(), "overrides": "training.total_steps=5"}, "overrides"),
        ({"spec": _spec(), "overrides": [5]}, "overrides"),
        ({"spec": _spec(), "overrides": ["training.total_steps"]}, "training.total_steps"),
        ({"spec": _spec(), "overrides": 7}, "overrides"),
        ({"spec": _spec(), "workflow_id": 42}, "workflow_id"),
    ],
)
async def test_python_api_arguments_of_the_wrong_type_raise_spec_error(
    kwargs: dict[str, Any], field: str
) -> None:
    # Nothing is sent before the arguments are checked, so no server is needed.
    sh = Shepherd(None, task_queue="unused")  # type: ignore[arg-type]
    with pytest.raises(SpecError) as refused:
        await sh.submit(**kwargs)
    assert field in [p.field for p in refused.value.problems], refused.value


async def test_submit_sweep_arguments_of_the_wrong_type_raise_spec_error() -> None:
    sh = Shepherd(None, task_queue="unused")  # type: ignore[arg-type]
    for bad in (123, None, ["x"]):
        with pytest.raises(SpecError) as refused:
            await sh.submit_sweep(bad)  # type: ignore[arg-type]
        assert refused.value.problems[0].field == "sweep"


def test_mapping_overrides_reach_nested_fields() -> None:
    spec = load_job_spec(_spec(), {"training.total_steps": 40, "labels.team": "ml"})
    assert spec.training.total_steps == 40 and spec.labels == {"team": "ml"}


def test_override_errors_are_not_called_an_invalid_spec() -> None:
    with pytest.raises(SpecError) as refused:
        apply_override({}, "no-equals-sign")
    assert "invalid job spec" not in str(refused.value)
    assert "override" in str(refused.value)


def test_sweep_ints_are_strict_too() -> None:
    with pytest.raises(SpecError) as refused:
        validate_sweep(
            {
                "name": "s",
                "spec": _spec(),
                "parameters": {"trainer.lora_rank": {"type": "int", "min": True, "max": 8}},
                "max_trials": True,
            }
        )
    fields = {p.field for p in refused.value.problems}
    assert "max_trials" in fields and "parameters.trainer.lora_rank.int.min" in fields


def test_a_schedule_without_our_memo_still_shows_its_cron() -> None:
    # The server keeps a cron expression only as a calendar; schedules created before the
    # memo existed (or by other tools) are described from it.
    from temporalio.client import ScheduleCalendarSpec, ScheduleRange, ScheduleSpec

    from shepherd.schedules import _spec_text

    calendar = ScheduleCalendarSpec(
        second=(ScheduleRange(0),),
        minute=(ScheduleRange(15),),
        hour=(ScheduleRange(3),),
        day_of_month=(ScheduleRange(1, 31),),
        month=(ScheduleRange(1, 12),),
        day_of_week=(ScheduleRange(1, 5),),
    )
    assert _spec_text(ScheduleSpec(calendars=[calendar]), {}) == "cron '15 3 * * 1-5'"
    every_15 = ScheduleCalendarSpec(
        minute=(ScheduleRange(0, 59, 15),), hour=(ScheduleRange(0, 23),)
    )
    assert _spec_text(ScheduleSpec(calendars=[every_15]), {}).startswith("cron '*/15 * ")
    assert _spec_text(ScheduleSpec(), {"spec": "cron '0 3 * * *'"}) == "cron '0 3 * * *'"


def test_route_race_window_is_tied_to_the_trainers_hold() -> None:
    """Issue 16: a trainer holds later seq_ids rules.SEQ_GAP_HOLD_S while an earlier one is
    retried within the route-race window; a window the hold cannot cover is refused."""
    from localplane.trainer.config import TrainerConfig

    assert TrainerConfig.__dataclass_fields__["seq_gap_timeout_s"].default == rules.SEQ_GAP_HOLD_S
    longest = f"{rules.ROUTE_RACE_WINDOW_MAX_S:g}s"
    validate_spec(spec_data("ok", policies={"route_race_window": longest}))
    with pytest.raises(SpecError) as refused:
        validate_spec(spec_data("too-long", policies={"route_race_window": "5m"}))
    message = str(refused.value)
    assert "policies.route_race_window" in message and longest in message
