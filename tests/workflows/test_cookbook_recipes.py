"""The wider net for program jobs: more of the tinker-cookbook (0.5.8), unmodified, run as program
jobs on JSON-only trainers, each preempted twice with a route race after the second preemption
(tests/workflows/test_programs.py's ``preempted_twice_with_a_route_race``):

* ``tinker_cookbook.recipes.sl_loop`` (its ``HuggingFaceH4/no_robots`` from the local datasets
  cache of tests/plane/cookbook_datasets.py);
* ``tinker_cookbook.recipes.rl_loop`` (``openai/gsm8k`` from that cache), through the driver
  tests/plane/cookbook_rl_loop.py, whose only change is a reward the stand-in LM can earn
  (unmodified, every advantage is 0 and rl_loop takes no optimizer step at all);
* DPO, ``train_dpo.main`` driven by tests/plane/cookbook_dpo_program.py: its reference sampler
  is a snapshot of the initial weights, kept across every checkpoint;
* on-policy distillation (``recipes/distillation/on_policy_distillation``, ``dataset=deepmath``
  from the cache) whose teacher is the sampler checkpoint another Shepherd job's program saved
  (its ``tinker://`` path from that job's checkpoints.jsonl);
* ``math_rl`` with its CLI's default loss (in 0.5.8 that is ``importance_sampling``, not
  ``stable_reinforce``: the loss_fn is left out), and with ``loss_fn=stable_reinforce``, whose
  ``forward_backward`` names sequences sampled earlier (on a trainer that may be gone since).

Each job must end COMPLETED, started its program once, with every optimizer step applied once
(the trainers served the program's steps plus exactly the steps the recoveries say they redid),
the recipe's own metrics showing every step once, and the promoted model's weights those of
the program's own final checkpoint (its ``final``, promoted on the side: localplane's model
carries the checkpoint's ``weightsDigest``) — for the recipes that sample nothing (sl_loop,
DPO) also those of the same run without faults. Step totals are mixed: some a multiple of
``checkpoint.every_steps`` (2), some not; the preemptions strike at odd and even steps (right
after a checkpoint, or with a step to redo).

Each recipe was first run straight against a localplane trainer with the same fixtures (the
direct runs were dropped from the suite for time: these runs cover the fixtures end to end)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHandle

from localplane.admin import PlaneAdmin
from shepherd.models import JobStatus
from shepherd.phases import Phase
from tests.plane import cookbook_datasets as data
from tests.plane import cookbook_support as cb
from tests.workflows.conftest import Stack
from tests.workflows.test_programs import (
    BASE,
    check_verified,
    cut_short,
    optim_steps_served,
    preempted_twice_with_a_route_race,
    program_starts,
    promoted_digest,
)

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EVERY = 2
SKIPPED = "all advantages zero, skipping training step"


def _cookbook(module: str, **fields: Any) -> dict[str, Any]:
    return {
        "module": module,
        "log_dir_arg": "log_path",
        "total_steps_arg": "max_steps",
        "model_arg": "model_name",
        # The drivers are modules of this repository (the program's cwd is the worker's).
        "env": {"PYTHONPATH": str(ROOT)},
        **fields,
    }


PROGRAMS = {
    "cookbook-sl-loop": _cookbook("tinker_cookbook.recipes.sl_loop"),
    "cookbook-rl-loop": _cookbook("tests.plane.cookbook_rl_loop"),
    "cookbook-dpo": _cookbook("tests.plane.cookbook_dpo_program"),
    "cookbook-distill": _cookbook(
        "tinker_cookbook.recipes.distillation.on_policy_distillation",
        # Shepherd makes the log directory before the program starts ("ask" would prompt).
        args=["behavior_if_log_dir_exists=resume"],
    ),
}

COMMON: dict[str, Any] = {"model_name": cb.MODEL, "lora_rank": 4, "learning_rate": 0.01}
#: 40 conversations in batches of 8: five steps (not a multiple of EVERY).
SL_LOOP: dict[str, Any] = {**COMMON, "batch_size": 8, "max_length": 64, "save_every": 2}
#: Two GSM8K questions a batch, four samples each.
RL_LOOP: dict[str, Any] = {**COMMON, "batch_size": 2, "group_size": 4, "max_tokens": 4}
DISTILL: dict[str, Any] = {
    **COMMON,
    "renderer_name": cb.RENDERER,
    "teacher_model": cb.MODEL,
    "dataset": "deepmath",
    "groups_per_batch": 2,
    "group_size": 2,
    "max_tokens": 4,
    "eval_every": 0,
    "save_every": 2,
}
#: math_rl's arithmetic environment, its CLI's loss (no loss_fn given).
MATH_RL: dict[str, Any] = {
    **COMMON,
    "env": "arithmetic",
    "renderer_name": cb.RENDERER,
    "group_size": 4,
    "groups_per_batch": 4,
    "max_tokens": 4,
    "eval_every": 0,
    "save_every": 2,
}


@pytest.fixture
async def recipes_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, faults: PlaneAdmin
) -> AsyncIterator[Path]:
    """The worker (in this process) knows the recipes above as programs (math_rl is built in),
    keeps their log directories under the test's temp dir and runs them offline, with the
    tiny hub datasets in the HF cache; trainers speak JSON only."""
    monkeypatch.setenv("SHEPHERD_PROGRAMS", json.dumps(PROGRAMS))
    directory = tmp_path / "programs"
    monkeypatch.setenv("SHEPHERD_PROGRAM_DIR", str(directory))
    home = data.write_hub_datasets(cb.hf_home(tmp_path))
    for key, value in cb.offline_env(home).items():
        monkeypatch.setenv(key, value)
    await faults.set_faults(trainerProtobuf=False)
    yield directory


def spec(stack: Stack, name: str, program: str, args: dict[str, Any], delay_ms: int = 250) -> Any:
    return stack.spec(
        name,
        # Slow enough steps (emulated GPU time) that a test acts mid-run.
        trainer={
            "base_model": BASE,
            "lora_rank": 4,
            "extra_args": [f"--compute-delay-ms={delay_ms}"],
        },
        training={"total_steps": None, "program": program, "args": args},
        # Every checkpoint kept, so the status lists each (check_verified reads them).
        checkpoint={"every_steps": EVERY, "keep_last": 10},
    )


def output(directory: Path, handle: WorkflowHandle[Any, Any]) -> list[str]:
    """Every line the program wrote (stdout and stderr), from its log directory."""
    lines = (directory / handle.id / "program.log").read_text().splitlines()
    return [json.loads(raw)["line"] for raw in lines]


def saved(directory: Path, handle: WorkflowHandle[Any, Any]) -> list[dict[str, Any]]:
    """The program's own checkpoints (the cookbook's checkpoints.jsonl)."""
    path = directory / handle.id / "checkpoints.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def program_final_digest(stack: Stack, status: JobStatus, name: str) -> str:
    """The weights digest of the program's own ``final`` checkpoint on the job's trainer:
    promoted on the side (localplane's model carries its checkpoint's ``weightsDigest``)."""
    client, trainer = stack.account.client, status.trainer_job_id or ""
    finals = [
        c
        async for c in client.iter_checkpoints(trainer)
        if c.checkpoint_id.split(".")[0] == "final" and c.promotable
    ]
    assert len(finals) == 1, [c.checkpoint_id async for c in client.iter_checkpoints(trainer)]
    model_id = f"{name}-program-final"
    await client.promote_checkpoint(
        finals[0].checkpoint_id, job_id=trainer, output_model_id=model_id
    )
    model = await client.get_model(model_id)
    return str((model.model_extra or {})["weightsDigest"])


async def check_survived(
    stack: Stack,
    handle: WorkflowHandle[Any, Any],
    final: JobStatus,
    log_dir: Path,
    *,
    steps: int,
    batches: int,
    served_before: int,
) -> None:
    """What every recipe here must show after two preemptions: ``steps`` optimizer steps
    applied once each, ``batches`` steps of the recipe's own metrics, one program start, and
    the program's final weights promoted."""
    # Shown with a failure: where each preemption struck and what its recovery did.
    for r in final.recoveries:
        print(f"{final.name} recovery {r.number}: {r.model_dump(mode='json')}")
    print(f"{final.name} checkpoints:", [(c.step, c.saved_at) for c in final.checkpoints])
    assert final.phase is Phase.COMPLETED, final.error
    assert final.step == steps, (final.step, steps)
    assert [r.reason for r in final.recoveries] == ["preemption", "preemption"]
    check_verified(final)
    assert await program_starts(handle) == 1  # never restarted
    redone = sum(r.steps_redone or 0 for r in final.recoveries)
    served = await optim_steps_served(stack) - served_before
    # Each step once, plus what the recoveries redid — and what a restore the next loss cut
    # short redid before it (at most an interval each; the weights below prove none counted).
    extra = served - (steps + redone)
    assert 0 <= extra <= cut_short(final) * EVERY, (served, steps, redone, cut_short(final))
    # At most a checkpoint interval per preemption.
    assert all((r.steps_redone or 0) <= EVERY for r in final.recoveries)
    assert [m["step"] for m in cb.metrics(log_dir)] == list(range(batches))
    assert final.model is not None
    assert await promoted_digest(stack, final.name) == await program_final_digest(
        stack, final, final.name
    )


async def clean_run(stack: Stack, name: str, program: str, args: dict[str, Any]) -> str:
    """The same recipe as a job without faults (quicker steps: nothing acts mid-run); the
    weights digest of its promoted model."""
    clean = await stack.start(spec(stack, name, program, args, delay_ms=40))
    done: JobStatus = await clean.result()
    assert done.phase is Phase.COMPLETED and not done.recoveries
    return await promoted_digest(stack, name)


async def same_weights_as_without_faults(
    stack: Stack,
    faults: PlaneAdmin,
    recipes_env: Path,
    name: str,
    program: str,
    args: dict[str, Any],
) -> tuple[WorkflowHandle[Any, Any], JobStatus]:
    """A deterministic recipe (5 steps) run without faults, then preempted twice (at steps 3
    and 4): it survived, and promoted the weights of the run without faults."""
    expected = await clean_run(stack, f"{name}clean", program, args)
    served_before = await optim_steps_served(stack)
    handle = await stack.start(spec(stack, name, program, args))
    final = await preempted_twice_with_a_route_race(
        stack, faults, handle, recipes_env / handle.id, 3, 4
    )
    await check_survived(
        stack,
        handle,
        final,
        recipes_env / handle.id,
        steps=5,
        batches=5,
        served_before=served_before,
    )
    assert await promoted_digest(stack, name) == expected
    return handle, final


async def test_sl_loop_survives_two_preemptions(
    stack: Stack, recipes_env: Path, faults: PlaneAdmin
) -> None:
    args = {**SL_LOOP, "max_steps": 5}
    # SFT is deterministic (no sampling): the run without faults ends at the same weights.
    handle, final = await same_weights_as_without_faults(
        stack, faults, recipes_env, "slloop", "cookbook-sl-loop", args
    )
    assert final.total_steps == 5
    names = [s["name"] for s in saved(recipes_env, handle)]
    assert names == ["000002", "000004", "final"]


async def test_rl_loop_survives_two_preemptions(
    stack: Stack, recipes_env: Path, faults: PlaneAdmin
) -> None:
    handle = await stack.start(
        spec(stack, "rlloop", "cookbook-rl-loop", {**RL_LOOP, "max_steps": 4, "save_every": 2})
    )
    final = await preempted_twice_with_a_route_race(
        stack, faults, handle, recipes_env / handle.id, 2, 3
    )
    # rl_loop skips the optimizer step of a batch whose every group has one reward.
    skipped = sum(SKIPPED in line for line in output(recipes_env, handle))
    assert skipped < 4
    await check_survived(
        stack, handle, final, recipes_env / handle.id, steps=4 - skipped, batches=4, served_before=0
    )


async def test_dpo_with_a_frozen_reference_survives_two_preemptions(
    stack: Stack, recipes_env: Path, faults: PlaneAdmin
) -> None:
    args = {"model_name": cb.MODEL, "max_steps": 5}
    # DPO samples nothing (its reference only scores): without faults, the same weights.
    handle, _ = await same_weights_as_without_faults(
        stack, faults, recipes_env, "dpo", "cookbook-dpo", args
    )
    metrics = cb.metrics(recipes_env / handle.id)
    assert all("dpo_loss" in m for m in metrics), metrics[0].keys()


async def test_distillation_from_another_jobs_checkpoint_survives_two_preemptions(
    stack: Stack, recipes_env: Path, faults: PlaneAdmin
) -> None:
    # The teacher: a short SFT program job, no faults; its program saves "final" (weights
    # and sampler) and writes its tinker:// paths down in checkpoints.jsonl.
    teacher = await stack.start(
        spec(
            stack,
            "teacher",
            "cookbook-sl-loop",
            {**SL_LOOP, "max_steps": 2, "save_every": 0},
            delay_ms=40,
        )
    )
    taught: JobStatus = await teacher.result()
    assert taught.phase is Phase.COMPLETED and taught.step == 2
    path = next(s for s in saved(recipes_env, teacher) if s["name"] == "final")["sampler_path"]
    assert str(path).startswith("tinker://")
    served_before = await optim_steps_served(stack)

    args = {**DISTILL, "max_steps": 4, "teacher_checkpoint": path}
    handle = await stack.start(spec(stack, "student", "cookbook-distill", args))
    final = await preempted_twice_with_a_route_race(
        stack, faults, handle, recipes_env / handle.id, 2, 3
    )
    await check_survived(
        stack,
        handle,
        final,
        recipes_env / handle.id,
        steps=4,
        batches=4,
        served_before=served_before,
    )
    assert final.total_steps == 4
    # Every step was scored against the teacher (the KL to it is the only reward).
    assert all("teacher_kl" in m for m in cb.metrics(recipes_env / handle.id))


async def test_math_rl_with_its_default_loss_survives_two_preemptions(
    stack: Stack, recipes_env: Path, faults: PlaneAdmin
) -> None:
    assert "loss_fn" not in MATH_RL  # the CLI's own default
    handle = await stack.start(
        spec(stack, "mathrl", "cookbook-math-rl", {**MATH_RL, "max_steps": 5})
    )
    final = await preempted_twice_with_a_route_race(
        stack, faults, handle, recipes_env / handle.id, 3, 4
    )
    await check_survived(
        stack, handle, final, recipes_env / handle.id, steps=5, batches=5, served_before=0
    )
    assert final.total_steps == 5


async def test_math_rl_with_stable_reinforce_survives_two_preemptions(
    stack: Stack, recipes_env: Path, faults: PlaneAdmin
) -> None:
    """StableReinforce needs the trainer to remember each sampled sequence (its
    ``sequence_id``); after a preemption the new trainer has none of the lost one's."""
    args = {**MATH_RL, "loss_fn": "stable_reinforce", "max_steps": 4}
    handle = await stack.start(spec(stack, "mathsr", "cookbook-math-rl", args))
    final = await preempted_twice_with_a_route_race(
        stack, faults, handle, recipes_env / handle.id, 2, 3
    )
    await check_survived(
        stack, handle, final, recipes_env / handle.id, steps=4, batches=4, served_before=0
    )
