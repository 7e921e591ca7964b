"""The platform restarting under running jobs (issue 32): localplane SIGKILLed — its trainers
die with it — and started again a few seconds later on its data directory and port, which
marks the jobs that were running FAILED, saying the platform restarted.

A program job recovers as a loop job does: the loss counted as a platform restart (not a
trainer failure, not a preemption), the program never started again, every step applied once
(the program's per-step losses and weight digests are the clean run's)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client

from localplane.process import PlaneProcess
from shepherd.models import JobStatus
from shepherd.phases import Phase
from tests.conftest import BASELINE
from tests.workflows.conftest import Stack, stack_on
from tests.workflows.test_programs import (
    per_step,
    printed,
    program_starts,
    sft_spec,
    until_printed,
)

#: How long the platform stays down.
DOWN_S = 3.0


@pytest.fixture
async def own_stack(
    client: Client, tmp_path: Path, programs_env: Path
) -> AsyncIterator[tuple[Stack, PlaneProcess]]:
    """A stack on a plane of this test's own (the session's is never restarted)."""
    plane = PlaneProcess(tmp_path / "plane", config={**BASELINE, "trainerProtobuf": False})
    async with stack_on(client, plane) as st:
        yield st, plane


async def restart(plane: PlaneProcess) -> None:
    """SIGKILL (its trainers die with it), down for ``DOWN_S``, started again where it was."""
    await asyncio.to_thread(plane.stop, kill=True)
    await asyncio.sleep(DOWN_S)
    await asyncio.to_thread(plane.start)


async def test_a_platform_restart_under_a_program_and_a_loop_is_a_platform_restart(
    own_stack: tuple[Stack, PlaneProcess], programs_env: Path
) -> None:
    stack, plane = own_stack
    clean = await stack.start(sft_spec(stack, "clean", steps=16))
    async with asyncio.timeout(240):
        await clean.result()
    program = await stack.start(sft_spec(stack, "restarted", steps=16))
    loop = await stack.start(
        stack.spec(
            "looping",
            # Slow steps: it trains when the platform goes down.
            trainer={"extra_args": ["--compute-delay-ms=300"]},
            training={"total_steps": 40},
            checkpoint={"every_steps": 5, "keep_last": 2},
        )
    )
    await until_printed(programs_env, program, 5)
    await restart(plane)
    async with asyncio.timeout(300):
        final: JobStatus = await program.result()
        looped: JobStatus = await loop.result()

    assert final.phase is Phase.COMPLETED and final.step == 16, final.error
    assert [r.reason for r in final.recoveries] == ["platform_restart"], final.recoveries
    assert final.platform_restarts == 1 and final.failures == 0 and final.preemptions == 0
    assert all(r.weights_verified for r in final.recoveries), final.recoveries
    assert await program_starts(program) == 1  # never started again
    # Every step once, with the clean run's losses and weights.
    assert per_step(printed(programs_env, program)) == per_step(printed(programs_env, clean))

    assert looped.phase is Phase.COMPLETED and looped.step == 40, looped.error
    assert [r.reason for r in looped.recoveries] == ["platform_restart"], looped.recoveries
    assert looped.failures == 0 and looped.preemptions == 0 and looped.platform_restarts == 1
