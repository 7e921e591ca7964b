"""Datasets the built-in loops read, on the worker (as with real Tinker, the client
tokenizes and sends tokens; trainers never read datasets).

A dataset is a list of records, each ``{"text"}``, ``{"prompt", "completion"}`` or
``{"messages": [{"role", "content"}]}``: the built-in ``synthetic:text`` corpus, or a
JSONL file the worker can read (``/abs/path.jsonl`` or ``file:///abs/path.jsonl``).
Everything is deterministic: the same name gives the same records in the same order, and
the split into train and validation records depends only on the validation fraction.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUILTIN = ("synthetic:text",)
DEFAULT_DATASET = "synthetic:text"


class DatasetError(ValueError):
    """The dataset cannot be used; the message says why."""


@dataclass(frozen=True)
class Example:
    """One record as token spans: the model learns ``completion`` given ``prompt``."""

    prompt: str
    completion: str


def record_example(record: Any, line_no: int) -> Example:
    if not isinstance(record, dict):
        raise DatasetError(f"line {line_no}: a record must be a JSON object")
    if isinstance(record.get("text"), str):
        return Example("", record["text"])
    if isinstance(record.get("prompt"), str) and isinstance(record.get("completion"), str):
        return Example(record["prompt"], record["completion"])
    messages = record.get("messages")
    if (
        isinstance(messages, list)
        and messages
        and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages)
    ):
        # The last assistant turn is the completion; everything before it the prompt.
        rendered = [f"{m.get('role', 'user')}: {m['content']}\n" for m in messages]
        last = messages[-1]
        if last.get("role") == "assistant":
            return Example("".join(rendered[:-1]) + "assistant: ", last["content"] + "\n")
        return Example("", "".join(rendered))
    raise DatasetError(
        f"line {line_no}: a record needs 'text', 'prompt'+'completion' or 'messages'"
    )


_WORDS = [
    "the",
    "a",
    "model",
    "trainer",
    "learns",
    "data",
    "step",
    "loss",
    "weights",
    "gradient",
    "checkpoint",
    "route",
    "gateway",
    "job",
    "node",
    "spot",
    "resume",
    "warm",
    "cold",
    "fast",
    "slow",
    "small",
    "large",
    "batch",
    "epoch",
    "signal",
    "worker",
    "queue",
    "shepherd",
    "temporal",
    "durable",
    "retry",
    "policy",
    "promote",
    "deploy",
    "evaluate",
    "held",
    "out",
    "token",
    "sample",
]


def _synthetic_text() -> list[Example]:
    import numpy as np  # here: the spec imports this module for check_name, in workflows too

    # A fixed seed: the corpus is part of the dataset's identity, not of the job's seed.
    rng = np.random.default_rng(20261122)
    lines = []
    for _ in range(1500):
        n = int(rng.integers(4, 11))
        lines.append(" ".join(_WORDS[int(i)] for i in rng.integers(0, len(_WORDS), size=n)) + ".")
    return [Example("", line) for line in lines]


def resolve_path(name: str) -> Path | None:
    """Where a file dataset lives on this worker, or None when ``name`` is not a file."""
    raw = name.removeprefix("file://")
    if raw.endswith(".jsonl") and Path(raw).is_absolute():
        return Path(raw)
    return None


def check_path(name: str) -> str | None:
    """Why a file dataset's name is refused as written (None: it is not), before any
    worker resolves it (which the allowed directories then check, symlinks followed):
    "/data/../../etc/shadow.jsonl" or "file:///../etc/x.jsonl" say one directory and mean
    another."""
    if resolve_path(name) is None:
        return None
    raw = name.removeprefix("file://")
    if os.path.normpath(raw) != raw or raw.startswith("//") or not raw.isprintable():
        return (
            "must be a normalised absolute path: no '.' or '..' segments, no '//', "
            "no control characters"
        )
    return None


def check_name(name: str) -> str | None:
    """Why a dataset name cannot be used (None when it can), without reading it."""
    if name in BUILTIN or resolve_path(name) is not None:
        return None
    return (
        "must be one of " + ", ".join(BUILTIN) + ", an absolute path to a .jsonl file "
        "or file:///path.jsonl (read by the worker)"
    )


#: Directories (``:``-separated) the worker may read dataset files from. Unset: any file the
#: worker can read (a single-user dev stack); set it wherever specs come from other people.
DIRS_ENV = "SHEPHERD_DATASET_DIRS"


def allowed_dirs() -> list[Path] | None:
    raw = os.environ.get(DIRS_ENV)
    if raw is None:
        return None
    return [Path(d).resolve() for d in raw.split(":") if d.strip()]


def _readable(path: Path) -> Path | None:
    """The file to read, or None: outside the allowed directories, missing, not a file or
    unreadable all look the same to the spec's author (no probing the worker's disk)."""
    try:
        real = path.resolve()  # symlinks followed: a link out of an allowed dir is outside
        dirs = allowed_dirs()
        if dirs is not None and not any(real.is_relative_to(d) for d in dirs):
            return None
        return real if real.is_file() and os.access(real, os.R_OK) else None
    except OSError:
        return None


def _load_jsonl(path: Path) -> list[Example]:
    real = _readable(path)
    if real is None:
        where = f" (allowed: {DIRS_ENV})" if allowed_dirs() is not None else ""
        raise DatasetError(f"dataset {path.name} is not readable on this worker{where}")
    examples = []
    with open(real, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"line {line_no}: not JSON ({exc.msg})") from None
            examples.append(record_example(record, line_no))
    if len(examples) < 2:
        raise DatasetError("a dataset needs at least 2 records")
    return examples


#: How many records a job's preflight parses: enough to catch a wrong file or format before
#: a trainer is created, without reading a large dataset twice.
PREFLIGHT_RECORDS = 64


def check_readable(name: str, validation_split: float) -> str | None:
    """Why this worker cannot train on dataset ``name`` (None: it can), from its first
    :data:`PREFLIGHT_RECORDS` records: inside the allowed directories, readable, JSONL
    records of a known kind, enough of them for the split."""
    if name in BUILTIN:
        return None
    if problem := check_name(name) or check_path(name):
        return problem
    path = resolve_path(name)
    if path is None:
        return "unknown dataset"
    real = _readable(path)
    if real is None:
        allowed = allowed_dirs()
        where = (
            f" (this worker reads datasets only under {DIRS_ENV}: "
            f"{':'.join(str(d) for d in allowed) or 'nowhere'})"
            if allowed is not None
            else ""
        )
        return f"{path} does not exist or is not readable on this worker{where}"
    examples = 0
    try:
        with open(real, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record_example(json.loads(line), line_no)
                except json.JSONDecodeError as exc:
                    return f"{path.name} line {line_no}: not JSON ({exc.msg})"
                except DatasetError as exc:
                    return f"{path.name} {exc}"
                examples += 1
                if examples >= PREFLIGHT_RECORDS:
                    return None
    except (OSError, UnicodeDecodeError) as exc:
        return f"{path.name} cannot be read: {exc}"
    if examples < 2:
        return f"{path.name} has {examples} record(s); a dataset needs at least 2"
    if max(1, int(examples * validation_split)) >= examples:
        return (
            f"{path.name}: {examples} records leave none for training at "
            f"validation_split {validation_split}"
        )
    return None


@functools.lru_cache(maxsize=16)
def load(name: str) -> tuple[Example, ...]:
    name = name or DEFAULT_DATASET
    if name == "synthetic:text":
        return tuple(_synthetic_text())
    path = resolve_path(name)
    if path is None:
        raise DatasetError(check_name(name) or "unknown dataset")
    return tuple(_load_jsonl(path))


def split(
    examples: tuple[Example, ...], validation_split: float
) -> tuple[tuple[Example, ...], tuple[Example, ...]]:
    """(train, validation): the last fraction of the records is held out."""
    n_val = max(1, int(len(examples) * validation_split))
    if n_val >= len(examples):
        raise DatasetError(
            f"{len(examples)} records leave none for training at validation_split {validation_split}"
        )
    return examples[:-n_val], examples[-n_val:]
