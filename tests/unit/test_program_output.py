"""The worker's reading of a program's output (activities/program_run.py ``_pump``): every
byte reaches the program's log, however long a line, and the stderr tail a failed program's
error shows is readable text."""

from __future__ import annotations

import asyncio
import collections
import json
from pathlib import Path

import structlog

from activities.program_run import OutputLog, _pump


async def _pumped(data: bytes, tmp_path: Path) -> tuple[list[str], list[str]]:
    stream = asyncio.StreamReader()  # the default limit: 64 KiB, as a subprocess pipe's
    stream.feed_data(data)
    stream.feed_eof()
    tail: collections.deque[str] = collections.deque(maxlen=40)
    out = tmp_path / "program.log"
    log = OutputLog(out, structlog.get_logger())
    await asyncio.wait_for(_pump(stream, "stderr", log, tail), 10)
    log.close()
    lines = [json.loads(raw)["line"] for raw in out.read_text().splitlines()]
    return lines, list(tail)


async def test_a_progress_bar_longer_than_the_pipe_reader_limit_does_not_stop_the_pump(
    tmp_path: Path,
) -> None:
    # A tqdm bar redrawn with \r for minutes: 300 KiB without a newline, then more output.
    bar = b"".join(b"\r%3d%%|" % (i % 100) + b"#" * 60 for i in range(5000))
    lines, _ = await _pumped(bar + b"\ndone\n", tmp_path)
    assert "".join(lines[:-1]).encode() == bar  # every byte kept, in pieces
    assert len(lines) > 2 and lines[-1] == "done"


async def test_the_stderr_tail_is_readable_text(tmp_path: Path) -> None:
    lines, tail = await _pumped(
        b"\x1b[31mError:\x1b[0m bad \xff byte\n 10%\r 50%\r100%\nlast line without newline",
        tmp_path,
    )
    assert tail == ["Error: bad \ufffd byte", "100%", "last line without newline"]
    assert lines[0] == "\x1b[31mError:\x1b[0m bad \ufffd byte"  # the log keeps what was written
