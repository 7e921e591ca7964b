"""Every control-plane endpoint of trainer-api.md §2 against a real plane, through the
typed client where it can express the call: the answer on success, the typed error on
failure, and the plane's own counters to prove what was (not) created, started or deleted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd.platform import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PlatformClient,
)
from shepherd.platform.models import Checkpoint, ShapeSnapshot
from shepherd.states import JobState
from tests.helpers import (
    BASE_MODEL,
    Account,
    Trainer,
    gateway_api,
    job_request,
    running_trainer,
    wait_state,
    warm,
)

TINY_CPU = "accounts/localplane/trainingShapes/tiny-cpu"
FIREWORKS_SHAPE = "accounts/fireworks/trainingShapes/qwen3-8b-128k-h200"
LORA_RANK = 4


# --------------------------------------------------------------------------- fixtures


@dataclass
class Trained:
    """A RUNNING LoRA job with checkpoints ``step-1`` … ``step-5``, one per step."""

    account: Account
    trainer: Trainer
    job_id: str = "trained"
    steps: int = 5

    def checkpoint_name(self, checkpoint_id: str) -> str:
        return (
            f"accounts/{self.account.id}/rlorTrainerJobs/{self.job_id}/checkpoints/{checkpoint_id}"
        )


@pytest.fixture(scope="module")
async def trained(plane: PlaneProcess) -> AsyncIterator[Trained]:
    # Module-scoped: one trainer and its checkpoints serve the listing and promotion tests.
    async with PlaneAdmin(plane.url, plane.admin_key) as admin:
        account_id, key = await admin.create_account()
    async with PlatformClient(plane.url, key) as client:
        account = Account(account_id, key, client)
        trainer = await running_trainer(
            account, "trained", training_config={"lora_rank": LORA_RANK}
        )
        found = Trained(account, trainer)
        for step in range(1, found.steps + 1):
            await trainer.model.train(step, step)
            # Both kinds under one name (as the Tinker cookbook saves): resumable and promotable.
            await trainer.model.save(f"step-{step}")
            await trainer.model.save_for_sampler(f"step-{step}")
        yield found
        await trainer.api.aclose()
        await client.delete_job(found.job_id)
        await wait_state(client, found.job_id, JobState.DELETED)


# ---------------------------------------------------------------------------- helpers


def assert_error(response: httpx.Response, code: int, status: str) -> None:
    """The contract's error body, exactly: ``{"error": {"code", "status", "message"}}``."""
    where = f"{response.request.method} {response.request.url.path}"
    assert response.status_code == code, f"{where}: {response.text}"
    body = response.json()
    assert set(body) == {"error"}, f"{where}: {body}"
    assert set(body["error"]) == {"code", "status", "message"}, body
    assert body["error"]["code"] == code
    assert body["error"]["status"] == status
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


async def all_checkpoints(
    client: PlatformClient, job_id: str, page_size: int
) -> list[list[Checkpoint]]:
    """Every page of a job's checkpoint listing; the last one ends with an empty token."""
    pages: list[list[Checkpoint]] = []
    token: str | None = None
    for _ in range(50):  # bounded: a token that never empties fails the test, not hangs it
        page = await client.list_checkpoints(job_id, page_size=page_size, page_token=token)
        pages.append(page.checkpoints)
        if not page.next_page_token:
            return pages
        token = page.next_page_token
    raise AssertionError("checkpoint listing never ended")


# --------------------------------------------------------------------------- accounts


async def test_accounts_resolve_the_key_to_its_account(
    account: Account, plane: PlaneProcess, http: httpx.AsyncClient
) -> None:
    accounts = await account.client.list_accounts(page_size=2)
    assert [a.name for a in accounts] == [f"accounts/{account.id}"]
    raw = await http.get(
        "/v1/accounts",
        params={"pageSize": 2},
        headers={"Authorization": f"Bearer {account.api_key}"},
    )
    assert raw.status_code == 200
    assert raw.json() == {"accounts": [{"name": f"accounts/{account.id}"}]}
    # A client given only the key finds its account by itself.
    async with PlatformClient(plane.url, account.api_key) as fresh:
        assert await fresh.account_id() == account.id


# ---------------------------------------------------------------------------- create


async def test_create_on_the_shape_path_uses_the_latest_validated_version(
    account: Account, admin: PlaneAdmin
) -> None:
    job = await account.client.create_job("shaped", job_request(), training_shape=TINY_CPU)
    assert job.name == f"accounts/{account.id}/rlorTrainerJobs/shaped"
    assert job.state in (JobState.PENDING, JobState.CREATING)
    assert job.training_shape_ref == f"{TINY_CPU}/versions/v2"
    tc = job.training_config
    # As sent …
    assert (tc.base_model, tc.lora_rank, tc.learning_rate) == (BASE_MODEL, 0, 3e-3)
    # … plus what the shape decides.
    assert (tc.accelerator_type, tc.accelerator_count) == ("CPU", 1)
    assert tc.custom_image_tag == "local-0.2"
    assert tc.max_context_length == 8192
    assert job.model_extra is not None and job.model_extra["nodeCount"] == 1
    assert job.service_mode is True and job.forward_only is False
    assert job.create_time is not None and job.update_time is not None

    got = await account.client.get_job("shaped")
    assert (got.name, got.training_shape_ref, got.training_config) == (
        job.name,
        job.training_shape_ref,
        job.training_config,
    )
    await wait_state(account.client, "shaped", JobState.RUNNING)
    stats = await admin.job_stats(job.name)
    assert (stats["creates"], stats["trainersStarted"], stats["liveTrainer"]) == (1, 1, True)


async def test_create_on_the_manual_path(account: Account, faults: PlaneAdmin) -> None:
    # No free slot: the job stays PENDING; what is under test is the stored request.
    await faults.set_faults(capacity=0)
    request = job_request(
        display_name="by hand",
        node_count=1,
        training_config={
            "accelerator_type": "CPU",
            "accelerator_count": 1,
            "max_context_length": 2048,
        },
    )
    job = await account.client.create_job("manual", request)
    assert job.state is JobState.PENDING
    assert job.training_shape_ref is None
    assert job.display_name == "by hand"
    tc = job.training_config
    assert (tc.accelerator_type, tc.accelerator_count, tc.max_context_length) == ("CPU", 1, 2048)
    assert (tc.base_model, tc.lora_rank) == (BASE_MODEL, 0)
    assert await account.client.get_job("manual") == job
    # Deleted here, while no slot is free: a PENDING job goes without ever starting a trainer.
    deleted = await account.client.delete_job("manual")
    assert deleted is not None and deleted.state is JobState.DELETED


async def test_create_is_idempotent_by_client_chosen_id(
    account: Account, admin: PlaneAdmin
) -> None:
    before = await admin.stats()
    first = await account.client.create_job("twice", job_request(display_name="first"))
    with pytest.raises(AlreadyExists) as conflict:
        await account.client.create_job("twice", job_request(display_name="second"))
    assert (conflict.value.status_code, conflict.value.status) == (409, "ALREADY_EXISTS")
    assert "twice" in conflict.value.message

    # The repeat changed nothing: one job, the first request's, one trainer.
    assert [job.name async for job in account.client.iter_jobs()] == [first.name]
    job = await wait_state(account.client, "twice", JobState.RUNNING)
    assert job.display_name == "first"
    after = await admin.stats()
    assert after["creates"] == before["creates"] + 1
    assert after["createConflicts"] == before["createConflicts"] + 1
    stats = after["jobs"][first.name]
    assert (stats["creates"], stats["createConflicts"], stats["trainersStarted"]) == (1, 1, 1)


# ------------------------------------------------------------------------ list / get


async def test_list_pages_through_every_job_exactly_once(
    account: Account, admin: PlaneAdmin, faults: PlaneAdmin
) -> None:
    # No slots and an immediate delete: listing is under test, no trainer is needed.
    await faults.set_faults(capacity=0)
    started = (await admin.stats())["trainersStarted"]
    ids = [f"page-{i}" for i in range(5)]
    for job_id in ids:
        await account.client.create_job(job_id, job_request())
        await account.client.delete_job(job_id)

    pages = []
    token: str | None = None
    for _ in range(10):  # bounded: a token that never empties fails the test
        page = await account.client.list_jobs(page_size=2, page_token=token)
        pages.append([job.job_id for job in page.rlor_trainer_jobs])
        token = page.next_page_token
        if not token:
            break
    assert [len(p) for p in pages] == [2, 2, 1]
    listed = [job_id for page in pages for job_id in page]
    assert sorted(listed) == ids  # no job missed, none twice
    assert token == ""

    everything = await account.client.list_jobs()
    assert sorted(j.job_id for j in everything.rlor_trainer_jobs) == ids
    assert everything.next_page_token == ""
    assert (await admin.stats())["trainersStarted"] == started


async def test_get_unknown_job_is_not_found(account: Account) -> None:
    with pytest.raises(NotFound) as missing:
        await account.client.get_job("never-was")
    assert (missing.value.status_code, missing.value.status) == (404, "NOT_FOUND")
    assert "never-was" in missing.value.message


# ---------------------------------------------------------------------------- delete


async def test_delete_twice_leaves_a_tombstone_whose_id_is_never_reused(
    account: Account, admin: PlaneAdmin
) -> None:
    live_before = (await admin.stats())["liveTrainers"]
    created = await account.client.create_job("short-lived", job_request())
    await wait_state(account.client, "short-lived", JobState.RUNNING)

    deleted = await account.client.delete_job("short-lived")
    assert deleted is not None and deleted.state in (JobState.DELETING, JobState.DELETED)
    await wait_state(account.client, "short-lived", JobState.DELETED)
    again = await account.client.delete_job("short-lived")  # deleting twice is fine
    assert again is not None and again.state is JobState.DELETED

    with pytest.raises(AlreadyExists) as reused:
        await account.client.create_job("short-lived", job_request())
    assert (reused.value.status_code, reused.value.status) == (409, "ALREADY_EXISTS")
    tombstone = await account.client.get_job("short-lived")
    assert tombstone.state is JobState.DELETED
    assert tombstone.create_time == created.create_time  # the original, not a new job

    # A tombstone cannot be resumed: no trainer will ever serve this id again.
    with pytest.raises(FailedPrecondition) as refused:
        await account.client.resume_job("short-lived")
    assert (refused.value.status_code, refused.value.status) == (400, "FAILED_PRECONDITION")

    stats = await admin.stats()
    job = stats["jobs"][created.name]
    assert (job["creates"], job["trainersStarted"], job["deletes"], job["deleteCalls"]) == (
        1,
        1,
        1,
        2,
    )
    assert job.get("resumes", 0) == 0
    assert job["liveTrainer"] is False
    assert stats["liveTrainers"] == live_before


# ---------------------------------------------------------------------------- resume


async def test_resume_starts_a_fresh_trainer_for_the_same_id(
    account: Account, admin: PlaneAdmin
) -> None:
    await account.client.create_job("comeback", job_request())
    await wait_state(account.client, "comeback", JobState.RUNNING)
    first = await admin.job("comeback", account=account.id)
    await admin.stop(
        "comeback", JobState.CANCELLED.value, "cancelled on the console", account=account.id
    )
    await wait_state(account.client, "comeback", JobState.CANCELLED)

    resumed = await account.client.resume_job("comeback")
    assert resumed.state in (JobState.PENDING, JobState.CREATING)
    # Synchronous: no GET after the resume may show the old state.
    assert (await account.client.get_job("comeback")).state in (
        JobState.PENDING,
        JobState.CREATING,
        JobState.RUNNING,
    )
    await wait_state(account.client, "comeback", JobState.RUNNING)
    async with gateway_api(account, "comeback") as api:
        await warm(api)  # the new route serves, once the route race settles
        assert (await api.healthz())["status"] == "ok"

    second = await admin.job("comeback", account=account.id)
    assert second["trainer"]["pid"] != first["trainer"]["pid"]
    assert second["generation"] == first["generation"] + 1
    stats = await admin.job_stats(resumed.name)
    assert (stats["creates"], stats["resumes"], stats["trainersStarted"]) == (1, 1, 2)


# ----------------------------------------------------------------------- checkpoints


async def test_checkpoints_are_listed_oldest_first_across_pages(trained: Trained) -> None:
    client = trained.account.client
    pages = await all_checkpoints(client, trained.job_id, page_size=2)
    assert [len(p) for p in pages] == [2, 2, 1]
    checkpoints = [c for page in pages for c in page]
    assert [c.name for c in checkpoints] == [
        trained.checkpoint_name(f"step-{n}") for n in range(1, trained.steps + 1)
    ]
    assert [c.step for c in checkpoints] == list(range(1, trained.steps + 1))
    assert all(
        c.promotable and c.checkpoint_type == "CHECKPOINT_TYPE_INFERENCE_LORA" for c in checkpoints
    )
    times = [c.create_time for c in checkpoints]
    assert None not in times and times == sorted(times)  # type: ignore[type-var]

    with pytest.raises(InvalidArgument) as bad_token:
        await client.list_checkpoints(trained.job_id, page_token="not-a-token")
    assert (bad_token.value.status_code, bad_token.value.status) == (400, "INVALID_ARGUMENT")
    assert "pageToken" in bad_token.value.message


async def test_delete_checkpoint_extension(trained: Trained) -> None:
    client = trained.account.client
    await trained.trainer.model.save("scratch")
    assert trained.checkpoint_name("scratch") in [
        c.name async for c in client.iter_checkpoints("trained")
    ]

    await client.delete_checkpoint("trained", "scratch")
    names = [c.name async for c in client.iter_checkpoints("trained")]
    assert trained.checkpoint_name("scratch") not in names
    assert len(names) == trained.steps  # the others are untouched
    with pytest.raises(NotFound) as gone:
        await client.delete_checkpoint("trained", "scratch")
    assert (gone.value.status_code, gone.value.status) == (404, "NOT_FOUND")
    assert "scratch" in gone.value.message
    with pytest.raises(NotFound):
        await client.promote_checkpoint("scratch", job_id="trained", output_model_id="from-scratch")


async def test_checkpoints_outlive_their_job_and_stay_promotable(account: Account) -> None:
    trainer = await running_trainer(account, "doomed")
    await trainer.model.train(1, 2)
    await trainer.model.save_for_sampler("final")
    await trainer.api.aclose()
    saved_name = f"accounts/{account.id}/rlorTrainerJobs/doomed/checkpoints/final"
    await account.client.delete_job("doomed")
    await wait_state(account.client, "doomed", JobState.DELETED)

    listed = [c async for c in account.client.iter_checkpoints("doomed")]
    assert [(c.name, c.step) for c in listed] == [(saved_name, 2)]

    answer = await account.client.promote_checkpoint(
        "final", job_id="doomed", output_model_id="after-delete"
    )
    assert answer.model is not None
    assert (answer.model.state, answer.model.checkpoint) == ("READY", saved_name)
    assert (await account.client.get_model("after-delete")).state == "READY"


# ------------------------------------------------------------------------- promotion


async def test_promote_synchronously(trained: Trained) -> None:
    client = trained.account.client
    answer = await client.promote_checkpoint(
        "step-2", job_id=trained.job_id, output_model_id="sync-model", base_model=BASE_MODEL
    )
    assert answer.operation is None and answer.model is not None
    model = answer.model
    assert model.name == f"accounts/{trained.account.id}/models/sync-model"
    assert model.state == "READY"
    assert model.kind == "HF_PEFT_ADDON"  # a LoRA checkpoint becomes an add-on of its base
    assert model.base_model == BASE_MODEL
    assert model.checkpoint == trained.checkpoint_name("step-2")
    assert model.peft_details is not None and model.peft_details.r == LORA_RANK
    assert await client.get_model("sync-model") == model

    # Promotion refuses a base model the checkpoint was not trained on.
    with pytest.raises(InvalidArgument) as mismatch:
        await client.promote_checkpoint(
            "step-2", job_id=trained.job_id, output_model_id="wrong-base", base_model="other/model"
        )
    assert "base_model" in mismatch.value.message
    with pytest.raises(NotFound):
        await client.get_model("wrong-base")


async def test_promote_asynchronously(trained: Trained) -> None:
    client = trained.account.client
    answer = await client.promote_checkpoint(
        "step-3", job_id=trained.job_id, output_model_id="async-model", async_promotion=True
    )
    assert answer.model is None and answer.operation is not None
    operation = answer.operation
    assert operation.name.startswith(f"accounts/{trained.account.id}/operations/")
    async with asyncio.timeout(15):  # bounded: the plane takes promotionSeconds (0.2 s)
        while not operation.done:
            await asyncio.sleep(0.05)
            operation = await client.get_operation(operation.name)
    assert operation.error is None and operation.response is not None
    assert operation.response.name == f"accounts/{trained.account.id}/models/async-model"
    assert operation.response.state == "READY"
    assert operation.response.checkpoint == trained.checkpoint_name("step-3")
    model = await client.get_model("async-model")
    assert (model.state, model.checkpoint) == ("READY", trained.checkpoint_name("step-3"))

    with pytest.raises(NotFound) as missing:
        await client.get_operation("no-such-operation")
    assert (missing.value.status_code, missing.value.status) == (404, "NOT_FOUND")


async def test_get_unknown_model_is_not_found(account: Account) -> None:
    with pytest.raises(NotFound) as missing:
        await account.client.get_model("no-such-model")
    assert (missing.value.status_code, missing.value.status) == (404, "NOT_FOUND")
    assert "no-such-model" in missing.value.message


# ---------------------------------------------------------------------------- shapes


async def test_latest_validated_shape_version(account: Account, http: httpx.AsyncClient) -> None:
    latest = await account.client.latest_shape_version(TINY_CPU)
    # v3-rc is newer but not validated.
    assert latest.name == f"{TINY_CPU}/versions/v2"
    raw = await http.get(
        f"/v1/{TINY_CPU}/versions",
        params={"filter": "latest_validated=true", "pageSize": 1},
        headers={"Authorization": f"Bearer {account.api_key}"},
    )
    assert raw.status_code == 200
    assert [v["name"] for v in raw.json()["trainingShapeVersions"]] == [latest.name]


async def test_shape_version_carries_every_snapshot_field(account: Account) -> None:
    version = await account.client.get_shape_version(f"{TINY_CPU}/versions/v1")
    assert version.name == f"{TINY_CPU}/versions/v1"
    snap = version.snapshot
    assert snap.model_fields_set == set(ShapeSnapshot.model_fields)  # all of them on the wire
    assert snap.trainer_image_tag == "local-0.1"
    assert snap.max_supported_context_length == 4096
    assert (snap.accelerator_type, snap.accelerator_count, snap.node_count) == ("CPU", 1, 1)
    assert snap.base_model_weight_precision == "BF16"
    assert snap.trainer_sharding_scheme is not None
    assert snap.trainer_sharding_scheme.pipeline_parallelism == 1
    assert snap.trainer_mode == "TRAINER_MODE_TRAIN"
    assert snap.deployment_shape_version is not None and snap.deployment_image_tag is not None


async def test_public_shapes_are_readable_by_any_account(
    account: Account, plane: PlaneProcess
) -> None:
    async with PlatformClient(plane.url, plane.api_key) as dev:
        for client in (account.client, dev):
            latest = await client.latest_shape_version(FIREWORKS_SHAPE)
            assert latest.name == f"{FIREWORKS_SHAPE}/versions/rc7d2k1a"
            assert latest.snapshot.accelerator_type == "NVIDIA_H200_141GB"
            assert (await client.get_shape_version(latest.name)) == latest


async def test_unknown_shape_is_not_found(account: Account) -> None:
    with pytest.raises(NotFound) as no_shape:
        await account.client.latest_shape_version(
            "accounts/localplane/trainingShapes/no-such-shape"
        )
    assert (no_shape.value.status_code, no_shape.value.status) == (404, "NOT_FOUND")
    with pytest.raises(NotFound) as no_version:
        await account.client.get_shape_version(f"{TINY_CPU}/versions/v9")
    assert (no_version.value.status_code, no_version.value.status) == (404, "NOT_FOUND")


# ------------------------------------------------------------------------------ auth


#: One raw call: method, path, and httpx keyword arguments (params, json).
Call = tuple[str, str, dict[str, Any]]


def _account_calls(victim: str) -> list[Call]:
    """Every account-scoped control-plane call, aimed at ``victim``'s job ``victim-job``."""
    base = f"/v1/accounts/{victim}"
    job = f"{base}/rlorTrainerJobs/victim-job"
    return [
        ("GET", f"{base}/rlorTrainerJobs", {}),
        (
            "POST",
            f"{base}/rlorTrainerJobs",
            {"params": {"rlorTrainerJobId": "intruder"}, "json": job_request().wire()},
        ),
        ("GET", job, {}),
        ("DELETE", job, {}),
        ("POST", f"{job}:resume", {"json": {}}),
        ("GET", f"{job}/checkpoints", {}),
        ("DELETE", f"{job}/checkpoints/c", {}),
        (
            "POST",
            f"{base}/checkpoints/c:promote",
            {"json": {"output_model": f"accounts/{victim}/models/m", "trainer_job_id": job[4:]}},
        ),
        ("GET", f"{base}/operations/o", {}),
        ("GET", f"{base}/models/m", {}),
        ("GET", f"{base}/rlorTrainerJobs:watch", {}),
    ]


#: Calls that need a key but no particular account.
_KEY_ONLY_CALLS: list[Call] = [
    ("GET", "/v1/accounts", {"params": {"pageSize": 2}}),
    ("GET", f"/v1/{TINY_CPU}/versions", {}),
    ("GET", f"/v1/{FIREWORKS_SHAPE}/versions/rc7d2k1a", {}),
    ("GET", "/admin/v1/stats", {}),
]


@pytest.mark.parametrize(
    ("who", "code", "status"),
    [
        pytest.param("missing", 401, "UNAUTHENTICATED", id="missing-key"),
        pytest.param("unknown", 401, "UNAUTHENTICATED", id="unknown-key"),
        pytest.param("not-bearer", 401, "UNAUTHENTICATED", id="not-a-bearer-key"),
        pytest.param("other-account", 403, "PERMISSION_DENIED", id="another-accounts-key"),
        pytest.param("admin", 403, "PERMISSION_DENIED", id="admin-key-on-v1"),
    ],
)
async def test_account_calls_need_that_accounts_key(
    who: str,
    code: int,
    status: str,
    account: Account,
    admin: PlaneAdmin,
    faults: PlaneAdmin,
    plane: PlaneProcess,
    http: httpx.AsyncClient,
) -> None:
    # The victim's job waits for a slot, so an unauthorized resume/delete would show.
    await faults.set_faults(capacity=0)
    victim = await account.client.create_job("victim-job", job_request())
    _, other_key = await admin.create_account()
    headers = {
        "missing": {},
        "unknown": {"Authorization": "Bearer lp_no-such-key"},
        "not-bearer": {"Authorization": f"Basic {account.api_key}"},
        "other-account": {"Authorization": f"Bearer {other_key}"},
        "admin": {"Authorization": f"Bearer {plane.admin_key}"},
    }[who]
    before = await admin.stats()
    calls = _account_calls(account.id)
    if who in ("missing", "unknown", "not-bearer"):
        calls += _KEY_ONLY_CALLS
    if who == "admin":
        # The admin key belongs to no account: it cannot even list one.
        calls.append(("GET", "/v1/accounts", {"params": {"pageSize": 2}}))
    for method, path, kwargs in calls:
        response = await http.request(method, path, headers=headers, **kwargs)
        assert_error(response, code, status)

    after = await admin.stats()
    for counter in ("creates", "resumes", "deletes", "deleteCalls", "trainersStarted"):
        assert after[counter] == before[counter], counter
    assert [job.name async for job in account.client.iter_jobs()] == [victim.name]
    assert (await account.client.get_job("victim-job")).state is JobState.PENDING
    # Deleted here, while no slot is free, so the victim never starts a trainer.
    await account.client.delete_job("victim-job")


async def test_admin_api_refuses_a_user_key(
    account: Account, faults: PlaneAdmin, http: httpx.AsyncClient
) -> None:
    headers = {"Authorization": f"Bearer {account.api_key}"}
    config = await faults.faults()
    calls: list[Call] = [
        ("GET", "/admin/v1/stats", {}),
        ("GET", "/admin/v1/faults", {}),
        ("POST", "/admin/v1/faults", {"json": {"capacity": 999}}),
        ("POST", "/admin/v1/accounts", {"json": {}}),
    ]
    for method, path, kwargs in calls:
        response = await http.request(method, path, headers=headers, **kwargs)
        assert_error(response, 403, "PERMISSION_DENIED")
    assert await faults.faults() == config  # the refused POST changed nothing
