""":class:`ProgramProxy`: one program job's data-plane proxy, as its owner (the worker's
``run_program`` activity) drives it. See the package's doc for what it guarantees."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable

import structlog

from shepherd.models import CheckpointRecord
from shepherd.platform import PlatformClient
from shepherd.proxy import answers, checkpoints, restore, samplers
from shepherd.proxy.api import ProgramApi
from shepherd.proxy.app import HttpServer, create_app
from shepherd.proxy.core import Core
from shepherd.proxy.events import AttachResult, ProxyEvent, ProxyProgress
from shepherd.proxy.settings import SWEEP_EVERY_S, ProxySettings
from shepherd.proxy.state import Model
from shepherd.proxy.steps import job_step
from shepherd.proxy.upstream import Detached, TrainerGone, Upstream

log = structlog.stdlib.get_logger("shepherd.proxy")


class ProxyError(Exception):
    """An ``attach`` or ``checkpoint_now`` that could not finish: the trainer was lost under
    way (a ``trainer_lost`` event says so too). The owner recovers the trainer and attaches
    again; nothing the program did is lost."""


class ProgramProxy:
    """The Tinker endpoint of one program: ``url`` and ``api_key`` are its
    ``TINKER_BASE_URL`` and ``TINKER_API_KEY``."""

    def __init__(
        self,
        platform: PlatformClient,
        settings: ProxySettings,
        on_event: Callable[[ProxyEvent], Awaitable[None]] | None = None,
    ) -> None:
        self.settings = settings
        #: The only key the proxy accepts: fresh per job, ``tml-`` (what the tinker SDK
        #: insists on). The platform's key stays in ``platform`` and never reaches the program.
        self.api_key = "tml-" + secrets.token_urlsafe(32)
        self.url = ""
        self._platform = platform
        # The trainer's requests go on a pool of their own (aiohttp: half httpx's cost per
        # request, and a program's step sends four or five).
        self._data_plane = platform.open_data_plane()
        self._on_event = on_event
        self._events: asyncio.Queue[ProxyEvent] = asyncio.Queue()
        self._core = Core(platform, settings, self._events.put_nowait, answers.settle)
        self._api = ProgramApi(self._core)
        self._server = HttpServer(create_app(self._api, self.api_key))
        self._attach_lock = asyncio.Lock()
        self._attaches = 0
        self._background: list[asyncio.Task[None]] = []

    def __repr__(self) -> str:  # never the key
        return f"ProgramProxy(url={self.url!r})"

    @property
    def progress(self) -> ProxyProgress:
        return self._core.progress

    def idle_for(self) -> float | None:
        """Seconds the attached trainer has had no request of the program's (None: none is
        attached)."""
        return self._core.idle_for()

    @property
    def restore_point(self) -> str | None:
        """The checkpoint the job's model would be restored from now (its full name)."""
        followed = self._core.followed()
        checkpoint = followed.checkpoint if followed is not None else None
        return checkpoint.record.name if checkpoint is not None else None

    @property
    def trainer_job_id(self) -> str | None:
        """The trainer job attached now (None while detached)."""
        up = self._core.up
        return up.trainer_job_id if up is not None else None

    async def start(self) -> None:
        """Serve on ``127.0.0.1``, an ephemeral port."""
        await self._server.start()
        self.url = f"http://127.0.0.1:{self._server.port}"
        self._background = [
            asyncio.create_task(self._deliver_events(), name="proxy events"),
            asyncio.create_task(self._sweep(), name="proxy sweep"),
        ]
        log.info("proxy.started", url=self.url)

    async def close(self) -> None:
        """Stop serving (the program's requests fail from now on) and every task."""
        self._core.detach("closed")
        self._core.release_holds()  # (after the detach: a poll answered now says try_again)
        await self._server.stop()
        await self._core.cancel_tasks()
        await self.drain_events()  # events already emitted are delivered before the end
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self._data_plane.aclose()
        log.info("proxy.closed", url=self.url)

    # ----------------------------------------------------------------- lifecycle

    async def attach(self, trainer_job_id: str) -> AttachResult:
        """The trainer ``trainer_job_id`` (RUNNING, its route warmed up) serves from now on.

        The first attach starts forwarding. A later one restores every model the program
        made: its last Shepherd checkpoint loaded with optimizer state into a new model (or
        the model created again as the program did, before any checkpoint), then its redo
        log sent again in order; the program's ids now name the new trainer's; sample
        requests the lost trainer had not answered are sent again; then the requests that
        waited go on. Raises :class:`ProxyError` if this trainer is lost meanwhile.
        """
        async with self._attach_lock:
            core = self._core
            if core.up is not None:
                core.detach("another trainer is attached")
            started = time.monotonic()
            first = self._attaches == 0
            self._attaches += 1
            result = AttachResult(trainer_job_id=trainer_job_id, first=first)
            trainer = await self._platform.trainer(trainer_job_id, via=self._data_plane)
            if core.account is None:
                core.account = await self._platform.account_id()
            up = Upstream(self._platform, trainer_job_id, trainer, self.settings, self._race)
            models = [m for m in core.models.values() if core.live_model(m)]
            try:
                async with contextlib.AsyncExitStack() as stack:
                    # Every model held while it is restored: the program's requests for it wait.
                    for model in models:
                        await stack.enter_async_context(model.cond)
                    core.begin(up)
                    await restore.restore_models(core, up, models, result)
                await samplers.resend_waiting(core, up, result)
            except TrainerGone as exc:
                core.lose(up, exc)
                raise ProxyError(
                    f"trainer {trainer_job_id} was lost while attaching: {exc}"
                ) from None
            except Detached:
                raise ProxyError(f"detached from {trainer_job_id} while attaching") from None
            result.seconds = time.monotonic() - started
            result.samplers_lost = sum(s.lost is not None for s in core.samplers.values())
            if not first:
                core.progress.recoveries.append(result)
            log.info(
                "proxy.attached",
                trainer_job_id=trainer_job_id,
                first=first,
                ops_redone=result.ops_redone,
                optimizer_steps_redone=result.optimizer_steps_redone,
                samples_redone=result.samples_redone,
                seconds=round(result.seconds, 3),
                digests_match=result.digests_match,
            )
            return result

    def detach(self, reason: str) -> None:
        """The trainer is gone or about to be deleted: the program's requests wait from now
        on (futures answer ``try_again``, direct calls are held) until the next attach.
        Nothing the program already got an answer to is redone. Idempotent."""
        self._core.detach(reason)

    async def checkpoint_now(self) -> CheckpointRecord | None:
        """For a pause: after what is in flight, Shepherd's checkpoint of the job's model at
        its current step (state with optimizer, and its sampler twin), then detach. None if
        the program has no model yet. Raises :class:`ProxyError` if the trainer is lost."""
        core = self._core
        up = core.up
        followed = core.followed()
        if up is None or followed is None:
            core.detach("checkpoint for a pause")
            return followed.checkpoint.record if followed and followed.checkpoint else None
        models = [m for m in core.models.values() if core.live_model(m) and m.broken is None]
        try:
            async with contextlib.AsyncExitStack() as stack:
                for model in models:
                    await stack.enter_async_context(model.cond)
                for model in models:
                    await self._checkpoint_model(model, up)
                core.detach("checkpoint for a pause")
        except TrainerGone as exc:
            core.lose(up, exc)
            raise ProxyError(f"the trainer was lost before the checkpoint: {exc}") from None
        except Detached:
            raise ProxyError("detached before the checkpoint was taken") from None
        checkpoint = followed.checkpoint
        return checkpoint.record if checkpoint is not None else None

    async def final_checkpoint(self) -> CheckpointRecord | None:
        """The program exited 0: Shepherd's checkpoint of the job's model at the weights the
        program ended with — whether or not its SDK finished its session or unloaded the
        model (the proxy kept it on the trainer for this) — and only then the end. With no
        trainer attached (a preemption as the program exited) it waits for the one the
        lifecycle brings back, restores the model there and checkpoints it. None: the
        program made no model. Raises :class:`ProxyError` when the model cannot be saved
        (it was broken): promoting an older checkpoint would name the wrong weights."""
        core = self._core
        followed = core.followed()
        if followed is None:
            return None
        while True:
            if followed.broken is not None:
                raise ProxyError(f"the job's model cannot be checkpointed: {followed.broken}")
            up = await core.wait_serving(float("inf"))
            if up is None:  # (an infinite wait ends with a trainer)
                continue
            try:
                async with followed.cond:
                    await self._checkpoint_model(followed, up)
            except TrainerGone as exc:
                core.lose(up, exc)
                continue
            except Detached:
                continue
            checkpoint = followed.checkpoint
            return checkpoint.record if checkpoint is not None else None

    async def _checkpoint_model(self, model: Model, up: Upstream) -> None:
        """After what is in flight for ``model`` (caller holds its ``cond``), its restore
        point holds its current weights: a checkpoint is taken unless it already does."""
        core = self._core
        await restore.ensure_model(core, model, up)
        if model.broken is not None:
            return
        in_flight = [op for op in model.redo if op.gen == core.gen]
        in_flight += [c.state_op for c in model.pending]
        in_flight += [c.sampler_op for c in model.pending]
        await core.wait_executed(up, in_flight)
        checkpoints.truncate(core, model)
        current = model.checkpoint
        if current is None or current.wver != model.wver:
            ckpt = await checkpoints.issue(
                core, model, up, step=job_step(model), wver=model.wver, lpos=model.lpos
            )
            await core.wait_executed(up, [ckpt.state_op, ckpt.sampler_op])
            if not ckpt.saved:
                raise ProxyError(f"Shepherd's checkpoint {ckpt.name} failed")
            checkpoints.truncate(core, model)

    async def drain_events(self) -> None:
        """Until every event emitted so far was handed to ``on_event``."""
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5.0):
                await self._events.join()

    # ------------------------------------------------------------------ plumbing

    def _race(self) -> None:
        self._core.progress.route_races += 1

    async def _deliver_events(self) -> None:
        while True:
            event = await self._events.get()
            try:
                if self._on_event is not None:
                    await self._on_event(event)
            except Exception:
                log.exception("proxy.event_delivery_failed", kind=event.kind)
            finally:
                self._events.task_done()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY_S)
            self._core.futures.sweep(time.monotonic())
