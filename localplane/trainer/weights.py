"""Checkpoint references and checkpoint files as a trainer reads and writes them.

A checkpoint lives at ``<data>/checkpoints/<account>/<job>/<name>.npz`` with its
:class:`~localplane.checkpoints.CheckpointMeta` sidecar (see :mod:`localplane.checkpoints`),
outside the trainer: it survives the trainer's death and the job's deletion, and any later
trainer of the same account can load it.

The ``path`` a save answers is ``tinker://<job>/weights/<name>`` (``save_weights``) or
``tinker://<job>/sampler_weights/<name>`` (``save_weights_for_sampler``) — three segments,
what the ``tinker`` SDK's own path parser accepts. ``load_weights`` takes that, or:

* a bare logical name (``step-40``): this job's checkpoint, whichever trainer generation
  saved it (the Fireworks SDK passes only such names, or ``cross_job://``);
* ``cross_job://<job>/<name>`` and ``<account>/<job>/<name>``: another job of the same
  account, also a deleted one;
* ``accounts/<a>/rlorTrainerJobs/<job>/checkpoints/<name>``: the control plane's name.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from localplane import checkpoints as ckpt
from localplane.trainer.lm import Adam, CausalLM, LMConfig
from localplane.trainer.wire import UserError
from shepherd.platform import rules

_SEGMENT = {"weights": "state", "sampler_weights": "sampler"}


@dataclass(frozen=True)
class Ref:
    account: str
    job: str
    checkpoint: str

    def tinker_path(self, kind: str) -> str:
        segment = "sampler_weights" if kind == "sampler" else "weights"
        return f"tinker://{self.job}/{segment}/{self.checkpoint}"


def _checked(account: str, job: str, checkpoint: str, path: str) -> Ref:
    for what, value in (("job", job), ("checkpoint", checkpoint)):
        if not value or (what == "job" and rules.check_resource_id(value)):
            raise UserError(f"path: {path!r} names an invalid {what} {value!r}")
    if p := rules.check_checkpoint_id(checkpoint):
        raise UserError(f"path: checkpoint name {checkpoint!r} {p}")
    return Ref(account, job, checkpoint)


def parse_ref(path: Any, account: str, job: str) -> Ref:
    """Where ``path`` points; the account is always the caller's (keys map to one account)."""
    if not isinstance(path, str) or not path.strip():
        raise UserError("path: is required (a checkpoint name or tinker:// path)")
    path = path.strip()
    if path.startswith("tinker://"):
        parts = path.removeprefix("tinker://").split("/")
        if len(parts) != 3 or parts[1] not in _SEGMENT:
            raise UserError(
                f"path: {path!r} must be tinker://<job>/weights/<name> or "
                "tinker://<job>/sampler_weights/<name>"
            )
        return _checked(account, parts[0], parts[2], path)
    if path.startswith("cross_job://"):
        source, _, name = path.removeprefix("cross_job://").partition("/")
        return _checked(account, source, name, path)
    if m := rules.CHECKPOINT_NAME_RE.match(path):
        if m["account"] != account:
            raise UserError(f"path: {path} belongs to another account than this trainer's")
        return _checked(account, m["job"], m["checkpoint"], path)
    parts = path.split("/")
    if len(parts) == 3:
        if parts[0] != account:
            raise UserError(f"path: {path} belongs to another account than this trainer's")
        return _checked(account, parts[1], parts[2], path)
    if len(parts) == 1:
        return _checked(account, job, path, path)
    raise UserError(
        f"path: {path!r} is not a checkpoint reference (a name, tinker://<job>/weights/<name>, "
        "cross_job://<job>/<name> or accounts/<a>/rlorTrainerJobs/<job>/checkpoints/<name>)"
    )


@dataclass
class Loaded:
    meta: ckpt.CheckpointMeta
    lm_config: LMConfig
    params: dict[str, np.ndarray]
    #: Adam's arrays, for resumable checkpoints.
    optimizer: dict[str, np.ndarray] | None


def read(data_dir: Path, ref: Ref) -> Loaded:
    meta = ckpt.read_meta(data_dir, ref.account, ref.job, ref.checkpoint)
    if meta is None:
        raise UserError(
            f"checkpoint {ref.checkpoint!r} of job {ref.job} does not exist "
            f"(accounts/{ref.account}/rlorTrainerJobs/{ref.job}/checkpoints/{ref.checkpoint})"
        )
    with np.load(ckpt.data_path(data_dir, ref.account, ref.job, ref.checkpoint)) as npz:
        state = json.loads(npz["state"].tobytes())
        params = {k[2:]: npz[k].copy() for k in npz.files if k.startswith("p/")}
        optimizer = {k[2:]: npz[k].copy() for k in npz.files if k.startswith("o/")} or None
    return Loaded(meta, LMConfig(**state["lm_config"]), params, optimizer)


def save(
    data_dir: Path,
    ref: Ref,
    *,
    kind: str,
    lm: CausalLM,
    adam: Adam,
    step: int,
    generation: int,
    overwrite: bool = False,
) -> ckpt.CheckpointMeta:
    """Write a checkpoint atomically. Saving a name again at the same weights is a no-op
    (a retried save), or adds the other kind (state + sampler = ``both``); at different
    weights it is refused unless ``overwrite``."""
    digest = lm.digest()
    existing = ckpt.read_meta(data_dir, ref.account, ref.job, ref.checkpoint)
    if existing is not None and not overwrite:
        if existing.digest != digest or existing.step != step:
            raise UserError(
                f"checkpoint {ref.checkpoint!r} already exists (step {existing.step}) with other "
                "weights; choose another name"
            )
        if existing.kind in ("both", kind):
            return existing
        kind = "both"
    arrays: dict[str, np.ndarray] = {f"p/{k}": v for k, v in lm.state().items()}
    if ckpt.CHECKPOINT_TYPES[kind][1]:
        arrays.update({f"o/{k}": v for k, v in adam.state().items()})
    state = {"lm_config": asdict(lm.cfg), "step": step, "kind": kind, "digest": digest}
    arrays["state"] = np.frombuffer(json.dumps(state).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy's stubs miss **arrays
    blob = buffer.getvalue()
    ckpt.atomic_write(
        ckpt.data_path(data_dir, ref.account, ref.job, ref.checkpoint), lambda f: f.write(blob)
    )
    meta = ckpt.CheckpointMeta(
        account=ref.account,
        job=ref.job,
        checkpoint=ref.checkpoint,
        step=step,
        create_time=existing.create_time
        if existing is not None and not overwrite
        else datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
        kind=kind,
        digest=digest,
        base_model=lm.cfg.base_model,
        lora_rank=lm.cfg.lora_rank,
        generation=generation,
        size_bytes=len(blob),
    )
    ckpt.write_meta(data_dir, meta)
    return meta
