"""Checkpoints: save (atomic and idempotent on the trainer), evaluate to track the best,
load after a (re)start, and prune to the last K."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.base import (
    ClientProvider,
    keepalive,
    log,
    previous_details,
    translate,
    verified_404,
)
from shepherd.models import (
    CheckpointRecord,
    EvaluateInput,
    EvaluateResult,
    LoadCheckpointInput,
    LoadCheckpointResult,
    PruneCheckpointsInput,
    PruneCheckpointsResult,
    SaveCheckpointInput,
)
from shepherd.platform import NotFound, PlatformClient, PlatformError, RouteNotFound, rules

#: A route 404 on these one-shot calls is verified like a training call's, with the
#: default budget (these calls are not configurable per job).
_RACES, _WINDOW = 4, timedelta(seconds=30)


#: Heartbeat this often while a (possibly minutes-long) save/evaluate/load is in flight, so a
#: dead worker is noticed within the heartbeat timeout, not the start-to-close timeout.
KEEPALIVE_S = 2.0


def _progress() -> dict[str, int]:
    return {"route_races": int(previous_details().get("route_races", 0))}


async def _route_lost(
    client: PlatformClient, trainer_job_id: str, progress: dict[str, int]
) -> ApplicationError:
    progress["route_races"] += 1
    activity.heartbeat(dict(progress))
    return await verified_404(
        client, trainer_job_id, races=progress["route_races"], retries=_RACES, window=_WINDOW
    )


class CheckpointActivities:
    def __init__(self, clients: ClientProvider) -> None:
        self.clients = clients

    @activity.defn(name="save_checkpoint")
    async def save_checkpoint(self, inp: SaveCheckpointInput) -> CheckpointRecord:
        client = self.clients.client(inp.backend)
        trainer = await client.trainer(inp.trainer_job_id)
        progress = _progress()
        try:
            async with keepalive(progress, KEEPALIVE_S):
                saved = await trainer.save_weights(inp.name)
        except RouteNotFound:
            raise await _route_lost(client, inp.trainer_job_id, progress) from None
        except PlatformError as exc:
            raise translate(exc, f"saving checkpoint {inp.name}") from None
        log(trainer_job_id=inp.trainer_job_id).info(
            "checkpoint.saved", name=saved.name, step=saved.step
        )
        return CheckpointRecord(name=saved.name, step=saved.step, trainer_job_id=inp.trainer_job_id)

    @activity.defn(name="evaluate")
    async def evaluate(self, inp: EvaluateInput) -> EvaluateResult:
        client = self.clients.client(inp.backend)
        trainer = await client.trainer(inp.trainer_job_id)
        progress = _progress()
        try:
            async with keepalive(progress, KEEPALIVE_S):
                result = await trainer.evaluate()
        except RouteNotFound:
            raise await _route_lost(client, inp.trainer_job_id, progress) from None
        except PlatformError as exc:
            raise translate(exc, "evaluating") from None
        metrics = {"eval_loss": float(result.eval_loss)}
        for key, value in (result.model_extra or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                metrics[key] = float(value)
        metrics.pop("step", None)
        return EvaluateResult(step=result.step, metrics=metrics)

    @activity.defn(name="load_checkpoint")
    async def load_checkpoint(self, inp: LoadCheckpointInput) -> LoadCheckpointResult:
        client = self.clients.client(inp.backend)
        trainer = await client.trainer(inp.trainer_job_id)
        progress = _progress()
        try:
            async with keepalive(progress, KEEPALIVE_S):
                loaded = await trainer.load_weights(inp.checkpoint)
        except RouteNotFound:
            raise await _route_lost(client, inp.trainer_job_id, progress) from None
        except PlatformError as exc:
            raise translate(exc, f"loading checkpoint {inp.checkpoint}") from None
        log(trainer_job_id=inp.trainer_job_id).info(
            "checkpoint.loaded", name=inp.checkpoint, step=loaded.step
        )
        return LoadCheckpointResult(
            step=loaded.step, weights_digest=(loaded.model_extra or {}).get("weights_digest")
        )

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
