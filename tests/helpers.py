"""Shared test helpers: waiting on the platform by its event stream (no sleep loops),
warming a route, finding trainer processes to prove nothing leaked."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shepherd.platform import PlatformClient
from shepherd.platform.models import CreateTrainerJobRequest, TrainerJob, TrainingConfig
from shepherd.states import JobState
from tests.tinker_http import Model, TinkerHTTP

if TYPE_CHECKING:
    from localplane.admin import PlaneAdmin
    from tests.workflows.conftest import Stack

BASE_MODEL = "accounts/fireworks/models/qwen3-8b"


def spec_data(name: str, /, **sections: Any) -> dict[str, Any]:
    """A minimal valid job spec as data, named ``name``; each keyword replaces a section,
    or is merged into it when both are mappings."""
    base: dict[str, Any] = {
        "name": name,
        "trainer": {"base_model": BASE_MODEL},
        "training": {"total_steps": 20},
        "checkpoint": {"every_steps": 10},
        "output": {"model_id": f"{name}-model"},
    }
    for key, value in sections.items():
        base[key] = (
            {**base[key], **value}
            if isinstance(value, dict) and isinstance(base.get(key), dict)
            else value
        )
    return base


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
    """Wait, by the watch stream, until the job is in one of ``states``. (The stream is
    read from its start, so no change after ``get_job`` is missed; the changes before the
    state ``get_job`` saw are skipped: a resumed job's earlier life was RUNNING too.)"""
    async with asyncio.timeout(timeout):
        job = await client.get_job(job_id)
        if job.state in states:
            return job
        since = job.update_time
        async for event in client.watch_jobs(job_id=job_id, last_event_id=0):
            if since is not None and event.event_time < since:
                continue
            if event.state in states:
                return event.job
    raise AssertionError("unreachable")


async def warm(api: TinkerHTTP, probes: int = 3, timeout: float = 30.0) -> int:
    """Consecutive successful healthz probes over the route; returns how many 404s (the
    route race, §5) were seen on the way."""
    seen_404 = 0
    ok = 0
    async with asyncio.timeout(timeout):
        while ok < probes:
            r = await api.raw("healthz", method="GET")
            if r.status_code == 404:
                seen_404 += 1
                ok = 0
                await asyncio.sleep(0.02)
                continue
            assert r.status_code == 200, r.text
            ok += 1
    return seen_404


@dataclass
class Trainer:
    """A RUNNING job's data plane (through the gateway), with one session and one model."""

    api: TinkerHTTP
    job_id: str
    session_id: str
    model: Model

    async def info(self) -> dict[str, Any]:
        return await self.model.info()


def gateway_api(account: Account, job_id: str, *, auth: str = "x-api-key") -> TinkerHTTP:
    base = f"{account.client.gateway_url}/training/v1/rlorTrainerJobs/{account.id}/{job_id}"
    return TinkerHTTP(base, account.api_key, auth=auth)


async def running_trainer(account: Account, job_id: str, **request: Any) -> Trainer:
    """Create a job, wait for RUNNING and a warm route, open a session and create a model
    (rank and base model as the job was created with)."""
    req = job_request(**request)
    await account.client.create_job(job_id, req)
    await wait_state(account.client, job_id, JobState.RUNNING)
    api = gateway_api(account, job_id)
    await warm(api)
    session = await api.session()
    tc = req.training_config
    model = await api.create_model(session, 0, tc.base_model, lora_rank=tc.lora_rank)
    return Trainer(api, job_id, session, model)


async def train_steps(trainer: Trainer, first: int, last: int) -> list[float]:
    """Steps ``first..last`` on the trainer's model; the losses."""
    return await trainer.model.train(first, last)


async def optimizer_steps(admin: PlaneAdmin) -> dict[str, int]:
    """Optimizer steps each live trainer job has been asked for, by the plane's count."""
    jobs = (await admin.stats())["jobs"]
    return {
        name: int(job.get("dataPlane", {}).get("json:optim_step", 0))
        for name, job in jobs.items()
        if job.get("liveTrainer")
    }


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


async def run_cli(
    *args: str,
    stack: Stack | None = None,
    address: str | None = None,
    columns: int = 200,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``shepherd ARGS`` as a user runs it, against ``stack``'s Temporal and task queue (or
    ``address``, e.g. one where nothing listens), ``columns`` wide."""
    env = {**os.environ, "COLUMNS": str(columns)}
    if stack is not None:
        env["TEMPORAL_ADDRESS"] = stack.client.service_client.config.target_host
        env["SHEPHERD_TASK_QUEUE"] = stack.task_queue
    if address is not None:
        env["TEMPORAL_ADDRESS"] = address
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "shepherd.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def fill(disk: Path) -> Path:
    """Fill ``disk`` to its last byte; the filler file."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        block = b"\0" * (1 << 20)
        try:
            while True:
                f.write(block)
                f.flush()
        except OSError:
            pass
    # The last partial block, byte pages at a time, until nothing at all fits.
    with open(filler, "ab", buffering=0) as f:
        for size in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                continue
    return filler
