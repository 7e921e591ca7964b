"""Promotion: turn a checkpoint into a model, and wait until the model is READY."""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.base import ClientProvider, log, not_ready, refusal, translate
from shepherd.models import ModelInfo, PromoteInput
from shepherd.platform import AlreadyExists, NotFound, PlatformError
from shepherd.platform.models import Model
from workflows import policies


def _info(model: Model) -> ModelInfo:
    return ModelInfo(
        name=model.name, state=model.state, kind=model.kind, checkpoint=model.checkpoint
    )


class PromotionActivities:
    def __init__(self, clients: ClientProvider) -> None:
        self.clients = clients

    @activity.defn(name="promote_checkpoint")
    async def promote_checkpoint(self, inp: PromoteInput) -> ModelInfo:
        """Start the promotion (asynchronously on the platform). A retry that finds the
        model already made from this very checkpoint is the same promotion, not a clash."""
        client = self.clients.client(inp.backend)
        checkpoint_id = inp.checkpoint.rsplit("/", 1)[-1]
        try:
            answer = await client.promote_checkpoint(
                checkpoint_id,
                job_id=inp.trainer_job_id,
                output_model_id=inp.model_id,
                base_model=inp.base_model,
                async_promotion=True,
            )
        except AlreadyExists:
            try:
                model = await client.get_model(inp.model_id)
            except PlatformError as exc:
                raise translate(exc, "reading the existing model") from None
            if model.checkpoint != inp.checkpoint:
                raise refusal(
                    f"{inp.field}: model {model.name} already exists (from {model.checkpoint})",
                    policies.MODEL_EXISTS,
                ) from None
            return _info(model)
        except PlatformError as exc:
            raise translate(exc, f"promoting {inp.checkpoint}") from None
        log(trainer_job_id=inp.trainer_job_id).info("model.promotion_started", model=inp.model_id)
        if answer.model is not None:
            return _info(answer.model)
        if answer.operation and answer.operation.done and answer.operation.response:
            return _info(answer.operation.response)
        return ModelInfo(
            name=f"accounts/{await client.account_id()}/models/{inp.model_id}",
            state="UPLOADING",
            checkpoint=inp.checkpoint,
        )

    @activity.defn(name="check_model_free")
    async def check_model_free(self, inp: PromoteInput) -> None:
        """Before anything is provisioned: the output model id must not be taken."""
        client = self.clients.client(inp.backend)
        try:
            model = await client.get_model(inp.model_id)
        except NotFound:
            return
        except PlatformError as exc:
            raise translate(exc, "checking the output model id") from None
        raise refusal(
            f"{inp.field}: model {model.name} already exists (from {model.checkpoint}); choose another id",
            policies.MODEL_EXISTS,
        )

    @activity.defn(name="retract_model")
    async def retract_model(self, inp: PromoteInput) -> bool:
        """A job cancelled while promoting takes its model back: the output model is deleted
        if it is this job's (made, or being made, from ``inp.checkpoint``); a model of another
        checkpoint is never touched. True if a model was deleted."""
        client = self.clients.client(inp.backend)
        try:
            model = await client.get_model(inp.model_id)
            if model.checkpoint != inp.checkpoint:
                return False
            await client.delete_model(inp.model_id)
        except NotFound:
            return False
        except PlatformError as exc:
            raise translate(exc, f"taking back model {inp.model_id}") from None
        log(trainer_job_id=inp.trainer_job_id).info("model.retracted", model=inp.model_id)
        return True

    @activity.defn(name="wait_for_model")
    async def wait_for_model(self, inp: PromoteInput) -> ModelInfo:
        client = self.clients.client(inp.backend)
        try:
            model = await client.get_model(inp.model_id)
        except NotFound:
            raise not_ready(f"model {inp.model_id} not visible yet") from None
        except PlatformError as exc:
            raise translate(exc, "reading the promoted model") from None
        if model.state == "READY":
            return _info(model)
        if model.state == "FAILED":
            raise ApplicationError(
                f"promotion of {inp.checkpoint} failed",
                type=policies.INVALID_REQUEST,
                non_retryable=True,
            )
        raise not_ready(f"model {inp.model_id} is {model.state}")
