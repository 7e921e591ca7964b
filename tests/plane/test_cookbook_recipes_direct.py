"""The offline fixtures of tests/workflows/test_cookbook_recipes.py proved without Shepherd: each
recipe that module runs as a program job runs here straight against a localplane trainer
(as tests/plane/test_cookbook.py runs math_rl and DPO), from the tiny hub datasets of
tests/plane/cookbook_datasets.py and the byte-level tokenizer of cookbook_support. A failure
here is the fixtures' (or the plane's), not the proxy's."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.plane import cookbook_datasets as data
from tests.plane import cookbook_support as cb
from tests.plane.sdk_support import PlaneHttp, SdkAccount

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
COMMON = [f"model_name={cb.MODEL}", "lora_rank=4"]
SL_LOOP = [*COMMON, "batch_size=8", "max_length=64", "learning_rate=1e-2", "save_every=2"]
RL_LOOP = [*COMMON, "batch_size=2", "group_size=4", "max_tokens=4", "learning_rate=1e-2"]
DISTILL = [
    *COMMON,
    f"renderer_name={cb.RENDERER}",
    f"teacher_model={cb.MODEL}",
    "dataset=deepmath",
    "groups_per_batch=2",
    "group_size=2",
    "max_tokens=4",
    "learning_rate=1e-2",
    "eval_every=0",
    "save_every=2",
    "behavior_if_log_dir_exists=delete",
]


def _trainer(sdk_http: PlaneHttp, prefix: str) -> tuple[SdkAccount, str, str]:
    account = sdk_http.new_account("tinker")
    job_id = f"{prefix}-{uuid.uuid4().hex[:8]}"
    sdk_http.create_job(account, job_id, lora_rank=4, base_model=cb.MODEL)
    sdk_http.wait_state(account, job_id, "JOB_STATE_RUNNING")
    base_url = sdk_http.trainer_base_url(account, job_id)
    sdk_http.warm(account, base_url)
    return account, job_id, base_url


def _env(tmp_path: Path, base_url: str, account: SdkAccount) -> dict[str, str]:
    home = data.write_hub_datasets(cb.hf_home(tmp_path))
    return cb.recipe_env(base_url, account.api_key, home)


def saved(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (log / "checkpoints.jsonl").read_text().splitlines()]


def test_sl_loop_reads_no_robots_from_the_local_cache(sdk_http: PlaneHttp, tmp_path: Path) -> None:
    account, job_id, base_url = _trainer(sdk_http, "slloop")
    log = tmp_path / "sl"
    cb.run_recipe(
        "tinker_cookbook.recipes.sl_loop",
        [*SL_LOOP, "max_steps=5", f"log_path={log}"],
        _env(tmp_path, base_url, account),
        cwd=tmp_path,
    )
    # 40 rows in batches of 8: five steps, each logged once, then "final".
    assert [m["step"] for m in cb.metrics(log)] == list(range(5))
    assert [s["name"] for s in saved(log)] == ["000002", "000004", "final"]
    assert (
        sdk_http.data_plane(account, job_id).get("protobuf:optim_step", 0)
        + sdk_http.data_plane(account, job_id).get("json:optim_step", 0)
        == 5
    )
    sdk_http.delete_job(account, job_id)


def test_rl_loop_reads_gsm8k_from_the_local_cache(sdk_http: PlaneHttp, tmp_path: Path) -> None:
    """Unmodified, rl_loop trains nothing on the stand-in LM (it never writes \\boxed{}: every
    advantage is 0 and every step is skipped); the driver's reward lets it train."""
    account, job_id, base_url = _trainer(sdk_http, "rlloop")
    env = _env(tmp_path, base_url, account)
    plain = tmp_path / "plain"
    done = cb.run_recipe(
        "tinker_cookbook.recipes.rl_loop",
        [*RL_LOOP, "max_steps=2", "save_every=0", f"log_path={plain}"],
        env,
        cwd=tmp_path,
    )
    assert [m["step"] for m in cb.metrics(plain)] == [0, 1]
    assert done.stderr.count("all advantages zero, skipping training step") == 2
    served = sdk_http.data_plane(account, job_id)
    assert not any(k.endswith(":optim_step") for k in served), served

    driven = tmp_path / "driven"
    done = cb.run_recipe(
        "tests.plane.cookbook_rl_loop",
        [*RL_LOOP, "max_steps=4", "save_every=2", f"log_path={driven}"],
        env,
        cwd=ROOT,
    )
    assert [m["step"] for m in cb.metrics(driven)] == list(range(4))
    skipped = done.stderr.count("all advantages zero, skipping training step")
    served = sdk_http.data_plane(account, job_id)
    steps = sum(n for k, n in served.items() if k.endswith(":optim_step"))
    assert steps == 4 - skipped and steps > 0
    assert [s["name"] for s in saved(driven)] == ["000002", "final"]
    sdk_http.delete_job(account, job_id)


def test_dpo_program_driver(sdk_http: PlaneHttp, tmp_path: Path) -> None:
    account, job_id, base_url = _trainer(sdk_http, "dpoprog")
    log = tmp_path / "dpo"
    cb.run_recipe(
        "tests.plane.cookbook_dpo_program",
        ["max_steps=5", f"log_path={log}"],
        _env(tmp_path, base_url, account),
        cwd=ROOT,
    )
    assert [m["step"] for m in cb.metrics(log)] == list(range(5))
    assert "final" in [s["name"] for s in saved(log)]
    sdk_http.delete_job(account, job_id)


def test_distillation_from_a_teacher_checkpoint_of_an_sft_run(
    sdk_http: PlaneHttp, tmp_path: Path
) -> None:
    account, job_id, base_url = _trainer(sdk_http, "distill")
    env = _env(tmp_path, base_url, account)
    teacher_log = tmp_path / "teacher"
    cb.run_recipe(
        "tinker_cookbook.recipes.sl_loop",
        [*SL_LOOP, "max_steps=2", "save_every=0", f"log_path={teacher_log}"],
        env,
        cwd=tmp_path,
    )
    final = next(s for s in saved(teacher_log) if s["name"] == "final")
    log = tmp_path / "student"
    cb.run_recipe(
        "tinker_cookbook.recipes.distillation.on_policy_distillation",
        [*DISTILL, "max_steps=3", f"teacher_checkpoint={final['sampler_path']}", f"log_path={log}"],
        env,
        cwd=tmp_path,
    )
    metrics = cb.metrics(log)
    assert [m["step"] for m in metrics] == list(range(3))
    assert all("teacher_kl" in m for m in metrics), metrics[0].keys()
    sdk_http.delete_job(account, job_id)
