"""Shared test helpers: waiting on the platform by its event stream (no sleep loops),
warming a route, finding trainer processes to prove nothing leaked."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shepherd.platform import PlatformClient, RouteNotFound, TrainerClient
from shepherd.platform.models import (
    CreateTrainerJobRequest,
    ForwardBackwardRequest,
    OptimStepRequest,
    TrainerJob,
    TrainingConfig,
)
from shepherd.states import JobState

BASE_MODEL = "accounts/fireworks/models/qwen3-8b"


@dataclass
class Account:
    id: str
    api_key: str
    client: PlatformClient


def job_request(**overrides: Any) -> CreateTrainerJobRequest:
    tc = {"base_model": BASE_MODEL, "lora_rank": 0, "learning_rate": 3e-3}
    tc.update(overrides.pop("training_config", {}))
    return CreateTrainerJobRequest(training_config=TrainingConfig(**tc), **overrides)


async def wait_state(
    client: PlatformClient, job_id: str, *states: JobState, timeout: float = 30.0
) -> TrainerJob:
    """Wait, by the watch stream, until the job is in one of ``states``."""
    async with asyncio.timeout(timeout):
        job = await client.get_job(job_id)
        if job.state in states:
            return job
        async for event in client.watch_jobs(job_id=job_id, last_event_id=0):
            if event.state in states:
                return event.job
    raise AssertionError("unreachable")


async def warm(trainer: TrainerClient, probes: int = 3, timeout: float = 30.0) -> int:
    """Consecutive successful get_info probes; returns how many 404s were seen."""
    seen_404 = 0
    ok = 0
    async with asyncio.timeout(timeout):
        while ok < probes:
            try:
                await trainer.get_info()
                ok += 1
            except RouteNotFound:
                seen_404 += 1
                ok = 0
                await asyncio.sleep(0.02)
    return seen_404


async def running_trainer(client: PlatformClient, job_id: str, **request: Any) -> TrainerClient:
    """Create a job, wait for RUNNING and a warm route, return its data plane."""
    await client.create_job(job_id, job_request(**request))
    await wait_state(client, job_id, JobState.RUNNING)
    trainer = await client.trainer(job_id)
    await warm(trainer)
    return trainer


async def train_steps(
    trainer: TrainerClient, first: int, last: int, micro_batches: int = 1
) -> list[float]:
    losses = []
    for step in range(first, last + 1):
        for mb in range(micro_batches):
            await trainer.forward_backward(ForwardBackwardRequest(step=step, micro_batch=mb))
        answer = await trainer.optim_step(OptimStepRequest(step=step))
        losses.append(answer.metrics["loss"])
    return losses


async def delete_all_jobs(client: PlatformClient) -> None:
    """Delete every job of the client's account and wait for the tombstones, so no trainer
    outlives a test and the next one's counts start from a quiet plane."""
    jobs = [job async for job in client.iter_jobs()]
    for job in jobs:
        if not job.state.is_gone():
            await client.delete_job(job.job_id)
    for job in jobs:
        await wait_state(client, job.job_id, JobState.DELETED)


def trainer_pids(data_dir: Path) -> list[int]:
    """Live trainer processes started by the plane with this data directory."""
    pids = []
    marker = str(data_dir)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (entry / "status").read_text()
        except OSError:
            continue
        if "localplane.trainer" in cmdline and marker in cmdline and "State:\tZ" not in status:
            pids.append(int(entry.name))
    return [p for p in pids if p != os.getpid()]
