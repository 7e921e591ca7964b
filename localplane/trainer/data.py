"""Datasets a local trainer can train on.

Two kinds, both classification so one tiny model serves them:

* ``text`` — character-level next-character prediction: the features of an example are the
  one-hot codes of the previous ``CONTEXT`` characters, the label the next one. Built from the
  built-in ``synthetic:text`` corpus or a JSONL file of ``{"text"}``, ``{"prompt",
  "completion"}`` or ``{"messages": [{"role", "content"}]}`` records.
* ``vectors`` — fixed-size feature vectors with an integer class: ``synthetic:blobs``,
  ``synthetic:spirals`` or a JSONL file of ``{"x": [...], "y": k}`` records.

Everything is deterministic: the same name gives the same examples in the same order, and a
batch for ``(seed, step, micro_batch)`` is always the same batch — which is what makes a run
that was killed and restored end bit-identical to one that was not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: Characters the text model sees; anything else maps to UNKNOWN.
ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))
VOCAB = len(ALPHABET) + 1
UNKNOWN = VOCAB - 1
PAD = ALPHABET.index(" ")
CONTEXT = 6
_CODE = {ch: i for i, ch in enumerate(ALPHABET)}

#: Fraction of examples held out for ``evaluate``.
EVAL_FRACTION = 0.1

BUILTIN = ("synthetic:text", "synthetic:blobs", "synthetic:spirals")
DEFAULT_DATASET = "synthetic:text"


class DatasetError(ValueError):
    """The dataset cannot be used; the message says why."""


def encode(text: str) -> np.ndarray:
    return np.fromiter((_CODE.get(ch, UNKNOWN) for ch in text), dtype=np.int16, count=len(text))


@dataclass
class Dataset:
    name: str
    kind: str  # "text" | "vectors"
    n_features: int
    n_classes: int
    # text: the encoded corpus; an example i predicts codes[CONTEXT + i] from the CONTEXT before it
    codes: np.ndarray | None = None
    # vectors: features and labels
    x: np.ndarray | None = None
    y: np.ndarray | None = None

    @property
    def n_examples(self) -> int:
        if self.kind == "text":
            assert self.codes is not None
            return max(0, len(self.codes) - CONTEXT)
        assert self.y is not None
        return len(self.y)

    @property
    def n_eval(self) -> int:
        return max(1, int(self.n_examples * EVAL_FRACTION))

    @property
    def n_train(self) -> int:
        return self.n_examples - self.n_eval

    def examples(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Features and labels of examples by absolute index (train: ``[0, n_train)``)."""
        if self.kind == "text":
            assert self.codes is not None
            windows = index[:, None] + np.arange(CONTEXT + 1)[None, :]
            chunk = self.codes[windows]
            return one_hot_context(chunk[:, :CONTEXT]), chunk[:, CONTEXT].astype(np.int64)
        assert self.x is not None and self.y is not None
        return self.x[index], self.y[index]

    def train_batch(
        self, seed: int, step: int, micro_batch: int, size: int
    ) -> tuple[np.ndarray, np.ndarray]:
        # A pure function of (seed, step, micro_batch): no hidden cursor to lose on a crash.
        rng = np.random.default_rng([seed, step, micro_batch])
        return self.examples(rng.integers(0, self.n_train, size=size))

    def eval_set(self, max_examples: int) -> tuple[np.ndarray, np.ndarray]:
        n = min(self.n_eval, max_examples)
        return self.examples(np.arange(self.n_train, self.n_train + n))


def one_hot_context(context: np.ndarray) -> np.ndarray:
    n = context.shape[0]
    x = np.zeros((n, CONTEXT * VOCAB), dtype=np.float64)
    cols = np.arange(CONTEXT)[None, :] * VOCAB + context.astype(np.int64)
    x[np.arange(n)[:, None], cols] = 1.0
    return x


def text_examples(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Every (previous CONTEXT chars -> next char) pair of each text, left-padded."""
    xs, ys = [], []
    for text in texts:
        codes = np.concatenate([np.full(CONTEXT, PAD, dtype=np.int16), encode(text)])
        if len(codes) <= CONTEXT:
            continue
        idx = np.arange(len(codes) - CONTEXT)
        windows = codes[idx[:, None] + np.arange(CONTEXT + 1)[None, :]]
        xs.append(one_hot_context(windows[:, :CONTEXT]))
        ys.append(windows[:, CONTEXT].astype(np.int64))
    if not xs:
        return np.zeros((0, CONTEXT * VOCAB)), np.zeros(0, dtype=np.int64)
    return np.concatenate(xs), np.concatenate(ys)


# ------------------------------------------------------------------------------ builtins

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


def _synthetic_text() -> Dataset:
    # A fixed seed: the corpus is part of the dataset's identity, not of the job's seed.
    rng = np.random.default_rng(20261122)
    lines = []
    for _ in range(1500):
        n = int(rng.integers(4, 11))
        words = [_WORDS[int(i)] for i in rng.integers(0, len(_WORDS), size=n)]
        lines.append(" ".join(words) + ".")
    corpus = "\n".join(lines) + "\n"
    return Dataset("synthetic:text", "text", CONTEXT * VOCAB, VOCAB, codes=encode(corpus))


def _synthetic_blobs() -> Dataset:
    rng = np.random.default_rng(7)
    n, d, c = 4096, 16, 4
    centers = rng.normal(0.0, 2.0, size=(c, d))
    y = rng.integers(0, c, size=n)
    x = centers[y] + rng.normal(0.0, 1.5, size=(n, d))
    return Dataset("synthetic:blobs", "vectors", d, c, x=x, y=y.astype(np.int64))


def _synthetic_spirals() -> Dataset:
    rng = np.random.default_rng(11)
    n, c = 3000, 3
    y = rng.integers(0, c, size=n)
    r = rng.uniform(0.1, 1.0, size=n)
    theta = r * 4.0 + y * (2 * np.pi / c) + rng.normal(0.0, 0.15, size=n)
    base = np.stack([r * np.cos(theta), r * np.sin(theta)], axis=1)
    # Fixed random features make the spiral learnable by a one-hidden-layer model.
    proj = np.random.default_rng(12).normal(0.0, 3.0, size=(2, 8))
    x = np.concatenate([base, np.sin(base @ proj)], axis=1)
    return Dataset("synthetic:spirals", "vectors", x.shape[1], c, x=x, y=y.astype(np.int64))


_BUILDERS = {
    "synthetic:text": _synthetic_text,
    "synthetic:blobs": _synthetic_blobs,
    "synthetic:spirals": _synthetic_spirals,
}


# --------------------------------------------------------------------------------- files


def record_text(record: dict[str, Any], line_no: int) -> str:
    if isinstance(record.get("text"), str):
        return record["text"]
    if isinstance(record.get("prompt"), str) and isinstance(record.get("completion"), str):
        return record["prompt"] + record["completion"]
    messages = record.get("messages")
    if isinstance(messages, list) and all(
        isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages
    ):
        return "\n".join(f"{m.get('role', 'user')}: {m['content']}" for m in messages)
    raise DatasetError(
        f"line {line_no}: a record needs 'text', 'prompt'+'completion', 'messages' or 'x'+'y'"
    )


def _load_jsonl(name: str, path: Path) -> Dataset:
    if not path.is_file():
        raise DatasetError(f"dataset file {path} does not exist")
    texts: list[str] = []
    xs: list[list[float]] = []
    ys: list[int] = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"line {line_no}: not JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise DatasetError(f"line {line_no}: a record must be a JSON object")
            if "x" in record:
                x, y = record.get("x"), record.get("y")
                if not (isinstance(x, list) and x and isinstance(y, int) and y >= 0):
                    raise DatasetError(
                        f"line {line_no}: 'x' must be a non-empty list and 'y' an int >= 0"
                    )
                if xs and len(x) != len(xs[0]):
                    raise DatasetError(
                        f"line {line_no}: 'x' has {len(x)} features, earlier lines {len(xs[0])}"
                    )
                xs.append([float(v) for v in x])
                ys.append(y)
            else:
                texts.append(record_text(record, line_no))
    if xs and texts:
        raise DatasetError("a dataset file mixes vector ('x'/'y') and text records")
    if xs:
        if len(xs) < 2:
            raise DatasetError("a vector dataset needs at least 2 records")
        x_arr = np.asarray(xs, dtype=np.float64)
        y_arr = np.asarray(ys, dtype=np.int64)
        return Dataset(name, "vectors", x_arr.shape[1], int(y_arr.max()) + 1, x=x_arr, y=y_arr)
    corpus = "\n".join(texts) + "\n"
    if len(corpus) < CONTEXT + 2:
        raise DatasetError("the dataset holds too little text to train on")
    return Dataset(name, "text", CONTEXT * VOCAB, VOCAB, codes=encode(corpus))


def resolve_path(name: str, data_dir: Path) -> Path | None:
    """Where a file dataset lives: ``file:///abs.jsonl``, an absolute ``.jsonl`` path, or
    ``accounts/<a>/datasets/<d>`` under ``<data>/datasets/<a>/<d>.jsonl``."""
    if name.startswith("file://"):
        return Path(name.removeprefix("file://"))
    if name.startswith("accounts/"):
        parts = name.split("/")
        if len(parts) == 4 and parts[2] == "datasets":
            return data_dir / "datasets" / parts[1] / f"{parts[3]}.jsonl"
        return None
    if name.endswith(".jsonl") and Path(name).is_absolute():
        return Path(name)
    return None


def check_name(name: str, data_dir: Path) -> str | None:
    """Why a dataset name cannot be used (None when it can): cheap, no loading."""
    if name in _BUILDERS:
        return None
    path = resolve_path(name, data_dir)
    if path is None:
        return (
            "must be one of " + ", ".join(BUILTIN) + ", an absolute path to a .jsonl file, "
            "file:///path.jsonl or accounts/<account>/datasets/<id>"
        )
    if not path.is_file():
        return f"dataset file {path} does not exist"
    return None


_CACHE: dict[str, Dataset] = {}


def load(name: str, data_dir: Path) -> Dataset:
    name = name or DEFAULT_DATASET
    if name not in _CACHE:
        if name in _BUILDERS:
            _CACHE[name] = _BUILDERS[name]()
        else:
            path = resolve_path(name, data_dir)
            if path is None:
                raise DatasetError(check_name(name, data_dir) or "unknown dataset")
            _CACHE[name] = _load_jsonl(name, path)
    return _CACHE[name]
