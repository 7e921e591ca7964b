"""Malformed and invalid requests against a real plane: each one is answered with a 4xx in
the contract's error body (trainer-api.md §1) whose message names the problem, and none of
them leaves anything behind — no job, no trainer, no resume, no model.

The requests go out through raw httpx, because most of them cannot be expressed with the
typed client (wrong types, non-JSON bodies) and because the wire body itself is under test.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
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
    """One invalid request; ``path`` is relative to ``/v1/accounts/{a}`` (to ``/admin/v1``
    with the admin key when ``admin``), where ``{a}`` is the test's account id."""

    method: str
    path: str
    names: tuple[str, ...]  # what the message must mention
    code: int = 400
    status: str = "INVALID_ARGUMENT"
    params: dict[str, str] = field(default_factory=dict)
    body: Any = None
    content: bytes | None = None
    admin: bool = False


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
    code: int = 400,
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
    return Bad("POST", "/rlorTrainerJobs", names, code, status, params=params, body=body)


def listing(*names: str, **params: str) -> Bad:
    return Bad("GET", "/rlorTrainerJobs", names, params=params)


def page_token(payload: bytes) -> str:
    """A token shaped like the plane's own (urlsafe base64 of JSON) around any payload."""
    return base64.urlsafe_b64encode(payload).decode().rstrip("=")


def raw_create(content: bytes, *names: str) -> Bad:
    return Bad("POST", "/rlorTrainerJobs", names, params={"rlorTrainerJobId": "x"}, content=content)


#: Nesting far beyond any request of the contract (and beyond Python's recursion limit).
DEEP_ARRAY = b"[" * 10_000 + b"]" * 10_000
DEEP_OBJECT = b'{"a":' * 10_000 + b"1" + b"}" * 10_000
#: An integer longer than Python converts from text by default (4300 digits).
LONG_NUMBER = b"1" + b"0" * 5000


def admin_call(method: str, path: str, *names: str, body: Any = None, **kw: Any) -> Bad:
    return Bad(method, path, names, body=body, admin=True, **kw)


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
    # --- base models localplane cannot serve (issue 17)
    pytest.param(
        create(
            "baseModel",
            "not a model localplane serves",
            tc={"baseModel": "accounts/fireworks/models/no-such-model"},
        ),
        id="base-model-unknown",
    ),
    pytest.param(
        create("baseModel", tc={"baseModel": "accounts/fireworks/models/QWEN3-8B"}),
        id="base-model-uppercase",
    ),
    pytest.param(
        create(
            "baseModel",
            "another account",
            tc={"baseModel": "accounts/someone-else/models/theirs"},
            code=403,
            status="PERMISSION_DENIED",
        ),
        id="base-model-other-account",
    ),
    pytest.param(
        create("baseModel", "load its checkpoint", tc={"baseModel": "accounts/{a}/models/mine"}),
        id="base-model-own-promoted",
    ),
    pytest.param(
        create("hotLoadDeploymentId", "does not exist", hotLoadDeploymentId="no-such-deployment"),
        id="hot-load-deployment-missing",
    ),
    # --- deployments
    pytest.param(
        Bad(
            "POST",
            "/deployments",
            ("baseModel",),
            params={"deploymentId": "d1"},
            body={"baseModel": "accounts/fireworks/models/nope"},
        ),
        id="deployment-base-model-unknown",
    ),
    pytest.param(
        Bad(
            "POST",
            "/deployments",
            ("deploymentId",),
            params={"deploymentId": "Bad_Id"},
            body={"baseModel": BASE_MODEL},
        ),
        id="deployment-id-invalid",
    ),
    pytest.param(
        Bad(
            "POST",
            "/deployments",
            ("extraArgs", "maxReplicaCount", "hotLoadTrainerJob"),
            params={"deploymentId": "d2"},
            body={
                "baseModel": BASE_MODEL,
                "extraArgs": ["--x"],
                "maxReplicaCount": -1,
                "hotLoadTrainerJob": "accounts/{a}/rlorTrainerJobs/never-was",
            },
        ),
        id="deployment-bad-fields",
    ),
    pytest.param(
        Bad("GET", "/deployments/never-was", ("never-was",), 404, "NOT_FOUND"),
        id="deployment-unknown",
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
    # Offsets past SQLite's integer range, that are not integers, or tokens that are not JSON
    # objects: none of them a token the plane issued.
    pytest.param(
        listing("pageToken", pageToken=page_token(json.dumps({"o": 10**30}).encode())),
        id="page-token-huge-offset",
    ),
    pytest.param(
        listing("pageToken", pageToken=page_token(json.dumps({"o": 2**63}).encode())),
        id="page-token-offset-past-int64",
    ),
    pytest.param(
        listing("pageToken", pageToken=page_token(b'{"o": true}')), id="page-token-bool-offset"
    ),
    pytest.param(
        listing("pageToken", pageToken=page_token(b"[" * 3000)), id="page-token-deeply-nested"
    ),
    pytest.param(
        listing("pageToken", pageToken=page_token(b'{"o": ' + LONG_NUMBER + b"}")),
        id="page-token-number-too-long",
    ),
    pytest.param(
        Bad("GET", "/rlorTrainerJobs:watch", ("Last-Event-ID",), params={"since": "9" * 40}),
        id="watch-since-past-int64",
    ),
    pytest.param(
        Bad("GET", "/rlorTrainerJobs:watch", ("Last-Event-ID",), params={"since": "-1"}),
        id="watch-since-negative",
    ),
    # --- bodies the JSON parser itself refuses
    pytest.param(raw_create(DEEP_ARRAY, "JSON", "nested"), id="body-deeply-nested-array"),
    pytest.param(raw_create(DEEP_OBJECT, "JSON", "nested"), id="body-deeply-nested-object"),
    pytest.param(
        raw_create(b'{"trainingConfig": {"loraRank": ' + LONG_NUMBER + b"}}", "JSON", "digits"),
        id="body-number-too-long",
    ),
    pytest.param(raw_create(b'{"displayName": "\xff"}', "JSON", "UTF-8"), id="body-not-utf8"),
    # --- extraArgs the trainer could not live with
    pytest.param(
        create("extraArgs", "--compute-delay-ms", tc={"extraArgs": ["--compute-delay-ms=inf"]}),
        id="extra-args-delay-infinite",
    ),
    pytest.param(
        create("extraArgs", "--compute-delay-ms", tc={"extraArgs": ["--compute-delay-ms=nan"]}),
        id="extra-args-delay-nan",
    ),
    pytest.param(
        create(
            "extraArgs",
            "--retrieve-hold-seconds",
            tc={"extraArgs": ["--retrieve-hold-seconds=1e400"]},
        ),
        id="extra-args-hold-overflows",
    ),
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


#: Datasets: localplane's trainers read none (clients send tokens), so the plane keeps a
#: dataset only as a name in the caller's own account and never touches a path or a URL.
DATASET_CASES = [
    pytest.param(
        create(
            "dataset",
            "another account",
            dataset="accounts/other/datasets/secret",
            code=403,
            status="PERMISSION_DENIED",
        ),
        id="dataset-of-another-account",
    ),
    pytest.param(create("dataset", dataset="file:///etc/passwd"), id="dataset-host-file-uri"),
    pytest.param(create("dataset", dataset="/etc/passwd"), id="dataset-host-path"),
    pytest.param(create("dataset", dataset="gs://bucket/data.jsonl"), id="dataset-bucket-url"),
    pytest.param(
        create("dataset", dataset="accounts/{a}/datasets/Bad_Id"), id="dataset-id-invalid"
    ),
    pytest.param(create("dataset", dataset="accounts/{a}/datasets/x/../y"), id="dataset-traversal"),
]
CASES += DATASET_CASES

#: Admin requests (``path`` relative to ``/admin/v1``): wrong JSON types, non-object bodies.
ADMIN_CASES = [
    pytest.param(
        admin_call("POST", "/accounts", "accountId", body={"accountId": 123}),
        id="account-id-number",
    ),
    pytest.param(
        admin_call("POST", "/accounts", "accountId", body={"accountId": ["a"]}),
        id="account-id-list",
    ),
    pytest.param(
        admin_call("POST", "/accounts", "keyStyle", body={"keyStyle": 5}), id="key-style-number"
    ),
    pytest.param(admin_call("POST", "/accounts", "JSON object", body=[1]), id="account-body-array"),
    pytest.param(
        admin_call("POST", "/accounts", "JSON", "nested", content=DEEP_OBJECT),
        id="account-body-deeply-nested",
    ),
    pytest.param(
        admin_call("POST", "/accounts/{a}/apiKeys", "JSON object", body=[1]),
        id="api-key-body-array",
    ),
    pytest.param(
        admin_call(
            "POST", "/faults", "outage.durationSeconds", body={"outage": {"durationSeconds": 1e308}}
        ),
        id="faults-outage-overflows",
    ),
    pytest.param(
        admin_call(
            "POST",
            "/faults",
            "outage.startInSeconds",
            body={"outage": {"durationSeconds": 1, "startInSeconds": 1e12}},
        ),
        id="faults-outage-start-overflows",
    ),
    pytest.param(
        admin_call(
            "POST", "/faults", "JSON", "digits", content=b'{"capacity": ' + LONG_NUMBER + b"}"
        ),
        id="faults-number-too-long",
    ),
    pytest.param(
        admin_call("POST", "/faults", "JSON", "nested", content=DEEP_ARRAY),
        id="faults-deeply-nested",
    ),
    pytest.param(
        admin_call(
            "POST",
            "/webhooks",
            "url",
            body={"url": "http://\x00", "secret": "s" * 16},
        ),
        id="webhook-url-unparseable",
    ),
    pytest.param(
        admin_call("POST", "/webhooks", "url", body={"url": "http://", "secret": "s" * 16}),
        id="webhook-url-no-host",
    ),
    pytest.param(
        admin_call(
            "POST",
            "/webhooks",
            "accountId",
            body={"url": "http://127.0.0.1:9/", "secret": "s" * 16, "accountId": {"a": 1}},
        ),
        id="webhook-account-id-object",
    ),
    pytest.param(
        admin_call(
            "POST",
            "/rlorTrainerJobs/never-was:stop",
            "message",
            body={"state": "JOB_STATE_CANCELLED", "message": {"a": 1}},
        ),
        id="stop-message-object",
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


async def send(
    http: httpx.AsyncClient, account: Account, bad: Bad, admin_key: str = ""
) -> httpx.Response:
    key, prefix = (admin_key, "/admin/v1") if bad.admin else (account.api_key, "/v1/accounts/{a}")
    headers = {"Authorization": f"Bearer {key}"}
    if bad.content is not None:
        headers["Content-Type"] = "application/json"
    request = http.build_request(
        bad.method,
        _fill(prefix + bad.path, account.id),
        params=bad.params,
        headers=headers,
        content=bad.content,
        json=None if bad.content is not None else _fill(bad.body, account.id),
    )
    response = await http.send(request, stream=True)
    try:
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            # An accepted watch streams forever: what it answered is all a test needs.
            return httpx.Response(response.status_code, text="<event stream>", request=request)
        await response.aread()
        return response
    finally:
        await response.aclose()


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


@pytest.mark.parametrize("bad", ADMIN_CASES)
async def test_invalid_admin_request_is_rejected_and_changes_nothing(
    bad: Bad, account: Account, faults: PlaneAdmin, http: httpx.AsyncClient, plane: PlaneProcess
) -> None:
    config, hooks = await faults.faults(), await faults.webhooks()
    before = await footprint(faults, account)
    response = await send(http, account, bad, plane.admin_key)
    assert_error(response, bad.code, bad.status, *bad.names)
    assert await footprint(faults, account) == before
    assert await faults.faults() == config
    assert await faults.webhooks() == hooks


async def test_dataset_errors_do_not_tell_whether_a_host_path_exists(
    account: Account, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    there = tmp_path / "data.jsonl"
    there.write_text('{"text": "x"}\n')
    messages = set()
    for path in (there, tmp_path / "missing.jsonl", tmp_path):
        for ref in (str(path), f"file://{path}"):
            bad = create("dataset", dataset=ref)
            response = await send(http, account, bad)
            assert_error(response, 400, "INVALID_ARGUMENT", "dataset")
            message = response.json()["error"]["message"]
            assert str(tmp_path) not in message
            messages.add(message)
    assert len(messages) == 1, messages


async def test_dataset_of_another_existing_account_is_refused_like_a_missing_one(
    account: Account, admin: PlaneAdmin, http: httpx.AsyncClient
) -> None:
    other, _ = await admin.create_account()
    for owner in (other, "no-such-account"):
        bad = create("dataset", owner, dataset=f"accounts/{owner}/datasets/secret")
        response = await send(http, account, bad)
        assert_error(response, 403, "PERMISSION_DENIED", "dataset", owner)
    assert [job async for job in account.client.iter_jobs()] == []


async def test_dataset_of_the_callers_own_account_is_kept_as_a_name(account: Account) -> None:
    name = f"accounts/{account.id}/datasets/support-chat"
    job = await account.client.create_job("own-dataset", job_request(dataset=name))
    assert job.dataset == name
    await account.client.delete_job("own-dataset")


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
