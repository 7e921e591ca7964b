"""What the parts of one trainer share: the seam between the service and the parts it composes.

The layering is SkyRL's Tinker server's (routes → engine → backend): :mod:`.routes` and
:mod:`.server` call the service (:mod:`.service`), the composition root, which builds one
:class:`TrainerContext` and hands it to each part it composes — models and their training
operations (:mod:`.training`) and sampling (:mod:`.sampling`). The parts reach the config,
the backend, the sessions, the future store and the compute thread through the context and
never import the service: every arrow between these modules points down, away from it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from localplane.errors import disk_full
from localplane.trainer import checkpoints as ckpts
from localplane.trainer.backend import Backend
from localplane.trainer.config import TrainerConfig
from localplane.trainer.errors import UserError
from localplane.trainer.futures import Future, FutureStore
from localplane.trainer.sessions import Sessions
from shepherd.tinker_wire.errors import WireError

log = structlog.stdlib.get_logger("localplane.trainer")


class Compute:
    """The trainer's one compute thread and how an operation's outcome settles its future."""

    def __init__(self, data_dir: Path) -> None:
        #: Where the trainer writes (checkpoints): named when a write finds the disk full.
        self.data_dir = data_dir
        self._gpu = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compute")
        self._tasks: set[asyncio.Task[None]] = set()
        #: Operations executing right now (the service's ``busy``: no idle exit meanwhile).
        self.running = 0

    async def call(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._gpu, fn)

    async def run(self, fut: Future, fn: Callable[[], dict[str, Any]], delay: float = 0.0) -> None:
        """Run ``fn`` on the compute thread and settle ``fut`` with its outcome."""
        self.running += 1
        try:
            result = await self.call(fn)
            if delay > 0:
                await asyncio.sleep(delay)  # emulated GPU time
            fut.resolve(result)
        except (UserError, WireError, ValueError) as exc:
            fut.fail(str(exc), "user")
        except Exception as exc:
            log.exception("operation.crashed", op=fut.op, request_id=fut.request_id)
            full = disk_full(exc, self.data_dir)
            cause = full.message if full else f"{type(exc).__name__}: {exc}"
            fut.fail(f"trainer error in {fut.op}: {cause}", "server")
        finally:
            self.running -= 1

    def spawn(self, fut: Future, fn: Callable[[], dict[str, Any]]) -> None:
        task = asyncio.get_running_loop().create_task(self.run(fut, fn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


@dataclass(eq=False)
class TrainerContext:
    """One trainer's shared parts, built by the service and passed to each part it composes."""

    cfg: TrainerConfig
    backend: Backend
    sessions: Sessions
    #: The tokenizer every model names in ``get_info`` (the base model's, on disk).
    tokenizer_dir: Path
    futures: FutureStore = field(default_factory=FutureStore)
    #: The compute thread, writing under ``cfg.data_dir``.
    compute: Compute = field(init=False)
    #: The event loop the tables live on, once the service started (see :meth:`after`).
    loop: asyncio.AbstractEventLoop | None = None
    #: What holds memory against the trainer's budget: each part's byte count, summed by
    #: :meth:`bytes_in_use` (the service registers its parts).
    holders: list[Callable[[], int]] = field(default_factory=list)

    def after(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the event loop, from the compute thread, before the operation's
        future settles (the loop runs callbacks in the order they were scheduled)."""
        loop = self.loop or asyncio.get_event_loop()
        loop.call_soon_threadsafe(fn)

    def caller(self, *, lineage: str = "", run: str = "") -> ckpts.Caller:
        return ckpts.Caller(self.cfg.data_dir, self.cfg.account, self.cfg.job, lineage, run)

    def __post_init__(self) -> None:
        self.compute = Compute(self.cfg.data_dir)

    def bytes_in_use(self) -> int:
        return sum(nbytes() for nbytes in self.holders)
