"""Promotion: turn a checkpoint into a model, and wait until the model is READY."""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.base import ClientProvider, log, not_ready, refusal, translate
from shepherd.models import DeploymentSnapshot, ModelInfo, PromoteInput, PublishInput
from shepherd.platform import AlreadyExists, NotFound, PlatformError, rules
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

    @activity.defn(name="publish_to_deployment")
    async def publish_to_deployment(self, inp: PublishInput) -> DeploymentSnapshot:
        """Hot-load the checkpoint onto the deployment and wait until every replica serves
        it (polling by retries: each attempt looks, loads if nothing is loading it, and says
        NotReady while a replica still loads)."""
        client = self.clients.client(inp.backend)
        try:
            deployment = await client.get_deployment(inp.deployment)
            base_model = str(deployment.get("baseModel") or inp.base_model)
            # A deployment hot-loads the snapshots of the trainer job it is attached to.
            m = rules.CHECKPOINT_NAME_RE.match(inp.checkpoint)
            if m and not str(deployment.get("hotLoadTrainerJob", "")).endswith(f"/{m['job']}"):
                deployment = await client.link_deployment(inp.deployment, m["job"])
            state = await client.hot_load_status(inp.deployment, base_model)
            replicas = state.get("replicas") or []
            if not _serving(replicas, inp.checkpoint) and not _loading(replicas, inp.checkpoint):
                await client.hot_load(inp.deployment, inp.checkpoint, base_model)
                state = await client.hot_load_status(inp.deployment, base_model)
                replicas = state.get("replicas") or []
        except NotFound:
            raise ApplicationError(
                f"output.hot_load_deployment: deployment {inp.deployment} does not exist",
                type=policies.INVALID_REQUEST,
                non_retryable=True,
            ) from None
        except PlatformError as exc:
            raise translate(exc, f"hot-loading {inp.checkpoint} onto {inp.deployment}") from None
        failed = [r for r in replicas if (r.get("loading_state") or {}).get("stage") == "error"]
        if failed:
            said = (failed[0].get("loading_state") or {}).get("message") or "no message"
            raise ApplicationError(
                f"hot-loading {inp.checkpoint} onto {inp.deployment} failed: {said}",
                type=policies.INVALID_REQUEST,
                non_retryable=True,
            )
        if not _serving(replicas, inp.checkpoint):
            raise not_ready(f"deployment {inp.deployment} is still loading {inp.checkpoint}")
        snapshot = (await client.get_deployment(inp.deployment)).get("currentSnapshot") or {}
        log().info("deployment.published", deployment=inp.deployment, checkpoint=inp.checkpoint)
        return DeploymentSnapshot(
            deployment=str(deployment.get("name") or inp.deployment),
            identity=inp.checkpoint,
            weights_digest=snapshot.get("weightsDigest"),
        )

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


def _serving(replicas: list[dict[str, Any]], identity: str) -> bool:
    return bool(replicas) and all(
        r.get("current_snapshot_identity") == identity
        and (r.get("loading_state") or {}).get("stage") in (None, "done", "idle")
        for r in replicas
    )


def _loading(replicas: list[dict[str, Any]], identity: str) -> bool:
    return any(
        (r.get("loading_state") or {}).get("target_snapshot_identity") == identity
        and (r.get("loading_state") or {}).get("stage") not in ("done", "error", "idle")
        for r in replicas
    )
