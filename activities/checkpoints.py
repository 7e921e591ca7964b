"""Checkpoints: save (atomic and idempotent on the trainer), evaluate to track the best,
load after a (re)start, and prune to the last K."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from temporalio import activity

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
from shepherd.platform import (
    NotFound,
    PlatformClient,
    PlatformError,
    RouteNotFound,
    TrainerClient,
    rules,
)

#: A route 404 on these one-shot calls is verified like a training call's, with the
#: default budget (these calls are not configurable per job).
_RACES, _WINDOW = 4, timedelta(seconds=30)


T = TypeVar("T")

#: Heartbeat this often while a (possibly minutes-long) save/evaluate/load is in flight, so a
#: dead worker is noticed within the heartbeat timeout, not the start-to-close timeout.
KEEPALIVE_S = 2.0


async def _one_call(
    client: PlatformClient,
    trainer_job_id: str,
    what: str,
    call: Callable[[TrainerClient], Awaitable[T]],
) -> T:
    """One data-plane call, heartbeating while in flight; a 404 is verified (§5), other
    platform errors are translated for the retry policy."""
    progress = {"route_races": int(previous_details().get("route_races", 0))}
    trainer = await client.trainer(trainer_job_id)
    try:
        async with keepalive(progress, KEEPALIVE_S):
            return await call(trainer)
    except RouteNotFound:
        progress["route_races"] += 1
        activity.heartbeat(dict(progress))
        raise await verified_404(
            client, trainer_job_id, races=progress["route_races"], retries=_RACES, window=_WINDOW
        ) from None
    except PlatformError as exc:
        raise translate(exc, what) from None


class CheckpointActivities:
    def __init__(self, clients: ClientProvider) -> None:
        self.clients = clients

    @activity.defn(name="save_checkpoint")
    async def save_checkpoint(self, inp: SaveCheckpointInput) -> CheckpointRecord:
        saved = await _one_call(
            self.clients.client(inp.backend),
            inp.trainer_job_id,
            f"saving checkpoint {inp.name}",
            lambda trainer: trainer.save_weights(inp.name),
        )
        log(trainer_job_id=inp.trainer_job_id).info(
            "checkpoint.saved", name=saved.name, step=saved.step
        )
        return CheckpointRecord(name=saved.name, step=saved.step, trainer_job_id=inp.trainer_job_id)

    @activity.defn(name="evaluate")
    async def evaluate(self, inp: EvaluateInput) -> EvaluateResult:
        result = await _one_call(
            self.clients.client(inp.backend),
            inp.trainer_job_id,
            "evaluating",
            lambda trainer: trainer.evaluate(),
        )
        metrics = {"eval_loss": float(result.eval_loss)}
        for key, value in (result.model_extra or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                metrics[key] = float(value)
        metrics.pop("step", None)
        return EvaluateResult(step=result.step, metrics=metrics)

    @activity.defn(name="load_checkpoint")
    async def load_checkpoint(self, inp: LoadCheckpointInput) -> LoadCheckpointResult:
        loaded = await _one_call(
            self.clients.client(inp.backend),
            inp.trainer_job_id,
            f"loading checkpoint {inp.checkpoint}",
            lambda trainer: trainer.load_weights(inp.checkpoint),
        )
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
