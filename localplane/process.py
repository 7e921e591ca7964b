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
    ) -> None:
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="localplane-")
        self.data_dir = data_dir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.port = port
        self.api_key = api_key or "lp_test_" + os.urandom(8).hex()
        self.admin_key = admin_key or "lpadmin_test_" + os.urandom(8).hex()
        self.config = config or {}
        self.log_path = log_path or self.data_dir / "plane.log"
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> Self:
        ready = self.data_dir / "ready.json"
        ready.unlink(missing_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-m", "shepherd.cli.main", "plane",
            "--port", str(self.port),
            "--data-dir", str(self.data_dir),
            "--ready-file", str(ready),
            "--config", json.dumps(self.config),
        ]
        env = {
            **os.environ,
            "SHEPHERD_PLANE_API_KEY": self.api_key,
            "SHEPHERD_PLANE_ADMIN_KEY": self.admin_key,
            "SHEPHERD_LOG_FORMAT": "json",
            **self.env,
        }
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"localplane exited with {self.proc.returncode}; see {self.log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"localplane did not become ready; see {self.log_path}")
            time.sleep(0.02)
        info = json.loads(ready.read_text())
        self.url = info["url"]
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
