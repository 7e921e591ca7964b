"""How ``shepherd logs`` words the signals a program job's worker sends its workflow
(``program_started`` and ``program_progress``, shepherd/models.py), read back from the
job's history as plain JSON: what a person wants from each, in one line
(``program progress: step 40, loss 0.1234; checkpoint step-00000040 saved``).

The payloads are read as data, never validated against the models: a history outlives the
code that wrote it, and fields are added over time. A field this module does not know is still
shown, compactly (``metrics acc=0.91``); a field of an unexpected shape is shown as it is.
"""

from __future__ import annotations

import json
import math
from typing import Any

#: A value shown for a field this module does not know is cut to this many characters (a
#: long list would bury the line).
COMPACT_CHARS = 100

_STARTED_FIELDS = {"control_queue", "attempt", "generation", "total_steps", "adopted", "attached"}
_PROGRESS_FIELDS = {
    "step",
    "last_loss",
    "losses",
    "checkpoints",
    "trainer_lost",
    "restore_point",
}


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _loss(value: Any) -> str:
    """A loss as the lifecycle's other lines give it (4 decimals), but a tiny one in full."""
    x = _number(value)
    if x is None:
        return _compact(value)
    return f"{x:.4f}" if x == 0 or not math.isfinite(x) or abs(x) >= 1e-3 else f"{x:.3g}"


def _compact(value: Any) -> str:
    """Any JSON value, short: a number or string as it is, an object as ``k=v`` pairs."""
    if isinstance(value, float):
        text = f"{value:.6g}"
    elif isinstance(value, str):
        text = value
    elif isinstance(value, dict):
        text = " ".join(f"{k}={_compact(v)}" for k, v in value.items())
    else:
        text = json.dumps(value, default=str, separators=(",", ":"))
    return text if len(text) <= COMPACT_CHARS else text[: COMPACT_CHARS - 3] + "..."


def _others(payload: dict[str, Any], known: set[str]) -> list[str]:
    """The payload's fields this module does not know, each as ``name value`` (a flag that is
    set as its name alone; one not set, like an empty field, says nothing)."""
    return [
        key if value is True else f"{key} {_compact(value)}"
        for key, value in payload.items()
        if key not in known and not _empty(value) and value is not False
    ]


def _checkpoint_name(record: Any) -> str:
    """A checkpoint's own name (``step-00000040``), not its resource path."""
    if isinstance(record, dict):
        if isinstance(record.get("name"), str) and record["name"]:
            return record["name"].rsplit("/", 1)[-1]
        if record.get("step") is not None:
            return f"at step {_compact(record['step'])}"
    return _compact(record)


class ProgramSignals:
    """Words the program's signals, one job's in order: what a progress report says depends on
    the one before (its restore point is shown only when it moves)."""

    def __init__(self) -> None:
        self._restore_point: Any = None

    def started(self, payload: dict[str, Any]) -> str:
        """``program started (attempt 2), 300 steps, on <its worker's control queue>``; or,
        when a later run of the workflow took over the program still running,
        ``program adopted by this run (still running), ..., attached to <trainer>``."""
        adopted = payload.get("adopted") is True
        text = "program adopted by this run" if adopted else "program started"
        # Which of the workflow's starts of the program, and which try of that start: said
        # only past the first, where it tells a restart from the start.
        counts = [
            f"{noun} {_compact(payload[key])}"
            for key, noun in (("generation", "start"), ("attempt", "attempt"))
            if not _empty(payload.get(key)) and _number(payload[key]) not in (0, 1)
        ]
        if adopted:
            counts.insert(0, "still running")
        if counts:
            text += f" ({', '.join(counts)})"
        parts = [text]
        if not _empty(payload.get("total_steps")):
            parts.append(f"{_compact(payload['total_steps'])} steps")
        if not _empty(payload.get("control_queue")):
            parts.append(f"on {_compact(payload['control_queue'])}")
        if adopted:
            attached = payload.get("attached")
            parts.append(f"attached to {_compact(attached)}" if attached else "no trainer attached")
        return ", ".join([*parts, *_others(payload, _STARTED_FIELDS)])

    def progress(self, payload: dict[str, Any]) -> str:
        """``program progress: step 40, loss 0.2011 -> 0.1234 (steps 31-40); checkpoint
        step-00000040 saved`` and, after a trainer loss, what the job restores from."""
        step = payload.get("step")
        head = [f"step {'?' if step is None else _compact(step)}"]
        reported = payload.get("losses")
        losses = [
            pair
            for pair in (reported if isinstance(reported, list) else [])
            if isinstance(pair, list) and len(pair) == 2
        ]
        last = payload.get("last_loss")
        if last is None and losses:
            last = losses[-1][1]
        if len(losses) > 1:
            (first_step, first), (last_step, _) = losses[0], losses[-1]
            steps = f"steps {_compact(first_step)}-{_compact(last_step)}"
            head.append(f"loss {_loss(first)} -> {_loss(last)} ({steps})")
        elif last is not None:
            head.append(f"loss {_loss(last)}")
        parts = [", ".join(head)]

        records = payload.get("checkpoints")
        saved = [_checkpoint_name(r) for r in records] if isinstance(records, list) else []
        if saved:
            noun = "checkpoint" if len(saved) == 1 else "checkpoints"
            parts.append(f"{noun} {', '.join(saved)} saved")
        elif not _empty(records):
            parts.append(f"checkpoints {_compact(records)}")

        lost = payload.get("trainer_lost")
        if not _empty(lost):
            parts.append(f"trainer lost: {_compact(lost)}")
        point = payload.get("restore_point")
        if not _empty(point):
            name = _checkpoint_name({"name": point}) if isinstance(point, str) else None
            # Each report repeats it; it says something when a loss needs it, or when it moved
            # to other than the checkpoint this report just named.
            moved = point != self._restore_point and name not in saved
            if not _empty(lost) or moved:
                parts.append(f"restore point {name or _compact(point)}")
            self._restore_point = point
        parts += _others(payload, _PROGRESS_FIELDS)
        return "program progress: " + "; ".join(parts)
