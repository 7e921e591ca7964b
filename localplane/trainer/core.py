"""The training state machine of one trainer process, free of HTTP.

Guarantees (trainer-api.md §4):

* ``forward_backward`` is idempotent per ``(step, micro_batch)`` for the pending step: a
  repeat returns the first answer and accumulates nothing.
* ``optim_step`` is exactly-once per step: a repeat of an applied step returns the same
  answer and changes nothing; a gap is a 409 naming the trainer's step.
* ``save_weights`` is atomic; ``load_weights`` restores weights, optimizer state and step.

Application errors are never 404s: on the data plane a 404 means "no route" (§5).
"""

from __future__ import annotations

import io
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from localplane import checkpoints as ckpt
from localplane.errors import AlreadyExists, FailedPrecondition, InvalidArgument, PermissionDenied
from localplane.trainer import data as datasets
from localplane.trainer.model import Adam, Architecture, TinyModel, global_norm
from shepherd.platform import rules

#: How many applied steps keep their optim_step answer for repeats.
HISTORY = 256
MAX_BATCH = 4096
MAX_EVAL = 100_000


def _gap(trainer_step: int) -> FailedPrecondition:
    return FailedPrecondition(
        f"step gap: the trainer is at step {trainer_step}; the next step is {trainer_step + 1}",
        code=409,
    )


@dataclass
class TrainerConfig:
    account: str
    job: str
    generation: int
    data_dir: Path
    base_model: str
    lora_rank: int = 0
    learning_rate: float = 1e-3
    max_context_length: int = 8192
    dataset: str = datasets.DEFAULT_DATASET
    seed: int = 0
    hidden: int = 64
    batch_size: int = 32
    compute_delay_s: float = 0.0
    inactivity_timeout_s: float = 3600.0
    forward_only: bool = False
    keys_file: Path | None = None

    @property
    def job_name(self) -> str:
        return f"accounts/{self.account}/rlorTrainerJobs/{self.job}"

    @classmethod
    def from_json(cls, text: str) -> TrainerConfig:
        raw = json.loads(text)
        raw["data_dir"] = Path(raw["data_dir"])
        if raw.get("keys_file"):
            raw["keys_file"] = Path(raw["keys_file"])
        return cls(**raw)

    def to_json(self) -> str:
        raw = dict(self.__dict__)
        raw["data_dir"] = str(self.data_dir)
        raw["keys_file"] = str(self.keys_file) if self.keys_file else None
        return json.dumps(raw)


@dataclass
class _Pending:
    """Micro-batches accumulated for the next optimizer step."""

    grads: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    answers: dict[int, dict[str, Any]] = field(default_factory=dict)


class TrainerCore:
    def __init__(self, cfg: TrainerConfig) -> None:
        self.cfg = cfg
        try:
            self.dataset = datasets.load(cfg.dataset, cfg.data_dir)
        except datasets.DatasetError as exc:
            raise InvalidArgument(f"dataset: {exc}") from None
        self.arch = Architecture(
            n_in=self.dataset.n_features,
            n_hidden=cfg.hidden,
            n_out=self.dataset.n_classes,
            lora_rank=cfg.lora_rank,
            base_model=cfg.base_model,
        )
        self.model = TinyModel(self.arch, cfg.seed)
        self.adam = Adam(self.model.params)
        self.step = 0
        self.pending = _Pending()
        self.history: OrderedDict[int, dict[str, Any]] = OrderedDict()

    # ------------------------------------------------------------------- info

    def info(self) -> dict[str, Any]:
        return {
            "model_id": self.cfg.job_name,
            "base_model": self.cfg.base_model,
            "lora_rank": self.cfg.lora_rank,
            "step": self.step,
            "max_context_length": self.cfg.max_context_length,
            "weights_digest": self.model.digest(),
            "stand_in_model": self.arch.stand_in,
            "trainable_parameters": self.model.n_trainable,
            "dataset": self.dataset.name,
            "generation": self.cfg.generation,
            "forward_only": self.cfg.forward_only,
            "pending_micro_batches": sorted(self.pending.grads),
        }

    # ---------------------------------------------------------------- batches

    def _dataset_for(self, name: Any, field_name: str) -> datasets.Dataset:
        if name is None or name == self.dataset.name:
            return self.dataset
        if not isinstance(name, str):
            raise InvalidArgument(f"{field_name}: must be a string")
        try:
            other = datasets.load(name, self.cfg.data_dir)
        except datasets.DatasetError as exc:
            raise InvalidArgument(f"{field_name}: {exc}") from None
        if (other.n_features, other.n_classes) != (self.arch.n_in, self.arch.n_out):
            raise InvalidArgument(
                f"{field_name}: {name} has {other.n_features} features and {other.n_classes} classes; "
                f"this trainer's model takes {self.arch.n_in} and {self.arch.n_out}"
            )
        return other

    def _examples(self, examples: Any) -> tuple[np.ndarray, np.ndarray]:
        if not isinstance(examples, list) or not examples:
            raise InvalidArgument("batch.examples: must be a non-empty list")
        if len(examples) > MAX_BATCH:
            raise InvalidArgument(f"batch.examples: at most {MAX_BATCH} examples per micro-batch")
        if self.dataset.kind == "vectors":
            xs, ys = [], []
            for i, ex in enumerate(examples):
                x, y = (ex.get("x"), ex.get("y")) if isinstance(ex, dict) else (None, None)
                if not (isinstance(x, list) and len(x) == self.arch.n_in and isinstance(y, int)):
                    raise InvalidArgument(
                        f"batch.examples[{i}]: needs 'x' (a list of {self.arch.n_in} numbers) and 'y' (an int)"
                    )
                if not 0 <= y < self.arch.n_out:
                    raise InvalidArgument(
                        f"batch.examples[{i}].y: must be in [0, {self.arch.n_out})"
                    )
                xs.append(x)
                ys.append(y)
            try:
                return np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.int64)
            except (TypeError, ValueError):
                raise InvalidArgument("batch.examples: 'x' values must be numbers") from None
        texts = []
        for i, ex in enumerate(examples):
            if not isinstance(ex, dict):
                raise InvalidArgument(f"batch.examples[{i}]: must be an object")
            try:
                text = datasets.record_text(ex, i)
            except datasets.DatasetError:
                raise InvalidArgument(
                    f"batch.examples[{i}]: needs 'text', 'prompt'+'completion' or 'messages'"
                ) from None
            if len(text) > self.cfg.max_context_length:
                raise InvalidArgument(
                    f"batch.examples[{i}]: {len(text)} characters exceeds max_context_length "
                    f"{self.cfg.max_context_length}"
                )
            texts.append(text)
        return datasets.text_examples(texts)

    def _batch(self, step: int, micro_batch: int, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        if not isinstance(batch, dict):
            raise InvalidArgument("batch: must be an object")
        if "examples" in batch and "indices" in batch:
            raise InvalidArgument("batch: give either 'examples' or 'indices', not both")
        if "examples" in batch:
            return self._examples(batch["examples"])
        ds = self._dataset_for(batch.get("dataset"), "batch.dataset")
        if "indices" in batch:
            idx = batch["indices"]
            if not (isinstance(idx, list) and idx and all(isinstance(i, int) for i in idx)):
                raise InvalidArgument("batch.indices: must be a non-empty list of ints")
            if len(idx) > MAX_BATCH:
                raise InvalidArgument(f"batch.indices: at most {MAX_BATCH} per micro-batch")
            if min(idx) < 0 or max(idx) >= ds.n_train:
                raise InvalidArgument(f"batch.indices: must be in [0, {ds.n_train})")
            return ds.examples(np.asarray(idx, dtype=np.int64))
        size = batch.get("size", self.cfg.batch_size)
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_BATCH:
            raise InvalidArgument(f"batch.size: must be an int in [1, {MAX_BATCH}]")
        return ds.train_batch(self.cfg.seed, step, micro_batch, size)

    # --------------------------------------------------------------- training

    def forward_backward(
        self, step: int, micro_batch: int, batch: Any
    ) -> tuple[dict[str, Any], bool]:
        """The answer, and whether it was computed now (False for an idempotent repeat)."""
        if step != self.step + 1:
            if step <= self.step:
                raise FailedPrecondition(
                    f"step {step} is already applied: the trainer is at step {self.step}; "
                    f"the next step is {self.step + 1}",
                    code=409,
                )
            raise _gap(self.step)
        if micro_batch in self.pending.answers:
            return self.pending.answers[micro_batch], False
        x, y = self._batch(step, micro_batch, batch)
        if self.cfg.forward_only:
            loss, _ = self.model.loss(x, y)
        else:
            loss, grads = self.model.loss_and_grads(x, y)
            self.pending.grads[micro_batch] = grads
        answer = {
            "loss": loss,
            "step": step,
            "micro_batch": micro_batch,
            "num_examples": int(len(y)),
        }
        self.pending.answers[micro_batch] = answer
        return answer, True

    def optim_step(self, step: int, adam: dict[str, Any]) -> dict[str, Any]:
        if self.cfg.forward_only:
            raise FailedPrecondition("this trainer is forward-only: optim_step is not available")
        if step <= self.step:
            if step in self.history:
                return self.history[step]
            raise FailedPrecondition(
                f"step {step} was applied before this trainer's history window; the trainer is at step {self.step}",
                code=409,
            )
        if step != self.step + 1:
            raise _gap(self.step)
        if not self.pending.grads:
            raise FailedPrecondition(f"no forward_backward was run for step {step}")
        lr = adam.get("learning_rate")
        lr = self.cfg.learning_rate if lr is None else lr
        if lr <= 0:
            raise InvalidArgument("adam_params.learning_rate: must be > 0")
        order = sorted(self.pending.grads)
        # Summed in micro-batch order whatever order they arrived in: bit-reproducible.
        total = {k: np.zeros_like(v) for k, v in self.model.params.items()}
        for mb in order:
            for k, g in self.pending.grads[mb].items():
                total[k] += g
        grads = {k: v / len(order) for k, v in total.items()}
        losses = [self.pending.answers[mb]["loss"] for mb in order]
        self.adam.apply(
            self.model.params,
            grads,
            lr=lr,
            beta1=adam.get("beta1", 0.9),
            beta2=adam.get("beta2", 0.95),
            eps=adam.get("eps", 1e-8),
        )
        self.step = step
        answer = {
            "step": step,
            "metrics": {
                "loss": float(np.mean(losses)),
                "grad_norm": global_norm(grads),
                "learning_rate": float(lr),
                "num_micro_batches": float(len(order)),
                "num_examples": float(
                    sum(self.pending.answers[mb]["num_examples"] for mb in order)
                ),
            },
        }
        self.history[step] = answer
        while len(self.history) > HISTORY:
            self.history.popitem(last=False)
        self.pending = _Pending()
        return answer

    # ------------------------------------------------------------ checkpoints

    def _own_checkpoint_id(self, name: Any) -> str:
        if not isinstance(name, str) or not name:
            raise InvalidArgument("name: is required")
        m = rules.CHECKPOINT_NAME_RE.match(name)
        if m:
            if (m["account"], m["job"]) != (self.cfg.account, self.cfg.job):
                raise InvalidArgument(
                    f"name: a trainer saves only under its own job {self.cfg.job_name}"
                )
            name = m["checkpoint"]
        problem = rules.check_checkpoint_id(name)
        if problem:
            raise InvalidArgument(f"name: checkpoint id {name!r} {problem}")
        return name

    def save(self, name: Any, kind: Any = "both") -> dict[str, Any]:
        checkpoint = self._own_checkpoint_id(name)
        if kind not in ckpt.CHECKPOINT_TYPES:
            raise InvalidArgument("kind: must be one of " + ", ".join(ckpt.CHECKPOINT_TYPES))
        digest = self.model.digest()
        existing = ckpt.read_meta(self.cfg.data_dir, self.cfg.account, self.cfg.job, checkpoint)
        if existing is not None:
            if existing.step == self.step and existing.digest == digest and existing.kind == kind:
                return self._save_answer(existing)  # a retried save: same bits, same answer
            raise AlreadyExists(
                f"checkpoint {existing.name} already exists (step {existing.step}); choose another name"
            )
        arrays: dict[str, np.ndarray] = {f"p/{k}": v for k, v in self.model.params.items()}
        state = {"step": self.step, "kind": kind, "arch": self.arch.fingerprint(), "digest": digest}
        if ckpt.CHECKPOINT_TYPES[kind][2]:
            arrays.update({f"m/{k}": v for k, v in self.adam.m.items()})
            arrays.update({f"v/{k}": v for k, v in self.adam.v.items()})
            state["adam_t"] = self.adam.t
            state["history"] = [[s, a] for s, a in list(self.history.items())[-32:]]
        arrays["state"] = np.frombuffer(json.dumps(state).encode(), dtype=np.uint8)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy's stubs miss **arrays
        blob = buffer.getvalue()
        path = ckpt.data_path(self.cfg.data_dir, self.cfg.account, self.cfg.job, checkpoint)
        ckpt.atomic_write(path, lambda f: f.write(blob))
        meta = ckpt.CheckpointMeta(
            account=self.cfg.account,
            job=self.cfg.job,
            checkpoint=checkpoint,
            step=self.step,
            create_time=datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
            kind=kind,
            digest=digest,
            base_model=self.cfg.base_model,
            lora_rank=self.cfg.lora_rank,
            generation=self.cfg.generation,
            size_bytes=len(blob),
        )
        ckpt.write_meta(self.cfg.data_dir, meta)
        return self._save_answer(meta)

    @staticmethod
    def _save_answer(meta: ckpt.CheckpointMeta) -> dict[str, Any]:
        return {
            "name": meta.name,
            "step": meta.step,
            "checkpoint_type": ckpt.CHECKPOINT_TYPES[meta.kind][0],
            "weights_digest": meta.digest,
        }

    def load(self, name: Any) -> dict[str, Any]:
        if not isinstance(name, str) or not name:
            raise InvalidArgument("name: is required")
        m = rules.CHECKPOINT_NAME_RE.match(name)
        account, job, checkpoint = (
            (m["account"], m["job"], m["checkpoint"])
            if m
            else (self.cfg.account, self.cfg.job, name)
        )
        if account != self.cfg.account:
            raise PermissionDenied(f"name: checkpoint {name} belongs to another account")
        meta = ckpt.read_meta(self.cfg.data_dir, account, job, checkpoint)
        if meta is None:
            raise InvalidArgument(f"name: checkpoint {name} does not exist")
        if not meta.resumable:
            raise FailedPrecondition(
                f"checkpoint {meta.name} holds sampler weights only (no optimizer state); it cannot be loaded to resume"
            )
        with np.load(ckpt.data_path(self.cfg.data_dir, account, job, checkpoint)) as npz:
            state = json.loads(npz["state"].tobytes())
            if state["arch"] != self.arch.fingerprint():
                diff = {
                    k: (state["arch"].get(k), v)
                    for k, v in self.arch.fingerprint().items()
                    if state["arch"].get(k) != v
                }
                detail = ", ".join(
                    f"{k} {saved!r} (this trainer: {mine!r})" for k, (saved, mine) in diff.items()
                )
                raise FailedPrecondition(
                    f"checkpoint {meta.name} was saved by a different model: {detail}"
                )
            params = {k.removeprefix("p/"): npz[k].copy() for k in npz.files if k.startswith("p/")}
            m_state = {k.removeprefix("m/"): npz[k].copy() for k in npz.files if k.startswith("m/")}
            v_state = {k.removeprefix("v/"): npz[k].copy() for k in npz.files if k.startswith("v/")}
        self.model.params = params
        self.adam.m, self.adam.v, self.adam.t = m_state, v_state, int(state["adam_t"])
        self.step = int(state["step"])
        self.history = OrderedDict((int(s), a) for s, a in state.get("history", []))
        self.pending = _Pending()
        return {"name": meta.name, "step": self.step, "weights_digest": self.model.digest()}

    def list_checkpoints(self) -> dict[str, Any]:
        metas = ckpt.list_meta(self.cfg.data_dir, self.cfg.account, self.cfg.job)
        return {"checkpoints": [m.wire() for m in metas]}

    # ------------------------------------------------------------- evaluation

    def evaluate(self, options: dict[str, Any]) -> dict[str, Any]:
        max_examples = options.get("max_examples", 1024)
        if (
            not isinstance(max_examples, int)
            or isinstance(max_examples, bool)
            or not 1 <= max_examples <= MAX_EVAL
        ):
            raise InvalidArgument(f"max_examples: must be an int in [1, {MAX_EVAL}]")
        ds = self._dataset_for(options.get("dataset"), "dataset")
        x, y = ds.eval_set(max_examples)
        loss, accuracy = self.model.loss(x, y)
        return {
            "eval_loss": loss,
            "step": self.step,
            "accuracy": accuracy,
            "num_examples": int(len(y)),
        }
