"""Pure logic: the contract's validation rules and the status -> error mapping."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from shepherd.platform import errors, rules
from shepherd.states import JobState


@pytest.mark.parametrize("value", ["a", "job-1", "x" * 63, "0-9"])
def test_resource_ids_accepted(value: str) -> None:
    assert rules.check_resource_id(value) is None


@pytest.mark.parametrize("value", ["", "A", "job_1", "x" * 64, "job.1", "jöb"])
def test_resource_ids_rejected(value: str) -> None:
    assert rules.check_resource_id(value) == rules.RESOURCE_ID_RULE


@pytest.mark.parametrize(
    "value",
    [
        "accounts/fireworks/trainingShapes/qwen3-8b-128k-h200",
        "accounts/a/trainingShapes/s/versions/v1",
    ],
)
def test_shape_refs_accepted(value: str) -> None:
    assert rules.check_shape_ref(value) is None


@pytest.mark.parametrize(
    "value",
    [
        "qwen3-8b",
        "accounts/a/shapes/s",
        "accounts/a/trainingShapes/",
        "accounts/a/trainingShapes/s/versions/",
    ],
)
def test_shape_refs_rejected(value: str) -> None:
    assert rules.check_shape_ref(value) == rules.SHAPE_REF_RULE


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("3600s", True),
        ("1.5s", True),
        ("10800s", True),
        ("10801s", False),
        ("0s", False),
        ("1h", False),
    ],
)
def test_inactivity_timeout(value: str, ok: bool) -> None:
    assert (rules.check_inactivity_timeout(value) is None) is ok


def test_base_model_and_lora_rank() -> None:
    assert rules.check_base_model("accounts/fireworks/models/qwen3-8b") is None
    assert rules.check_base_model("any-name-works") is None
    assert rules.check_base_model("  ") == "is required"
    assert rules.check_base_model("accounts/x/datasets/y") is not None
    assert rules.check_lora_rank(0) is None and rules.check_lora_rank(-1) is not None


def _response(code: int, body: object | None = None, text: str | None = None) -> httpx.Response:
    request = httpx.Request("POST", "http://plane/v1/accounts/a/rlorTrainerJobs?rlorTrainerJobId=j")
    if body is not None:
        return httpx.Response(code, json=body, request=request)
    return httpx.Response(code, text=text or "", request=request)


def _body(code: int, status: str, message: str = "m") -> dict[str, object]:
    return {"error": {"code": code, "status": status, "message": message}}


@pytest.mark.parametrize(
    ("code", "status", "cls", "retryable"),
    [
        (400, "INVALID_ARGUMENT", errors.InvalidArgument, False),
        (400, "FAILED_PRECONDITION", errors.FailedPrecondition, False),
        (409, "FAILED_PRECONDITION", errors.FailedPrecondition, False),
        (409, "ALREADY_EXISTS", errors.AlreadyExists, False),
        (401, "UNAUTHENTICATED", errors.Unauthenticated, False),
        (403, "PERMISSION_DENIED", errors.PermissionDenied, False),
        (404, "NOT_FOUND", errors.NotFound, False),
        (429, "RESOURCE_EXHAUSTED", errors.RateLimited, True),
        (500, "INTERNAL", errors.InternalError, True),
        (503, "UNAVAILABLE", errors.Unavailable, True),
        (504, "DEADLINE_EXCEEDED", errors.RequestTimeout, True),
    ],
)
def test_error_mapping_from_contract_bodies(
    code: int, status: str, cls: type, retryable: bool
) -> None:
    exc = errors.error_from_response(_response(code, _body(code, status, "the message")))
    assert type(exc) is cls
    assert exc.retryable is retryable
    assert exc.message == "the message" and exc.status_code == code


def test_error_mapping_without_our_body() -> None:
    # A proxy's HTML 502 is still retryable; a bare 404 on the data plane is a route 404.
    assert isinstance(
        errors.error_from_response(_response(502, text="<html>bad gateway</html>")),
        errors.Unavailable,
    )
    assert (
        type(errors.error_from_response(_response(404, text="nope"), data_plane=True))
        is errors.RouteNotFound
    )
    assert (
        type(errors.error_from_response(_response(404, _body(404, "NOT_FOUND")))) is errors.NotFound
    )
    assert type(errors.error_from_response(_response(408, text=""))) is errors.RequestTimeout


def test_errors_keep_no_secrets_and_pickle() -> None:
    import pickle

    exc = errors.error_from_response(_response(409, _body(409, "ALREADY_EXISTS", "exists")))
    assert "Bearer" not in str(exc)
    copy = pickle.loads(pickle.dumps(exc))
    assert (
        type(copy) is errors.AlreadyExists and copy.status_code == 409 and copy.message == "exists"
    )


def test_transport_errors_are_retryable() -> None:
    request = httpx.Request("GET", "http://plane/v1/accounts")
    assert errors.error_from_transport(httpx.ConnectError("refused"), request).retryable
    assert isinstance(
        errors.error_from_transport(httpx.ReadTimeout("slow"), request), errors.RequestTimeout
    )


def test_job_states() -> None:
    assert JobState("JOB_STATE_SOMETHING_NEW") is JobState.UNSPECIFIED
    assert {s for s in JobState if s.is_resumable()} == {
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.PAUSED,
        JobState.COMPLETED,
        JobState.IDLE,
    }
    assert JobState.DELETED.is_gone() and JobState.CREATING.is_transitional()
    assert JobState.RUNNING.short == "RUNNING"


def test_future_outcomes_map_to_the_workflow_s_error_types() -> None:
    from activities.base import translate
    from workflows import policies

    user = errors.future_failed("r1", {"error": "bad loss_fn", "category": "user"})
    server = errors.future_failed("r2", {"error": "oom", "category": "server"})
    expired = errors.FutureExpired("gone", status_code=410)
    assert (translate(user).type, translate(user).non_retryable) == (policies.INVALID_REQUEST, True)
    assert (translate(server).type, translate(server).non_retryable) == ("FutureServerError", False)
    assert (translate(expired).type, translate(expired).non_retryable) == (
        policies.TRAINER_BEHIND,
        True,
    )


@pytest.mark.parametrize("ready", [timedelta(minutes=1), timedelta(minutes=15), timedelta(hours=2)])
def test_a_trainer_is_made_or_resumed_through_any_platform_outage_within_its_ready_timeout(
    ready: timedelta,
) -> None:
    """A 3-minute partition mid-recovery outlasted ten attempts of resume_trainer (issue 32):
    create and resume are retried without a count, at most 5 s apart (so they land within
    5 s of the platform's return), until the job's ready_timeout."""
    from shepherd.spec import PoliciesSpec  # noqa: PLC0415 - the workflow side's
    from workflows.policies import Policies  # noqa: PLC0415

    pol = Policies.for_spec(PoliciesSpec(ready_timeout=ready), chunk_steps=10)
    for policy in (pol.create_trainer, pol.resume_trainer):
        assert policy.retry.maximum_attempts == 0
        assert policy.retry.maximum_interval is not None
        assert policy.retry.maximum_interval <= timedelta(seconds=5)
        assert policy.schedule_to_close == ready
        assert "TrainerLost" in (policy.retry.non_retryable_error_types or [])
