"""Malformed and invalid requests against a real plane: each one is answered with a 4xx in
the contract's error body (trainer-api.md §1) whose message names the problem, and none of
them leaves anything behind — no job, no trainer, no resume, no model.

The requests go out through raw httpx, because most of them cannot be expressed with the
typed client (wrong types, non-JSON bodies) and because the wire body itself is under test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd.platform import NotFound, PlatformClient
from shepherd.states import JobState
from tests.helpers import BASE_MODEL, Account, job_request, running_trainer, wait_state

TINY_CPU = "accounts/localplane/trainingShapes/tiny-cpu"
#: Totals of the plane that any created job, started trainer or resume would move.
WATCHED_TOTALS = ("creates", "resumes", "trainersStarted", "liveTrainers", "pendingJobs")
WATCHED_PER_JOB = ("creates", "resumes", "trainersStarted", "deletes", "state", "liveTrainer")


# ------------------------------------------------------------------------------ cases


@dataclass(frozen=True)
class Bad:
    """One invalid request; ``path`` is relative to ``/v1/accounts/{a}``."""

    method: str
    path: str
    names: tuple[str, ...]  # what the message must mention
    code: int = 400
    status: str = "INVALID_ARGUMENT"
    params: dict[str, str] = field(default_factory=dict)
    body: Any = None
    content: bytes | None = None


def _valid_body() -> dict[str, Any]:
    return {
        "serviceMode": True,
        "trainingConfig": {"baseModel": BASE_MODEL, "loraRank": 0, "learningRate": 3e-3},
    }


def create(
    *names: str,
    job_id: str = "valid-id",
    shape: str | None = None,
    tc: dict[str, Any] | None = None,
    status: str = "INVALID_ARGUMENT",
    **top: Any,
) -> Bad:
    """A create request that is valid except for the given changes (a ``None`` drops a key)."""
    body = _valid_body()
    for key, value in (tc or {}).items():
        if value is None:
            body["trainingConfig"].pop(key)
        else:
            body["trainingConfig"][key] = value
    for key, value in top.items():
        if value is None:
            body.pop(key)
        else:
            body[key] = value
    params = {"rlorTrainerJobId": job_id}
    if shape is not None:
        params["trainingShape"] = shape
    return Bad("POST", "/rlorTrainerJobs", names, status=status, params=params, body=body)


def listing(*names: str, **params: str) -> Bad:
    return Bad("GET", "/rlorTrainerJobs", names, params=params)


CASES = [
    # --- the client-chosen job id
    pytest.param(create("rlorTrainerJobId", job_id="BadJob"), id="job-id-uppercase"),
    pytest.param(create("rlorTrainerJobId", job_id="a" * 64), id="job-id-64-chars"),
    pytest.param(create("rlorTrainerJobId", job_id="bad_job"), id="job-id-underscore"),
    # --- the body's fields
    pytest.param(create("trainingConfig", trainingConfig=None), id="training-config-missing"),
    pytest.param(create("baseModel", tc={"baseModel": None}), id="base-model-missing"),
    pytest.param(create("baseModel", tc={"baseModel": ""}), id="base-model-empty"),
    pytest.param(create("loraRank", tc={"loraRank": -1}), id="lora-rank-negative"),
    pytest.param(create("loraRank", tc={"loraRank": "abc"}), id="lora-rank-string"),
    pytest.param(create("learningRate", tc={"learningRate": -0.1}), id="learning-rate-negative"),
    pytest.param(create("maxContextLength", tc={"maxContextLength": 0}), id="max-context-zero"),
    pytest.param(create("displayName", displayName="d" * 64), id="display-name-64-chars"),
    pytest.param(create("inactivityTimeout", inactivityTimeout="90m"), id="inactivity-minutes"),
    pytest.param(create("inactivityTimeout", inactivityTimeout="99999s"), id="inactivity-over-3h"),
    pytest.param(create("serviceMode", serviceMode=False), id="service-mode-false"),
    pytest.param(
        create("extraArgs", "--seed", tc={"extraArgs": ["--seed=x"]}), id="extra-args-seed"
    ),
    pytest.param(
        create("acceleratorType", tc={"acceleratorType": "TPU_V9"}), id="manual-accelerator-unknown"
    ),
    # --- the shape path
    pytest.param(create("trainingShape", shape="tiny-cpu"), id="shape-ref-malformed"),
    pytest.param(
        create("trainingShape", shape="accounts/localplane/trainingShapes/no-such-shape"),
        id="shape-unknown",
    ),
    pytest.param(
        create("trainingShape", shape=f"{TINY_CPU}/versions/v9"), id="shape-version-unknown"
    ),
    pytest.param(
        create("acceleratorType", shape=TINY_CPU, tc={"acceleratorType": "CPU"}),
        id="shape-with-accelerator-type",
    ),
    pytest.param(
        create("acceleratorCount", shape=TINY_CPU, tc={"acceleratorCount": 1}),
        id="shape-with-accelerator-count",
    ),
    pytest.param(create("nodeCount", shape=TINY_CPU, nodeCount=1), id="shape-with-node-count"),
    pytest.param(
        create(
            "trainingShape",
            "skipValidations",
            shape=f"{TINY_CPU}/versions/v3-rc",
            status="FAILED_PRECONDITION",
        ),
        id="shape-version-unvalidated",
    ),
    # --- bodies that are not a JSON object
    pytest.param(
        Bad(
            "POST",
            "/rlorTrainerJobs",
            ("JSON",),
            params={"rlorTrainerJobId": "x"},
            content=b"{nope",
        ),
        id="body-not-json",
    ),
    pytest.param(
        Bad(
            "POST", "/rlorTrainerJobs", ("JSON object",), params={"rlorTrainerJobId": "x"}, body=[1]
        ),
        id="body-json-array",
    ),
    # --- listing
    pytest.param(listing("pageSize", pageSize="-1"), id="page-size-negative"),
    pytest.param(listing("pageSize", pageSize="1.5"), id="page-size-fraction"),
    pytest.param(listing("pageSize", pageSize="two"), id="page-size-word"),
    pytest.param(listing("pageToken", pageToken="not-a-token"), id="page-token-garbage"),
    # --- jobs that never existed
    pytest.param(
        Bad("GET", "/rlorTrainerJobs/never-was", ("never-was",), 404, "NOT_FOUND"), id="get-unknown"
    ),
    pytest.param(
        Bad("DELETE", "/rlorTrainerJobs/never-was", ("never-was",), 404, "NOT_FOUND"),
        id="delete-unknown",
    ),
    pytest.param(
        Bad("POST", "/rlorTrainerJobs/never-was:resume", ("never-was",), 404, "NOT_FOUND", body={}),
        id="resume-unknown",
    ),
    pytest.param(
        Bad("GET", "/rlorTrainerJobs/never-was/checkpoints", ("never-was",), 404, "NOT_FOUND"),
        id="checkpoints-of-unknown",
    ),
]


#: Cases that need a live job with a checkpoint and a promoted model (the ``busy`` fixture).
BUSY_CASES = [
    # Resume is only for stopped jobs; a RUNNING one must keep its trainer.
    pytest.param(
        Bad(
            "POST",
            "/rlorTrainerJobs/busy:resume",
            ("busy", "RUNNING"),
            400,
            "FAILED_PRECONDITION",
            body={},
        ),
        id="resume-while-running",
    ),
    pytest.param(
        Bad(
            "POST",
            "/rlorTrainerJobs",
            ("busy",),
            409,
            "ALREADY_EXISTS",
            params={"rlorTrainerJobId": "busy"},
            body=_valid_body(),
        ),
        id="create-existing-id",
    ),
]


def promote(
    model: str,
    *names: str,
    checkpoint: str = "ckpt-1",
    code: int = 400,
    status: str = "INVALID_ARGUMENT",
) -> Bad:
    # ``{a}`` in the output model is filled with the busy account's id when sent.
    body = {
        "output_model": f"accounts/{{a}}/models/{model}",
        "trainer_job_id": "accounts/{a}/rlorTrainerJobs/busy",
    }
    return Bad("POST", f"/checkpoints/{checkpoint}:promote", names, code, status, body=body)


BUSY_CASES += [
    pytest.param(promote("Bad_Model", "output_model"), id="promote-model-id-invalid"),
    pytest.param(promote("m" * 64, "output_model"), id="promote-model-id-64-chars"),
    pytest.param(promote("", "output_model"), id="promote-model-id-empty"),
    pytest.param(
        promote("taken", "taken", code=409, status="ALREADY_EXISTS"), id="promote-onto-existing"
    ),
    pytest.param(
        promote(
            "fresh-model", "no-such-ckpt", checkpoint="no-such-ckpt", code=404, status="NOT_FOUND"
        ),
        id="promote-unknown-checkpoint",
    ),
]


# --------------------------------------------------------------------------- fixtures


@dataclass
class Busy:
    """An account with a RUNNING job that has a checkpoint and a model promoted from it."""

    account: Account
    job_id: str = "busy"
    checkpoint: str = "ckpt-1"
    model: str = "taken"


@pytest.fixture(scope="module")
async def busy(plane: PlaneProcess) -> AsyncIterator[Busy]:
    # Module-scoped: one trainer serves every case that needs a live job.
    async with PlaneAdmin(plane.url, plane.admin_key) as admin:
        account_id, key = await admin.create_account()
    async with PlatformClient(plane.url, key) as client:
        found = Busy(Account(account_id, key, client))
        trainer = await running_trainer(found.account, found.job_id)
        await trainer.model.train(1, 1)
        await trainer.model.save_for_sampler(found.checkpoint)
        await trainer.api.aclose()
        await client.promote_checkpoint(
            found.checkpoint, job_id=found.job_id, output_model_id=found.model
        )
        yield found
        await client.delete_job(found.job_id)
        await wait_state(client, found.job_id, JobState.DELETED)


# ---------------------------------------------------------------------------- helpers


def _fill(value: Any, account_id: str) -> Any:
    """Put the test's account id where a case body says ``{a}``."""
    if isinstance(value, str):
        return value.replace("{a}", account_id)
    if isinstance(value, dict):
        return {k: _fill(v, account_id) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, account_id) for v in value]
    return value


async def send(http: httpx.AsyncClient, account: Account, bad: Bad) -> httpx.Response:
    headers = {"Authorization": f"Bearer {account.api_key}"}
    if bad.content is not None:
        headers["Content-Type"] = "application/json"
        return await http.request(
            bad.method,
            f"/v1/accounts/{account.id}{bad.path}",
            params=bad.params,
            headers=headers,
            content=bad.content,
        )
    return await http.request(
        bad.method,
        f"/v1/accounts/{account.id}{bad.path}",
        params=bad.params,
        headers=headers,
        json=_fill(bad.body, account.id),
    )


def assert_error(response: httpx.Response, code: int, status: str, *names: str) -> None:
    """The contract's error body, exactly: ``{"error": {"code", "status", "message"}}``."""
    where = f"{response.request.method} {response.request.url.path}"
    assert response.status_code == code, f"{where}: {response.text}"
    body = response.json()
    assert set(body) == {"error"}, f"{where}: {body}"
    error = body["error"]
    assert set(error) == {"code", "status", "message"}, error
    assert error["code"] == code
    assert error["status"] == status
    assert isinstance(error["message"], str)
    for name in names:
        assert name in error["message"], f"{name!r} not named in {error['message']!r}"


async def footprint(admin: PlaneAdmin, account: Account) -> dict[str, Any]:
    """What a created job, a started trainer or a resume would change."""
    stats = await admin.stats()
    prefix = f"accounts/{account.id}/"
    return {
        "totals": {k: stats[k] for k in WATCHED_TOTALS},
        "perJob": {
            name: {k: counters.get(k, 0) for k in WATCHED_PER_JOB}
            for name, counters in stats["jobs"].items()
            if name.startswith(prefix)
        },
        "jobs": [
            (job.name, job.state, job.update_time) async for job in account.client.iter_jobs()
        ],
    }


# ------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("bad", CASES)
async def test_invalid_request_is_rejected_and_creates_nothing(
    bad: Bad, account: Account, admin: PlaneAdmin, http: httpx.AsyncClient
) -> None:
    before = await footprint(admin, account)
    response = await send(http, account, bad)
    assert_error(response, bad.code, bad.status, *bad.names)
    after = await footprint(admin, account)
    assert after == before
    assert after["jobs"] == []


@pytest.mark.parametrize("bad", BUSY_CASES)
async def test_invalid_request_on_a_running_job_changes_nothing(
    bad: Bad, busy: Busy, admin: PlaneAdmin, http: httpx.AsyncClient
) -> None:
    account = busy.account
    model_before = await account.client.get_model(busy.model)
    before = await footprint(admin, account)
    response = await send(http, account, bad)
    assert_error(response, bad.code, bad.status, *bad.names)
    after = await footprint(admin, account)
    assert after == before
    assert [state for _, state, _ in after["jobs"]] == [JobState.RUNNING]
    # No model was created or overwritten: the taken id still points at the first promotion.
    assert await account.client.get_model(busy.model) == model_before
    with pytest.raises(NotFound):
        await account.client.get_model("fresh-model")


async def test_unvalidated_shape_version_is_accepted_with_skip_validations(
    account: Account, admin: PlaneAdmin, faults: PlaneAdmin
) -> None:
    # No free slot: the job stays PENDING, so acceptance is proven without booting a trainer.
    await faults.set_faults(capacity=0)
    before = await admin.stats()
    version = f"{TINY_CPU}/versions/v3-rc"
    job = await account.client.create_job(
        "rc-shape", job_request(), training_shape=version, skip_validations=True
    )
    assert job.state is JobState.PENDING
    assert job.training_shape_ref == version
    # The release candidate's own snapshot, not the latest validated one's.
    assert job.training_config.custom_image_tag == "local-0.3-rc"
    assert job.training_config.max_context_length == 16384
    after = await admin.stats()
    assert after["creates"] == before["creates"] + 1
    await account.client.delete_job("rc-shape")
    assert (await account.client.get_job("rc-shape")).state is JobState.DELETED
    assert (await admin.stats())["trainersStarted"] == before["trainersStarted"]
