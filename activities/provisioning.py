"""Provisioning: resolve the training shape, create the trainer (idempotently, by a
client-chosen id), and delete it."""

from __future__ import annotations

import asyncio
import time

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.base import ClientProvider, log, snapshot, translate
from shepherd.models import (
    CreateTrainerInput,
    PlatformJob,
    ResolveShapeInput,
    ShapeInfo,
    TrainerRef,
)
from shepherd.platform import AlreadyExists, NotFound, PlatformError
from shepherd.platform.models import CreateTrainerJobRequest, TrainingConfig
from shepherd.platform.rules import format_duration
from shepherd.states import JobState
from workflows import policies


class ProvisioningActivities:
    def __init__(self, clients: ClientProvider) -> None:
        self.clients = clients

    @activity.defn(name="resolve_shape")
    async def resolve_shape(self, inp: ResolveShapeInput) -> ShapeInfo:
        client = self.clients.client(inp.backend)
        try:
            version = await client.resolve_shape(inp.shape)
        except NotFound as exc:
            raise ApplicationError(
                f"trainer.training_shape: {inp.shape} does not exist ({exc.message})",
                type=policies.INVALID_REQUEST,
                non_retryable=True,
            ) from None
        except PlatformError as exc:
            raise translate(exc, "resolving the training shape") from None
        snap = version.snapshot
        return ShapeInfo(
            version=version.name,
            max_context_length=snap.max_supported_context_length,
            accelerator_type=snap.accelerator_type,
            accelerator_count=snap.accelerator_count,
            node_count=snap.node_count,
            trainer_mode=snap.trainer_mode,
        )

    @activity.defn(name="create_trainer")
    async def create_trainer(self, inp: CreateTrainerInput) -> PlatformJob:
        """Create the trainer job; a retried create (409) finds the same job."""
        client = self.clients.client(inp.backend)
        t = inp.trainer
        extra = list(t.extra_args)
        # localplane's stand-in trainer reads its seed from extraArgs.
        if not any(a.startswith("--seed=") for a in extra):
            extra.append(f"--seed={inp.seed}")
        request = CreateTrainerJobRequest(
            display_name=inp.display_name,
            # Service-mode trainers read no dataset: the loop sends tokens (Tinker API).
            dataset="",
            training_config=TrainingConfig(
                base_model=t.base_model,
                lora_rank=t.lora_rank,
                learning_rate=t.learning_rate,
                max_context_length=t.max_context_length,
                region=t.region,
                accelerator_type=t.accelerator_type,
                accelerator_count=t.accelerator_count,
                extra_args=extra,
            ),
            node_count=t.node_count,
            hot_load_deployment_id=t.hot_load_deployment,
            forward_only=t.forward_only or None,
            preemptible=inp.preemptible,
            inactivity_timeout=format_duration(t.inactivity_timeout.total_seconds()),
        )
        logger = log(trainer_job_id=inp.trainer_job_id)
        try:
            job = await client.create_job(
                inp.trainer_job_id, request, training_shape=inp.shape_version
            )
            logger.info("trainer.created", state=job.state.value)
        except AlreadyExists:
            try:
                job = await client.get_job(inp.trainer_job_id)
            except PlatformError as exc:
                raise translate(exc, "reading back an existing trainer") from None
            if job.state.is_gone():
                raise ApplicationError(
                    f"trainer id {inp.trainer_job_id} belongs to a deleted job; it cannot be reused",
                    type=policies.TRAINER_ID_TAKEN,
                    non_retryable=True,
                ) from None
            logger.info("trainer.create_found_existing", state=job.state.value)
        except PlatformError as exc:
            raise translate(exc, "creating the trainer") from None
        return snapshot(job)

    @activity.defn(name="delete_trainer")
    async def delete_trainer(self, ref: TrainerRef) -> PlatformJob | None:
        """Stop the trainer and give its slot back. Deleting twice, or a job that never
        existed, is fine: the goal is that nothing keeps running."""
        client = self.clients.client(ref.backend)
        try:
            job = await client.delete_job(ref.trainer_job_id)
        except NotFound:
            return None
        except PlatformError as exc:
            # Always retryable, even a 401: a leaked trainer is worse than a stuck cleanup
            # that an operator fixes by repairing the credentials.
            raise ApplicationError(
                f"deleting the trainer: {exc}", type=type(exc).__name__
            ) from None
        # Wait (briefly) for the platform to confirm: the status then says DELETED, not
        # DELETING, and "no trainer left" is what the platform says, not what we asked for.
        deadline = time.monotonic() + policies.DELETE_CONFIRM_WAIT.total_seconds()
        while job is not None and job.state is not JobState.DELETED:
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(policies.DELETE_CONFIRM_SPACING.total_seconds())
            try:
                job = await client.get_job(ref.trainer_job_id)
            except NotFound:
                break
            except PlatformError:
                break  # deleting was asked and accepted; confirming is best effort
        log(trainer_job_id=ref.trainer_job_id).info(
            "trainer.deleted", state=job.state.value if job else None
        )
        return snapshot(job) if job else None
