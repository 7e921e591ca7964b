"""Room on the disk under a directory, and what to say when there is none.

``shepherd dev`` keeps everything in its state directory — the Temporal database, the plane's
checkpoints, every log — and a full disk there shows only as Temporal answering "shard status
unknown" to every call: jobs wait (their workers retry) and nothing says why. So the dev stack
says when that disk runs short and when it has room again, and the CLI names it in the error
of a server that cannot serve."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

#: Below this much free space the dev stack warns. SQLite's next transactions, a checkpoint of
#: the tiny model (about 1 MiB) and the logs need a few MiB: 64 leaves time to act.
LOW_BYTES = 64 * 2**20
#: How often the dev stack looks (a statvfs call: nothing).
CHECK_EVERY_S = 1.0


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use under ``path`` (None: it cannot be read)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n //= 1024
    return f"{n} GiB"


def shortage(path: Path) -> str | None:
    """What to say about the disk under ``path`` when it has less than ``LOW_BYTES`` free
    (None: it has room, or there is no such directory)."""
    return _said(path, free_bytes(path))


def _said(path: Path, free: int | None) -> str | None:
    level = _level(free)
    if level is None or free is None:
        return None
    return f"the disk under {path} is {level}" + (f" ({_size(free)} free)" if free else "")


def _level(free: int | None) -> str | None:
    if free is None or free >= LOW_BYTES:
        return None
    return "full" if free < 2**20 else "nearly full"


class Watch:
    """Says (with ``say``) when the disk under ``path`` runs short, when it is full, and when
    it has room again; ``check`` is cheap to call often (it looks every ``CHECK_EVERY_S``)."""

    def __init__(self, path: Path, say: Callable[[str], None]) -> None:
        self.path = path
        self.say = say
        self.level: str | None = None
        self._next = 0.0

    def check(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + CHECK_EVERY_S
        free = free_bytes(self.path)
        level = _level(free)
        if level == self.level:
            return
        if level is not None:
            self.say(
                f"warning: {_said(self.path, free)}: Temporal cannot write its database there "
                "(temporal.db) once it is full, nor the plane its checkpoints, nor the logs — "
                "jobs wait, and go on once space is freed"
            )
        else:
            self.say(f"space is back under {self.path}: jobs go on")
        self.level = level
