"""Training: one activity per chunk of optimizer steps.

The trainer's own step (``get_info``) is the truth about progress, so a retried chunk —
after a worker crash, a transient error or a route race — resumes exactly at the step after
the last one applied, and no step is applied twice. Progress is heartbeated after every step
and during long steps.
"""

from __future__ import annotations

import asyncio
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
from shepherd.loops import LoopContext, LoopLoadError, load_loop
from shepherd.models import ChunkResult, TrainChunkInput
from shepherd.platform import FailedPrecondition, PlatformError, RouteNotFound
from workflows import policies

#: Heartbeat at least this often while a step is in flight (well under any heartbeat timeout).
KEEPALIVE_S = 2.0


class TrainingActivities:
    def __init__(self, clients: ClientProvider) -> None:
        self.clients = clients

    @activity.defn(name="train_chunk")
    async def train_chunk(self, inp: TrainChunkInput) -> ChunkResult:
        before = previous_details()
        races = int(before.get("route_races", 0))
        client = self.clients.client(inp.backend)
        trainer = await client.trainer(inp.trainer_job_id)
        logger = log(trainer_job_id=inp.trainer_job_id)
        try:
            loop = load_loop(inp.loop)
        except LoopLoadError as exc:
            raise ApplicationError(str(exc), type=policies.LOOP_ERROR, non_retryable=True) from None
        ctx = LoopContext(
            trainer=trainer,
            dataset=inp.dataset,
            batch_size=inp.batch_size,
            micro_batches=inp.micro_batches,
            seed=inp.seed,
            learning_rate=inp.learning_rate,
            step_timeout=inp.step_timeout_s,
        )
        progress: dict[str, int] = {"step": inp.first_step - 1, "route_races": races}
        losses: list[float] = []
        try:
            async with keepalive(progress, KEEPALIVE_S):
                applied = (await trainer.get_info()).step
                if applied < inp.first_step - 1:
                    raise ApplicationError(
                        f"trainer {inp.trainer_job_id} is at step {applied} but steps up to "
                        f"{inp.first_step - 1} were applied: its progress was lost",
                        type=policies.TRAINER_BEHIND,
                        non_retryable=True,
                    )
                skipped = min(applied, inp.last_step) - (inp.first_step - 1)
                progress["step"] = min(applied, inp.last_step)
                for step in range(applied + 1, inp.last_step + 1):
                    losses.append(await loop(ctx, step))
                    progress["step"] = step
                    activity.heartbeat(dict(progress))
        except asyncio.CancelledError:
            # Asked to stop (a pause, or the workflow heard the trainer died): report how
            # far the trainer really got; the step in flight is either applied or not.
            return ChunkResult(
                last_step=progress["step"],
                last_loss=losses[-1] if losses else None,
                mean_loss=sum(losses) / len(losses) if losses else None,
                route_races=races,
                partial=True,
            )
        except RouteNotFound:
            progress["route_races"] = races + 1
            activity.heartbeat(dict(progress))
            raise await verified_404(
                client,
                inp.trainer_job_id,
                races=races + 1,
                retries=inp.route_race_retries,
                window=timedelta(seconds=inp.route_race_window_s),
                applied_step=progress["step"],
            ) from None
        except FailedPrecondition as exc:
            # A step gap: the trainer and Shepherd disagree about progress.
            raise ApplicationError(
                f"trainer {inp.trainer_job_id} refused a step: {exc.message}",
                type=policies.TRAINER_BEHIND,
                non_retryable=True,
            ) from None
        except PlatformError as exc:
            raise translate(exc, f"training steps {inp.first_step}-{inp.last_step}") from None
        if skipped:
            logger.info("chunk.resumed", skipped=skipped, first_step=inp.first_step)
        return ChunkResult(
            last_step=inp.last_step,
            last_loss=losses[-1] if losses else None,
            mean_loss=sum(losses) / len(losses) if losses else None,
            steps_skipped=max(0, skipped),
            route_races=races,
        )
