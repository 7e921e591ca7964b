"""Every spec in examples/ runs to its end on the embedded stack, as a newcomer runs it: the
worker knows what ``shepherd dev`` registers with its worker (the example loops and program,
the offline tokenizer cache), works in the repository's root (the examples' relative paths
are the worker's), and each example is submitted from its file — the quickstart with the
CLI, the rest from Python — and must end COMPLETED.

Where an example's own numbers are long for the suite, it runs with fewer steps (overrides, as
a user gives them); the sweep runs two trials and the nightly schedule is created and
triggered once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shepherd import programs
from shepherd.client import JobHandle, Shepherd, load_job_spec
from shepherd.phases import Phase
from shepherd.spec import load_spec, load_spec_data
from shepherd.sweep import validate_sweep
from tests.helpers import run_cli
from tests.workflows.conftest import Stack
from workers.devstack import DevStack, example_loops, example_programs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

#: Each job example and the overrides it runs with here ({queue}: the test's task queue).
JOBS: dict[str, list[str]] = {
    "quickstart.yaml": [],
    # 200 steps of 20 ms: one checkpoint interval is enough to see it through; its queue is
    # the dev stack's ("shepherd").
    "full.yaml": ["training.total_steps=50", "scheduling.task_queue={queue}"],
    "rl.yaml": ["training.total_steps=20"],
    # The programs: one checkpoint interval or two (most of their time is their start).
    "tinker-sft.yaml": ["training.args.steps=8"],
    "cookbook-chat-sl.yaml": ["training.args.max_steps=5"],
    "cookbook-math-rl.yaml": ["training.args.max_steps=5"],
}
SWEEP, SCHEDULE = "sweep.yaml", "nightly.yaml"


@pytest.fixture(autouse=True)
def as_shepherd_dev(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """What ``shepherd dev`` gives its worker (workers/devstack.py), set before the stack's
    worker starts (autouse: it advertises the loops and programs it finds)."""
    for key, value in {
        **example_loops({}),
        **example_programs({}),
        **DevStack(tmp_path / "state").tokenizers(),
        "SHEPHERD_PROGRAM_DIR": str(tmp_path / "programs"),
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(ROOT)
    yield


def test_every_example_is_run_here() -> None:
    assert {p.name for p in EXAMPLES.glob("*.yaml")} == {*JOBS, SWEEP, SCHEDULE}


async def _completed(stack: Stack, job: JobHandle) -> Any:
    stack.handles.append(stack.client.get_workflow_handle(job.id))  # torn down on failure
    final = await job.wait(raise_on_failure=False)
    assert final.phase is Phase.COMPLETED, (job.id, final.phase, final.error)
    return final


@pytest.mark.parametrize("example", sorted(JOBS))
async def test_the_example_runs_to_its_end(stack: Stack, example: str) -> None:
    overrides = [o.format(queue=stack.task_queue) for o in JOBS[example]]
    spec = load_spec(EXAMPLES / example, overrides=overrides)
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    if example == "quickstart.yaml":  # the README's first command, to its exit status
        job = sh.get(f"job-{spec.name}-{uuid.uuid4().hex[:8]}")
        sets = [arg for o in overrides for arg in ("--set", o)]
        done = await run_cli(
            "submit", f"examples/{example}", *sets, "--id", job.id, "--watch", stack=stack
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    else:
        job = await sh.submit(f"examples/{example}", overrides=overrides)
    final = await _completed(stack, job)
    program = spec.training.program
    total = spec.training.total_steps or programs.resolve(program or "").total_steps(
        spec.training.args
    )
    assert (final.step, final.total_steps) == (total, total)
    # Every example promotes, to its model id filled with the submission time.
    prefix = (spec.output.model_id or "").partition("{")[0]
    assert final.model is not None and final.model.name.rsplit("/", 1)[-1].startswith(prefix)
    if program is not None:
        # The program's own headline measure, as its registration names it (its metrics
        # file; chat_sl's test/nll comes only at its evaluations, past these short runs).
        for name in programs.resolve(program).metrics[:1]:
            assert final.metric_curves.get(name), (name, sorted(final.metrics))
        if spec.checkpoint.metric == "env/all/reward/total":
            assert all(c.metric is not None for c in final.checkpoints), final.checkpoints
    if spec.output.promote == "last":  # the weights the job ended with (a sampler twin)
        promoted = (final.model.checkpoint or "").rsplit("/", 1)[-1].removesuffix("-sampler")
        assert promoted == f"step-{total:08d}", final.model


async def test_the_sweep_example_runs_to_its_end(stack: Stack) -> None:
    data = load_spec_data(EXAMPLES / SWEEP)
    data["max_trials"] = 2  # of 6: two trials at once are the sweep's whole behaviour
    sweep = validate_sweep(data, base_dir=EXAMPLES, overrides=["training.total_steps=20"])
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    handle = await sh.submit_sweep(sweep)
    stack.handles.append(stack.client.get_workflow_handle(handle.id))
    status = await handle.wait()
    assert status.phase == "COMPLETED", status.error
    assert [t.state for t in status.trials] == ["completed", "completed"]
    assert status.model is not None and status.model.endswith("/models/lr-sweep-best")


async def test_the_nightly_example_runs_when_triggered(stack: Stack) -> None:
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    name = f"nightly-{uuid.uuid4().hex[:6]}"
    # As README's `shepherd schedule create nightly examples/nightly.yaml --cron ... --set`.
    spec = load_job_spec(EXAMPLES / SCHEDULE, ["training.total_steps=20"])
    await sh.schedules.create(name, spec, cron="0 3 * * *")
    try:
        started = await sh.schedules.trigger(name)
        assert started.outcome == "started" and started.workflow_id, started
        final = await _completed(stack, sh.get(started.workflow_id))
        assert final.step == 20 and final.model is not None
        assert final.model.name.rsplit("/", 1)[-1].startswith("nightly-")
    finally:
        await sh.schedules.delete(name)
