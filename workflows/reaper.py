"""``ShepherdReaper``: one pass of the reaper (shepherd/reaper.py), as a Temporal Schedule
runs it every ``policies.REAPER_PERIOD``. Its result (and its ``status`` query) is what it
deleted, or in a dry run what it would have.

Deterministic code only.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import workflows.policies as policies
    from activities.reaper import ReaperActivities
    from shepherd.reaper import WORKFLOW_TYPE, ReaperInput, ReaperReport


@workflow.defn(name=WORKFLOW_TYPE)
class ReaperWorkflow:
    def __init__(self) -> None:
        self.report: ReaperReport | None = None

    @workflow.run
    async def run(self, inp: ReaperInput) -> ReaperReport:
        report: ReaperReport = await workflow.execute_activity_method(
            ReaperActivities.reap,
            inp,
            **policies.REAP.options(),
            summary="dry run: find orphaned trainers"
            if inp.dry_run
            else "delete orphaned trainers",
        )
        self.report = report
        return report

    @workflow.query(name="status")
    def status(self) -> ReaperReport | None:
        return self.report
