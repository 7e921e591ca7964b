"""The trainers' fork server: one process per plane that has imported everything a trainer
needs and forks a trainer per request, so a trainer's start costs a fork (milliseconds of
CPU) instead of Python's start-up and imports (half a second of CPU each, which on a small
machine the plane's other trainers, Temporal and Shepherd's worker pay in latency).

Runs in the zygote process (``python -m localplane.trainer --zygote=DATA_DIR
--control-fd=N``); the plane's side is ``localplane/forks.py``. One message per datagram on
a ``SOCK_SEQPACKET`` socket (its boundaries carry a file descriptor with its message):

- plane -> zygote: ``{"argv": [...]}``, a trainer's arguments;
- zygote -> plane: ``{"ready": pid}`` once, after the imports; per request, in order,
  ``{"started": pid}`` with the read end of the child's stdout+stderr pipe attached, or
  ``{"error": "..."}``; ``{"exited": pid, "code": n}`` when a child ends (``n`` as
  ``asyncio`` reports it: negative for a signal).

The zygote's end of the socket closing (the plane stopped or died) ends the zygote; its
children are killed with it (``PR_SET_PDEATHSIG``), as the plane's own trainers die with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
from typing import Any

_MAX_MESSAGE = 1 << 16


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _send(control: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(control, [data], fds)
    else:
        control.send(data)


def _reap(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(control, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def serve(control_fd: int) -> list[str] | None:
    """Fork a trainer per request until the plane closes the socket (then None). Returns only
    in a forked child, with that trainer's arguments: the caller goes on as a trainer started
    with them."""
    control = socket.socket(fileno=control_fd)
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD reaches the pipe
    _send(control, {"ready": os.getpid()})
    while True:
        try:
            readable, _, _ = select.select([control.fileno(), wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
            _reap(control)
        if control.fileno() not in readable:
            continue
        try:
            message = control.recv(_MAX_MESSAGE)
        except ConnectionError:
            message = b""
        if not message:
            return None  # the plane is gone: so are we (and, with us, our children)
        argv = [str(a) for a in json.loads(message)["argv"]]
        out_r, out_w = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(out_r)
            os.close(out_w)
            _send(control, {"error": f"fork failed: {exc}"})
            continue
        if pid == 0:
            _become_child(control, (wake_r, wake_w, out_r), out_w)
            return argv
        os.close(out_w)
        _send(control, {"started": pid}, [out_r])
        os.close(out_r)


def _become_child(control: socket.socket, close: tuple[int, ...], out: int) -> None:
    """In the fresh child: nothing of the zygote's plumbing; its own session (Ctrl-C on a
    terminal is the plane's to handle); dies with the zygote; stdout and stderr to its pipe."""
    zygote = os.getppid()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    control.close()
    for fd in close:
        os.close(fd)
    os.setsid()
    _die_with_parent()
    if os.getppid() != zygote:  # the zygote died between the fork and the prctl
        os._exit(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
