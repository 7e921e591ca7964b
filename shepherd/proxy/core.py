"""The proxy's shared state — what it knows of the program and of the trainer it is attached
to — and the moves every part of it makes on that state.

A *generation* is one attached trainer (:class:`~shepherd.proxy.upstream.Upstream`): begun
by an attach, ended by a detach or a loss. Every session, model and sampler the program made
is made live on a generation lazily, the first time something needs it there. :class:`Core`
holds the program's tables (sessions, models, samplers, futures, ids), the generation, the
job's model (:meth:`Core.is_followed`), the tasks, and the trainer's answers polled. What the
proxy *does* lives each in a module named for it, over this one ``Core``:

* :mod:`.operations` — an operation sent as its model's next trainer ``seq_id``;
* :mod:`.answers` — the trainer's answer settled: the program's future, and what follows;
* :mod:`.redo` — a model's redo log: what goes in, what is sent again after a loss;
* :mod:`.restore` — a model (and its session) made live on a trainer: created, or restored;
* :mod:`.checkpoints` — Shepherd's checkpoints issued and settled, the redo log truncated;
* :mod:`.snapshots` — what becomes of a sampler snapshot that leaves the redo log;
* :mod:`.samplers` — sampling sessions made live, remade, their samples sent (again);
* :mod:`.spans` — provenance spans sent as the log-probabilities they name;
* :mod:`.steps` — the job's steps, losses and weights digests, read from the answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import structlog

from shepherd.models import FollowedModel
from shepherd.platform import PlatformClient, PlatformError
from shepherd.proxy import ids
from shepherd.proxy.events import FollowEvent, ProxyEvent, ProxyProgress, TrainerLostEvent
from shepherd.proxy.ids import IdMap
from shepherd.proxy.settings import IDS_FILE, ProxySettings
from shepherd.proxy.spans import Spans
from shepherd.proxy.state import FutureTable, Model, Op, Sampler, Session
from shepherd.proxy.upstream import Detached, TrainerGone, Upstream

log = structlog.stdlib.get_logger("shepherd.proxy")


def describe(model: Model) -> FollowedModel:
    """What the job says of the model it follows: its number, and how the program made it."""
    body = model.create.body
    lora = body.get("lora_config") if isinstance(body.get("lora_config"), dict) else {}
    rank = lora.get("rank") if isinstance(lora, dict) else None
    path = body.get("path") if model.create.op == "load_weights" else None
    base = body.get("base_model")
    return FollowedModel(
        number=model.index + 1,
        base_model=base if isinstance(base, str) else None,
        lora_rank=rank if isinstance(rank, int) else None,
        loaded_from=path if isinstance(path, str) else None,
    )


class Refused(Exception):
    """The trainer refused a request at submission (a 4xx): the program gets the same answer;
    nothing was applied and no ``seq_id`` was taken."""

    def __init__(self, code: int, status: str, message: str) -> None:
        super().__init__(message)
        self.code, self.status, self.message = code, status, message


class NoTrainer(Exception):
    """No trainer was attached within the hold: the program is answered 503 (retryable)."""

    def __init__(self, hold: float) -> None:
        super().__init__(
            f"no trainer is serving this job right now (it is being brought back after a "
            f"preemption or a pause); waited {hold:g}s — try again"
        )


#: What a trainer says of an id it does not hold (a model, a sampler, a session).
NOT_HERE = "is not on this trainer"


#: What becomes of the trainer's answer to an operation: :func:`.answers.settle`, handed to
#: Core by whoever builds it (an answer sets off checkpoints, which send operations, which
#: use Core: Core importing answers would close that circle).
Settle = Callable[["Core", Op, dict[str, Any]], None]


class Core:
    """Everything the proxy knows of the program and of the trainer it is attached to, and
    the moves every part makes on it (see the module's doc for the parts)."""

    def __init__(
        self,
        platform: PlatformClient,
        settings: ProxySettings,
        emit: Callable[[ProxyEvent], None],
        settle: Settle,
    ) -> None:
        self.platform = platform
        self.settings = settings
        self.emit = emit
        self._settle = settle
        self.progress = ProxyProgress()
        self.ids = IdMap(store=Path(settings.state_dir) / IDS_FILE if settings.state_dir else None)
        self.futures = FutureTable()
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, Model] = {}
        self.samplers: OrderedDict[str, Sampler] = OrderedDict()
        #: Sample requests not answered yet that name no sampling session (a path or the
        #: base model).
        self.oneoff: dict[str, Op] = {}
        self.gen = 0
        self.up: Upstream | None = None
        self._attached_at = 0.0
        #: Set while a trainer is attached (a restore may still be under way).
        self.serving = asyncio.Event()
        self.account: str | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        #: The current generation's pollers (cancelled when it ends).
        self._pollers: set[asyncio.Task[Any]] = set()
        #: The program's polls held open (:meth:`hold`).
        self._holds: set[asyncio.Future[Any]] = set()
        self._holds_released = False
        #: Whether the trainer is asked for the job's model's weights digests (no more once
        #: it reports none).
        self.ask_digests = settings.record_digests
        #: Shepherd's checkpoints reported saved, by name (each is reported once).
        self.reported_checkpoints: set[str] = set()
        self._shepherd_names = ids.shepherd_checkpoint(settings.checkpoint_prefix)
        #: Sampled sequences' log-probabilities, and the provenance spans that name them.
        self.spans = Spans(self.futures)
        #: The index of the job's model (:meth:`is_followed`): a number the spec gives, else
        #: the first model until ``last`` moves on to a newer one that trains.
        follow = settings.follow
        self.followed_index = int(follow) - 1 if follow.isdigit() else 0

    # ----------------------------------------------------------------- plumbing

    def spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("proxy.task_failed", task=task.get_name(), error=repr(exc)[:500])

    async def cancel_tasks(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def is_shepherd_name(self, name: str) -> bool:
        """Whether ``name`` is one of Shepherd's checkpoints (left out of the program's view)."""
        return bool(self._shepherd_names.match(name))

    # ---------------------------------------------------------- the job's model

    def is_followed(self, model: Model) -> bool:
        """Whether ``model`` is the one the job follows — the *job's model*: its optimizer
        steps are the job's steps (step events, losses, digests), its Shepherd checkpoints
        raise checkpoint events and are the ones a restore reports, pause and finish take and
        Shepherd promotes, and the proxy keeps it on the trainer after the program closed it
        (SDKs finish their session on the way out, before the final checkpoint). Every such
        decision asks here: the model ``settings.follow`` names (:meth:`trained`)."""
        return model.index == self.followed_index

    def made(self, model: Model) -> None:
        """The program made ``model``: when it is the job's, the job is told which it is."""
        if self.is_followed(model):
            self.emit(FollowEvent(model=describe(model), step=model.reported_step))

    def trained(self, model: Model) -> None:
        """``model`` logged an optimizer step. Following ``last``, the job follows the newest
        model the program has trained — a pipeline's SFT model, then its reward model, then
        its RL policy — and never goes back to an older one (a program that trains two models
        in turn, an actor and a critic, is followed by the later-made of them): the job is
        told (:class:`FollowEvent`), and its step is that model's from then on."""
        if self.settings.follow != "last" or model.index <= self.followed_index:
            return
        self.followed_index = model.index
        self.progress.step = model.reported_step
        self.progress.digests.clear()  # (another model's weights)
        log.info("proxy.following", model=model.program_id, number=model.index + 1)
        self.emit(FollowEvent(model=describe(model), step=model.reported_step))

    def followed(self) -> Model | None:
        """The job's model (see :meth:`is_followed`); None while the program has made none."""
        return next((m for m in self.models.values() if self.is_followed(m)), None)

    def live_model(self, model: Model) -> bool:
        """Whether ``model`` is made again on a new trainer: an open one, or the job's model
        (kept for its final checkpoint)."""
        return not model.closed or self.is_followed(model)

    # -------------------------------------------------------------- generations

    def begin(self, up: Upstream) -> int:
        self.gen += 1
        self.up = up
        self.serving.set()
        self._attached_at = time.monotonic()
        return self.gen

    def live(self, up: Upstream) -> bool:
        return up is self.up and not up.closed

    async def wait_serving(self, deadline: float) -> Upstream | None:
        """The attached trainer, waiting for one until ``deadline`` (None: still none)."""
        while True:
            up = self.up
            if up is not None and not up.closed:
                return up
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.serving.wait(), left)

    async def with_trainer(self, fn: Callable[[Upstream], Awaitable[Any]], hold: float) -> Any:
        """``fn(up)`` against the attached trainer; while none is, or when it is lost under
        way, wait for the next one (up to ``hold`` seconds: then :class:`NoTrainer`)."""
        deadline = time.monotonic() + hold
        while True:
            up = await self.wait_serving(deadline)
            if up is None:
                raise NoTrainer(hold)
            try:
                return await fn(up)
            except Detached:
                continue
            except TrainerGone as exc:
                self.lose(up, exc)

    async def hold(self, event: asyncio.Event, seconds: float) -> None:
        """Until ``event`` is set, ``seconds`` pass, or the proxy closes (:meth:`release_holds`):
        a program's held poll. Released at close, it is answered (``try_again``) instead of
        being cancelled by the HTTP server's shutdown (logged as an error for each)."""
        if self._holds_released:
            return
        waiting = asyncio.ensure_future(event.wait())
        self._holds.add(waiting)
        try:
            await asyncio.wait({waiting}, timeout=seconds)
        finally:
            self._holds.discard(waiting)
            waiting.cancel()

    def release_holds(self) -> None:
        self._holds_released = True
        for waiting in list(self._holds):
            waiting.cancel()

    def idle_for(self) -> float | None:
        """How long the attached trainer has had nothing of the program's to do: no request
        in flight, none answered (None: no trainer attached, so nothing is held)."""
        if self.up is None:
            return None
        if self._pollers:
            return 0.0
        last = max(self._attached_at, self.progress.answered_at or 0.0)
        return time.monotonic() - last

    def lose(self, up: Upstream, exc: TrainerGone) -> None:
        """The trainer of ``up`` is gone (seen by the proxy): tell the owner, wait."""
        if not self.live(up):
            return
        self.progress.trainer_losses += 1
        log.warning("proxy.trainer_lost", trainer_job_id=up.trainer_job_id, reason=exc.reason)
        self.emit(
            TrainerLostEvent(trainer_job_id=up.trainer_job_id, reason=exc.reason, state=exc.state)
        )
        self.detach(f"trainer lost: {exc.reason}")

    def detach(self, reason: str) -> None:
        up = self.up
        if up is None:
            return
        up.closed = True
        self.up = None
        self.serving.clear()
        # Polls held open on that trainer end now (a live one would hold them ~20 s).
        for poller in list(self._pollers):
            poller.cancel()
        # Checkpoints not yet the restore point are issued again by the redo (a save of the
        # same name at the same weights is a no-op): the next trainer restores from the last
        # restore point, the only one every earlier operation's answer is safe behind.
        for model in self.models.values():
            model.pending.clear()
        log.info("proxy.detached", trainer_job_id=up.trainer_job_id, reason=reason)

    # -------------------------------------------------------------- the trainer

    async def model_info(self, model: Model, up: Upstream) -> dict[str, Any]:
        """The trainer's ``get_info`` of ``model`` (live on ``up``)."""
        answer = await up.call("POST", "get_info", {"model_id": model.trainer_id})
        return answer if isinstance(answer, dict) else {}

    async def refusal(self, up: Upstream, exc: PlatformError) -> Exception:
        """What a trainer's 4xx on a submission means. A refusal (the program gets it), unless
        the trainer says it does not hold what the proxy made on it *and* the evidence says
        it lost everything: the control plane no longer says RUNNING, or the trainer does
        not know the job's model either (it restarted). A trainer's word alone never starts
        a recovery: a snapshot it still holds, refused for another reason, is not a loss."""
        refused = Refused(exc.status_code or 400, exc.status, exc.message)
        if NOT_HERE not in exc.message:
            return refused
        await up.verify(f"the trainer refused an id the proxy made on it ({exc.message[:200]})")
        live = [m for m in self.models.values() if m.gen == self.gen and m.trainer_id]
        for model in live[:1]:
            try:
                await self.model_info(model, up)
            except PlatformError as again:
                if NOT_HERE in again.message:
                    return TrainerGone(
                        f"the trainer no longer holds what the proxy made on it (it restarted): "
                        f"{exc.message}"
                    )
                raise
        log.warning("proxy.refused_id", trainer_job_id=up.trainer_job_id, error=exc.message[:300])
        return refused

    async def await_trainer(self, up: Upstream, request_id: str) -> dict[str, Any]:
        """The trainer's answer to one of its futures (polled until it is there)."""
        while True:
            answer = await up.poll(request_id)
            if answer.get("type") != "try_again":
                return answer

    async def wait_executed(self, up: Upstream, ops: Iterable[Op]) -> None:
        """Until the trainer of ``up`` executed every op (raises Detached if it is lost)."""
        deadline = time.monotonic() + self.settings.call_timeout_s
        for op in ops:
            while not op.executed.is_set():
                if not self.live(up):
                    raise Detached("wait")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TrainerGone(
                        f"{op.op} not executed within {self.settings.call_timeout_s:g}s",
                        None,
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(op.executed.wait(), min(left, 0.5))

    def watch(self, op: Op, up: Upstream, trainer_request_id: str) -> None:
        """``op`` was sent to the trainer of ``up`` as its ``trainer_request_id``: a poller of
        this generation waits for the answer and settles it (``settle``: :mod:`.answers`)."""
        op.gen = self.gen
        op.trainer_request_id = trainer_request_id
        op.executed = asyncio.Event()
        op.outcome_ok = None
        poller = self.spawn(self._poll(op, up), f"poll {op.op}")
        self._pollers.add(poller)
        poller.add_done_callback(self._pollers.discard)

    async def _poll(self, op: Op, up: Upstream) -> None:
        assert op.trainer_request_id is not None
        try:
            answer = await self.await_trainer(up, op.trainer_request_id)
        except Detached:
            return
        except TrainerGone as exc:
            self.lose(up, exc)
            return
        except PlatformError as exc:
            # A refusal of the poll itself (the key revoked, a malformed id): not the
            # trainer's outcome of the operation; say so to whoever waits.
            answer = {"error": f"retrieving the result failed: {exc}", "category": "server"}
        if op.gen != self.gen or not self.live(up):
            return
        self._settle(self, op, answer)
