"""Run a real localplane as a child process on an ephemeral port — for tests, benchmarks,
the demo and ``shepherd dev``. Stopping it stops every trainer it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Self

from localplane.plane import ADMIN_KEY_FILE, API_KEY_FILE

READY_TIMEOUT_S = 30.0


class PlaneProcess:
    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        port: int = 0,
        api_key: str | None = None,
        admin_key: str | None = None,
        config: dict[str, Any] | None = None,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
        prefix: list[str] | None = None,
    ) -> None:
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="localplane-")
        self.data_dir = data_dir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.port = port
        # None: the plane generates its keys on first start and keeps them in the data dir.
        self.api_key = api_key or ""
        self.admin_key = admin_key or ""
        self._given_keys = {
            k: v
            for k, v in (
                ("SHEPHERD_PLANE_API_KEY", api_key),
                ("SHEPHERD_PLANE_ADMIN_KEY", admin_key),
            )
            if v
        }
        self.config = config or {}
        self.log_path = log_path or self.data_dir / "plane.log"
        self.env = env or {}
        #: Run under this command (``ip netns exec <ns>``: the plane on a test host of its own).
        self.prefix = prefix or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> Self:
        """Spawn the plane and wait until it serves; stopped again if that fails."""
        self.spawn()
        return self.wait_ready()

    def spawn(self) -> Self:
        """Start the process without waiting for it (see :meth:`wait_ready`)."""
        ready = self.data_dir / "ready.json"
        ready.unlink(missing_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            *self.prefix,
            sys.executable,
            "-m",
            "shepherd.cli.main",
            "plane",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--ready-file",
            str(ready),
            "--config",
            json.dumps(self.config),
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHEPHERD_PLANE_")}
        env.update(SHEPHERD_LOG_FORMAT="json", **self._given_keys, **self.env)
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the fd
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL
            )
        return self

    def wait_ready(self) -> Self:
        """Wait until the spawned plane serves; on any failure or interruption (Ctrl-C,
        a stop signal) the process is stopped before the error propagates."""
        assert self.proc is not None, "spawn() first"
        ready = self.data_dir / "ready.json"
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while not ready.exists():
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"localplane exited with {self.proc.returncode}; see {self.log_path}"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(f"localplane did not become ready; see {self.log_path}")
                time.sleep(0.02)
        except BaseException:
            self.stop()
            raise
        info = json.loads(ready.read_text())
        self.url = info["url"]
        self.api_key = self.api_key or (self.data_dir / API_KEY_FILE).read_text().strip()
        self.admin_key = self.admin_key or (self.data_dir / ADMIN_KEY_FILE).read_text().strip()
        self.port = info["port"]  # a restart keeps the same address
        return self

    def stop(self, *, kill: bool = False, timeout: float = 15.0) -> int | None:
        """SIGTERM (or SIGKILL) and wait; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code

    def restart(self, *, kill: bool = False) -> Self:
        self.stop(kill=kill)
        return self.start()

    def cleanup(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
