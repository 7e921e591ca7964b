"""A program that trains several models promotes the one its user wants (issue 30, item 5):
``training.follow`` — by default the newest model the program trained (a pipeline's last
stage) — is the model the job counts its steps by, checkpoints and promotes, through a
preemption in each stage. A model loaded from another's weights counts the steps the program
applies to it, not the checkpoint's (item 6)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from localplane.admin import PlaneAdmin
from shepherd.models import JobStatus
from shepherd.phases import Phase
from shepherd.states import JobState
from tests.helpers import run_cli, wait_state
from tests.workflows.conftest import Stack
from tests.workflows.test_programs import printed, promoted_digest, sft_spec, until_printed_where

STAGES = {"sft": 4, "rm": 3, "rl": 4}


def pipeline_spec(stack: Stack, name: str, follow: Any = None) -> Any:
    spec = sft_spec(
        stack,
        name,
        program="pipeline",
        args=dict(STAGES),
        checkpoint={"every_steps": 2, "keep_last": 2},
    )
    if follow is not None:
        spec = spec.model_copy(
            update={"training": spec.training.model_copy(update={"follow": follow})}
        )
    return spec


def by_stage(out: list[dict[str, Any]]) -> dict[str, list[tuple[int, float, str]]]:
    stages: dict[str, list[tuple[int, float, str]]] = {}
    for line in out:
        if "stage" in line:
            stages.setdefault(line["stage"], []).append(
                (line["step"], line["loss"], line["digest"])
            )
    return stages


async def test_a_pipeline_promotes_its_last_stage_through_a_preemption_in_each(
    stack: Stack, programs_env: Path, faults: PlaneAdmin
) -> None:
    clean = await stack.start(pipeline_spec(stack, "calm-pipe"))
    hurt = await stack.start(pipeline_spec(stack, "rough-pipe"))
    # A preemption in the SFT stage, and another in the RL stage.
    await until_printed_where(
        programs_env, hurt, lambda x: x.get("stage") == "sft" and x["step"] >= 2
    )
    trainer = (await stack.status(hurt)).trainer_job_id or ""
    await faults.preempt(trainer)
    await until_printed_where(
        programs_env, hurt, lambda x: x.get("stage") == "rl" and x["step"] >= 1
    )
    await wait_state(stack.account.client, trainer, JobState.RUNNING, timeout=120)
    await faults.preempt(trainer)
    final: JobStatus = await hurt.result()
    ref: JobStatus = await clean.result()

    assert final.phase is Phase.COMPLETED and final.preemptions == 2
    out, ref_out = printed(programs_env, hurt), printed(programs_env, clean)
    # Every stage as in the undisturbed run, step by step.
    assert by_stage(out) == by_stage(ref_out)
    assert {k: len(v) for k, v in by_stage(ref_out).items()} == STAGES
    for status, lines, name in ((final, out, "rough-pipe"), (ref, ref_out, "calm-pipe")):
        # The job follows the program's third model, the policy: its steps are the job's,
        # counted from 0 although it was loaded from the SFT model's 4-step state.
        assert status.following is not None and status.following.number == 3
        assert status.following.loaded_from is not None
        assert status.step == STAGES["rl"]
        last = status.last_checkpoint
        assert last is not None and last.model == 3 and last.step == STAGES["rl"]
        assert last.name.endswith("step-00000004-m3"), last.name
        assert await promoted_digest(stack, name) == lines[-1]["final"]["rl"]
    shown = await run_cli("status", hurt.id, stack=stack)
    assert "the program's model 3" in shown.stdout, shown.stdout


async def test_a_pipeline_can_promote_the_model_its_spec_names(
    stack: Stack, programs_env: Path
) -> None:
    handle = await stack.start(pipeline_spec(stack, "first-pipe", follow=1))
    final: JobStatus = await handle.result()
    assert final.phase is Phase.COMPLETED
    assert final.following is not None and final.following.number == 1
    assert final.step == STAGES["sft"]
    assert all(c.model == 1 for c in final.checkpoints)
    ended = printed(programs_env, handle)[-1]["final"]
    assert await promoted_digest(stack, "first-pipe") == ended["sft"]
