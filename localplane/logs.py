"""Trainer logs: each trainer process's output, stamped per line when the plane writes it, and
read back in pages from a position, so a follower tails without re-reading
(``GET /v1/accounts/{a}/rlorTrainerJobs/{j}:logs``, trainer-api.md §7).

A job's log is the concatenation of its runs: run ``N`` is the trainer process started for
the job's ``N``-th start or resume, written to ``trainers/<account>/<job>/gen-<N>/trainer.log``.
The files stay after the job is deleted, so a deleted trainer's log is still readable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localplane.trainer.server import READY_PREFIX

LOG_FILE = "trainer.log"
#: Bytes read per page at most: a page costs the plane a bounded read, whatever its size.
MAX_READ_BYTES = 1 << 20
#: A longer line is cut (a runaway print should not make one answer megabytes long).
MAX_LINE_CHARS = 16_384
_STAMP = re.compile(rb"\A(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z) ")
_RUN_DIR = re.compile(r"\Agen-([0-9]+)\Z")
_READY = READY_PREFIX.encode()


def run_dir(data_dir: Path, account: str, job: str, run: int) -> Path:
    return data_dir / "trainers" / account / job / f"gen-{run}"


def stamp(line: bytes, now: str) -> bytes:
    """A line as the plane writes it: ``<RFC 3339 write time> <line>``. The trainer's own
    lines need not carry a time (a traceback does not), so the plane adds one to each."""
    return now.encode() + b" " + line


@dataclass(frozen=True)
class Position:
    """Where a reader is: byte ``offset`` into run ``run`` (0: before the first run)."""

    run: int = 0
    offset: int = 0


@dataclass
class Page:
    entries: list[dict[str, Any]]
    next: Position
    #: Every complete line written so far was returned (a follower asks again later).
    caught_up: bool


def _runs(data_dir: Path, account: str, job: str) -> list[int]:
    root = data_dir / "trainers" / account / job
    try:
        names = [p.name for p in root.iterdir()]
    except OSError:
        return []
    return sorted(int(m[1]) for n in names if (m := _RUN_DIR.match(n)))


def _entry(raw: bytes, run: int) -> dict[str, Any] | None:
    raw = raw.rstrip(b"\r\n")
    m = _STAMP.match(raw)
    time = m[1].decode() if m else None  # files written before lines were stamped
    body = raw[m.end() :] if m else raw
    if body.startswith(_READY):
        return None  # the plane's own start-up handshake, not the trainer's output
    text = body.decode(errors="replace")
    if len(text) > MAX_LINE_CHARS:
        text = text[:MAX_LINE_CHARS] + f" …[{len(text) - MAX_LINE_CHARS} characters cut]"
    return {"time": time, "run": run, "text": text}


def read_page(
    data_dir: Path,
    account: str,
    job: str,
    start: Position,
    limit: int,
    live_run: int | None,
) -> Page:
    """Up to ``limit`` lines after ``start``. ``live_run`` is the run whose trainer is still
    writing: its last line is returned only once it is complete."""
    entries: list[dict[str, Any]] = []
    pos = start
    budget = MAX_READ_BYTES
    for run in _runs(data_dir, account, job):
        if run < pos.run:
            continue
        offset = pos.offset if run == pos.run else 0
        pos = Position(run, offset)
        try:
            with open(run_dir(data_dir, account, job, run) / LOG_FILE, "rb") as f:
                f.seek(offset)
                chunk = f.read(budget)
                at_end = not chunk or f.read(1) == b""
        except FileNotFoundError:
            chunk, at_end = b"", True
        lines = chunk.splitlines(keepends=True)
        for i, raw in enumerate(lines):
            complete = raw.endswith(b"\n")
            # One line fills a whole read: it is cut here (its rest follows as more lines).
            overlong = len(raw) == MAX_READ_BYTES
            finished = run != live_run and at_end and i == len(lines) - 1
            if not (complete or overlong or finished):
                break  # still being written
            if len(entries) == limit:
                return Page(entries, pos, caught_up=False)
            offset += len(raw)
            budget -= len(raw)
            pos = Position(run, offset)
            if (entry := _entry(raw, run)) is not None:
                entries.append(entry)
        if budget <= 0 or not at_end:
            return Page(entries, pos, caught_up=False)
        if run == live_run:
            break  # a later run cannot exist while this one is live
    return Page(entries, pos, caught_up=True)
