"""Checkpoints: save both kinds (atomic and deduped on the trainer by ``seq_id``), and
prune to the last K."""

from __future__ import annotations

from temporalio import activity

from activities.base import (
    ClientProvider,
    keepalive,
    log,
    one_shot_404,
    previous_details,
    translate,
)
from activities.training import training_client
from shepherd.models import (
    CheckpointRecord,
    PruneCheckpointsInput,
    PruneCheckpointsResult,
    SaveCheckpointInput,
    SaveCheckpointResult,
)
from shepherd.platform import NotFound, PlatformError, RouteNotFound, rules

#: Heartbeat this often while a (possibly minutes-long) save is in flight, so a dead worker
#: is noticed within the heartbeat timeout, not the start-to-close timeout.
KEEPALIVE_S = 2.0

#: The promotable twin of a state checkpoint is saved under this suffix.
SAMPLER_SUFFIX = "-sampler"


class CheckpointActivities:
    def __init__(self, clients: ClientProvider) -> None:
        self.clients = clients

    @activity.defn(name="save_checkpoint")
    async def save_checkpoint(self, inp: SaveCheckpointInput) -> SaveCheckpointResult:
        """``save_weights`` (weights + optimizer: resumable) and
        ``save_weights_for_sampler`` (promotable) of the same weights, back to back."""
        client = self.clients.client(inp.backend)
        trainer = await client.trainer(inp.trainer_job_id)
        tc = training_client(trainer, inp.session, inp.base_model, inp.call_timeout_s)
        progress = {"route_races": int(previous_details().get("route_races", 0))}
        try:
            async with keepalive(progress, KEEPALIVE_S):
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
