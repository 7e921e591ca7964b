"""``shepherd dev`` and ``shepherd demo`` as a user runs them: real processes, real ports,
a real job through the stack, and a clean shutdown that leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from shepherd.jobs import start_job
from shepherd.phases import Phase
from shepherd.spec import validate_spec
from shepherd.temporal import TemporalSettings, connect
from tests.helpers import trainer_pids
from workers.devstack import free_port, wait_until


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose (its parent has not reaped it yet).
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()


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

        client = await connect(TemporalSettings(address=info["temporal"]))
        spec = validate_spec(
            {
                "name": "devstack",
                "trainer": {"base_model": "m"},
                "training": {"total_steps": 10},
                "checkpoint": {"every_steps": 5},
                "output": {"model_id": "devstack-model"},
            }
        )
        handle = await start_job(client, spec, task_queue=info["task_queue"])
        result = await handle.result()
        assert result.phase is Phase.COMPLETED and result.model is not None
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out.decode()
    assert b"stopped." in out
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
