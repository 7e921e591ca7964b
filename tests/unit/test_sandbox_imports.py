"""A new workflow run (a new job, or one taken back into the worker's cache) runs its own
module in a fresh sandbox; everything it imports inside ``imports_passed_through()`` must come
from the worker's modules, not run again. ``from workflows import slot`` inside that block is
run again anyway (the package is already in the sandbox, and Python loads a from-list's
submodules without the sandbox's importer): it cost every new job 11 modules, half the
worker's CPU while a burst of 1,000 jobs was taken in (bench/scale.py). Hence ``import
workflows.slot as slot``."""

from __future__ import annotations

import importlib._bootstrap_external as bootstrap_external
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from temporalio import workflow
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

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
