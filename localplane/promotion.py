"""Checkpoint promotion to models, with long-running operations (trainer-api.md §2).

A promotion copies the checkpoint's weights under ``<data>/models/<account>/<model>/`` and
records the model. With ``async_promotion`` it returns an operation at once and finishes
after the configured promotion time; operations left unfinished by a plane restart are
finished at the next start. Promotion works from any job state, also after deletion.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from localplane import checkpoints as ckpt
from localplane.config import PlaneConfig
from localplane.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    describe_validation_error,
    shorten,
)
from localplane.jobs import now_rfc3339
from localplane.storage import Storage
from shepherd.platform import rules


class _PromoteIn(BaseModel):
    # The contract spells the body snake_case; camelCase is accepted as well.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    output_model: str = ""
    trainer_job_id: str = ""
    base_model: str | None = None
    async_promotion: bool = False

    @classmethod
    def parse(cls, body: Any) -> _PromoteIn:
        if not isinstance(body, dict):
            raise InvalidArgument("request body must be a JSON object")
        aliases = {
            "outputModel": "output_model",
            "trainerJobId": "trainer_job_id",
            "baseModel": "base_model",
            "asyncPromotion": "async_promotion",
        }
        normalized = {aliases.get(k, k): v for k, v in body.items()}
        try:
            return cls.model_validate(normalized)
        except ValidationError as exc:
            raise InvalidArgument(describe_validation_error(exc)) from None


class PromotionService:
    def __init__(self, storage: Storage, data_dir: Path, config: Callable[[], PlaneConfig]) -> None:
        self.storage = storage
        self.data_dir = data_dir
        self._config = config
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        for row in self.storage.unfinished_operations():
            self._finish(row["account_id"], row["op_id"])

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # --------------------------------------------------------------- promote

    def promote(self, account: str, checkpoint_id: str, body: Any) -> dict[str, Any]:
        req = _PromoteIn.parse(body)
        problems = []
        m = rules.MODEL_NAME_RE.match(req.output_model)
        model_id = ""
        if not req.output_model:
            problems.append("output_model: is required, as accounts/<account>/models/<model>")
        elif not m:
            problems.append(
                f"output_model: {shorten(req.output_model)!r} must be accounts/<account>/models/<model>"
            )
        elif m["account"] != account:
            problems.append(f"output_model: must be a model of account {account}")
        elif p := rules.check_resource_id(m["model"]):
            problems.append(f"output_model: model id {shorten(m['model'])!r} {p}")
        else:
            model_id = m["model"]
        job_id = req.trainer_job_id
        jm = rules.JOB_NAME_RE.match(job_id)
        if not job_id:
            problems.append(
                "trainer_job_id: is required, as accounts/<account>/rlorTrainerJobs/<job>"
            )
        elif jm:
            if jm["account"] != account:
                problems.append(f"trainer_job_id: must be a job of account {account}")
            job_id = jm["job"]
        if p := rules.check_checkpoint_id(checkpoint_id):
            problems.append(f"checkpoint: {shorten(checkpoint_id)!r} {p}")
        if problems:
            raise InvalidArgument("; ".join(problems))

        job = self.storage.get_job(account, job_id)
        if job is None:
            raise NotFound(f"rlorTrainerJob accounts/{account}/rlorTrainerJobs/{job_id} not found")
        meta = ckpt.read_meta(self.data_dir, account, job_id, checkpoint_id)
        if meta is None:
            raise NotFound(
                f"checkpoint accounts/{account}/rlorTrainerJobs/{job_id}/checkpoints/{checkpoint_id} not found"
            )
        if not meta.promotable:
            raise FailedPrecondition(
                f"checkpoint {meta.resource_name} is not promotable ({meta.checkpoint_type}): it holds "
                "training state; promote a checkpoint saved with save_weights_for_sampler"
            )
        if req.base_model and req.base_model != meta.base_model:
            raise InvalidArgument(
                f"base_model: {shorten(req.base_model)!r} does not match the checkpoint's base model {meta.base_model!r}"
            )

        model: dict[str, Any] = {
            "name": f"accounts/{account}/models/{model_id}",
            "state": "UPLOADING",
            "kind": "HF_PEFT_ADDON" if meta.lora_rank else "HF_BASE_MODEL",
            "baseModel": meta.base_model,
            "checkpoint": meta.resource_name,
            "createTime": now_rfc3339(),
            "stepCount": meta.step,
            "weightsDigest": meta.digest,
        }
        if meta.lora_rank:
            model["peftDetails"] = {
                "baseModel": meta.base_model,
                "r": meta.lora_rank,
                "targetModules": ["w1", "w2"],
            }
        if not self.storage.put_model(account, model_id, model, create=True):
            raise AlreadyExists(f"model accounts/{account}/models/{model_id} already exists")
        op_id = f"promote-{secrets.token_hex(6)}"
        self.storage.insert_operation(
            account, op_id, model_id, {"checkpoint": meta.resource_name}, model["createTime"]
        )
        delay = self._config().promotion_seconds if req.async_promotion else 0.0
        if delay > 0:
            task = asyncio.get_running_loop().create_task(self._finish_later(account, op_id, delay))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._finish(account, op_id)
        if req.async_promotion:
            return {"operation": self.operation(account, op_id)}
        return {"model": self.model(account, model_id)}

    async def _finish_later(self, account: str, op_id: str, delay: float) -> None:
        await asyncio.sleep(delay)
        self._finish(account, op_id)

    def _finish(self, account: str, op_id: str) -> None:
        row = self.storage.get_operation(account, op_id)
        if row is None or row["done"]:
            return
        model_id = row["model_id"]
        model = self.storage.get_model(account, model_id)
        assert model is not None
        m = rules.CHECKPOINT_NAME_RE.match(model["checkpoint"])
        assert m is not None
        src = ckpt.data_path(self.data_dir, m["account"], m["job"], m["checkpoint"])
        if not src.exists():
            model["state"] = "FAILED"
            self.storage.put_model(account, model_id, model, create=False)
            self.storage.finish_operation(
                account,
                op_id,
                {
                    "code": 404,
                    "status": "NOT_FOUND",
                    "message": f"checkpoint {model['checkpoint']} was deleted before promotion finished",
                },
            )
            return
        ckpt.copy_data(src, self.data_dir / "models" / account / model_id / "weights.npz")
        model["state"] = "READY"
        self.storage.put_model(account, model_id, model, create=False)
        self.storage.finish_operation(account, op_id, None)

    def delete_model(self, account: str, model_id: str) -> dict[str, Any]:
        """Delete a model (and its weights). A promotion still in progress is cancelled:
        its operation ends with CANCELLED and the model never becomes READY."""
        if self.storage.get_model(account, model_id) is None:
            raise NotFound(f"model accounts/{account}/models/{model_id} not found")
        for row in self.storage.unfinished_operations_of(account, model_id):
            self.storage.finish_operation(
                account,
                row["op_id"],
                {"code": 499, "status": "CANCELLED", "message": "the model was deleted"},
            )
        self.storage.delete_model(account, model_id)
        shutil.rmtree(self.data_dir / "models" / account / model_id, ignore_errors=True)
        return {}

    # ---------------------------------------------------------------- reads

    def model(self, account: str, model_id: str) -> dict[str, Any]:
        model = self.storage.get_model(account, model_id)
        if model is None:
            raise NotFound(f"model accounts/{account}/models/{model_id} not found")
        return model

    def operation(self, account: str, op_id: str) -> dict[str, Any]:
        row = self.storage.get_operation(account, op_id)
        if row is None:
            raise NotFound(f"operation accounts/{account}/operations/{op_id} not found")
        out: dict[str, Any] = {
            "name": f"accounts/{account}/operations/{op_id}",
            "done": bool(row["done"]),
        }
        if row["done"]:
            if row["error"]:
                out["error"] = json.loads(row["error"])
            else:
                out["response"] = self.model(account, row["model_id"])
        return out
