"""Checkpoints: save both kinds (atomic and deduped on the trainer by ``seq_id``), and
prune to the last K."""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.base import (
    ClientProvider,
    keepalive,
    log,
    one_shot_404,
    previous_details,
    translate,
)
from activities.training import checkpoint_step, training_client
from shepherd.models import (
    CheckCheckpointInput,
    CheckCheckpointResult,
    CheckpointRecord,
    PruneCheckpointsInput,
    PruneCheckpointsResult,
    SaveCheckpointInput,
    SaveCheckpointResult,
)
from shepherd.platform import NotFound, PlatformError, RouteNotFound, rules
from workflows import policies

#: The promotable twin of a state checkpoint is saved under this suffix.
SAMPLER_SUFFIX = "-sampler"


class CheckpointActivities:
    def __init__(self, clients: ClientProvider) -> None:
        self.clients = clients

    @activity.defn(name="check_checkpoint")
    async def check_checkpoint(self, inp: CheckCheckpointInput) -> CheckCheckpointResult:
        """Can a trainer of this job start from ``checkpoint``? Asked before anything is
        provisioned for a resume, a retry or ``resume_from``: it exists, it belongs to the
        account of the job's backend, and it was trained on the same base model and rank
        (when its trainer job can still be read)."""
        client = self.clients.client(inp.backend)
        m = rules.CHECKPOINT_NAME_RE.match(inp.checkpoint)
        if not m:
            return CheckCheckpointResult(
                problem="checkpoint: must be accounts/<a>/rlorTrainerJobs/<j>/checkpoints/<c>"
            )
        try:
            account = await client.account_id()
            if m["account"] != account:
                return CheckCheckpointResult(
                    problem=f"checkpoint {inp.checkpoint} belongs to account {m['account']}, "
                    f"not to this job's ({account})"
                )
            step = await checkpoint_step(client, inp.checkpoint)
            try:
                source = (await client.get_job(m["job"])).training_config
            except NotFound:
                source = None  # its trainer job is gone; its checkpoints stay loadable
        except ApplicationError as err:
            if err.non_retryable:
                return CheckCheckpointResult(problem=err.message)
            raise
        except PlatformError as exc:
            raise translate(exc, f"checking checkpoint {inp.checkpoint}") from None
        if source is not None:
            if source.base_model and source.base_model != inp.base_model:
                return CheckCheckpointResult(
                    problem=f"checkpoint {m['checkpoint']} was trained from {source.base_model}; "
                    f"this job's trainer.base_model is {inp.base_model}"
                )
            if (source.lora_rank or 0) != inp.lora_rank:
                return CheckCheckpointResult(
                    problem=f"checkpoint {m['checkpoint']} has LoRA rank {source.lora_rank or 0}; "
                    f"this job's trainer.lora_rank is {inp.lora_rank}"
                )
        return CheckCheckpointResult(step=step)

    @activity.defn(name="save_checkpoint")
    async def save_checkpoint(self, inp: SaveCheckpointInput) -> SaveCheckpointResult:
        """``save_weights`` (weights + optimizer: resumable) and
        ``save_weights_for_sampler`` (promotable) of the same weights, back to back."""
        client = self.clients.client(inp.backend)
        trainer = await client.trainer(inp.trainer_job_id)
        tc = training_client(trainer, inp.session, inp.base_model, inp.call_timeout_s)
        progress = {"route_races": int(previous_details().get("route_races", 0))}
        try:
            async with keepalive(progress, policies.SAVE_KEEPALIVE):
                state = tc.save_state(inp.name)
                sampler = tc.save_weights_for_sampler(inp.name + SAMPLER_SUFFIX)
                await state
                await sampler
        except RouteNotFound:
            tc.cancel_pending()
            raise await one_shot_404(
                client, inp.trainer_job_id, progress["route_races"] + 1
            ) from None
        except PlatformError as exc:
            tc.cancel_pending()
            raise translate(exc, f"saving checkpoint {inp.name}") from None
        job = await client.job_name(inp.trainer_job_id)
        record = CheckpointRecord(
            name=f"{job}/checkpoints/{inp.name}",
            step=inp.step,
            trainer_job_id=inp.trainer_job_id,
            sampler=f"{job}/checkpoints/{inp.name}{SAMPLER_SUFFIX}",
        )
        log(trainer_job_id=inp.trainer_job_id).info(
            "checkpoint.saved", name=record.name, step=record.step
        )
        return SaveCheckpointResult(record=record, next_seq=tc.next_seq)

    @activity.defn(name="prune_checkpoints")
    async def prune_checkpoints(self, inp: PruneCheckpointsInput) -> PruneCheckpointsResult:
        """Delete the given checkpoints; one already gone counts as deleted."""
        client = self.clients.client(inp.backend)
        deleted: list[str] = []
        for name in inp.checkpoints:
            m = rules.CHECKPOINT_NAME_RE.match(name)
            if not m:
                continue
            try:
                await client.delete_checkpoint(m["job"], m["checkpoint"])
            except NotFound:
                pass  # already gone
            except PlatformError as exc:
                if exc.status_code in (405, 501):
                    # The backend has no delete call: keep every checkpoint (nothing lost).
                    return PruneCheckpointsResult(deleted=deleted, unsupported=True)
                raise translate(exc, f"deleting checkpoint {name}") from None
            deleted.append(name)
        return PruneCheckpointsResult(deleted=deleted)
