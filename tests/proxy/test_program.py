"""A plain ``tinker``-SDK script (examples/programs/tinker_sft.py), unmodified, through
Shepherd's proxy to JSON-only trainers: it gets the answers it gets straight from a trainer —
the same losses, the same weights after every step (the trainer's digest), the same samples —
also through two preemptions and a route race, and through a pause onto a new trainer job;
and every optimizer step reached the weights it ends with exactly once (counted on the
plane)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.proxy.rig import SFT_SCRIPT, Rig, Run, finish, program_env, start_program, stop

STEPS = 12
CHECKPOINT_EVERY = 4


def _same_run(run: Run, reference: Run) -> None:
    assert len(run.losses) == STEPS
    assert run.losses == reference.losses
    assert run.digests == reference.digests
    assert run.samples == reference.samples
    assert run.final["digest"] == reference.final["digest"]
    assert "Traceback" not in run.stderr, run.stderr[-4000:]


def _events_in_order(rig: Rig, run: Run) -> None:
    """A step event per optimizer step, once each, in order, with the step's loss; a
    checkpoint event every CHECKPOINT_EVERY steps, once each."""
    steps = [e for e in rig.events if e.kind == "step"]
    assert [e.step for e in steps] == list(range(1, STEPS + 1))  # type: ignore[union-attr]
    assert [e.loss for e in steps] == run.losses  # type: ignore[union-attr]
    checkpoints = [e.record for e in rig.events if e.kind == "checkpoint"]  # type: ignore[union-attr]
    steps_saved = [c.step for c in checkpoints]
    assert len(set(steps_saved)) == len(steps_saved) == len({c.name for c in checkpoints})
    assert set(range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY)) <= set(steps_saved)
    assert all(c.name.endswith(f"/checkpoints/step-{c.step:08d}") for c in checkpoints)
    assert all(c.sampler == f"{c.name}-sampler" for c in checkpoints)


def _digests_recorded(rig: Rig, reference: Run) -> None:
    """The proxy's own per-step digests (what a restore is checked against) are the
    reference run's."""
    recorded = rig.proxy.progress.digests
    assert recorded
    assert all(recorded[step] == reference.digests[step - 1] for step in recorded)


async def _run(rig: Rig, during: Any = None) -> Run:
    proc = await start_program(SFT_SCRIPT, program_env(rig.proxy.url, rig.proxy.api_key))
    try:
        if during is not None:
            await during()
        return await finish(proc)
    finally:
        await stop(proc)


async def _steps_applied_once(rig: Rig, final_job: str) -> None:
    """The trainers served one optim_step per program step plus one per step the proxy
    redid (each redo starts from a checkpoint that holds none of them), and the final
    weights are those of STEPS steps (the trainer counts steps on from the checkpoint)."""
    redone = sum(a.optimizer_steps_redone for a in rig.attaches)
    assert await rig.optim_steps_served() == STEPS + redone
    assert await rig.checkpoint_step(final_job, "final") == STEPS


@pytest.mark.slow
async def test_the_same_answers_through_the_proxy_as_straight_from_a_trainer(
    rig: Rig, reference: tuple[Run, dict[str, int]]
) -> None:
    direct, direct_served = reference
    await rig.new_trainer()
    first = await rig.attach()
    assert first.first and first.ops_redone == 0
    run = await _run(rig)
    _same_run(run, direct)
    _events_in_order(rig, run)
    _digests_recorded(rig, direct)
    await _steps_applied_once(rig, rig.job_id)
    # The script spoke protobuf (the tinker SDK's forward_backward) straight to a trainer;
    # through the proxy the JSON-only trainer received JSON only.
    assert direct_served.get("protobuf:forward_backward", 0) == STEPS, direct_served
    assert await rig.dialects() == {"json"}
    assert rig.proxy.progress.step == STEPS and rig.proxy.progress.last_loss == run.losses[-1]
    # Shepherd's checkpoints are the job's, as the control plane lists them: each with its
    # promotable sampler twin.
    listed = {c.name: c async for c in rig.client.iter_checkpoints(rig.job_id)}
    for record in rig.proxy.progress.checkpoints:
        assert not listed[record.name].promotable and listed[record.sampler].promotable
        assert listed[record.name].step == record.step


@pytest.mark.slow
async def test_two_preemptions_and_a_route_race_change_nothing(
    rig: Rig, reference: tuple[Run, dict[str, int]]
) -> None:
    direct, _ = reference
    await rig.new_trainer()
    await rig.attach()

    async def faults() -> None:
        await rig.wait_step(3)
        await rig.preempt(proxy_sees_it=True)  # before the first checkpoint: made afresh
        await rig.wait_step(6)
        # The route race mid-run: the gateway answers 404 while the job is RUNNING.
        await rig.admin.set_faults(gateway404Rate=1.0)
        async with asyncio.timeout(30):
            while rig.proxy.progress.route_races == 0:
                await asyncio.sleep(0.005)
        await rig.admin.set_faults(gateway404Rate=0.0)
        await rig.wait_step(9)
        await rig.preempt()  # after step 8's checkpoint

    run = await _run(rig, faults)
    _same_run(run, direct)
    _events_in_order(rig, run)
    _digests_recorded(rig, direct)
    await _steps_applied_once(rig, rig.job_id)
    first, made_afresh, from_checkpoint = rig.attaches
    assert made_afresh.restored_from is None and made_afresh.models_restored == 1
    assert from_checkpoint.restored_from is not None
    assert from_checkpoint.restored_from.step == 8
    for attach in (made_afresh, from_checkpoint):
        # The redo is what followed the restore point: at most an interval and the step the
        # program had in flight.
        assert 1 <= attach.optimizer_steps_redone <= CHECKPOINT_EVERY
        assert attach.digests_match is not False
    assert from_checkpoint.checkpoint_digest == direct.digests[7]
    assert sum(e.kind == "trainer_lost" for e in rig.events) >= 1
    assert rig.proxy.progress.route_races >= 1
    assert await rig.dialects() == {"json"}
    # The platform's key went nowhere the program or the workflow sees.
    key = rig.account.api_key
    assert key not in run.stdout + run.stderr
    assert not any(key in e.model_dump_json() for e in rig.events)
    assert key not in rig.proxy.progress.model_dump_json()


@pytest.mark.slow
async def test_a_pause_onto_a_new_trainer_job_changes_nothing(
    rig: Rig, reference: tuple[Run, dict[str, int]]
) -> None:
    direct, _ = reference
    first_job = await rig.new_trainer()
    await rig.attach()
    paused: dict[str, Any] = {}

    async def pause() -> None:
        await rig.wait_step(6)
        paused["record"], paused["attach"] = await rig.pause_and_resume()

    run = await _run(rig, pause)
    _same_run(run, direct)
    _events_in_order(rig, run)
    record, attach = paused["record"], paused["attach"]
    assert rig.job_id != first_job
    # The pause's checkpoint holds the step the program had reached; the new trainer
    # started from it and redid no optimizer step.
    assert record is not None and record.trainer_job_id == first_job and record.step >= 6
    assert attach.restored_from == record and attach.optimizer_steps_redone == 0
    assert attach.checkpoint_digest == direct.digests[record.step - 1]
    await _steps_applied_once(rig, rig.job_id)
    assert await rig.dialects() == {"json"}
