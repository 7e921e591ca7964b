"""A plain workflow (no Shepherd code) that shows temporalio 1.35.0 handing a local
activity's result to the workflow one workflow task later live than on replay, when the
worker answers a query meanwhile (docs/determinism.md)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn
async def quick() -> str:
    return "done"


@workflow.defn
class LocalActivityThenPatch:
    """Rounds of: an activity (a workflow task ends), a local activity, then the first call
    of a new patch."""

    def __init__(self) -> None:
        self.stage = "start"

    @workflow.run
    async def run(self, rounds: int) -> str:
        for i in range(rounds):
            await workflow.execute_activity(quick, start_to_close_timeout=timedelta(seconds=10))
            self.stage = f"local activity {i}"
            await workflow.execute_local_activity(
                quick, start_to_close_timeout=timedelta(seconds=10)
            )
            self.stage = f"after {i}"
            workflow.patched(f"after-local-activity-{i}")
        return "ok"

    @workflow.query
    def where(self) -> str:
        # A query that takes a few milliseconds, as a large status model does; it widens the
        # window in which the local activity ends while the worker answers the query.
        sum(range(200_000))
        return self.stage
