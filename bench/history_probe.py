"""bench/history.py's probe of the Temporal server's continue-as-new suggestion.

A workflow class must live in a module the worker's sandbox can import again by name (never
``__main__``): bench/ is ``sys.path[0]`` when a bench script runs, so this file is the
top-level module ``history_probe``. Nothing here is Shepherd's: it only asks the server.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow

#: A round waits on short timers. A fine round is one timer: TimerStarted (with the previous
#: task's completion), TimerFired, WorkflowTaskScheduled, WorkflowTaskStarted,
#: WorkflowTaskCompleted — five events, so the length is known within five events of where
#: the server first suggested. A coarse round is ``batch`` timers at once (two events each,
#: and the workflow tasks that take them): fewer round trips to get near.
ROUND_TIMER = timedelta(milliseconds=1)


@dataclass
class ProbeInput:
    #: Give up once the history holds this many events.
    limit: int
    #: Coarse rounds while a whole one ends below this length, fine rounds from there.
    fine_from: int
    #: Timers per coarse round.
    batch: int = 50


@dataclass
class ProbeResult:
    #: The history length (``get_current_history_length``) at the first workflow task that
    #: was told ``is_continue_as_new_suggested()``; None: not by ``limit`` events.
    suggested_at: int | None
    #: The history length at the last workflow task before it that was not told so.
    last_not_suggested: int
    #: The history's size in bytes at the first suggested task (else at the last task).
    size_bytes: int
    rounds: int
    fine_rounds: int


@workflow.defn(name="ShepherdBenchHistoryProbe")
class HistoryProbe:
    """Lengthens its own history a round at a time until the server suggests continue-as-new
    (or the history holds ``limit`` events), then ends and says at what length."""

    @workflow.run
    async def run(self, probe: ProbeInput) -> ProbeResult:
        last, rounds, fine = 0, 0, 0
        coarse_events = 2 * probe.batch + 6  # its timers and (at least) two workflow tasks
        while True:
            info = workflow.info()
            length = info.get_current_history_length()
            if info.is_continue_as_new_suggested():
                size = info.get_current_history_size()
                return ProbeResult(length, last, size, rounds, fine)
            if length >= probe.limit:
                size = info.get_current_history_size()
                return ProbeResult(None, length, size, rounds, fine)
            last, rounds = length, rounds + 1
            if length + coarse_events < probe.fine_from:
                await asyncio.gather(*(workflow.sleep(ROUND_TIMER) for _ in range(probe.batch)))
            else:
                fine += 1
                await workflow.sleep(ROUND_TIMER)
