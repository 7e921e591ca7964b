"""Training on the trainer's Tinker API: open the model, train a chunk of steps with the
job's loop, evaluate.

Exactly-once by ``seq_id``: every sequenced operation on the model carries the ``seq_id``
Shepherd gives it, and the trainer dedupes on ``(model_id, seq_id)``. A chunk heartbeats
``(step, next_seq)`` as it goes (policies.KEEPALIVE, from the quiet start on); a retried
attempt (worker crash, route race, transient error) starts from the last heartbeat (or the
chunk's start) and re-sends the same operations with the same ``seq_id``s — those already
applied come back from the trainer's dedupe, unapplied.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.base import (
    ClientProvider,
    RouteWait,
    keepalive,
    log,
    one_shot_404,
    previous_details,
    translate,
    verified_404,
    warm_route,
)
from shepherd import loops
from shepherd.models import (
    ChunkResult,
    EvaluateInput,
    EvaluateResult,
    LoopSettings,
    OpenModelInput,
    OpenModelResult,
    TrainChunkInput,
    TrainerSession,
)
from shepherd.platform import (
    NotFound,
    PlatformClient,
    PlatformError,
    RouteNotFound,
    TrainerClient,
    rules,
)
from shepherd.tinker_client import TrainingClient
from workflows import policies


def load_path(checkpoint: str, trainer_job_id: str) -> str:
    """What ``load_weights`` is given for a checkpoint resource name: the logical name for
    the same job (resolved across its trainer generations), ``cross_job://<job>/<c>`` for
    another job of the account (the Fireworks convention)."""
    m = rules.CHECKPOINT_NAME_RE.match(checkpoint)
    if not m:
        return checkpoint
    if m["job"] == trainer_job_id:
        return m["checkpoint"]
    return f"cross_job://{m['job']}/{m['checkpoint']}"


def training_client(
    trainer: TrainerClient, session: TrainerSession, base_model: str, timeout: float
) -> TrainingClient:
    return TrainingClient(
        trainer,
        session_id=session.session_id,
        model_id=session.model_id,
        base_model=base_model,
        next_seq=session.next_seq,
        timeout=timeout,
        tokenizer_id=session.tokenizer_id,
    )


def loop_context(tc: TrainingClient, settings: LoopSettings) -> loops.LoopContext:
    """What the loop is told: the job's loop settings (every field but the loop's name)."""
    return loops.LoopContext(training_client=tc, **settings.model_dump(exclude={"loop"}))


def _resolve_loop(name: str) -> loops.Loop:
    try:
        return loops.resolve(name)
    except loops.LoopLoadError as exc:
        raise ApplicationError(str(exc), type=policies.LOOP_ERROR, non_retryable=True) from None


async def checkpoint_step(client: PlatformClient, checkpoint: str) -> int:
    """The step a checkpoint was saved at, from the control plane's listing."""
    m = rules.CHECKPOINT_NAME_RE.match(checkpoint)
    if not m:
        raise ApplicationError(
            f"checkpoint {checkpoint!r} is not accounts/<a>/rlorTrainerJobs/<j>/checkpoints/<c>",
            type=policies.INVALID_REQUEST,
            non_retryable=True,
        )
    try:
        async for found in client.iter_checkpoints(
            f"accounts/{m['account']}/rlorTrainerJobs/{m['job']}"
        ):
            if found.name == checkpoint:
                return int(found.step or 0)
    except NotFound:
        pass
    except PlatformError as exc:
        raise translate(exc, f"listing the checkpoints of {m['job']}") from None
    raise ApplicationError(
        f"checkpoint {checkpoint} does not exist", type=policies.NOT_FOUND, non_retryable=True
    )


T = TypeVar("T")


async def despite_cancels(task: asyncio.Future[T], timeout: float) -> T:
    """``task``'s result within ``timeout`` seconds (else TimeoutError), however many times
    the caller is cancelled meanwhile: an activity may be told to stop more than once (its
    cancel request, then a heartbeat that fails because of it)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        left = deadline - asyncio.get_running_loop().time()
        try:
            return await asyncio.wait_for(asyncio.shield(task), max(0.0, left))
        except asyncio.CancelledError:
            if task.done():
                return task.result()
            continue


class TrainingActivities:
    def __init__(self, clients: ClientProvider) -> None:
        self.clients = clients

    @activity.defn(name="open_model")
    async def open_model(self, inp: OpenModelInput) -> OpenModelResult:
        """A session and a model on the (freshly started) trainer: created from
        ``checkpoint`` (weights and optimizer state) when given, else a new model; and, beside
        it, ``warm_up_probes`` consecutive probes over the route training takes.

        A retried attempt goes on from its heartbeat: the model an earlier attempt opened
        is used again (opening another would leave that one behind on the trainer)."""
        client = self.clients.client(inp.backend)
        trainer = await client.trainer(inp.trainer_job_id)
        before = previous_details()
        races = int(before.get("route_races", 0))
        step = await checkpoint_step(client, inp.checkpoint) if inp.checkpoint else 0
        progress: dict[str, Any] = {"route_races": races}
        # Right after RUNNING the route may not be everywhere yet: a verified route 404
        # sends the same request again (it never reached the trainer).
        route = RouteWait(client, inp.trainer_job_id, progress, booting=inp.booting)
        # The warm-up probes run beside the model's calls: both wait for the route to reach
        # the gateway's replicas, and the probes' consecutive successes prove every replica
        # has it however the two interleave (a replica that has the route keeps it). After
        # the model's calls, as they ran before, they added ~40 ms to every trainer's start.
        probes = asyncio.ensure_future(
            warm_route(trainer, route, inp.warm_up_probes)
            if inp.warm_up_probes
            else asyncio.sleep(0)
        )
        try:
            async with keepalive(progress, policies.KEEPALIVE):
                opened = before.get("session")
                if isinstance(opened, dict):
                    session = TrainerSession.model_validate(opened)
                else:
                    session = await self._open(trainer, route, inp)
                progress["session"] = session.model_dump()
                info = await route.call(lambda: trainer.get_info(session.model_id))
                await probes
        except PlatformError as exc:
            raise translate(exc, "opening the model") from None
        finally:
            if not probes.done():  # the open failed: the probes end with it
                probes.cancel()
                await asyncio.gather(probes, return_exceptions=True)
        log(trainer_job_id=inp.trainer_job_id).info(
            "model.opened", model_id=session.model_id, step=step, checkpoint=inp.checkpoint
        )
        session.tokenizer_id = info.model_data.tokenizer_id or info.model_data.model_name
        return OpenModelResult(
            session=session,
            step=step,
            weights_digest=info.weights_digest,
            route_races=races + route.races,
        )

    @staticmethod
    async def _open(
        trainer: TrainerClient, route: RouteWait, inp: OpenModelInput
    ) -> TrainerSession:
        session_id = await route.call(
            lambda: trainer.create_session(
                tags=["shepherd"],
                user_metadata={"workflow_id": activity.info().workflow_id},
            )
        )
        if inp.checkpoint:
            loaded = await trainer.load_into_new_model(
                session_id,
                1,
                load_path(inp.checkpoint, inp.trainer_job_id),
                optimizer=True,
                timeout=inp.call_timeout_s,
                via=route.call,
            )
            model_id = str(loaded.get("model_id") or f"{session_id}:train:1")
        else:
            model_id = await trainer.create_model(
                session_id,
                1,
                inp.base_model,
                inp.lora_rank,
                seed=inp.seed,
                timeout=inp.call_timeout_s,
                via=route.call,
            )
        return TrainerSession(session_id=session_id, model_id=model_id, next_seq=1)

    @activity.defn(name="train_chunk")
    async def train_chunk(self, inp: TrainChunkInput) -> ChunkResult:
        before = previous_details()
        races = int(before.get("route_races", 0))
        client = self.clients.client(inp.backend)
        trainer = await client.trainer(inp.trainer_job_id)
        loop = _resolve_loop(inp.settings.loop)
        # Start where the last attempt's heartbeat says it was (same model only).
        start_step, next_seq = inp.first_step - 1, inp.session.next_seq
        if before.get("model_id") == inp.session.model_id:
            start_step = max(start_step, int(before.get("step", start_step)))
            next_seq = max(next_seq, int(before.get("next_seq", next_seq)))
        session = inp.session.model_copy(update={"next_seq": next_seq})
        tc = training_client(trainer, session, inp.base_model, inp.step_timeout_s)
        ctx = loop_context(tc, inp.settings)
        progress: dict[str, Any] = {
            "step": start_step,
            "next_seq": next_seq,
            "route_races": races,
            "model_id": inp.session.model_id,
        }
        losses: list[float] = []

        async def one_step(step: int) -> float | None:
            loss = await loop.step(ctx, step)
            await tc.drain()  # everything the step submitted is applied
            return loss

        def done(step: int, loss: float | None) -> None:
            # The keepalive heartbeats the progress: at most a second behind, and none at
            # all in a chunk that ends within the quiet start (policies.py).
            if loss is not None:
                losses.append(float(loss))
            progress["step"], progress["next_seq"] = step, tc.next_seq

        try:
            async with keepalive(progress, policies.KEEPALIVE):
                for step in range(start_step + 1, inp.last_step + 1):
                    task = asyncio.ensure_future(one_step(step))
                    optim_steps = tc.optim_steps
                    try:
                        done(step, await asyncio.shield(task))
                    except asyncio.CancelledError:
                        # Asked to stop (a pause, a cancel, the trainer died): finish the
                        # step in flight so the model is at a step boundary, then report —
                        # whatever other cancel comes meanwhile: the trainer took the step's
                        # seq_ids, and a report of none would have the pause's save reuse
                        # one (FAILED_PRECONDITION: the job failed instead of pausing).
                        with contextlib.suppress(Exception):
                            done(step, await despite_cancels(task, inp.step_timeout_s))
                        if progress["step"] < step:
                            await despite_cancels(
                                asyncio.ensure_future(
                                    self._abandon(tc, progress, step, optim_steps)
                                ),
                                inp.step_timeout_s,
                            )
                        tc.cancel_pending()
                        return self._result(progress, losses, races, partial=True)
        except RouteNotFound:
            tc.cancel_pending()
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
        except PlatformError as exc:
            tc.cancel_pending()
            raise translate(exc, f"training steps {inp.first_step}-{inp.last_step}") from None
        except loops.LoopLoadError as exc:
            tc.cancel_pending()
            raise ApplicationError(str(exc), type=policies.LOOP_ERROR, non_retryable=True) from None
        except ApplicationError:
            tc.cancel_pending()
            raise
        except Exception as exc:
            # A bug in the loop is deterministic: retrying the same step cannot fix it.
            tc.cancel_pending()
            raise ApplicationError(
                f"training loop {inp.settings.loop!r} failed at step {progress['step'] + 1}: "
                f"{type(exc).__name__}: {exc}",
                type=policies.LOOP_ERROR,
                non_retryable=True,
            ) from None
        skipped = start_step - (inp.first_step - 1)
        if skipped:
            log(trainer_job_id=inp.trainer_job_id).info(
                "chunk.resumed", skipped=skipped, first_step=inp.first_step
            )
        result = self._result(progress, losses, races, partial=False)
        result.steps_skipped = skipped
        return result

    @staticmethod
    async def _abandon(
        tc: TrainingClient, progress: dict[str, Any], step: int, optim_steps: int
    ) -> None:
        """The step in flight outlived the wait: the trainer still applies what of it was
        submitted, in ``seq_id`` order, whatever we do now. So every ``seq_id`` it took
        stays taken (``next_seq`` moves past them: the next operation, e.g. a pause's save,
        must not reuse one), each is made sure to reach the trainer (a missing one would
        hold the save behind it), and the step counts as applied once its ``optim_step``
        was submitted: a save ordered after it holds it."""
        with contextlib.suppress(PlatformError):
            await tc.confirm_submitted()
        progress["next_seq"] = tc.next_seq
        if tc.optim_steps > optim_steps:
            progress["step"] = step
        log().warning(
            "chunk.step_abandoned",
            step=step,
            applied=progress["step"] == step,
            next_seq=tc.next_seq,
        )

    @staticmethod
    def _result(
        progress: dict[str, Any], losses: list[float], races: int, *, partial: bool
    ) -> ChunkResult:
        return ChunkResult(
            last_step=progress["step"],
            next_seq=progress["next_seq"],
            last_loss=losses[-1] if losses else None,
            mean_loss=sum(losses) / len(losses) if losses else None,
            route_races=races,
            partial=partial,
        )

    @activity.defn(name="evaluate")
    async def evaluate(self, inp: EvaluateInput) -> EvaluateResult:
        """The loop's evaluation (the built-in one: held-out cross-entropy, a forward pass)."""
        client = self.clients.client(inp.backend)
        trainer = await client.trainer(inp.trainer_job_id)
        loop = _resolve_loop(inp.settings.loop)
        races = int(previous_details().get("route_races", 0))
        tc = training_client(trainer, inp.session, inp.base_model, inp.call_timeout_s)
        ctx = loop_context(tc, inp.settings)
        evaluate = getattr(loop, "evaluate", None) or loops.BUILTIN["supervised"].evaluate  # type: ignore[attr-defined]
        progress = {"route_races": races}
        try:
            async with keepalive(progress, policies.KEEPALIVE):
                raw = await evaluate(ctx)
                await tc.drain()
        except RouteNotFound:
            tc.cancel_pending()
            raise await one_shot_404(client, inp.trainer_job_id, races + 1) from None
        except PlatformError as exc:
            tc.cancel_pending()
            raise translate(exc, "evaluating") from None
        except loops.LoopLoadError as exc:
            raise ApplicationError(str(exc), type=policies.LOOP_ERROR, non_retryable=True) from None
        except Exception as exc:
            tc.cancel_pending()
            raise ApplicationError(
                f"evaluation of loop {inp.settings.loop!r} failed: {type(exc).__name__}: {exc}",
                type=policies.LOOP_ERROR,
                non_retryable=True,
            ) from None
        metrics = {
            k: float(v)
            for k, v in (raw or {}).items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        return EvaluateResult(step=inp.step, metrics=metrics, next_seq=tc.next_seq)
