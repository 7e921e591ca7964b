"""What a submission refuses before anything starts, and the CLI's rough edges, on the real
stack: a bad spec needs no server, a taken workflow id is refused (a re-run only on request),
two live jobs never claim one output model id (not even when submitted at once), a backend
no worker serves is refused; tables keep ids whole at 80 columns; schedules, cancel and
failed sweeps say plainly what happened."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RetryConfig
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from shepherd import binaries
from shepherd.client import (
    JobNotFound,
    Shepherd,
    SubmissionRefused,
    TemporalUnreachable,
)
from shepherd.phases import Phase
from shepherd.preflight import served_backends, worker_identity
from shepherd.spec import SpecError
from tests.helpers import run_cli as cli
from tests.workflows.conftest import Stack
from workers.main import WORKFLOWS, activities_for

#: A trainer slow enough that a job is surely live while a test looks at it.
SLOW = {"extra_args": ["--compute-delay-ms=200"]}


def write(tmp: Path, name: str, data: dict[str, Any]) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def spec_data(name: str = "guard", **sections: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": name,
        "trainer": {"base_model": "accounts/fireworks/models/qwen3-8b"},
        "training": {"total_steps": 20},
        "checkpoint": {"every_steps": 10},
        "output": {"model_id": f"{name}-model"},
        "policies": {"poll_interval": "1s", "heartbeat_timeout": "5s"},
    }
    for key, value in sections.items():
        data[key] = {**data[key], **value} if isinstance(data.get(key), dict) else value
    return data


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


async def _started(stack: Stack) -> list[str]:
    query = f'TaskQueue = "{stack.task_queue}"'
    return [w.id async for w in stack.client.list_workflows(query)]


async def _cancel_and_wait(stack: Stack, workflow_id: str) -> None:
    handle = stack.client.get_workflow_handle(workflow_id)
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()


# ---------------------------------------------------------------- validate first


async def test_a_bad_spec_is_refused_without_any_server(tmp_path: Path) -> None:
    bad = write(tmp_path, "bad", spec_data("Bad Name", training={"total_steps": True}))
    nowhere = "127.0.0.1:1"
    done = await cli("submit", str(bad), address=nowhere)
    assert done.returncode == 2, done.stderr
    assert "invalid job spec" in done.stderr and "cannot reach" not in done.stderr
    assert "name" in done.stderr and "training.total_steps" in done.stderr

    good = write(tmp_path, "good", spec_data("good"))
    checked = await cli("validate", str(good), "--set", "training.total_steps=40", address=nowhere)
    assert checked.returncode == 0, checked.stderr
    normalised = yaml.safe_load(checked.stdout)
    assert normalised["training"]["total_steps"] == 40
    assert normalised["training"]["batch_size"] == 32  # defaults are filled in
    as_json = await cli("validate", str(good), "--json", address=nowhere)
    assert json.loads(as_json.stdout)["name"] == "good"

    refused = await cli("validate", str(bad), address=nowhere)
    assert refused.returncode == 2 and "training.total_steps" in refused.stderr
    assert refused.stdout == ""

    sweep = write(
        tmp_path,
        "sweep",
        {
            "name": "vs",
            "base": str(good),
            "parameters": {"trainer.lora_rank": {"type": "int", "min": 4, "max": 8, "step": 4}},
        },
    )
    swept = await cli("validate", str(sweep), "--json", address=nowhere)
    assert swept.returncode == 0, swept.stderr
    assert json.loads(swept.stdout)["base"]["name"] == "good"

    # Option errors are not reported as a bad spec.
    option = await cli("submit", str(good), "--set", "no-equals", address=nowhere)
    assert option.returncode == 2 and "invalid override" in option.stderr
    assert "invalid job spec" not in option.stderr
    rerun = await cli("submit", str(good), "--rerun", address=nowhere)
    assert rerun.returncode == 2 and "--id" in one_line(rerun)
    slash = await cli("submit", str(good), "--id", "a/b", address=nowhere)
    assert slash.returncode == 2 and "workflow_id" in slash.stderr
    assert "invalid workflow id" in slash.stderr
    sched = await cli("schedule", "create", "Bad Name", str(good), "--every", "1h", address=nowhere)
    assert sched.returncode == 2 and "invalid schedule" in sched.stderr


async def test_dry_run_checks_and_starts_nothing(stack: Stack, tmp_path: Path) -> None:
    spec = write(tmp_path, "dry", spec_data("dry"))
    done = await cli("submit", str(spec), "--dry-run", "--json", stack=stack)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["workflow_id"].startswith("job-dry-") and plan["claims_model"] == "dry-model"
    assert plan["spec"]["training"]["total_steps"] == 20
    human = await cli("submit", str(spec), "--dry-run", stack=stack)
    assert human.returncode == 0 and "would start" in human.stdout
    assert await _started(stack) == []


# ---------------------------------------------------------------- workflow ids


async def test_a_taken_id_is_refused_and_a_rerun_must_be_asked_for(
    stack: Stack, tmp_path: Path
) -> None:
    spec = write(tmp_path, "ided", spec_data("ided", trainer=SLOW, output={"promote": "none"}))
    workflow_id = f"my-job-{uuid.uuid4().hex[:6]}"
    first = await cli("submit", str(spec), "--id", workflow_id, "--json", stack=stack)
    assert first.returncode == 0, first.stderr
    stack.handles.append(stack.client.get_workflow_handle(workflow_id))
    first_run = (await stack.client.get_workflow_handle(workflow_id).describe()).run_id

    running = await cli("submit", str(spec), "--id", workflow_id, stack=stack)
    assert running.returncode == 2 and "running" in one_line(running)
    # Even a re-run never replaces a live job.
    running_rerun = await cli("submit", str(spec), "--id", workflow_id, "--rerun", stack=stack)
    assert running_rerun.returncode == 2 and "running" in one_line(running_rerun)
    dry = await cli("submit", str(spec), "--id", workflow_id, "--dry-run", stack=stack)
    assert dry.returncode == 2 and "running" in one_line(dry)

    await _cancel_and_wait(stack, workflow_id)
    ended = await cli("submit", str(spec), "--id", workflow_id, stack=stack)
    assert ended.returncode == 2
    line = one_line(ended)
    assert "already ran" in line and "CANCELLED" in line and "--rerun" in line
    assert (await stack.client.get_workflow_handle(workflow_id).describe()).run_id == first_run

    again = await cli("submit", str(spec), "--id", workflow_id, "--rerun", "--json", stack=stack)
    assert again.returncode == 0, again.stderr
    assert (await stack.client.get_workflow_handle(workflow_id).describe()).run_id != first_run


async def test_cancel_of_an_ended_job_says_it_ended(stack: Stack) -> None:
    handle = await stack.start(stack.spec("over", output={"promote": "none"}))
    await handle.result()
    done = await cli("cancel", handle.id, stack=stack)
    assert done.returncode == 1
    line = one_line(done)
    assert "already ended" in line and "COMPLETED" in line
    missing = await cli("cancel", "job-never-was", stack=stack)
    assert missing.returncode == 4


# ---------------------------------------------------------------- model claims


async def test_two_live_jobs_never_claim_one_model_id(stack: Stack, tmp_path: Path) -> None:
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    model = f"claimed-{uuid.uuid4().hex[:6]}"
    data = spec_data("claim", trainer=SLOW, output={"model_id": model})
    # Submitted at the same moment: exactly one wins; the lock closes the visibility race.
    results = await asyncio.gather(sh.submit(data), sh.submit(data), return_exceptions=True)
    winners = [r for r in results if not isinstance(r, BaseException)]
    losers = [r for r in results if isinstance(r, BaseException)]
    assert len(winners) == 1 and len(losers) == 1, results
    assert isinstance(losers[0], SubmissionRefused) and losers[0].field == "output.model_id"
    assert winners[0].id in str(losers[0])
    stack.handles.append(stack.client.get_workflow_handle(winners[0].id))
    assert len(await _started(stack)) == 1

    # The CLI says the same in one line, exit 2; so does a dry run.
    path = write(tmp_path, "claim", data)
    for args in (("submit", str(path)), ("submit", str(path), "--dry-run")):
        done = await cli(*args, stack=stack)
        assert done.returncode == 2 and "output.model_id" in one_line(done), done.stderr
    # A sweep promoting to it is refused too.
    sweep = {
        "name": "claimsweep",
        "spec": spec_data("claimbase"),
        "parameters": {"trainer.lora_rank": {"type": "categorical", "values": [4]}},
        "max_trials": 1,
        "promote_best": {"model_id": model},
    }
    with pytest.raises(SubmissionRefused) as refused:
        await sh.submit_sweep(sweep)
    assert refused.value.field == "promote_best.model_id"

    # Once the holder has ended, the id is free again.
    await _cancel_and_wait(stack, winners[0].id)
    later = await sh.submit(data)
    stack.handles.append(stack.client.get_workflow_handle(later.id))


async def test_the_claim_survives_continue_as_new(stack: Stack) -> None:
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    model = f"long-{uuid.uuid4().hex[:6]}"
    data = spec_data(
        "longclaim",
        trainer=SLOW,
        training={"total_steps": 200, "steps_per_chunk": 1},
        output={"model_id": model},
        policies={"max_history_events": 200},
    )
    job = await sh.submit(data)
    handle = stack.client.get_workflow_handle(job.id)
    stack.handles.append(handle)
    await stack.until(handle, lambda s: s.continued_as_new >= 1, timeout=120)
    with pytest.raises(SubmissionRefused) as refused:
        await sh.submit(spec_data("other", output={"model_id": model}))
    assert job.id in str(refused.value)


async def test_a_live_sweep_claims_its_promote_best_model(stack: Stack) -> None:
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    model = f"sweepbest-{uuid.uuid4().hex[:6]}"
    sweep = {
        "name": "claiming",
        "spec": spec_data("claimtrial", trainer=SLOW),
        "parameters": {"trainer.lora_rank": {"type": "categorical", "values": [4]}},
        "max_trials": 1,
        "promote_best": {"model_id": model},
    }
    handle = await sh.submit_sweep(sweep)
    stack.handles.append(stack.client.get_workflow_handle(handle.id))
    with pytest.raises(SubmissionRefused) as refused:
        await sh.submit(spec_data("late", output={"model_id": model}))
    assert refused.value.field == "output.model_id" and handle.id in str(refused.value)
    with pytest.raises(SubmissionRefused):
        await sh.submit_sweep(sweep)
    await handle.cancel()
    cancelled = await cli("sweep", "cancel", handle.id, stack=stack)
    assert cancelled.returncode in (0, 1)  # racing the end of the first cancel


# ---------------------------------------------------------------- backends


async def test_a_backend_no_worker_serves_is_refused(stack: Stack) -> None:
    sh = Shepherd(stack.client, task_queue=f"tq-{uuid.uuid4().hex}")
    async with Worker(
        stack.client,
        task_queue=sh.task_queue,
        workflows=WORKFLOWS,
        activities=activities_for(stack.registry),
        identity=worker_identity(stack.registry.profiles),
    ):
        async with asyncio.timeout(30):  # until the server lists the worker as a poller
            while await served_backends(stack.client, sh.task_queue) is None:
                await asyncio.sleep(0.2)
        with pytest.raises(SubmissionRefused) as refused:
            await sh.submit(spec_data("nobackend", backend="elsewhere"))
        assert refused.value.field == "backend"
        assert "elsewhere" in str(refused.value) and "local" in str(refused.value)
        query = f'TaskQueue = "{sh.task_queue}"'
        assert [w async for w in stack.client.list_workflows(query)] == []

        job = await sh.submit(spec_data("hasbackend", output={"promote": "none"}))
        final = await job.wait()
        assert final.phase is Phase.COMPLETED


# ---------------------------------------------------------------- small CLI items


async def test_ids_are_whole_at_80_columns(stack: Stack) -> None:
    name = "a-name-as-long-as-names-may-be-is-forty0"
    assert len(name) == 40
    handle = await stack.start(stack.spec(name, output={"promote": "none"}))
    final = await handle.result()
    assert len(final.checkpoints) == 2

    listed = await cli("list", "--name", name, stack=stack, columns=80)
    assert listed.returncode == 0, listed.stderr
    assert handle.id in listed.stdout.splitlines()
    assert "…" not in listed.stdout

    ckpts = await cli("checkpoints", handle.id, stack=stack, columns=80)
    assert ckpts.returncode == 0, ckpts.stderr
    lines = ckpts.stdout.splitlines()
    for c in final.checkpoints:
        assert c.name in lines, ckpts.stdout
    wide = await cli("checkpoints", handle.id, stack=stack, columns=250)
    assert "┃" in wide.stdout  # a table where it fits


async def test_schedule_list_shows_cron_and_a_missing_schedule_is_named(
    stack: Stack, tmp_path: Path
) -> None:
    spec = write(tmp_path, "cronned", spec_data("cronned", output={"promote": "none"}))
    name = f"cron-{uuid.uuid4().hex[:6]}"
    created = await cli(
        "schedule", "create", name, str(spec), "--cron", "15 3 * * 1-5", "--paused", stack=stack
    )
    assert created.returncode == 0, created.stderr
    try:
        listed = json.loads((await cli("schedule", "list", "--json", stack=stack)).stdout)
        mine = next(i for i in listed if i["name"] == name)
        assert "15 3 * * 1-5" in mine["spec"]
        human = await cli("schedule", "list", stack=stack)
        assert "15 3 * * 1-5" in human.stdout
        paused = await cli("schedule", "pause", name, "--json", stack=stack)
        assert json.loads(paused.stdout) == {"schedule": name, "action": "paused"}
    finally:
        deleted = await cli("schedule", "delete", name, stack=stack)
        assert deleted.returncode == 0, deleted.stderr
    for action in ("delete", "pause", "trigger", "describe"):
        missing = await cli("schedule", action, name, stack=stack)
        assert missing.returncode == 4
        assert one_line(missing) == f"error: no schedule {name!r}"


async def test_a_failed_sweep_says_failed_and_why(stack: Stack) -> None:
    taken = await stack.start(stack.spec("taken", output={"model_id": "sweep-target"}))
    await taken.result()  # the model now exists: the sweep's promotion must fail
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    handle = await sh.submit_sweep(
        {
            "name": "doomed",
            "spec": spec_data("doomedbase"),
            "parameters": {"trainer.lora_rank": {"type": "categorical", "values": [4]}},
            "max_trials": 1,
            "promote_best": {"model_id": "sweep-target"},
        }
    )
    with pytest.raises(WorkflowFailureError):
        await stack.client.get_workflow_handle(handle.id).result()
    status = json.loads((await cli("sweep", "status", handle.id, "--json", stack=stack)).stdout)
    assert status["phase"] == "FAILED" and "sweep-target" in status["error"]
    human = await cli("sweep", "status", handle.id, stack=stack)
    assert "FAILED" in human.stdout and "sweep-target" in human.stdout


# ---------------------------------------------------------------- the API's own errors


async def test_a_parent_that_is_no_job_is_refused_before_anything_starts(stack: Stack) -> None:
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    with pytest.raises(SpecError) as refused:
        await sh.submit(spec_data("orphan"), parent_workflow_id="no-such")
    (problem,) = refused.value.problems
    assert problem.field == "parent_workflow_id" and "existing job" in problem.rule
    # A workflow that is not a job (a sweep, a reaper pass ...) is no parent either.
    other = await stack.client.start_workflow(
        "NotAJob", id=f"not-a-job-{uuid.uuid4().hex[:6]}", task_queue=f"{stack.task_queue}-none"
    )
    try:
        with pytest.raises(SpecError) as refused:
            await sh.submit(spec_data("orphan"), parent_workflow_id=other.id)
        assert "NotAJob workflow" in refused.value.problems[0].rule
    finally:
        await other.terminate()
    assert await _started(stack) == []


async def test_a_missing_workflow_is_job_not_found(stack: Stack) -> None:
    sh = Shepherd(stack.client, task_queue=stack.task_queue)
    job = sh.get("job-never-was")
    calls = {
        "status": job.status(),
        "spec": job.spec(),
        "wait": job.wait(),
        "pause": job.pause(),
        "resume": job.resume(),
        "cancel": job.cancel(),
        "retry": job.retry(),
        "checkpoints": job.checkpoints(),
        "watch": anext(job.watch()),
        "sweep status": sh.get_sweep("sweep-never-was").status(),
        "sweep cancel": sh.get_sweep("sweep-never-was").cancel(),
    }
    for what, call in calls.items():
        with pytest.raises(JobNotFound) as missing:
            await call
        assert missing.value.workflow_id.endswith("-never-was"), what
        assert "never-was" in str(missing.value), what
    shown = await cli("status", "job-never-was", stack=stack)
    assert shown.returncode == 4
    assert "'job-never-was'" in one_line(shown) and "RPCError" not in shown.stderr


async def test_a_server_that_went_away_is_unreachable_with_its_address() -> None:
    """Connected, then the server stops: calls raise TemporalUnreachable naming the
    address, not the SDK's RPC error (its message a Rust transport error)."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=binaries.temporal(),
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
    )
    address = env.client.service_client.config.target_host
    client = await Client.connect(
        address,
        data_converter=pydantic_data_converter,
        retry_config=RetryConfig(max_retries=2, max_elapsed_time_millis=2000),
    )
    sh = Shepherd(client, task_queue="q")
    assert await sh.list(query='WorkflowType = "x"') == []  # it answers
    await env.shutdown()
    for call in (sh.get("job-x").status(), sh.list(), sh.submit(spec_data("gone"))):
        with pytest.raises(TemporalUnreachable) as unreachable:
            await call
        assert unreachable.value.address == address and address in str(unreachable.value)
        assert "tonic" not in str(unreachable.value)
