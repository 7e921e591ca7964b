"""Driving a :class:`~shepherd.proxy.ProgramProxy` the way the job lifecycle will, without
Temporal: create a trainer job, wait for RUNNING, warm its route, attach; run a program as a
subprocess with the proxy's URL and token; preempt (admin API), detach, resume, wait, warm,
attach again; or pause (checkpoint_now, delete, a new job, attach)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localplane.admin import PlaneAdmin
from shepherd.platform import PlatformClient
from shepherd.proxy import AttachResult, ProgramProxy, ProxyEvent, ProxySettings
from shepherd.states import JobState
from tests.helpers import Account, gateway_api, job_request, warm

ROOT = Path(__file__).resolve().parents[2]
SFT_SCRIPT = ROOT / "examples" / "programs" / "tinker_sft.py"
BASE_MODEL = "accounts/fireworks/models/qwen3-8b"
RANK = 4
#: Emulated GPU time per forward_backward: a 12-step run takes a few seconds, long enough to
#: preempt it at a chosen step.
COMPUTE_DELAY = "--compute-delay-ms=60"
#: A program's run, bounded (the SDKs retry for minutes on their own).
PROGRAM_TIMEOUT_S = 150.0
#: Probes over the route before a trainer counts as warm: twice the plane's gateway
#: replicas, so every replica has been seen to know the route.
WARM_PROBES = 6


def settings(**overrides: Any) -> ProxySettings:
    base: dict[str, Any] = {
        "trainer_base_model": BASE_MODEL,
        "lora_rank": RANK,
        "checkpoint_every": 4,
        # A short race window: a test's injected race is over in well under a second.
        "route_race_window_s": 3.0,
        "call_timeout_s": 60.0,
    }
    return ProxySettings(**{**base, **overrides})


def program_env(url: str, api_key: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TINKER_", "SHEPHERD_PLANE"))}
    return {
        **env,
        "TINKER_BASE_URL": url,
        "TINKER_API_KEY": api_key,
        "TINKER_TELEMETRY": "0",
        **extra,
    }


@dataclass
class Run:
    """A program's finished run: its JSON lines, by kind."""

    stdout: str
    stderr: str

    @property
    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.stdout.splitlines() if x.startswith("{")]

    @property
    def losses(self) -> list[float]:
        return [x["loss"] for x in self.lines if "loss" in x]

    @property
    def digests(self) -> list[str]:
        return [x["digest"] for x in self.lines if "loss" in x]

    @property
    def samples(self) -> list[Any]:
        return [x["samples"] for x in self.lines if "samples" in x]

    @property
    def final(self) -> dict[str, Any]:
        return next(x for x in self.lines if "final" in x)


async def start_program(
    script: Path | list[str], env: dict[str, str]
) -> asyncio.subprocess.Process:
    argv = [str(script)] if isinstance(script, Path) else script
    return await asyncio.create_subprocess_exec(
        sys.executable,
        *argv,
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )


async def finish(proc: asyncio.subprocess.Process, timeout: float = PROGRAM_TIMEOUT_S) -> Run:
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        raise AssertionError(
            f"the program did not finish within {timeout}s:\n{out.decode()[-3000:]}\n"
            f"{err.decode()[-6000:]}"
        ) from None
    run = Run(out.decode(), err.decode())
    assert proc.returncode == 0, (
        f"program exited {proc.returncode}:\n{run.stdout}\n{run.stderr[-6000:]}"
    )
    return run


async def stop(proc: asyncio.subprocess.Process) -> None:
    """Whatever happened to the test, the program does not outlive it."""
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


@dataclass
class Rig:
    """One program job's trainer(s) and proxy."""

    account: Account
    admin: PlaneAdmin
    proxy: ProgramProxy
    job_id: str = ""
    events: list[ProxyEvent] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    attaches: list[AttachResult] = field(default_factory=list)

    @property
    def client(self) -> PlatformClient:
        return self.account.client

    def job_name(self, job_id: str | None = None) -> str:
        return f"accounts/{self.account.id}/rlorTrainerJobs/{job_id or self.job_id}"

    async def new_trainer(self, **training_config: Any) -> str:
        """A new trainer job, RUNNING and warm (what the lifecycle's provisioning does)."""
        job_id = f"px-{uuid.uuid4().hex[:8]}"
        config = {"lora_rank": RANK, "extra_args": [COMPUTE_DELAY], **training_config}
        await self.client.create_job(job_id, job_request(training_config=config))
        self.jobs.append(job_id)
        await self.ready(job_id)
        self.job_id = job_id
        return job_id

    async def state(self, job_id: str, state: JobState, timeout: float = 60.0) -> None:
        """Until the control plane says ``state`` now. Asked, not watched: the event stream
        replayed from the start would answer with an earlier run's FAILED or RUNNING."""
        async with asyncio.timeout(timeout):
            while (await self.client.get_job(job_id)).state != state:
                await asyncio.sleep(0.02)

    async def ready(self, job_id: str) -> None:
        await self.state(job_id, JobState.RUNNING)
        api = gateway_api(self.account, job_id)
        try:
            await warm(api, probes=WARM_PROBES)
        finally:
            await api.http.aclose()

    async def attach(self) -> AttachResult:
        result = await self.proxy.attach(self.job_id)
        self.attaches.append(result)
        return result

    async def wait_step(
        self, step: int, proc: asyncio.subprocess.Process | None = None, timeout: float = 60.0
    ) -> None:
        """Until the program's model reached ``step``. With the program's process: as long as
        it runs, within its own bound (``PROGRAM_TIMEOUT_S``) — a cookbook recipe spends 10 s
        (idle machine) to 30 s (a busy one) importing torch and transformers before its first
        request, which a fixed wait from the spawn counted as steps — and at once if it
        exits (its output in the failure)."""
        if proc is None:
            async with asyncio.timeout(timeout):
                while self.proxy.progress.step < step:
                    await asyncio.sleep(0.005)
            return
        async with asyncio.timeout(PROGRAM_TIMEOUT_S):
            while self.proxy.progress.step < step:
                if proc.returncode is not None:
                    run = await finish(proc)
                    raise AssertionError(
                        f"the program exited {proc.returncode} before step {step}:\n"
                        f"{run.stderr[-3000:]}"
                    )
                await asyncio.sleep(0.005)

    async def wait_event(self, kind: str, count: int = 1, timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            while sum(e.kind == kind for e in self.events) < count:
                await asyncio.sleep(0.01)

    async def preempt(self, *, proxy_sees_it: bool = False) -> AttachResult:
        """A spot reclaim and what the lifecycle does about it: detach, resume, wait,
        warm, attach. ``proxy_sees_it``: wait for the proxy's own ``trainer_lost`` first."""
        lost_before = sum(e.kind == "trainer_lost" for e in self.events)
        await self.admin.preempt(self.job_id, account=self.account.id)
        await self.state(self.job_id, JobState.FAILED)
        if proxy_sees_it:
            await self.wait_event("trainer_lost", lost_before + 1)
        self.proxy.detach("preempted")
        await self.client.resume_job(self.job_id)
        await self.ready(self.job_id)
        return await self.attach()

    async def pause_and_resume(self) -> tuple[Any, AttachResult]:
        """A pause: checkpoint, give the trainer back; a resume: a new trainer job (new id),
        attach."""
        record = await self.proxy.checkpoint_now()
        await self.client.delete_job(self.job_id)
        await self.state(self.job_id, JobState.DELETED)
        await self.new_trainer()
        return record, await self.attach()

    async def optim_steps_served(self) -> int:
        """optim_step requests the trainers of this rig served, every job together."""
        total = 0
        for job_id in self.jobs:
            served = await self.admin.data_plane(self.job_name(job_id))
            total += sum(n for key, n in served.items() if key.endswith(":optim_step"))
        return total

    async def dialects(self) -> set[str]:
        seen: set[str] = set()
        for job_id in self.jobs:
            seen |= {
                key.split(":", 1)[0] for key in await self.admin.data_plane(self.job_name(job_id))
            }
        return seen

    async def checkpoint_step(self, job_id: str, name: str) -> int:
        async for checkpoint in self.client.iter_checkpoints(job_id):
            if checkpoint.name.rsplit("/", 1)[-1] == name:
                return int(checkpoint.step or 0)
        raise AssertionError(f"no checkpoint {name} in {job_id}")


async def open_rig(account: Account, admin: PlaneAdmin, **overrides: Any) -> Rig:
    holder: list[Rig] = []

    async def on_event(event: ProxyEvent) -> None:
        holder[0].events.append(event)

    proxy = ProgramProxy(account.client, settings(**overrides), on_event)
    rig = Rig(account, admin, proxy)
    holder.append(rig)
    await proxy.start()
    return rig
