"""The ``shepherd`` CLI as a user runs it: real subprocesses against the real stack, exit
codes (0 success, 1 failed, 2 invalid input, 3 unreachable, 4 not found) and one-line
reasons."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from shepherd.phases import Phase
from tests.helpers import run_cli
from tests.workflows.conftest import Stack


async def cli(
    stack: Stack, *args: str, timeout: float = 120, address: str | None = None
) -> subprocess.CompletedProcess[str]:
    return await run_cli(*args, stack=stack, address=address, timeout=timeout)


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000  # a drawn figure, not an empty image


def write_spec(stack: Stack, tmp: Path, name: str, **sections: Any) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(stack.spec(name, **sections).model_dump(mode="json", exclude_defaults=True))
    )
    return path


async def test_invalid_spec_lists_every_problem_and_starts_nothing(
    stack: Stack, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "name": "Bad Name",
                "trainer": {"base_model": "m", "lora_rank": -2},
                "training": {"total_steps": 0},
                "output": {"model_id": "UPPER"},
            }
        )
    )
    done = await cli(stack, "submit", str(bad))
    assert done.returncode == 2
    for field in ("name", "trainer.lora_rank", "training.total_steps", "output.model_id"):
        assert field in done.stderr
    assert [w async for w in stack.client.list_workflows(f'TaskQueue = "{stack.task_queue}"')] == []


async def test_submit_watch_status_list_checkpoints(stack: Stack, tmp_path: Path) -> None:
    spec = write_spec(stack, tmp_path, "clijob", labels={"team": "cli-test"})
    done = await cli(stack, "submit", str(spec), "--watch", "--set", "training.total_steps=20")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "COMPLETED" in done.stdout and "clijob-model" in done.stdout
    # Not a terminal: one plain line per change, not just the bar's last frame.
    lines = [w for w in done.stdout.splitlines() if "step " in w and "/20" in w]
    assert len(lines) >= 3 and any(w.startswith("TRAINING") for w in lines), done.stdout
    workflow_id = next(w.split()[1] for w in done.stdout.splitlines() if w.startswith("submitted"))

    status = json.loads((await cli(stack, "status", workflow_id, "--json")).stdout)
    assert status["phase"] == Phase.COMPLETED.value and status["step"] == 20
    human = await cli(stack, "status", workflow_id)
    assert human.returncode == 0 and "COMPLETED" in human.stdout and "team=cli-test" in human.stdout
    # The curves: in the JSON; drawn as plain text (not a terminal) and as a PNG.
    assert [p["step"] for p in status["loss_curve"]] == [10, 20]
    assert [p["step"] for p in status["eval_curve"]] == [10, 20]
    png = tmp_path / "curves.png"
    plotted = await cli(stack, "status", workflow_id, "--plot", "--png", str(png))
    assert plotted.returncode == 0, plotted.stderr
    assert "training loss" in plotted.stdout and "eval_loss (at each" in plotted.stdout
    assert "\x1b[" not in plotted.stdout and "recorded yet" not in plotted.stdout
    assert_png(png)

    listed = json.loads(
        (
            await cli(stack, "list", "--label", "team=cli-test", "--phase", "completed", "--json")
        ).stdout
    )
    assert [row["workflow_id"] for row in listed] == [workflow_id]
    assert json.loads((await cli(stack, "list", "--label", "team=nobody", "--json")).stdout) == []

    ckpts = json.loads((await cli(stack, "checkpoints", workflow_id, "--json")).stdout)
    assert [c["step"] for c in ckpts] == [10, 20]


async def test_pause_resume_cancel_and_retry(stack: Stack, tmp_path: Path) -> None:
    spec = write_spec(
        stack,
        tmp_path,
        "steer",
        trainer={"extra_args": ["--compute-delay-ms=80"]},
        training={"total_steps": 60},
    )
    submitted = json.loads((await cli(stack, "submit", str(spec), "--json")).stdout)
    workflow_id = submitted["workflow_id"]
    await stack.until(
        stack.client.get_workflow_handle(workflow_id),
        lambda s: s.step >= 10 and s.phase is Phase.TRAINING,
    )

    paused = await cli(stack, "pause", workflow_id, "--json")
    assert paused.returncode == 0, paused.stderr
    assert json.loads(paused.stdout)["checkpoint"].endswith("pause-1")
    again = await cli(stack, "pause", workflow_id)
    assert (
        again.returncode == 1
        and "already paused" in again.stderr
        and len(again.stderr.strip().splitlines()) == 1
    )

    # Another job's checkpoint is refused at the command (it would make this job that
    # one); this job's own is taken by its short name, as retry --from-checkpoint does.
    foreign = f"accounts/{stack.account.id}/rlorTrainerJobs/someone-else/checkpoints/step-00000010"
    refused = await cli(stack, "resume", workflow_id, "--checkpoint", foreign)
    assert refused.returncode == 2 and "is not a checkpoint of" in refused.stderr
    resumed = await cli(stack, "resume", workflow_id, "--checkpoint", "pause-1")
    assert resumed.returncode == 0 and "resumed" in resumed.stdout, resumed.stderr
    shown = json.loads((await cli(stack, "status", workflow_id, "--json")).stdout)
    assert f"(generation {shown['generation']})" in resumed.stdout  # the same number

    await stack.until(
        stack.client.get_workflow_handle(workflow_id),
        lambda s: s.phase is Phase.TRAINING and s.generation == 1,
    )
    assert (await cli(stack, "cancel", workflow_id)).returncode == 0
    watched = await cli(stack, "watch", workflow_id)
    assert watched.returncode == 1 and "CANCELLED" in watched.stdout
    ended = await cli(stack, "pause", workflow_id)
    assert (
        ended.returncode == 1 and "had already ended (CANCELLED); nothing to pause" in ended.stderr
    )
    other = "accounts/other/rlorTrainerJobs/x/checkpoints/step-00000010"
    wrong = await cli(stack, "retry", workflow_id, "--from-checkpoint", other)
    assert wrong.returncode == 2 and "is not a checkpoint of" in wrong.stderr

    retried = await cli(
        stack,
        "retry",
        workflow_id,
        "--set",
        "training.total_steps=40",
        "--set",
        "trainer.extra_args=[]",
        "--watch",
    )
    assert retried.returncode == 0, retried.stdout + retried.stderr
    new_id = next(w.split()[2] for w in retried.stdout.splitlines() if w.startswith("retrying as"))
    child = json.loads((await cli(stack, "status", new_id, "--json")).stdout)
    assert child["parent_workflow_id"] == workflow_id and child["phase"] == "COMPLETED"
    # It started from the parent's checkpoint, not from scratch.
    assert child["checkpoints"][0]["step"] > 10


async def test_not_found_and_unreachable_are_one_line_with_their_own_codes(stack: Stack) -> None:
    missing = await cli(stack, "status", "job-does-not-exist")
    assert missing.returncode == 4 and len(missing.stderr.strip().splitlines()) == 1
    assert "'job-does-not-exist'" in missing.stderr
    unreachable = await cli(stack, "list", address="127.0.0.1:1", timeout=60)
    assert unreachable.returncode == 3 and "cannot reach Temporal" in unreachable.stderr
    assert len(unreachable.stderr.strip().splitlines()) == 1
    # The address and the reason in words, not the SDK's Rust transport error.
    assert "127.0.0.1:1" in unreachable.stderr and "Connection refused" in unreachable.stderr
    assert "tonic" not in unreachable.stderr


async def test_schedule_and_sweep_commands(stack: Stack, tmp_path: Path) -> None:
    spec = write_spec(
        stack, tmp_path, "cron", output={"model_id": "cron-{scheduled_time:%Y%m%d%H%M%S}"}
    )
    name = f"cli-{os.getpid()}"
    created = await cli(
        stack, "schedule", "create", name, str(spec), "--cron", "0 3 * * *", "--paused", "--json"
    )
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["paused"] is True
    assert (await cli(stack, "schedule", "trigger", name)).returncode == 0
    async with asyncio.timeout(60):
        while True:
            described = json.loads(
                (await cli(stack, "schedule", "describe", name, "--json")).stdout
            )
            if described["recent_runs"] and described["recent_runs"][0]["outcome"] == "COMPLETED":
                break
            await asyncio.sleep(1)
    assert name in (await cli(stack, "schedule", "list")).stdout
    bad = await cli(stack, "schedule", "create", f"{name}-x", str(spec))
    assert bad.returncode == 2 and "--cron" in bad.stderr
    assert (await cli(stack, "schedule", "delete", name)).returncode == 0

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "name": "clisweep",
                "base": str(write_spec(stack, tmp_path, "sweepbase")),
                "parameters": {
                    "trainer.learning_rate": {
                        "type": "double",
                        "min": 0.005,
                        "max": 0.02,
                        "scale": "log",
                    }
                },
                "max_trials": 2,
                "parallelism": 2,
                "promote_best": {"model_id": "clisweep-best"},
            }
        )
    )
    swept = await cli(stack, "sweep", "submit", str(sweep), "--watch")
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert "best: trial" in swept.stdout and "promoted: " in swept.stdout
    sweep_id = next(
        w.split()[2] for w in swept.stdout.splitlines() if w.startswith("submitted sweep")
    )
    png = tmp_path / "sweep.png"
    plotted = await cli(stack, "sweep", "status", sweep_id, "--plot", "--png", str(png))
    assert plotted.returncode == 0, plotted.stderr
    # Every trial on one plot, the key naming each by its mark and the best.
    assert "eval_loss per trial" in plotted.stdout
    assert "• trial 0" in plotted.stdout and "x trial 1" in plotted.stdout
    assert "(best)" in plotted.stdout
    assert_png(png)


async def test_watched_progress_moves_within_a_chunk(stack: Stack) -> None:
    from shepherd.client import Shepherd

    # Half-second steps, one chunk of 10, heartbeats sent every 1.6 s (80 % of the timeout).
    spec = stack.spec(
        "inchunk",
        trainer={"extra_args": ["--compute-delay-ms=500"]},
        training={"total_steps": 10},
        policies={"heartbeat_timeout": "2s"},
    )
    job = await Shepherd(stack.client, task_queue=stack.task_queue).submit(spec)
    seen: set[int] = set()
    async for status in job.watch(interval=0.05):
        seen.add(status.step)
    # The chunk ends at 10; its heartbeat shows the steps before.
    assert seen - {0, 10}, seen


async def test_connection_options_go_before_or_after_the_command(
    stack: Stack, tmp_path: Path
) -> None:
    """``--address``, ``--namespace`` (and ``--task-queue`` where the command starts work
    on a queue) are taken after the command's name as well as before it."""
    address = stack.client.service_client.config.target_host
    nowhere = "127.0.0.1:1"
    # The environment points nowhere: only the option can reach the server.
    for args in (
        ("--address", address, "list", "--json"),
        ("list", "--address", address, "--json"),
    ):
        done = await run_cli(*args, address=nowhere)
        assert done.returncode == 0, (args, done.stderr)
        assert isinstance(json.loads(done.stdout), list)
    # Given in both places, the one after the command's name wins.
    later = await run_cli("--address", address, "list", "--address", nowhere)
    assert later.returncode == 3 and nowhere in later.stderr
    for args in (("--namespace", "no-such-ns", "list"), ("list", "--namespace", "no-such-ns")):
        done = await cli(stack, *args)
        assert done.returncode == 2 and "namespace" in done.stderr, (args, done.stderr)
        assert "no-such-ns" in done.stderr
    # A group's command takes them too.
    reaped = await run_cli("reaper", "status", "--json", "--address", address, address=nowhere)
    assert reaped.returncode == 0, reaped.stderr

    # The task queue: without it (and no SHEPHERD_TASK_QUEUE) the default queue, which no
    # worker here polls, refuses the submission; given either way, the stack's is used.
    spec = write_spec(stack, tmp_path, "placed")
    env_queue = os.environ.pop("SHEPHERD_TASK_QUEUE", None)
    try:
        refused = await run_cli("submit", str(spec), "--dry-run", address=address)
        assert refused.returncode == 2, refused.stderr
        queue = stack.task_queue
        for args in (
            ("--task-queue", queue, "submit", str(spec), "--dry-run"),
            ("submit", str(spec), "--dry-run", "--task-queue", queue),
        ):
            done = await run_cli(*args, address=address)
            assert done.returncode == 0, (args, done.stderr)
            assert f"on task queue {queue!r}" in done.stdout
        manual = await run_cli("reaper", "run", "--dry-run", "--task-queue", queue, address=address)
        assert manual.returncode == 0, manual.stderr
    finally:
        if env_queue is not None:
            os.environ["SHEPHERD_TASK_QUEUE"] = env_queue
