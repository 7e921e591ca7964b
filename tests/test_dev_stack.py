"""``shepherd dev`` and ``shepherd demo`` as a user runs them: real processes, real ports,
a real job through the stack, and a clean shutdown that leaves nothing behind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from shepherd import offline, reaper
from shepherd.jobs import start_job
from shepherd.phases import Phase
from shepherd.scheduling import SchedulerState, scheduler_id
from shepherd.spec import validate_spec
from shepherd.temporal import TemporalSettings, connect
from tests.helpers import fill, trainer_pids
from tests.replay import replay_since
from workers.devstack import free_port, http_ok, tcp_open, wait_until


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose (its parent has not reaped it yet).
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()


def assert_keys_kept_secret(state: Path, output: str) -> None:
    """The plane's keys are in their 0600 files and nowhere else: no log, database or ready
    file under the stack's directory, and not in the captured output (not a terminal)."""
    key_files = [state / "plane" / "dev-api-key", state / "plane" / "admin-api-key"]
    keys = []
    for path in key_files:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == 0o600, f"{path} has mode {mode:o}"
        keys.append(path.read_text().strip())
    assert all(keys)
    checked = 0
    for path in state.rglob("*"):
        if path.is_file() and path not in key_files:
            data = path.read_bytes()
            checked += 1
            assert not any(key.encode() in data for key in keys), f"an API key is in {path}"
    assert (state / "logs" / "plane.log").is_file() and checked > 3
    assert not any(key in output for key in keys), "an API key was printed to a non-terminal"


async def test_dev_brings_everything_up_runs_a_job_and_stops_cleanly(tmp_path: Path) -> None:
    ports = {"temporal": free_port(), "ui": free_port(), "plane": free_port()}
    ready = tmp_path / "ready.json"
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shepherd.cli.main",
            "dev",
            "--temporal-port",
            str(ports["temporal"]),
            "--ui-port",
            str(ports["ui"]),
            "--plane-port",
            str(ports["plane"]),
            "--state-dir",
            str(state),
            "--ready-file",
            str(ready),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(ready.exists, "shepherd dev", timeout=90, proc=proc)
        info = json.loads(ready.read_text())
        assert httpx.get(info["ui"], timeout=5).status_code == 200  # the Web UI
        assert httpx.get(f"{info['plane']}/healthz", timeout=5).status_code == 200
        assert all(_alive(pid) for pid in info["pids"].values())
        # Its worker's programs read the byte-level tokenizer, under the examples' model
        # name, from the stack's own Hugging Face cache, never from the Hub.
        worker_env = dict(
            item.split("=", 1)
            for item in Path(f"/proc/{info['pids']['worker']}/environ").read_text().split("\0")
            if "=" in item
        )
        assert worker_env["HF_HOME"] == info["hf_home"] == str((state / "hf-home").resolve())
        assert worker_env["HF_HUB_OFFLINE"] == "1"
        assert offline.tokenizer_problem("Qwen/Qwen3-8B-Base", worker_env) is None
        # Jobs wait for admission in Shepherd: as many slots as the plane has trainers.
        assert worker_env["SHEPHERD_BACKEND_LOCAL_SLOTS"] == "4"

        client = await connect(TemporalSettings(address=info["temporal"]))
        spec = validate_spec(
            {
                "name": "devstack",
                "trainer": {"base_model": "accounts/fireworks/models/qwen3-8b"},
                "training": {"total_steps": 10},
                "checkpoint": {"every_steps": 5},
                "output": {"model_id": "devstack-model"},
            }
        )
        since = datetime.now(UTC)
        handle = await start_job(client, spec, task_queue=info["task_queue"])
        result = await handle.result()
        assert result.phase is Phase.COMPLETED and result.model is not None
        line = client.get_workflow_handle(scheduler_id("local"))
        async with asyncio.timeout(30):  # (the release reaches the scheduler just after)
            while (admitted := await line.query("state", result_type=SchedulerState)).holders:
                await asyncio.sleep(0.1)
        assert admitted.admitted_total == 1
        # The stack's own server: its workflows replay as the session's do (tests/replay.py).
        assert await replay_since(client, since, "dev stack") >= 1
        # The stack runs the reaper (terminated jobs' trainers are deleted, README).
        reaper_state = await reaper.state(client)
        assert reaper_state.installed and reaper_state.task_queue == info["task_queue"]

        # The CLI in another shell links to this stack's Web UI port, not the default one.
        link = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", "from shepherd.cli.common import ui_link; print(ui_link('w'))"],
            env={
                **os.environ,
                "SHEPHERD_STATE_DIR": str(state),
                "TEMPORAL_ADDRESS": info["temporal"],
            },
            capture_output=True,
            text=True,
            check=True,
        )
        assert link.stdout.strip().startswith(f"{info['ui']}/namespaces/"), link.stdout
        # ... also where the shell names the server "localhost" (stack.json: 127.0.0.1),
        # which is how `shepherd logs` finds the stack's trainer log.
        port = info["temporal"].rpartition(":")[2]
        found = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-c",
                "from shepherd.cli.common import dev_stack_info; print(dev_stack_info()['plane'])",
            ],
            env={
                **os.environ,
                "SHEPHERD_STATE_DIR": str(state),
                "TEMPORAL_ADDRESS": f"localhost:{port}",
            },
            capture_output=True,
            text=True,
        )
        assert found.stdout.strip() == info["plane"], found.stderr

        # A second stack in the same directory is refused, naming the running one, and
        # leaves its stack.json alone.
        again = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "shepherd.cli.main", "dev", "--state-dir", str(state)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert again.returncode == 1, again.stdout + again.stderr
        assert "already running" in again.stderr and info["temporal"] in again.stderr
        assert "Traceback" not in again.stdout + again.stderr
        assert len(again.stderr.strip().splitlines()) == 1
        assert json.loads((state / "stack.json").read_text()) == info
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out.decode()
    assert b"stopped." in out
    assert f"export SHEPHERD_UI_URL={info['ui']}" in out.decode()
    assert not (state / "stack.json").exists()  # no stale addresses once stopped
    assert not any(_alive(pid) for pid in info["pids"].values())
    assert trainer_pids(state / "plane") == []
    assert_keys_kept_secret(state, out.decode())
    assert str(state / "plane" / "dev-api-key") in out.decode()  # where the key is, instead


@pytest.mark.slow
async def test_a_full_disk_under_the_stack_says_where_and_its_job_goes_on_once_freed(
    small_disk: Path, tmp_path: Path
) -> None:
    """The state directory (the Temporal database, the plane's checkpoints, the logs) on a
    small tmpfs, filled while a job trains: Temporal serves nothing — ``shepherd dev`` says
    the disk under its state directory is full, and the CLI's error names it instead of
    asking whether the stack runs; freed, the stack says so and the job completes."""
    ports = {"temporal": free_port(), "ui": free_port(), "plane": free_port()}
    ready, state, output = tmp_path / "ready.json", small_disk / "state", tmp_path / "dev.out"
    with open(output, "wb") as out:  # noqa: ASYNC230 - a local file, opened once
        proc = subprocess.Popen(
            [
                sys.executable,
                *("-m", "shepherd.cli.main", "dev", "--state-dir", str(state)),
                *("--temporal-port", str(ports["temporal"]), "--ui-port", str(ports["ui"])),
                *("--plane-port", str(ports["plane"]), "--ready-file", str(ready)),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    said = output.read_text
    try:
        wait_until(ready.exists, "shepherd dev", timeout=90, proc=proc)
        info = json.loads(ready.read_text())
        client = await connect(TemporalSettings(address=info["temporal"]))
        spec = validate_spec(
            {
                "name": "disk",
                "trainer": {
                    "base_model": "accounts/fireworks/models/qwen3-8b",
                    "extra_args": ["--compute-delay-ms=100"],
                },
                "training": {"total_steps": 40},
                "checkpoint": {"every_steps": 10},
                "output": {"model_id": "disk-model"},
            }
        )
        handle = await start_job(client, spec, task_queue=info["task_queue"])
        async with asyncio.timeout(60):
            while (await handle.query("status")).get("step", 0) < 3:
                await asyncio.sleep(0.2)
        filler = fill(small_disk)
        wait_until(lambda: f"the disk under {state} is full" in said(), "the warning", timeout=15)
        # Reads are served until a write fails and the server closes its shard: ask until the
        # CLI is refused.
        env = {**os.environ, "SHEPHERD_STATE_DIR": str(state), "TEMPORAL_ADDRESS": info["temporal"]}
        status_cmd = [sys.executable, "-m", "shepherd.cli.main", "status", handle.id]
        async with asyncio.timeout(90):
            while True:
                shown = await asyncio.to_thread(
                    subprocess.run, status_cmd, env=env, capture_output=True, text=True, timeout=60
                )
                if shown.returncode != 0:
                    break
                await asyncio.sleep(1)
        assert shown.returncode == 3, shown.stdout + shown.stderr
        assert f"the disk under {state} is full" in shown.stderr, shown.stderr
        assert "where its database lives" in shown.stderr, shown.stderr
        assert "is `shepherd dev` running" not in shown.stderr
        filler.unlink()
        wait_until(lambda: f"space is back under {state}" in said(), "the all-clear", timeout=15)
        async with asyncio.timeout(120):
            result = await handle.result()
        assert result.phase is Phase.COMPLETED and result.step == 40 and result.model is not None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0, said()
    assert not any(_alive(pid) for pid in info["pids"].values())
    assert trainer_pids(state / "plane") == []


def test_demo_succeeds(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "shepherd.cli.main", "demo", "--state-dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "COMPLETED" in done.stdout and "demo succeeded" in done.stdout
    assert "recovery 1: preemption" in done.stdout
    assert "trainers still running on the plane: 0" in done.stdout
    assert "replays against this code" in done.stdout  # (the demo's own server: tests/replay.py)
    assert_keys_kept_secret(tmp_path / "demo", done.stdout + done.stderr)


# --------------------------------------------------------- stopped during start-up


def _survivors(marker: Path) -> dict[int, str]:
    """Live processes whose command line names ``marker`` (the test's own temp dir): the
    Temporal server, localplane, its trainers and the worker all carry it in theirs."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # gone meanwhile
        if str(marker) in cmdline and _alive(int(entry.name)):
            found[int(entry.name)] = cmdline
    return found


def _exists(path: Path) -> Any:
    return path.exists


def _trainer_running(marker: Path) -> Any:
    return lambda: any("localplane.trainer" in c for c in _survivors(marker).values())


def _stop_at(moment: Any, command: list[str], tmp_path: Path) -> tuple[int, str]:
    """Start ``command``, SIGTERM it once ``moment`` is true, and check that nothing it
    started outlives it; returns its exit code and output."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "shepherd.cli.main", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        if moment is not None:
            wait_until(moment, "the start-up moment", timeout=120, proc=proc)
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=90)[0].decode()
        left = _survivors(tmp_path)
        assert left == {}, f"left running after SIGTERM: {left}\n{out}"
        return proc.returncode, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in _survivors(tmp_path):  # what the failing code left: not the next test's
            os.kill(pid, signal.SIGKILL)


#: Moments of ``shepherd dev``'s start-up, each a check on its state dir and ports.
DEV_MOMENTS = {
    "at-once": None,  # before the command has even installed its handlers
    "temporal-spawned": lambda state, ports: _exists(state / "logs" / "temporal.log"),
    "temporal-serving": lambda state, ports: lambda: tcp_open("127.0.0.1", int(ports[0])),
    # The Web UI answers just before the search attributes are registered (asyncio).
    "ui-serving": lambda state, ports: lambda: http_ok(f"http://127.0.0.1:{ports[1]}"),
    "plane-spawned": lambda state, ports: _exists(state / "logs" / "plane.log"),
    "worker-spawned": lambda state, ports: _exists(state / "logs" / "worker.log"),
}


@pytest.mark.parametrize("moment", DEV_MOMENTS)
def test_dev_stopped_during_start_up_leaves_nothing_behind(moment: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    ports = [str(free_port()) for _ in range(3)]
    command = ["dev", "--temporal-port", ports[0], "--ui-port", ports[1], "--plane-port", ports[2]]
    check = DEV_MOMENTS[moment]
    code, out = _stop_at(
        check and check(state, ports), [*command, "--state-dir", str(state)], tmp_path
    )
    if check is not None:  # once its handlers are in, a stop is a clean one
        assert code == 0 and "stopped." in out, out


DEMO_MOMENTS = {
    "plane-spawned": lambda state: _exists(state / "logs" / "plane.log"),
    "trainer-running": lambda state: _trainer_running(state),
}


@pytest.mark.parametrize("moment", DEMO_MOMENTS)
def test_demo_stopped_midway_leaves_nothing_behind(moment: str, tmp_path: Path) -> None:
    state = tmp_path / "demo"
    code, out = _stop_at(DEMO_MOMENTS[moment](state), ["demo", "--state-dir", str(state)], tmp_path)
    assert code == 1 and "demo failed" in out, out
