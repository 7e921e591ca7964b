"""Checkpoint files, shared by trainer processes (which write them) and the control plane
(which lists, deletes and promotes them).

Layout: ``<data>/checkpoints/<account>/<job>/<checkpoint>.npz`` holds the arrays, and a
sidecar ``<checkpoint>.json`` its metadata. Both are written atomically (temp file, fsync,
rename, fsync of the directory) and the sidecar last, so a checkpoint is listed only once
its data is durable: a trainer killed mid-save leaves no half checkpoint behind. Files live
outside the job's trainer, so they survive trainer death and job deletion.

A checkpoint has up to two *segments*: ``state`` (save_weights: weights and optimizer
state) and ``sampler`` (save_weights_for_sampler). Each may carry its own expiry
(``ttl_seconds``): an expired segment is gone for every reader from that instant, and the
plane's sweeper (:func:`sweep`) deletes what has expired from disk.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: What was saved -> (promotable, resumable). ``state`` is ``save_weights`` (weights and
#: optimizer state), ``sampler`` is ``save_weights_for_sampler`` (weights only), ``both`` is a
#: name saved both ways at the same weights (the Tinker cookbook saves both under one name).
CHECKPOINT_TYPES = {
    "both": (True, True),
    "state": (False, True),
    "sampler": (True, False),
}
#: The segments of each kind, and the kind of a set of segments.
SEGMENTS = {"both": ("state", "sampler"), "state": ("state",), "sampler": ("sampler",)}


def kind_of(segments: set[str]) -> str | None:
    if segments == {"state", "sampler"}:
        return "both"
    return next(iter(segments)) if segments else None


def now_rfc3339() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def checkpoint_type(kind: str, lora_rank: int) -> str:
    """The hosted service's ``checkpointType`` for a checkpoint (clients treat it as opaque
    and filter on ``promotable``): inference checkpoints are the promotable ones."""
    if CHECKPOINT_TYPES[kind][0]:
        return "CHECKPOINT_TYPE_INFERENCE_LORA" if lora_rank else "CHECKPOINT_TYPE_INFERENCE_BASE"
    return "CHECKPOINT_TYPE_TRAINING_LORA" if lora_rank else "CHECKPOINT_TYPE_TRAINING"


def job_dir(data_dir: Path, account: str, job: str) -> Path:
    return data_dir / "checkpoints" / account / job


def data_path(data_dir: Path, account: str, job: str, checkpoint: str) -> Path:
    return job_dir(data_dir, account, job) / f"{checkpoint}.npz"


def meta_path(data_dir: Path, account: str, job: str, checkpoint: str) -> Path:
    return job_dir(data_dir, account, job) / f"{checkpoint}.json"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Any) -> None:
    """Write via ``write(fileobj)`` to a temp file, fsync it, rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)


@dataclass(frozen=True)
class CheckpointMeta:
    account: str
    job: str
    #: The control plane's id: the logical name, or qualified by lineage (trainer/checkpoints.py).
    checkpoint: str
    step: int
    create_time: str
    kind: str
    digest: str
    base_model: str
    lora_rank: int
    generation: int
    size_bytes: int
    #: The name the client saved it under (``checkpoint`` unless qualified).
    name: str = ""
    #: Training runs (model ids) that saved exactly these weights under this name.
    runs: list[str] = field(default_factory=list)
    #: The training lineage it belongs to: a run, and every run that continued from it.
    lineage: str = ""
    #: Per segment (``state``/``sampler``): when it expires (RFC 3339), absent for never.
    expires: dict[str, str] = field(default_factory=dict)
    #: The model config its arrays rebuild (backend-specific).
    model_config: dict[str, Any] = field(default_factory=dict)
    #: What the client attached to the save (``Checkpoint.user_metadata``).
    user_metadata: dict[str, str] = field(default_factory=dict)

    @property
    def logical_name(self) -> str:
        return self.name or self.checkpoint

    def segments(self) -> tuple[str, ...]:
        return SEGMENTS[self.kind]

    def alive(self, now: datetime | None = None) -> CheckpointMeta | None:
        """This checkpoint without its expired segments; None when nothing is left."""
        if not self.expires:
            return self
        now = now or datetime.now(UTC)
        left = {
            s for s in self.segments() if s not in self.expires or parse_time(self.expires[s]) > now
        }
        kind = kind_of(left)
        if kind is None:
            return None
        return self if kind == self.kind else dataclasses.replace(self, kind=kind)

    def expiry(self, segment: str) -> str | None:
        return self.expires.get(segment)

    @property
    def resource_name(self) -> str:
        return f"accounts/{self.account}/rlorTrainerJobs/{self.job}/checkpoints/{self.checkpoint}"

    @property
    def promotable(self) -> bool:
        return CHECKPOINT_TYPES[self.kind][0]

    @property
    def resumable(self) -> bool:
        return CHECKPOINT_TYPES[self.kind][1]

    @property
    def checkpoint_type(self) -> str:
        return checkpoint_type(self.kind, self.lora_rank)

    def wire(self) -> dict[str, Any]:
        return {
            "name": self.resource_name,
            "createTime": self.create_time,
            "checkpointType": self.checkpoint_type,
            "promotable": self.promotable,
            "step": self.step,
            # localplane extension: whether load_weights can resume from it (optimizer state).
            "resumable": self.resumable,
        }


def write_meta(data_dir: Path, meta: CheckpointMeta) -> None:
    blob = json.dumps(meta.__dict__, sort_keys=True).encode()
    atomic_write(
        meta_path(data_dir, meta.account, meta.job, meta.checkpoint), lambda f: f.write(blob)
    )


def _load(path: Path) -> CheckpointMeta:
    raw = json.loads(path.read_text())
    known = {f.name for f in dataclasses.fields(CheckpointMeta)}
    return CheckpointMeta(**{k: v for k, v in raw.items() if k in known})


def read_meta(
    data_dir: Path, account: str, job: str, checkpoint: str, *, expired: bool = False
) -> CheckpointMeta | None:
    """A checkpoint's metadata (None when absent or, unless ``expired``, expired)."""
    path = meta_path(data_dir, account, job, checkpoint)
    try:
        meta = _load(path)
    except FileNotFoundError:
        return None
    return meta if expired else meta.alive()


def list_meta(
    data_dir: Path, account: str, job: str, *, expired: bool = False
) -> list[CheckpointMeta]:
    """Checkpoints of a job, oldest first (by creation time, then name)."""
    directory = job_dir(data_dir, account, job)
    if not directory.is_dir():
        return []
    now = datetime.now(UTC)
    metas = []
    for path in directory.glob("*.json"):
        try:
            meta: CheckpointMeta | None = _load(path)
        except (OSError, ValueError, TypeError):
            continue  # a sidecar being replaced right now; it is listed next time
        if meta is not None and not expired:
            meta = meta.alive(now)
        if meta is not None:
            metas.append(meta)
    metas.sort(key=lambda m: (m.create_time, m.checkpoint))
    return metas


def list_account(data_dir: Path, account: str) -> list[CheckpointMeta]:
    """Every live checkpoint of an account, across its jobs (deleted jobs included)."""
    root = data_dir / "checkpoints" / account
    if not root.is_dir():
        return []
    metas = [
        m
        for job in sorted(root.iterdir())
        if job.is_dir()
        for m in list_meta(data_dir, account, job.name)
    ]
    metas.sort(key=lambda m: (m.create_time, m.job, m.checkpoint))
    return metas


def remove_segment(data_dir: Path, meta: CheckpointMeta, segment: str) -> None:
    """Delete one segment of a checkpoint; the whole checkpoint when it was the last."""
    left = set(meta.segments()) - {segment}
    kind = kind_of(left)
    if kind is None:
        delete(data_dir, meta.account, meta.job, meta.checkpoint)
        return
    expires = {k: v for k, v in meta.expires.items() if k != segment}
    write_meta(data_dir, dataclasses.replace(meta, kind=kind, expires=expires))


def sweep(data_dir: Path) -> int:
    """Delete every expired segment from disk; the number of checkpoints changed."""
    root = data_dir / "checkpoints"
    if not root.is_dir():
        return 0
    now = datetime.now(UTC)
    changed = 0
    for path in root.glob("*/*/*.json"):
        try:
            meta = _load(path)
        except (OSError, ValueError, TypeError):
            continue
        expired = [
            seg
            for seg in meta.segments()
            if seg in meta.expires and parse_time(meta.expires[seg]) <= now
        ]
        if not expired:
            continue
        left = set(meta.segments()) - set(expired)
        kind = kind_of(left)
        if kind is None:
            delete(data_dir, meta.account, meta.job, meta.checkpoint)
        else:
            expires = {k: v for k, v in meta.expires.items() if k in left}
            write_meta(data_dir, dataclasses.replace(meta, kind=kind, expires=expires))
        changed += 1
    return changed


def delete(data_dir: Path, account: str, job: str, checkpoint: str) -> bool:
    """Remove a checkpoint: the sidecar first, so it is never listed without its data."""
    meta = meta_path(data_dir, account, job, checkpoint)
    try:
        meta.unlink()
    except FileNotFoundError:  # never there, or a concurrent sweep took it first
        return False
    data_path(data_dir, account, job, checkpoint).unlink(missing_ok=True)
    fsync_dir(meta.parent)
    return True


def copy_data(src: Path, dst: Path) -> None:
    def write(f: Any) -> None:
        with open(src, "rb") as source:
            shutil.copyfileobj(source, f)

    atomic_write(dst, write)
