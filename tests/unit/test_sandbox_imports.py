"""A new workflow run (a new job, or one taken back into the worker's cache) runs its own
module in a fresh sandbox; everything it imports inside ``imports_passed_through()`` must come
from the worker's modules, not run again. ``from workflows import slot`` inside that block is
run again anyway (the package is already in the sandbox, and Python loads a from-list's
submodules without the sandbox's importer): it cost every new job 11 modules, half the
worker's CPU while a burst of 1,000 jobs was taken in (bench/scale.py). Hence ``import
workflows.slot as slot``."""

from __future__ import annotations

import importlib._bootstrap_external as bootstrap_external
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

import workflows
from workflows.job import TrainingJobWorkflow
from workflows.reaper import ReaperWorkflow
from workflows.scheduler import SchedulerWorkflow
from workflows.sweep import SweepWorkflow


@contextmanager
def modules_run() -> Iterator[list[str]]:
    """The names of the modules whose code runs meanwhile (a source or bytecode load)."""
    ran: list[str] = []
    original = bootstrap_external._LoaderBasics.exec_module

    def recording(self: object, module: object) -> None:
        ran.append(module.__name__)  # type: ignore[attr-defined]
        original(self, module)  # type: ignore[arg-type]

    bootstrap_external._LoaderBasics.exec_module = recording  # type: ignore[method-assign]
    try:
        yield ran
    finally:
        bootstrap_external._LoaderBasics.exec_module = original  # type: ignore[method-assign]


@pytest.mark.parametrize(
    "cls", [TrainingJobWorkflow, SchedulerWorkflow, SweepWorkflow, ReaperWorkflow]
)
async def test_a_new_run_runs_only_its_own_module_in_the_sandbox(cls: type) -> None:
    runner = SandboxedWorkflowRunner()
    defn = workflow._Definition.must_from_class(cls)
    runner.prepare_workflow(defn)  # the first run may import what the worker has not yet
    with modules_run() as ran:
        runner.prepare_workflow(defn)  # what every later new run costs
    ours = sorted({name for name in ran if name.split(".")[0] in ("workflows", "shepherd")})
    assert ours == ["workflows", cls.__module__]


#: What the sandbox refuses in a workflow (the clock, randomness, the environment, files, real
#: sleeps and threads): the step modules are passed through, so its restrictions no longer look
#: inside them, and this does.
NOT_IN_WORKFLOWS = re.compile(
    r"\b(time\.(time|monotonic|perf_counter|sleep)|datetime\.(now|utcnow|today)|date\.today"
    r"|random\.|uuid\.uuid[14]|os\.(environ|getenv)|open\(|asyncio\.sleep|threading\.)"
)


def test_no_workflow_module_calls_what_the_sandbox_would_refuse() -> None:
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(Path(workflows.__file__).parent.glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if NOT_IN_WORKFLOWS.search(line.split("#", 1)[0])
    ]
    assert found == [], "use workflow.now(), workflow.random(), workflow.uuid4(), ..."


def test_the_check_finds_a_wall_clock_call() -> None:
    assert NOT_IN_WORKFLOWS.search("started = datetime.now(UTC)")
    assert NOT_IN_WORKFLOWS.search("    await asyncio.sleep(1)")
    assert not NOT_IN_WORKFLOWS.search("now = workflow.now()")
