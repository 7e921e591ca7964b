"""Fail before the GPU, on the real stack: what a submission refuses at once (a queue no
worker polls, a loop no worker has), what the job's first activity refuses on the worker
before any trainer exists (its dataset, the metric its loop reports, its base model), and a
sweep whose promoted model exists — each naming the field, and the plane's ``creates``
proving no trainer was made."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.client import WorkflowFailureError

from shepherd import datasets
from shepherd.client import Shepherd, SubmissionRefused
from shepherd.phases import Phase
from tests.helpers import run_cli
from tests.workflows import user_loops
from tests.workflows.conftest import Stack


def _data(name: str, **sections: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": name,
        "trainer": {"base_model": "accounts/fireworks/models/qwen3-8b"},
        "training": {"total_steps": 10},
        "checkpoint": {"every_steps": 5},
        "output": {"promote": "none"},
        "policies": {"poll_interval": "1s"},
    }
    for key, value in sections.items():
        data[key] = {**data[key], **value} if isinstance(data.get(key), dict) else value
    return data


async def _started(stack: Stack, queue: str | None = None) -> list[str]:
    query = f'TaskQueue = "{queue or stack.task_queue}"'
    return [w.id async for w in stack.client.list_workflows(query)]


async def test_a_submission_no_worker_can_run_is_refused(stack: Stack, tmp_path: Path) -> None:
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    refusals: dict[str, SubmissionRefused] = {}
    for case, kwargs in {
        "scheduling.task_queue": {"spec": _data("noq", scheduling={"task_queue": "no-such-queue"})},
        # The old meaning of scheduling.queue (the workers' task queue), for workers that run:
        # refused, naming the field that routes a job now.
        "scheduling.queue": {
            "spec": _data("oldq", scheduling={"queue": f"{stack.task_queue}-waits"})
        },
        "task_queue": {"spec": _data("bogus"), "task_queue": "bogus-q"},
        "training.loop": {"spec": _data("noloop", training={"loop": "not-registered"})},
    }.items():
        with pytest.raises(SubmissionRefused) as refused:
            await sh.submit(**kwargs)
        assert refused.value.field == case, refused.value
        refusals[case] = refused.value
    assert "no worker polls task queue 'no-such-queue'" in str(refusals["scheduling.task_queue"])
    assert "set scheduling.task_queue" in str(refusals["scheduling.queue"])
    assert "'not-registered'" in str(refusals["training.loop"])
    assert "supervised" in str(refusals["training.loop"])  # what the workers do have
    # A sweep's base is held to the same rules.
    sweep = {
        "name": "nowhere",
        "spec": _data("nowherebase", scheduling={"task_queue": "no-such-queue"}),
        "parameters": {"trainer.lora_rank": {"type": "categorical", "values": [4]}},
        "max_trials": 1,
    }
    with pytest.raises(SubmissionRefused) as swept:
        await sh.submit_sweep(sweep)
    assert swept.value.field == "base.scheduling.task_queue"
    assert await _started(stack) == [] and await _started(stack, "no-such-queue") == []

    # The CLI says it in one line, exit 2, and never blocks.
    path = tmp_path / "noq.yaml"
    path.write_text(yaml.safe_dump(_data("noq", scheduling={"task_queue": "no-such-queue"})))
    done = await run_cli("submit", str(path), stack=stack, timeout=30)
    assert done.returncode == 2 and "scheduling.task_queue" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


async def test_the_first_activity_refuses_what_only_a_worker_can_check(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed = tmp_path / "data"
    allowed.mkdir()
    (allowed / "bad.jsonl").write_text('{"text": "fine"}\n{"question": "no text"}\n')
    outside = tmp_path / "outside.jsonl"
    outside.write_text("".join(f'{{"text": "r{i}"}}\n' for i in range(10)))
    monkeypatch.setenv(datasets.DIRS_ENV, str(allowed))
    monkeypatch.setenv("SHEPHERD_LOOPS", user_loops.REF)
    creates = (await stack.admin.stats())["creates"]
    cases: dict[str, tuple[dict[str, Any], str, str]] = {
        "outside": (
            {"training": {"dataset": str(outside)}},
            "training.dataset",
            "InvalidDataset",
        ),
        "missing": (
            {"training": {"dataset": str(allowed / "missing.jsonl")}},
            "training.dataset",
            "InvalidDataset",
        ),
        "unparsable": (
            {"training": {"dataset": str(allowed / "bad.jsonl")}},
            "training.dataset",
            "InvalidDataset",
        ),
        "metric": (
            {"training": {"loop": "inline-examples"}, "checkpoint": {"metric": "reward"}},
            "checkpoint.metric",
            "MetricMissing",
        ),
        "unknown-model": (
            {"trainer": {"base_model": "accounts/fireworks/models/no-such-model"}},
            "trainer.base_model",
            "InvalidBaseModel",
        ),
        "other-account": (
            {"trainer": {"base_model": "accounts/someone-else/models/private"}},
            "trainer.base_model",
            "InvalidBaseModel",
        ),
    }
    handles = {
        case: await stack.start(stack.spec(f"pre-{case}", **sections, output={"promote": "none"}))
        for case, (sections, _, _) in cases.items()
    }

    async def outcome(case: str) -> tuple[str, WorkflowFailureError]:
        with pytest.raises(WorkflowFailureError) as failed:
            await handles[case].result()
        return case, failed.value

    for case, failure in await asyncio.gather(*(outcome(c) for c in cases)):
        _, field, kind = cases[case]
        assert getattr(failure.cause, "type", None) == kind, (case, failure.cause)
        assert field in str(failure.cause), (case, failure.cause)
        status = await stack.status(handles[case])
        assert status.phase is Phase.FAILED and status.trainer_job_id is None, case
    assert (await stack.admin.stats())["creates"] == creates  # no trainer, not one


async def test_a_sweep_whose_model_exists_runs_no_trial(stack: Stack) -> None:
    model = f"swept-{uuid.uuid4().hex[:6]}"
    taken = await stack.start(stack.spec("maker", output={"model_id": model}))
    await taken.result()
    creates = (await stack.admin.stats())["creates"]
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    handle = await sh.submit_sweep(
        {
            "name": "toolate",
            "spec": _data("toolatebase"),
            "parameters": {"trainer.lora_rank": {"type": "categorical", "values": [4, 8]}},
            "max_trials": 2,
            "promote_best": {"model_id": model},
        }
    )
    status = await handle.wait()
    assert status.phase == "FAILED" and status.trials == []
    assert status.error and "promote_best.model_id" in status.error and model in status.error
    assert (await stack.admin.stats())["creates"] == creates
    shown = json.loads((await run_cli("sweep", "status", handle.id, "--json", stack=stack)).stdout)
    assert shown["phase"] == "FAILED"
    # A sweep's id given where a job's is expected: said, no validation errors.
    as_job = await run_cli("status", handle.id, stack=stack)
    assert as_job.returncode == 2 and "is a sweep" in as_job.stderr
    assert "pydantic" not in as_job.stderr
    as_sweep = await run_cli("sweep", "status", taken.id, stack=stack)
    assert as_sweep.returncode == 2 and "is a job" in as_sweep.stderr
    assert "pydantic" not in as_sweep.stderr


async def test_the_first_activity_refuses_a_program_it_cannot_run_as_asked(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program job whose submitter did not know the program (so nothing refused it there):
    the worker refuses, before any trainer, an argument the registration fixes, a recipe that
    asks on stdin, a program it does not have, and (offline) a model whose tokenizer it does
    not have — each with a program's error type and the field."""
    base = {"base_model": "accounts/fireworks/models/qwen3-8b"}
    args: dict[str, dict[str, Any]] = {
        "fixed": {"log_dir": "/tmp/mine", "steps": 4},
        "asks": {},
        "unknown": {},
        "tokenizer": {"model_name": "Qwen/Qwen3-8B-Base"},
    }
    program = {"fixed": "tinker-sft", "asks": "basic", "unknown": "nowhere", "tokenizer": "chat"}
    # Specs made before the registrations exist in this (the submitter's) process.
    specs = {
        case: stack.spec(
            f"prog-{case}",
            trainer=base,
            training={"total_steps": None, "program": program[case], "args": args[case]},
            checkpoint={"every_steps": 2},
            output={"promote": "none"},
        )
        for case in args
    }
    registrations = {
        "tinker-sft": {"script": "/opt/sft.py", "log_dir_arg": "log_dir"},
        "basic": {"module": "tinker_cookbook.recipes.sl_basic", "log_dir_arg": "log_path"},
        "chat": {
            "module": "tinker_cookbook.recipes.chat_sl.train",
            "log_dir_arg": "log_path",
            "model_arg": "model_name",
        },
    }
    monkeypatch.setenv("SHEPHERD_PROGRAMS", json.dumps(registrations))
    empty = tmp_path / "empty-hf-home"
    empty.mkdir()
    monkeypatch.setenv("HF_HOME", str(empty))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    creates = (await stack.admin.stats())["creates"]
    handles = {case: await stack.start(spec) for case, spec in specs.items()}
    expected = {
        "fixed": (
            "InvalidProgram",
            "training.args.log_dir: is fixed by the registration of program 'tinker-sft' "
            "(Shepherd passes the job's log directory); leave it out",
        ),
        "asks": ("InvalidProgram", "training.program: program 'basic' runs"),
        "unknown": ("InvalidProgram", "training.program: no program 'nowhere' is registered"),
        "tokenizer": ("TokenizerMissing", "training.args.model_name: the worker is offline"),
    }
    for case, (kind, text) in expected.items():
        with pytest.raises(WorkflowFailureError) as failed:
            await handles[case].result()
        cause = failed.value.cause
        assert getattr(cause, "type", None) == kind, (case, cause)
        assert text in str(cause) and "''" not in str(cause), (case, str(cause))
        status = await stack.status(handles[case])
        assert status.phase is Phase.FAILED and status.trainer_job_id is None, case
        if case == "tokenizer":  # and how to get one
            assert 'docs/programs.md, "Tokenizers offline"' in str(cause)
            assert "python -m shepherd.offline" in str(cause), str(cause)
    assert (await stack.admin.stats())["creates"] == creates  # no trainer, not one
