"""Two versions of one small workflow, the second incompatible with the first: what the
teardown replay (tests/replay.py) must catch and locate."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow


@workflow.defn(name="Drifting")
class DriftingV1:
    @workflow.run
    async def run(self) -> str:
        await workflow.sleep(timedelta(milliseconds=10))
        await workflow.sleep(timedelta(milliseconds=10))
        return "v1"


@workflow.defn(name="Drifting")
class DriftingV2:
    @workflow.run
    async def run(self) -> str:
        await workflow.sleep(timedelta(milliseconds=10))
        # A second timer became a patch-less activity-free wait on a condition: a different
        # command where history has a timer.
        await workflow.wait_condition(lambda: True)
        workflow.upsert_memo({"v": 2})
        await workflow.sleep(timedelta(milliseconds=10))
        return "v2"


@workflow.defn(name="TrainingJob")
class IncompatibleTrainingJob:
    """Another version of the job workflow that cannot replay the real one's histories (as
    an old or broken worker would run): what ``status`` must survive."""

    @workflow.run
    async def run(self, inp: dict) -> str:  # type: ignore[type-arg]
        await workflow.sleep(timedelta(hours=1))
        return "never"

    @workflow.query(name="status")
    def status(self) -> dict:  # type: ignore[type-arg]
        return {}
