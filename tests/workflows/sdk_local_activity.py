"""A plain workflow (no Shepherd code) that shows temporalio 1.35.0 handing a local
activity's result to the workflow one workflow task later live than on replay, when the
local activity completes while the worker answers a query (docs/determinism.md)."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta

from temporalio import activity, workflow

# Set by a query that reaches the workflow while its local activity runs: the activity then
# completes while the query is still being answered, which is the race the bug needs. Shared
# between the workflow thread and the activity, so the worker runs this workflow unsandboxed.
QUERIED = threading.Event()


@activity.defn
async def quick() -> str:
    return "done"


@activity.defn
async def held(gated: bool) -> str:
    """Completes at once, or (gated) only once a query has started to be answered."""
    if gated:
        while not QUERIED.is_set():
            await asyncio.sleep(0.002)
    return "done"


@workflow.defn
class LocalActivityThenPatch:
    """Rounds of: an activity (a workflow task ends), a local activity, then the first call
    of a new patch."""

    def __init__(self) -> None:
        self.stage = "start"

    @workflow.run
    async def run(self, rounds: int, gated: bool) -> str:
        for i in range(rounds):
            await workflow.execute_activity(quick, start_to_close_timeout=timedelta(seconds=10))
            self.stage = f"local activity {i}"
            QUERIED.clear()  # only a query answered from here on releases this round's
            await workflow.execute_local_activity(
                held, gated, start_to_close_timeout=timedelta(seconds=10)
            )
            self.stage = f"after {i}"
            workflow.patched(f"after-local-activity-{i}")
        return "ok"

    @workflow.query
    def where(self) -> str:
        # A query that takes a while to answer, as a large status model does: the local
        # activity it releases ends before the answer is sent.
        if self.stage.startswith("local activity"):
            QUERIED.set()
            time.sleep(0.1)
        return self.stage
