"""The plane's side of the trainers' fork server (``localplane/trainer/zygote.py``): starts
the zygote, asks it for trainers, and hands each back as a :class:`ForkedTrainer`, which the
plane drives as it would an ``asyncio`` subprocess (``pid``, ``returncode``, ``stdout``,
``wait``, ``kill``, ``terminate``).

Why: a trainer started from scratch pays Python's start-up and imports, about half a second
of CPU. The plane starts one per job and per recovery; the tests start hundreds, and on a
small machine each start took that CPU from the plane's other trainers, Temporal and
Shepherd's worker at the moment a slot changed hands. A fork of a process that has imported
everything costs milliseconds, and the children share its memory until they write to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections import deque
from pathlib import Path
from typing import Any

import structlog

log = structlog.stdlib.get_logger("localplane.forks")

#: The zygote imports what a trainer imports (about a second on a small machine, more when
#: the machine is busy): a zygote that has not said so within this long is given up on.
ZYGOTE_READY_TIMEOUT_S = 60.0
#: Grace for the zygote to exit once its socket is closed, before it is killed.
ZYGOTE_STOP_GRACE_S = 5.0
_MAX_MESSAGE = 1 << 16


class ForkedTrainer:
    """A trainer process forked by the zygote (not the plane's child: its exit is reported by
    the zygote, which reaps it)."""

    def __init__(self, pid: int, stdout: asyncio.StreamReader) -> None:
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def _ended(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._exited.set_result(code)


class Zygote:
    """One fork server and the trainers it forked."""

    def __init__(self, data_dir: Path, preexec_fn: Any) -> None:
        self._data_dir = data_dir
        self._preexec_fn = preexec_fn
        self._process: asyncio.subprocess.Process | None = None
        self._control: socket.socket | None = None
        self._ready: asyncio.Future[None] | None = None
        self._asked: deque[asyncio.Future[ForkedTrainer]] = deque()
        self._children: dict[int, ForkedTrainer] = {}
        self._attaching: set[asyncio.Task[Any]] = set()

    @property
    def alive(self) -> bool:
        return self._control is not None

    async def start(self) -> None:
        """Start the zygote; returns once it has imported everything."""
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "localplane.trainer",
                f"--zygote={self._data_dir}",
                f"--control-fd={theirs.fileno()}",
                stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                pass_fds=(theirs.fileno(),),
                preexec_fn=self._preexec_fn,
                start_new_session=True,  # Ctrl-C on the plane's terminal is the plane's to handle
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._control = ours
        self._ready = loop.create_future()
        loop.add_reader(ours.fileno(), self._on_readable)
        try:
            async with asyncio.timeout(ZYGOTE_READY_TIMEOUT_S):
                await asyncio.shield(self._ready)
        except BaseException:
            await self.stop()
            raise

    async def fork(self, argv: list[str]) -> ForkedTrainer:
        """A trainer started with ``argv``; OSError when the zygote cannot fork one."""
        if self._control is None:
            raise OSError("the trainers' fork server is not running")
        future: asyncio.Future[ForkedTrainer] = asyncio.get_running_loop().create_future()
        self._asked.append(future)
        try:
            self._control.send(json.dumps({"argv": argv}).encode())
        except OSError:
            self._asked.remove(future)
            self._gone()
            raise
        return await future

    async def stop(self) -> None:
        """Close the socket (the zygote exits, its children with it) and wait for it."""
        self._gone()
        process, self._process = self._process, None
        if process is None:
            return
        try:
            async with asyncio.timeout(ZYGOTE_STOP_GRACE_S):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()

    # ------------------------------------------------------------- messages

    def _on_readable(self) -> None:
        control = self._control
        while control is not None:
            try:
                message, fds, _, _ = socket.recv_fds(control, _MAX_MESSAGE, 1)
            except BlockingIOError:
                return
            except OSError:
                message, fds = b"", []
            if not message:
                self._gone()
                return
            self._handle(json.loads(message), fds)

    def _handle(self, message: dict[str, Any], fds: list[int]) -> None:
        if "ready" in message:
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(None)
        elif "started" in message:
            future = self._asked.popleft()
            child = self._adopt(int(message["started"]), fds[0])
            if not future.done():
                future.set_result(child)
        elif "error" in message:
            future = self._asked.popleft()
            if not future.done():
                future.set_exception(OSError(message["error"]))
        elif "exited" in message:
            ended = self._children.pop(int(message["exited"]), None)
            if ended is not None:
                ended._ended(int(message["code"]))

    def _adopt(self, pid: int, out_fd: int) -> ForkedTrainer:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(loop=loop)
        child = self._children[pid] = ForkedTrainer(pid, reader)
        pipe = os.fdopen(out_fd, "rb", buffering=0)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        # Connected at once (the pipe is registered with the loop in this iteration): none of
        # the child's output is missed, and EOF comes when it exits.
        task = loop.create_task(loop.connect_read_pipe(lambda: protocol, pipe))
        self._attaching.add(task)
        task.add_done_callback(self._attaching.discard)
        return child

    def _gone(self) -> None:
        """The socket is closed or broken: no more forks; the children die with the zygote
        (PR_SET_PDEATHSIG), so each is reported ended as killed."""
        control, self._control = self._control, None
        if control is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(control.fileno())
            control.close()
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(OSError("the trainers' fork server exited while starting"))
        while self._asked:
            future = self._asked.popleft()
            if not future.done():
                future.set_exception(OSError("the trainers' fork server exited"))
        for child in list(self._children.values()):
            child.kill()
            child._ended(-signal.SIGKILL)
        self._children.clear()
