"""Checkpoint files, shared by trainer processes (which write them) and the control plane
(which lists, deletes and promotes them).

Layout: ``<data>/checkpoints/<account>/<job>/<checkpoint>.npz`` holds the arrays, and a
sidecar ``<checkpoint>.json`` its metadata. Both are written atomically (temp file, fsync,
rename, fsync of the directory) and the sidecar last, so a checkpoint is listed only once
its data is durable: a trainer killed mid-save leaves no half checkpoint behind. Files live
outside the job's trainer, so they survive trainer death and job deletion.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
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
    checkpoint: str
    step: int
    create_time: str
    kind: str
    digest: str
    base_model: str
    lora_rank: int
    generation: int
    size_bytes: int

    @property
    def name(self) -> str:
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
            "name": self.name,
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


def read_meta(data_dir: Path, account: str, job: str, checkpoint: str) -> CheckpointMeta | None:
    path = meta_path(data_dir, account, job, checkpoint)
    try:
        return CheckpointMeta(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None


def list_meta(data_dir: Path, account: str, job: str) -> list[CheckpointMeta]:
    """Checkpoints of a job, oldest first (by creation time, then name)."""
    directory = job_dir(data_dir, account, job)
    if not directory.is_dir():
        return []
    metas = []
    for path in directory.glob("*.json"):
        try:
            metas.append(CheckpointMeta(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue  # a sidecar being replaced right now; it is listed next time
    metas.sort(key=lambda m: (m.create_time, m.checkpoint))
    return metas


def delete(data_dir: Path, account: str, job: str, checkpoint: str) -> bool:
    """Remove a checkpoint: the sidecar first, so it is never listed without its data."""
    meta = meta_path(data_dir, account, job, checkpoint)
    if not meta.exists():
        return False
    meta.unlink()
    data_path(data_dir, account, job, checkpoint).unlink(missing_ok=True)
    fsync_dir(meta.parent)
    return True


def copy_data(src: Path, dst: Path) -> None:
    def write(f: Any) -> None:
        with open(src, "rb") as source:
            shutil.copyfileobj(source, f)

    atomic_write(dst, write)
