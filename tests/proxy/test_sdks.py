"""Real programs through the proxy, unmodified: the tinker-cookbook's ``chat_sl`` recipe on
its own example conversations, preempted mid-run; and a loop written with the
``fireworks-ai`` fork's ``FiretitanServiceClient``."""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import tinker_cookbook

from tests.helpers import Account
from tests.plane import cookbook_support as cb
from tests.proxy.rig import ROOT, Rig, finish, program_env, start_program, stop

pytestmark = [pytest.mark.slow]

CONVERSATIONS = Path(tinker_cookbook.__file__).parent / "example_data" / "conversations.jsonl"
#: 128 conversations in batches of 16: 8 steps, the recipe keeping two in flight.
CHAT_SL = [
    f"dataset={CONVERSATIONS}",
    f"model_name={cb.MODEL}",
    f"renderer_name={cb.RENDERER}",
    "lora_rank=4",
    "batch_size=16",
    "max_length=256",
    "learning_rate=1e-2",
    "save_every=3",
    "eval_every=0",
    "infrequent_eval_every=0",
    "behavior_if_log_dir_exists=delete",
]
CHAT_SL_STEPS = 8


async def test_cookbook_chat_sl_survives_a_preemption(
    rigs: Callable[..., Awaitable[Rig]], tmp_path: Path
) -> None:
    rig = await rigs(trainer_base_model=cb.MODEL, checkpoint_every=2)
    await rig.new_trainer(base_model=cb.MODEL)
    await rig.attach()
    env = cb.recipe_env(rig.proxy.url, rig.proxy.api_key, cb.hf_home(tmp_path))
    log = tmp_path / "log"
    proc = await start_program(
        ["-m", "tinker_cookbook.recipes.chat_sl.train", *CHAT_SL, f"log_path={log}"], env
    )
    try:
        await rig.wait_step(3, proc)
        await rig.preempt()
        run = await finish(proc)
    finally:
        await stop(proc)
    assert "Training completed successfully" in run.stderr, run.stderr[-3000:]
    steps = cb.metrics(log)
    assert [m["step"] for m in steps] == list(range(CHAT_SL_STEPS))
    nll = [float(m["train_mean_nll"]) for m in steps]
    assert all(math.isfinite(x) for x in nll) and nll[-1] < nll[0], nll
    # Every step once, in order, and the recipe's losses are the proxy's (loss:sum over the
    # batch's loss tokens, which the recipe divides out).
    events = [e for e in rig.events if e.kind == "step"]
    assert [e.step for e in events] == list(range(1, CHAT_SL_STEPS + 1))  # type: ignore[union-attr]
    restored = rig.attaches[-1]
    assert restored.models_restored == 1 and restored.digests_match is not False
    assert 1 <= restored.optimizer_steps_redone <= 2 + 2  # an interval and two in flight
    redone = restored.optimizer_steps_redone
    assert await rig.optim_steps_served() == CHAT_SL_STEPS + redone
    assert await rig.checkpoint_step(rig.job_id, "final") == CHAT_SL_STEPS
    # The recipe's own checkpoints carry the platform's paths (not the proxy's): they
    # resolve in any job of the account, after this one and its proxy are gone.
    saved = [json.loads(x) for x in (log / "checkpoints.jsonl").read_text().splitlines()]
    assert [s["name"] for s in saved] == ["000003", "000006", "final"]
    assert all(s["state_path"].startswith("tinker://") for s in saved)
    assert not any(s["state_path"].startswith("tinker://ps-") for s in saved)
    assert await rig.dialects() == {"json"}


async def _fork_loop(url: str, key: str) -> list[dict[str, Any]]:
    env = program_env(url, key, PYTHONPATH=str(ROOT))
    proc = await start_program(["-m", "tests.proxy.fork_loop", "3"], env)
    try:
        return (await finish(proc)).lines
    finally:
        await stop(proc)


async def test_the_fireworks_fork_through_the_proxy(rig: Rig, account: Account) -> None:
    direct_job = await rig.new_trainer()
    base_url = f"{account.client.gateway_url}/training/v1/rlorTrainerJobs/{account.id}/{direct_job}"
    direct = await _fork_loop(base_url, account.api_key)
    await rig.new_trainer()
    await rig.attach()
    proxied = await _fork_loop(rig.proxy.url, rig.proxy.api_key)
    assert proxied == direct
    losses = [x["loss"] for x in proxied if "loss" in x]
    assert len(losses) == 3 and losses[-1] < losses[0]
    restored = proxied[-1]
    assert restored["forward_loaded"] == restored["forward_after"]
    assert await rig.dialects() == {"json"}
