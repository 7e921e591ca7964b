"""Training runs: what the hosted Tinker service calls a model (trainer-api.md §4, REST).

A training run is a model a client created (``create_model``, or a load that creates one);
its id is the model id, ``tinker://<run>/weights/<name>`` paths name its checkpoints, and its
record outlives the trainer process: a cookbook resuming on a new trainer asks for the run
behind a checkpoint it saved days ago (``get_training_run_by_tinker_path``) to find its
renderer in ``user_metadata``. Records live at ``<data>/runs/<account>/<run>.json``, written
when the run is created and when it saves; every trainer of the account can read them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localplane import checkpoints as ckpt

#: Run ids this trainer makes are "<session>:train:<n>"; any id read from a path is checked
#: against this before it names a file.
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")


@dataclass
class RunRecord:
    run_id: str
    account: str
    job: str
    generation: int
    base_model: str
    lora_rank: int
    #: The run whose training this one continues (itself, unless it resumed from a checkpoint
    #: with its optimizer state; see trainer/checkpoints.py).
    lineage: str
    created: str
    updated: str
    user_metadata: dict[str, str] = field(default_factory=dict)
    model_config: dict[str, Any] = field(default_factory=dict)
    corrupted: bool = False


def run_path(data_dir: Path, account: str, run_id: str) -> Path:
    return data_dir / "runs" / account / f"{run_id}.json"


def write(data_dir: Path, rec: RunRecord) -> None:
    blob = json.dumps(dataclasses.asdict(rec), sort_keys=True).encode()
    ckpt.atomic_write(run_path(data_dir, rec.account, rec.run_id), lambda f: f.write(blob))


def read(data_dir: Path, account: str, run_id: str) -> RunRecord | None:
    if not RUN_ID_RE.match(run_id):
        return None
    try:
        raw = json.loads(run_path(data_dir, account, run_id).read_text())
    except (FileNotFoundError, ValueError):
        return None
    known = {f.name for f in dataclasses.fields(RunRecord)}
    return RunRecord(**{k: v for k, v in raw.items() if k in known})


def list_runs(data_dir: Path, account: str) -> list[RunRecord]:
    """The account's runs, oldest first."""
    directory = data_dir / "runs" / account
    if not directory.is_dir():
        return []
    out = []
    for path in directory.glob("*.json"):
        rec = read(data_dir, account, path.stem)
        if rec is not None:
            out.append(rec)
    out.sort(key=lambda r: (r.created, r.run_id))
    return out


def checkpoints_of(data_dir: Path, rec: RunRecord) -> list[ckpt.CheckpointMeta]:
    """The run's live checkpoints (it saved them, or saved the very same weights), oldest first."""
    return [m for m in ckpt.list_meta(data_dir, rec.account, rec.job) if rec.run_id in m.runs]


def checkpoint_wire(meta: ckpt.CheckpointMeta, segment: str, run_id: str) -> dict[str, Any]:
    """One ``tinker.types.Checkpoint``: a checkpoint seen through one run and one segment."""
    prefix = "weights" if segment == "state" else "sampler_weights"
    return {
        "checkpoint_id": f"{prefix}/{meta.logical_name}",
        "checkpoint_type": "training" if segment == "state" else "sampler",
        "time": meta.create_time,
        "tinker_path": f"tinker://{run_id}/{prefix}/{meta.logical_name}",
        "size_bytes": meta.size_bytes,
        "public": False,
        "user_metadata": meta.user_metadata or None,
        "expires_at": meta.expiry(segment),
    }


def run_wire(
    rec: RunRecord, metas: list[ckpt.CheckpointMeta], last_request: str | None
) -> dict[str, Any]:
    """One ``tinker.types.TrainingRun``."""

    def newest(segment: str) -> dict[str, Any] | None:
        found = [m for m in metas if segment in m.segments()]
        return checkpoint_wire(found[-1], segment, rec.run_id) if found else None

    return {
        "training_run_id": rec.run_id,
        "base_model": rec.base_model,
        "model_owner": rec.account,
        "is_lora": rec.lora_rank > 0,
        "corrupted": rec.corrupted,
        "lora_rank": rec.lora_rank or None,
        "last_request_time": last_request or rec.updated,
        "last_checkpoint": newest("state"),
        "last_sampler_checkpoint": newest("sampler"),
        "user_metadata": rec.user_metadata or None,
    }
