"""``shepherd logs JOB [--follow]`` as a user runs it: the lifecycle (from the workflow's
history) and the trainers' output (from the plane) in one stream, in time order; following a
job across a pause into its next trainer until it ends; Ctrl-C; no trainer log (but a
reason) when this shell cannot reach the platform; and a program job's terminal output and
reports as text."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shepherd.models import JobStatus, PauseRequest, PauseResult, ResumeRequest
from shepherd.phases import Phase
from tests.helpers import run_cli
from tests.plane import cookbook_support as cb
from tests.workflows.conftest import KEY_ENV, Stack


@pytest.fixture
def profile(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """This shell's backend profile, as the workers have it (the CLI subprocess inherits it)."""
    monkeypatch.setenv("SHEPHERD_BACKENDS", "local")
    monkeypatch.setenv("SHEPHERD_BACKEND_LOCAL_URL", stack.plane.url)
    monkeypatch.setenv("SHEPHERD_BACKEND_LOCAL_API_KEY_ENV", KEY_ENV)
    monkeypatch.setenv(KEY_ENV, stack.account.api_key)


def index(lines: list[str], needle: str, after: int = -1) -> int:
    """The first line after line ``after`` that contains ``needle``."""
    return next(i for i, line in enumerate(lines) if i > after and needle in line)


@contextlib.asynccontextmanager
async def following(stack: Stack, workflow_id: str) -> AsyncIterator[asyncio.subprocess.Process]:
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": stack.client.service_client.config.target_host,
        "SHEPHERD_TASK_QUEUE": stack.task_queue,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "shepherd.cli.main", "logs", workflow_id, "--follow"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def read_until(proc: asyncio.subprocess.Process, needle: str) -> list[str]:
    assert proc.stdout is not None
    lines: list[str] = []
    async with asyncio.timeout(60):
        while not lines or needle not in lines[-1]:
            line = await proc.stdout.readline()
            assert line, f"the follower ended before {needle!r}: {lines}"
            lines.append(line.decode().rstrip("\n"))
    return lines


async def test_logs_interleave_the_lifecycle_and_the_trainer_by_time(
    stack: Stack, profile: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # One chunk, one checkpoint, no promotion: enough of a story, quickly told.
    handle = await stack.start(
        stack.spec("logged", training={"total_steps": 10}, output={"promote": "none"})
    )
    await handle.result()

    done = await run_cli("logs", handle.id, stack=stack)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    stamps = [line.split(" ", 1)[0] for line in lines]
    assert stamps == sorted(stamps), done.stdout
    assert "[shepherd] phase TRAINING" in done.stdout
    # Causal order across the two sources: the trainer writes only once created, saves a
    # checkpoint while Shepherd's save activity runs, and is gone before the job ends.
    created = index(lines, "[shepherd] create trainer ")
    session = index(lines, "[trainer g0] session.created", created)
    saving = index(lines, "[shepherd] save checkpoint step-00000010", session)
    saved = index(lines, "[trainer g0] checkpoint.saved", saving)
    assert "step-00000010" in lines[saved]
    assert saved < index(lines, "[shepherd] save checkpoint step-00000010: done", saving)
    assert lines[-1].endswith("[shepherd] job completed")

    # A shell without the platform's key still gets the lifecycle, and one line on why not more.
    monkeypatch.setenv("SHEPHERD_BACKEND_LOCAL_API_KEY_ENV", "SHEPHERD_TEST_UNSET_KEY")
    monkeypatch.setenv("SHEPHERD_STATE_DIR", str(tmp_path))  # no dev stack either
    alone = await run_cli("logs", handle.id, "--json", "-n", "5", stack=stack)
    assert alone.returncode == 0, alone.stderr
    records = [json.loads(line) for line in alone.stdout.splitlines()]
    assert len(records) == 5 and {r["source"] for r in records} == {"shepherd"}
    assert records[-1]["text"] == "job completed" and records[-2]["text"] == "phase COMPLETED"
    assert alone.stderr.count("trainer log not shown") == 1
    assert "SHEPHERD_TEST_UNSET_KEY" in alone.stderr

    # The stack `shepherd dev` runs names its plane and key file (never the key) in stack.json.
    key_file = tmp_path / "dev-api-key"
    key_file.write_text(stack.account.api_key)
    (tmp_path / "stack.json").write_text(
        json.dumps(
            {
                "temporal": stack.client.service_client.config.target_host,
                "plane": stack.plane.url,
                "plane_api_key_file": str(key_file),
            }
        )
    )
    dev = await run_cli("logs", handle.id, stack=stack)
    assert dev.returncode == 0 and dev.stdout == done.stdout, dev.stderr
    for out in (done, alone, dev):
        assert stack.account.api_key not in out.stdout + out.stderr


async def test_follow_goes_on_into_the_next_trainer_until_the_job_ends(
    stack: Stack, profile: None
) -> None:
    handle = await stack.start(stack.spec("followed", output={"promote": "none"}))
    await stack.until(handle, lambda s: s.phase is Phase.TRAINING)
    await handle.execute_update("request_pause", PauseRequest(), result_type=PauseResult)

    # Ctrl-C ends a follower at once and quietly.
    async with following(stack, handle.id) as interrupted:
        await read_until(interrupted, "[shepherd] phase PAUSED")
        interrupted.send_signal(signal.SIGINT)
        async with asyncio.timeout(20):
            _, err = await interrupted.communicate()
        assert interrupted.returncode == 130 and b"Traceback" not in err, err

    async with following(stack, handle.id) as follower:
        before = await read_until(follower, "[shepherd] phase PAUSED")
        await handle.execute_update("request_resume", ResumeRequest(), result_type=JobStatus)
        async with asyncio.timeout(90):
            out, err = await follower.communicate()
    assert follower.returncode == 0, err.decode()
    lines = before + out.decode().splitlines()
    assert "[trainer g1] trainer.ready" in out.decode()  # the resumed job's new trainer
    assert "[shepherd] job completed" in lines[-1]
    assert (await stack.status(handle)).phase is Phase.COMPLETED


@pytest.fixture
def noisy_program(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The worker (in this process) knows tests/workflows/noisy_program.py as ``noisy`` and
    keeps program log directories under the test's temp dir, where ``shepherd logs`` (a
    subprocess with this environment) reads them."""
    program = {"module": "tests.workflows.noisy_program", "total_steps_arg": "steps"}
    monkeypatch.setenv("SHEPHERD_PROGRAMS", json.dumps({"noisy": program}))
    monkeypatch.setenv("SHEPHERD_PROGRAM_DIR", str(tmp_path / "programs"))
    for key, value in cb.offline_env(cb.hf_home(tmp_path)).items():
        monkeypatch.setenv(key, value)


async def test_a_programs_terminal_output_and_reports_read_as_text(
    stack: Stack, profile: None, noisy_program: None
) -> None:
    spec = stack.spec(
        "noisy",
        trainer={"base_model": "accounts/fireworks/models/qwen3-8b", "lora_rank": 4},
        training={"total_steps": None, "program": "noisy", "args": {"steps": 4}},
        checkpoint={"every_steps": 4, "keep_last": 2},
        output={"promote": "none"},
    )
    handle = await stack.start(spec)
    assert (await handle.result()).phase is Phase.COMPLETED

    done = await run_cli("logs", handle.id, stack=stack)
    assert done.returncode == 0, done.stderr
    program = [
        line.split(" [program] ", 1)[1]
        for line in done.stdout.splitlines()
        if " [program] " in line
    ]
    # (Its stdout and stderr are read apart: their lines may come in either order.)
    assert {
        "ready to train",
        "100%|########| 4/4",  # the bar's last state, not its five
        "caf\ufffd \ufffd\\x07 done",  # bytes that were not UTF-8; the bell shown, not rung
        "warning: in colour",
    } <= set(program), done.stdout
    assert not any(c in done.stdout for c in "\x1b\r\x07"), done.stdout
    # Shepherd's own reports on the program read as sentences, not as their payloads.
    assert "[shepherd] program started, 4 steps, on " in done.stdout
    assert any(
        "[shepherd] program progress: step 4, loss " in line
        and line.endswith("; checkpoint step-00000004 saved")
        for line in done.stdout.splitlines()
    ), done.stdout
    assert "signal program_" not in done.stdout

    # Following a job that has ended tells the same story.
    followed = await run_cli("logs", handle.id, "--follow", stack=stack)
    assert followed.returncode == 0 and followed.stdout == done.stdout, followed.stderr

    # JSON: each line as shown, and as the program wrote it.
    records = [
        json.loads(line)
        for line in (await run_cli("logs", handle.id, "--json", stack=stack)).stdout.splitlines()
    ]
    ready = next(r for r in records if r["source"] == "program")
    assert ready["text"] == "ready to train" and ready["fields"] == {"stream": "stdout"}
    assert ready["raw"] == "\x1b[1;32mready\x1b[0m to \x1b[38;5;208mtrain\x1b[0m"
