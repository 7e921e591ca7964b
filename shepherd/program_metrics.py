"""A program's own measures of progress: the metrics file it writes.

A Tinker program knows what its training is for — an RL recipe's reward, an SFT recipe's
test loss — and Shepherd, which only sees the wire, does not. So a program job reads the
program's **metrics file**: JSON lines, one object per logged step, ``{"step": <int>, "<name>":
<number>, ...}`` — the tinker-cookbook's ``metrics.jsonl`` as its recipes write it
(``ml_log.JsonLogger``). Any program can write one: Shepherd tells it where in the
environment variable ``SHEPHERD_METRICS_FILE`` (its registration's ``metrics_file``, relative
to the job's log directory; ``metrics.jsonl`` by default).

``step`` is the program's own (a cookbook recipe counts its batches from 0); names are the
program's; values that are not finite numbers (strings, booleans, NaN) are left out. Lines
are read as they are completed; a line that is not such an object is skipped.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The file a program writes its metrics to, relative to its job's log directory, unless its
#: registration says otherwise: the tinker-cookbook's.
DEFAULT_METRICS_FILE = "metrics.jsonl"
#: The environment variable that tells a program where its metrics file is.
METRICS_FILE_ENV = "SHEPHERD_METRICS_FILE"
#: Most bytes read at one look: a program that writes megabytes of metrics at once is read
#: over several looks rather than all in one go.
READ_CHUNK = 1 << 20
#: Metric names a record may carry that are kept (a cookbook RL record has about 40).
MAX_NAMES = 64


@dataclass
class MetricRecord:
    """One line of the file: the program's step and its numeric metrics."""

    step: int | None
    values: dict[str, float]


def parse(line: str) -> MetricRecord | None:
    """One line as a record (None: not a metrics object)."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    step = data.get("step")
    values = {
        str(name): float(value)
        for name, value in data.items()
        if name != "step"
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
    }
    if not values:
        return None
    if len(values) > MAX_NAMES:
        values = dict(list(values.items())[:MAX_NAMES])
    return MetricRecord(
        step=step if isinstance(step, int) and not isinstance(step, bool) else None, values=values
    )


@dataclass
class MetricsTail:
    """Reads a metrics file as it grows: each :meth:`read` returns the records completed
    since the last one. A file replaced or truncated (a program started again that rewrites
    it) is read again from its start."""

    path: Path
    #: Bytes of the file read so far.
    offset: int = 0
    _partial: bytes = b""
    _inode: int | None = field(default=None, repr=False)

    def read(self) -> list[MetricRecord]:
        try:
            stat = self.path.stat()
        except OSError:
            return []
        if stat.st_ino != self._inode or stat.st_size < self.offset:
            self._inode, self.offset, self._partial = stat.st_ino, 0, b""
        if stat.st_size == self.offset:
            return []
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read(READ_CHUNK)
        except OSError:
            return []
        self.offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an unfinished line waits for its end
        records = []
        for raw in lines:
            record = parse(raw.decode("utf-8", "replace"))
            if record is not None:
                records.append(record)
        return records


def read_all(path: Path) -> list[MetricRecord]:
    """Every record of a metrics file (``shepherd status --plot --metric`` where the file
    is readable)."""
    tail = MetricsTail(path)
    records: list[MetricRecord] = []
    while True:
        before = tail.offset
        records += tail.read()
        if tail.offset == before:
            return records


def curve(records: list[MetricRecord], name: str) -> list[tuple[int, float]]:
    """``name``'s values by the program's step (records without a step are numbered in
    order)."""
    points: list[tuple[int, float]] = []
    for i, record in enumerate(records):
        if name in record.values:
            points.append((record.step if record.step is not None else i, record.values[name]))
    return points


def names(records: list[MetricRecord]) -> list[str]:
    """Every metric name the records carry, in the order they first appear."""
    seen: dict[str, Any] = {}
    for record in records:
        for name in record.values:
            seen.setdefault(name, None)
    return list(seen)
