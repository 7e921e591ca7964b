"""Checkpoints as a trainer names, writes and reads them (trainer-api.md §4, §7).

Files and their metadata are :mod:`localplane.checkpoints` (shared with the control plane,
which lists, promotes and deletes them). This module decides *which* checkpoint a name means.

**Two namespaces.** The control plane (and the Fireworks SDK, and Shepherd) names a job's
checkpoints by the name they were saved under: ``step-40`` is the job's ``step-40`` whichever
trainer generation saved it, and a replay after a preemption that saves ``step-40`` again at
the same weights is the same checkpoint. The hosted Tinker service scopes names by training
run instead: ``tinker://<run>/weights/final`` — two runs may each have a ``final``. Both hold:

* A save returns ``tinker://<run>/weights/<name>`` (``sampler_weights`` for sampler saves).
* Every run belongs to a *lineage*: the lineage of the checkpoint it resumed from when it
  was loaded *with optimizer state* (``create_training_client_from_state_with_optimizer``,
  Shepherd's restore: a resumed run continues its predecessor's training), the run itself
  otherwise — created from the base model, or from a checkpoint's weights only
  (``create_training_client_from_state``: hosted Tinker starts a new training run there, and
  a preference pipeline's RL stage saves ``000002`` again after its SFT stage did). A
  weights-only load into an existing model leaves its lineage as it was. Within a lineage a
  name is unique: saving an existing name at other weights is refused unless ``overwrite``
  (a replay that diverged is seen, not hidden). Another lineage saving a taken name gets its
  own checkpoint, whose control-plane id is qualified: ``<name>.<8 hex of the lineage>``.
* A bare name resolves to the caller's lineage's checkpoint of that name, else the job's
  (the first lineage's, whose id is the name itself); ``tinker://<run>/weights/<name>``
  resolves to the checkpoint that run saved under ``<name>``, qualified or not.

**References** ``load_weights``, ``create_sampling_session`` and ``asample`` accept:
``tinker://<run>/(weights|sampler_weights)/<name>``; ``tinker://<job>/...`` (older paths);
``cross_job://<job>/<name>``; ``<account>/<job>/<name>``;
``accounts/<a>/rlorTrainerJobs/<job>/checkpoints/<id>``; and a bare name. Always the caller's
account; deleted jobs included.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from localplane import checkpoints as ckpt
from localplane.errors import shorten
from localplane.trainer import runs
from localplane.trainer.backend import Exported
from localplane.trainer.errors import UserError
from shepherd.platform import rules

#: A tinker path's middle segment -> the checkpoint segment it names.
SEGMENT_OF = {"weights": "state", "sampler_weights": "sampler"}
PATH_SEGMENT = {"state": "weights", "sampler": "sampler_weights"}


@dataclass(frozen=True)
class Caller:
    """Who asks: names resolve in this account, job and lineage."""

    data_dir: Path
    account: str
    job: str
    lineage: str = ""
    run: str = ""


def qualified(name: str, lineage: str) -> str:
    """The control-plane id of ``name`` saved by another lineage than the name's first."""
    tag = hashlib.sha256(lineage.encode()).hexdigest()[:8]
    return f"{name[:54]}.{tag}"


def tinker_path(run: str, segment: str, name: str) -> str:
    return f"tinker://{run}/{PATH_SEGMENT[segment]}/{name}"


def validate_name(name: str, where: str = "path") -> None:
    if p := rules.check_checkpoint_id(name):
        raise UserError(f"{where}: checkpoint name {shorten(name)!r} {p}")


_check_name = validate_name


def _get(caller: Caller, job: str, checkpoint: str) -> ckpt.CheckpointMeta | None:
    if rules.check_resource_id(job) or rules.check_checkpoint_id(checkpoint):
        return None
    return ckpt.read_meta(caller.data_dir, caller.account, job, checkpoint)


def _missing(what: str) -> UserError:
    return UserError(f"path: {what} does not exist (or has expired)")


def resolve(path: Any, caller: Caller, *, segment: str | None = None) -> ckpt.CheckpointMeta:
    """The live checkpoint ``path`` names (see the module's doc for the forms)."""
    if not isinstance(path, str) or not path.strip():
        raise UserError("path: is required (a checkpoint name or tinker:// path)")
    path = path.strip()
    shown = shorten(path)
    meta: ckpt.CheckpointMeta | None
    if path.startswith("tinker://"):
        parts = path.removeprefix("tinker://").split("/")
        if len(parts) != 3 or parts[1] not in SEGMENT_OF:
            raise UserError(
                f"path: {shown!r} must be tinker://<training run>/weights/<name> or "
                "tinker://<training run>/sampler_weights/<name>"
            )
        owner, seg, name = parts[0], SEGMENT_OF[parts[1]], parts[2]
        # A training run (job ids have no ':'), or a job as older paths named it.
        meta = _by_run(caller, owner, name, seg) if ":" in owner else _get(caller, owner, name)
        if meta is None or seg not in meta.segments():
            raise _missing(f"checkpoint {shown}")
        return meta
    if path.startswith("cross_job://"):
        job, _, name = path.removeprefix("cross_job://").partition("/")
        meta = _get(caller, job, name)
    elif m := rules.CHECKPOINT_NAME_RE.match(path):
        if m["account"] != caller.account:
            raise UserError(f"path: {shown} belongs to another account than this trainer's")
        meta = _get(caller, m["job"], m["checkpoint"])
    elif len(parts := path.split("/")) == 3:
        if parts[0] != caller.account:
            raise UserError(f"path: {shown} belongs to another account than this trainer's")
        meta = _get(caller, parts[1], parts[2])
    elif len(parts) == 1:
        _check_name(path, "path")
        meta = None
        if caller.lineage:
            meta = _get(caller, caller.job, qualified(path, caller.lineage))
        meta = meta or _get(caller, caller.job, path)
    else:
        raise UserError(
            f"path: {shown!r} is not a checkpoint reference (a name, "
            "tinker://<training run>/weights/<name>, cross_job://<job>/<name> or "
            "accounts/<a>/rlorTrainerJobs/<job>/checkpoints/<name>)"
        )
    if meta is None:
        raise _missing(f"checkpoint {shown}")
    if segment is not None and segment not in meta.segments():
        raise UserError(f"path: checkpoint {shown} holds no {segment} weights")
    return meta


def _by_run(caller: Caller, run_id: str, name: str, segment: str) -> ckpt.CheckpointMeta | None:
    rec = runs.read(caller.data_dir, caller.account, run_id)
    if rec is None:
        raise UserError(
            f"path: training run {shorten(run_id)} is not known to account {caller.account}"
        )
    for meta in runs.checkpoints_of(caller.data_dir, rec):
        if meta.logical_name == name and segment in meta.segments():
            return meta
    return None


def read(data_dir: Path, meta: ckpt.CheckpointMeta) -> Exported:
    """The arrays (and optimizer state, if saved) of a checkpoint."""
    try:
        with np.load(ckpt.data_path(data_dir, meta.account, meta.job, meta.checkpoint)) as npz:
            state = json.loads(npz["state"].tobytes())
            params = {k[2:]: npz[k].copy() for k in npz.files if k.startswith("p/")}
            optimizer = {k[2:]: npz[k].copy() for k in npz.files if k.startswith("o/")} or None
    except FileNotFoundError:
        raise UserError(f"checkpoint {meta.checkpoint} of job {meta.job} was deleted") from None
    return Exported(
        config=state["lm_config"],
        params=params,
        optimizer=optimizer if "state" in meta.segments() else None,
        digest=state["digest"],
        base_model=meta.base_model,
        lora_rank=meta.lora_rank,
    )


def _expiry(ttl_seconds: int | None) -> str | None:
    if ttl_seconds is None:
        return None
    when = datetime.now(UTC) + timedelta(seconds=ttl_seconds)
    return when.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _merged_expiry(old: str | None, new: str | None, had: bool) -> str | None:
    """Two saves of the same segment: the one that keeps it longer wins (nothing is lost)."""
    if not had:
        return new
    if old is None or new is None:
        return None
    return max(old, new, key=ckpt.parse_time)


def save(
    caller: Caller,
    name: str,
    *,
    segment: str,
    exported: Exported,
    step: int,
    generation: int,
    ttl_seconds: int | None = None,
    overwrite: bool = False,
    user_metadata: dict[str, str] | None = None,
) -> ckpt.CheckpointMeta:
    """Write a checkpoint atomically under the name's id for the caller's lineage (see the
    module's doc). Saving a name again at the same weights is a no-op that records the run
    (a retry, or a replay) or adds the other segment."""
    _check_name(name, "path")
    checkpoint = name
    existing = ckpt.read_meta(caller.data_dir, caller.account, caller.job, name)
    if (
        existing is not None
        and not _same(existing, exported, step)
        and existing.lineage not in ("", caller.lineage)
    ):
        checkpoint = qualified(name, caller.lineage)
        existing = ckpt.read_meta(caller.data_dir, caller.account, caller.job, checkpoint)
    if existing is not None and not overwrite and not _same(existing, exported, step):
        raise UserError(
            f"checkpoint {name!r} already exists (step {existing.step}) with other weights; "
            "choose another name (or save with overwrite)"
        )
    keep = existing if existing is not None and not overwrite else None
    segments = {segment, *(keep.segments() if keep else ())}
    kind = ckpt.kind_of(segments)
    assert kind is not None
    expires = dict(keep.expires) if keep else {}
    had = keep is not None and segment in keep.segments()
    merged = _merged_expiry(expires.get(segment), _expiry(ttl_seconds), had)
    if merged is None:
        expires.pop(segment, None)
    else:
        expires[segment] = merged
    run_list = list(keep.runs) if keep else []
    if caller.run and caller.run not in run_list:
        run_list.append(caller.run)
    metadata = {**(keep.user_metadata if keep else {}), **(user_metadata or {})}
    if (
        keep is not None
        and keep.kind == kind
        and keep.runs == run_list
        and keep.expires == expires
        and keep.user_metadata == metadata
    ):
        return keep  # a retried save: nothing changes
    size = keep.size_bytes if keep else 0
    if keep is None or (segment == "state" and "state" not in keep.segments()):
        # Write the arrays: weights, with the optimizer state when a state segment exists.
        arrays: dict[str, np.ndarray] = {f"p/{k}": v for k, v in exported.params.items()}
        if "state" in segments:
            assert exported.optimizer is not None
            arrays.update({f"o/{k}": v for k, v in exported.optimizer.items()})
        state = {
            "lm_config": exported.config,
            "step": step,
            "kind": kind,
            "digest": exported.digest,
        }
        arrays["state"] = np.frombuffer(json.dumps(state).encode(), dtype=np.uint8)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy's stubs miss **arrays
        blob = buffer.getvalue()
        ckpt.atomic_write(
            ckpt.data_path(caller.data_dir, caller.account, caller.job, checkpoint),
            lambda f: f.write(blob),
        )
        size = len(blob)
    meta = ckpt.CheckpointMeta(
        account=caller.account,
        job=caller.job,
        checkpoint=checkpoint,
        step=step,
        create_time=keep.create_time if keep else ckpt.now_rfc3339(),
        kind=kind,
        digest=exported.digest,
        base_model=exported.base_model,
        lora_rank=exported.lora_rank,
        generation=keep.generation if keep else generation,
        size_bytes=size,
        name=name,
        runs=run_list,
        lineage=keep.lineage if keep and keep.lineage else caller.lineage,
        expires=expires,
        model_config=exported.config,
        user_metadata=metadata,
    )
    ckpt.write_meta(caller.data_dir, meta)
    return meta


def set_expiry(data_dir: Path, meta: ckpt.CheckpointMeta, segment: str, ttl: int | None) -> None:
    """Set (or, with None, remove) a segment's expiry, counted from now."""
    expires = dict(meta.expires)
    when = _expiry(ttl)
    if when is None:
        expires.pop(segment, None)
    else:
        expires[segment] = when
    ckpt.write_meta(data_dir, dataclasses.replace(meta, expires=expires))


def _same(meta: ckpt.CheckpointMeta, exported: Exported, step: int) -> bool:
    return meta.digest == exported.digest and meta.step == step


def weights_info(meta: ckpt.CheckpointMeta) -> dict[str, Any]:
    """``tinker.types.WeightsInfoResponse`` of a checkpoint."""
    cfg = meta.model_config
    out: dict[str, Any] = {
        "base_model": meta.base_model,
        "is_lora": meta.lora_rank > 0,
        "lora_rank": meta.lora_rank or None,
        "optimizer_config": {"type": "adamw"},
    }
    if meta.lora_rank:
        out.update(
            train_mlp=bool(cfg.get("train_mlp", True)),
            train_unembed=bool(cfg.get("train_unembed", True)),
            train_attn=False,
        )
    return out
