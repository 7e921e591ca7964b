"""The unmodified tinker-cookbook (0.5.8) against localplane directly, offline
(tests/plane/cookbook_support.py): ``math_rl`` with StableReinforce and with CISPO, and the DPO
trainer (``forward_backward_custom`` plus the reference sampler's ``compute_logprobs``) with
periodic and rolling checkpoints; then the REST surface the cookbook uses, through the
tinker SDK's own ``RestClient``: training runs by tinker path (the renderer in
``user_metadata``), checkpoint listing and deletion, TTLs expiring, sessions, server
capabilities. Self-distillation (``recipes/sdft``): the teacher's top-k prompt logprobs and
cross_entropy on [T, K] soft targets, forward KL and reverse KL (a client-side loss)."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import datasets
import pytest
import tinker

from tests.plane import cookbook_support as cb
from tests.plane.sdk_support import RESULT_TIMEOUT, PlaneHttp, SdkAccount

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MATH_RL = [
    "env=arithmetic",
    f"model_name={cb.MODEL}",
    "group_size=2",
    "groups_per_batch=2",
    "max_tokens=4",
    "max_steps=2",
    "eval_every=0",
    "save_every=0",
    "learning_rate=1e-2",
    "behavior_if_log_dir_exists=delete",
]


def _trainer(sdk_http: PlaneHttp, prefix: str) -> tuple[SdkAccount, str, str]:
    account = sdk_http.new_account("tinker")  # the tinker SDK insists on tml- keys
    job_id = f"{prefix}-{uuid.uuid4().hex[:8]}"
    sdk_http.create_job(account, job_id, lora_rank=4, base_model=cb.MODEL)
    sdk_http.wait_state(account, job_id, "JOB_STATE_RUNNING")
    base_url = sdk_http.trainer_base_url(account, job_id)
    sdk_http.warm(account, base_url)  # the SDK takes any 404 as final (trainer-api.md §5)
    return account, job_id, base_url


def test_math_rl_with_stable_reinforce_and_cispo(sdk_http: PlaneHttp, tmp_path: Path) -> None:
    account, job_id, base_url = _trainer(sdk_http, "mathrl")
    env = cb.recipe_env(base_url, account.api_key, cb.hf_home(tmp_path))
    # Two training runs on one trainer (ranks differ, so their weights do).
    for loss, rank in (("stable_reinforce", 4), ("cispo", 2)):
        log = tmp_path / loss
        cb.run_recipe(
            "tinker_cookbook.recipes.math_rl.train",
            [*MATH_RL, f"loss_fn={loss}", f"lora_rank={rank}", f"log_path={log}"],
            env,
            cwd=tmp_path,
        )
        assert cb.metrics(log)[-1]["progress/done_frac"] == 1.0
    losses = sdk_http.trainer_tables(account, job_id)["losses"]
    assert losses.get("forward_backward:stable_reinforce", 0) >= 2, losses
    assert losses.get("forward_backward:cispo", 0) >= 2, losses
    # Both runs saved "final" at other weights: names are scoped by training run (the second's
    # control-plane id is qualified by its lineage), so nothing clashed.
    finals = [c for c in sdk_http.checkpoint_ids(account, job_id) if c.startswith("final")]
    assert len(finals) == 2 and "final" in finals, finals
    sdk_http.delete_job(account, job_id)


def test_dpo_custom_loss_rest_surface_and_checkpoint_ttl(
    sdk_http: PlaneHttp, tmp_path: Path, data_dir: Path
) -> None:
    account, job_id, base_url = _trainer(sdk_http, "dpo")
    env = {
        **cb.recipe_env(base_url, account.api_key, cb.hf_home(tmp_path)),
        "DPO_MAX_STEPS": "2",
        "DPO_SAVE_EVERY": "1",
        "DPO_TTL_SECONDS": "2",  # periodic checkpoints expire two seconds after their save
        "DPO_ROLLING_SAVE_EVERY": "1",
    }
    log = tmp_path / "dpo"
    cb.run_recipe("tests.plane.cookbook_dpo", [str(log), base_url], env, cwd=ROOT)
    steps = cb.metrics(log)
    assert len(steps) == 2 and "surrogate_loss:sum" in steps[0] and "dpo_loss" in steps[0]
    losses = sdk_http.trainer_tables(account, job_id)["losses"]
    # forward_backward_custom: a forward, then a weighted cross_entropy; the reference
    # sampler's compute_logprobs ran too (its results are in the DPO loss).
    assert losses["forward:cross_entropy"] >= 2 and losses["forward_backward:cross_entropy"] >= 2

    saved = [json.loads(line) for line in (log / "checkpoints.jsonl").read_text().splitlines()]
    final = next(s for s in saved if s["name"] == "final")
    rest = tinker.RestClient(base_url=base_url, api_key=account.api_key)

    # The run behind a checkpoint, with the renderer the cookbook stored in user_metadata.
    run = rest.get_training_run_by_tinker_path(final["state_path"]).result(RESULT_TIMEOUT)
    assert run.user_metadata and run.user_metadata.get("renderer_name") == "role_colon"
    assert run.base_model == cb.MODEL and run.is_lora and run.lora_rank == 4
    assert run.last_checkpoint is not None and run.last_checkpoint.checkpoint_id == "weights/final"
    runs = rest.list_training_runs().result(RESULT_TIMEOUT)
    assert run.training_run_id in [r.training_run_id for r in runs.training_runs]
    capabilities = rest.get_server_capabilities().result(RESULT_TIMEOUT)
    assert [m.model_name for m in capabilities.supported_models] == [cb.MODEL]
    session_ids = rest.list_sessions().result(RESULT_TIMEOUT).sessions
    assert (
        session_ids
        and run.training_run_id
        in rest.get_session(session_ids[0]).result(RESULT_TIMEOUT).training_run_ids
    )

    # Rolling checkpoints were deleted by the cookbook through the REST API, periodic ones
    # expired by their TTL: after the TTL only "final" is left, for every reader.
    periodic = [s for s in saved if s["name"] != "final" and "sampler_path" in s]
    assert periodic, saved
    deadline = time.monotonic() + 10
    listed = rest.list_checkpoints(run.training_run_id).result(RESULT_TIMEOUT).checkpoints
    while any(c.expires_at is not None for c in listed) and time.monotonic() < deadline:
        time.sleep(0.5)
        listed = rest.list_checkpoints(run.training_run_id).result(RESULT_TIMEOUT).checkpoints
    assert sorted(c.checkpoint_id for c in listed) == ["sampler_weights/final", "weights/final"]
    assert sdk_http.checkpoint_ids(account, job_id) == ["final"]
    with pytest.raises(tinker.APIStatusError):
        rest.get_weights_info_by_tinker_path(periodic[0]["sampler_path"]).result(RESULT_TIMEOUT)
    # The files of what expired are gone once the plane sweeps (it does every minute).
    job_dir = data_dir / "checkpoints" / account.id / job_id

    def files() -> list[str]:
        return sorted(p.stem for p in job_dir.glob("*.json"))

    before = files()
    swept = sdk_http.sweep_checkpoints()
    assert files() == ["final"]
    # The plane's own sweep (every minute) may have come first on a slow run; otherwise the
    # files were there until this one.
    assert swept >= 1 or before == ["final"], (before, swept)

    # A checkpoint deleted by its tinker path is gone; deleting it again says so.
    rest.delete_checkpoint_from_tinker_path(final["sampler_path"]).result(RESULT_TIMEOUT)
    assert [
        c.checkpoint_id
        for c in rest.list_checkpoints(run.training_run_id).result(RESULT_TIMEOUT).checkpoints
    ] == ["weights/final"]
    with pytest.raises(tinker.APIStatusError):
        rest.delete_checkpoint_from_tinker_path(final["sampler_path"]).result(RESULT_TIMEOUT)
    sdk_http.delete_job(account, job_id)


def test_sdft_distils_the_teachers_top_k(sdk_http: PlaneHttp, tmp_path: Path) -> None:
    """``recipes/sdft`` unmodified, with its defaults for what it asks of the service: the
    teacher's top-20 prompt logprobs at every completion position, then ``cross_entropy`` on
    [T, 20] soft targets (forward KL). Its dataset is ToolAlpaca from a local Arrow directory
    (``toolalpaca_data_path``), a few made-up rows. (Its ``reverse=True`` mode, a client-side
    loss over [T, K] logprobs, is the SDK test's ``forward_backward_custom`` case.)"""
    account, job_id, base_url = _trainer(sdk_http, "sdft")
    env = cb.recipe_env(base_url, account.api_key, cb.hf_home(tmp_path))
    rows = {
        "prompt": [f"What is {a} plus {a}?" for a in range(1, 7)],
        "golden_response": [f"{a} plus {a} is {2 * a}." for a in range(1, 7)],
    }
    data_path = tmp_path / "toolalpaca"
    datasets.Dataset.from_dict(rows).save_to_disk(str(data_path))
    log = tmp_path / "sdft"
    cb.run_recipe(
        "tinker_cookbook.recipes.sdft.train",
        [
            f"model_name={cb.MODEL}",
            f"renderer_name={cb.RENDERER}",
            "lora_rank=4",
            "dataset=toolalpaca",
            f"toolalpaca_data_path={data_path}",
            "groups_per_batch=2",
            "max_tokens=8",
            "max_steps=2",
            "learning_rate=1e-2",
            "eval_every=0",
            "save_every=0",
            f"log_path={log}",
            "behavior_if_log_dir_exists=delete",
        ],
        env,
        cwd=tmp_path,
    )
    steps = cb.metrics(log)
    assert len(steps) == 2 and steps[-1]["progress/done_frac"] == 1.0, steps
    for step in steps:
        assert step["sdft/topk"] == 20.0 and step["sdft/total_completion_tokens"] > 0, step
        # Positions past the first three completion tokens were distilled, from a teacher
        # distribution that is not one-hot.
        assert step["sdft/mean_teacher_entropy"] > 0.0, step
    losses = sdk_http.trainer_tables(account, job_id)["losses"]
    assert losses.get("forward_backward:cross_entropy", 0) >= 2, losses
    saved = [json.loads(line) for line in (log / "checkpoints.jsonl").read_text().splitlines()]
    assert [s["name"] for s in saved if "state_path" in s] == ["final"], saved
    sdk_http.delete_job(account, job_id)
