"""The reaper's one activity: find the trainers whose job workflow ended without its cleanup
and delete them (shepherd/reaper.py says which trainers count as Shepherd's, and when one is
an orphan). Uses the worker's Temporal client for visibility and its platform clients."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from temporalio import activity
from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus
from temporalio.service import RPCError

from activities.base import ClientProvider, log
from shepherd import search_attributes as sa
from shepherd.platform import NotFound, PlatformError
from shepherd.platform.models import TrainerJob
from shepherd.reaper import ReapedTrainer, ReaperInput, ReaperReport
from shepherd.states import JobState
from shepherd.trainer_ids import made_by_run, owner_of, prefix_of, trainer_prefix

_JOB_TYPE = "TrainingJob"
_GENERATION = re.compile(r"-g([0-9]+)\Z")


class Profiles(ClientProvider, Protocol):
    @property
    def profiles(self) -> Mapping[str, Any]: ...


def _q(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _Verdict:
    """Whose a trainer is, and whether its job is over (and since when)."""

    def __init__(self, *, ours: bool, closed_at: datetime | None = None, why: str = "") -> None:
        self.ours = ours
        self.closed_at = closed_at  # None: the job is live
        self.why = why
        self.workflow_id: str | None = None


def _closed(runs: list[WorkflowExecution], why: str) -> _Verdict:
    """The job of these runs: live if any runs (a continued-as-new chain goes on in a later
    run), else closed when its last run closed."""
    if any(r.status in (None, WorkflowExecutionStatus.RUNNING) for r in runs):
        return _Verdict(ours=True)
    last = max(runs, key=lambda r: r.close_time or r.start_time)
    status = last.status.name if last.status else "CLOSED"
    return _Verdict(ours=True, closed_at=last.close_time, why=f"{why} {status}")


def _generation(trainer_job_id: str) -> int | None:
    m = _GENERATION.search(trainer_job_id)
    return int(m[1]) if m else None


def gave_out(trainer_job_id: str, runs: Iterable[WorkflowExecution]) -> bool:
    """Whether these runs of one job got as far as this trainer's generation: each run
    records its current trainer (``ShepherdTrainerJobId``) before creating it, so a
    generation past the highest one recorded is an id the job never gave a trainer."""
    prefix, generation = prefix_of(trainer_job_id), _generation(trainer_job_id)
    if prefix is None or generation is None:
        return False
    reached = [
        _generation(recorded)
        for r in runs
        if (recorded := r.typed_search_attributes.get(sa.TRAINER_JOB_ID))
        and prefix_of(recorded) == prefix
    ]
    return any(g is not None and generation <= g for g in reached)


def made_prefix(prefix: str, name: str | None, workflow_id: str, run_id: str) -> bool:
    """Whether run ``run_id`` of ``workflow_id`` makes trainer ids ``<prefix>-g<n>`` of the
    kind without the owner: ``<name[:40]>-<6 hex of the run>`` (shepherd/trainer_ids.py)."""
    if name:
        return prefix == trainer_prefix(name, workflow_id, run_id, owner_in_id=False)
    digest = hashlib.sha256(f"{workflow_id}/{run_id}".encode()).hexdigest()[:6]
    return prefix.endswith(f"-{digest}")


class ReaperActivities:
    def __init__(self, clients: Profiles) -> None:
        self.clients = clients

    async def _runs(self, client: Client, query: str) -> list[WorkflowExecution]:
        return [ex async for ex in client.list_workflows(query)]

    async def _verdict(self, client: Client, job: TrainerJob) -> _Verdict:
        owner = owner_of(job.job_id)
        prefix = prefix_of(job.job_id)
        if owner is not None and prefix is not None:
            runs = await self._runs(
                client, f"WorkflowId = {_q(owner)} AND WorkflowType = {_q(_JOB_TYPE)}"
            )
            if not runs:
                # Missing: provably Shepherd's only with the display name Shepherd gives.
                if job.display_name == owner:
                    verdict = _Verdict(ours=True, closed_at=job.create_time, why="workflow missing")
                    verdict.workflow_id = owner
                    return verdict
                return _Verdict(ours=False)
            made = [r for r in runs if made_by_run(job.job_id, owner, r.run_id or "")]
            if not made:
                return _Verdict(ours=False)  # the id only looks like one of ours
            # Its run and every later run of the workflow id (a continued-as-new chain).
            since = min(r.start_time for r in made)
            chain = [r for r in runs if r.start_time >= since]
            if not gave_out(job.job_id, chain):
                return _Verdict(ours=False)  # a generation the job never reached
            verdict = _closed(chain, "workflow")
            verdict.workflow_id = owner
            return verdict
        if prefix is None:
            return _Verdict(ours=False)
        # Ids without the owner (``<name[:40]>-<6 hex>``): the workflow that recorded this
        # trainer's job (a generation of it) in its search attributes ...
        recorded = await self._runs(
            client,
            f"{sa.TRAINER_JOB_ID.name} STARTS_WITH {_q(prefix + '-g')} "
            f"AND WorkflowType = {_q(_JOB_TYPE)}",
        )
        if not recorded or not gave_out(job.job_id, recorded):
            return _Verdict(ours=False)
        workflow_id = recorded[0].id
        # ... and one of whose runs the hex names, as for the ids that carry their owner: a
        # recorded prefix alone would take in anyone's ``<prefix>-g<n>``.
        runs = await self._runs(
            client, f"WorkflowId = {_q(workflow_id)} AND WorkflowType = {_q(_JOB_TYPE)}"
        )
        name = recorded[0].typed_search_attributes.get(sa.JOB_NAME)
        made = [r for r in runs if made_prefix(prefix, name, workflow_id, r.run_id or "")]
        if not made:
            return _Verdict(ours=False)
        since = min(r.start_time for r in made)
        verdict = _closed([r for r in runs if r.start_time >= since], "workflow")
        verdict.workflow_id = workflow_id
        return verdict

    @activity.defn(name="reap_orphaned_trainers")
    async def reap(self, inp: ReaperInput) -> ReaperReport:
        client = activity.client()
        now = datetime.now(UTC)
        report = ReaperReport(
            started_at=now, dry_run=inp.dry_run, grace_s=inp.grace.total_seconds()
        )
        logger = log()
        for backend in inp.backends or sorted(self.clients.profiles):
            platform = self.clients.client(backend)
            try:
                async for job in platform.iter_jobs():
                    if job.state in (JobState.DELETED, JobState.DELETING):
                        continue
                    report.checked += 1
                    activity.heartbeat(report.checked)
                    try:
                        verdict = await self._verdict(client, job)
                    except RPCError as exc:
                        report.errors.append(f"{job.job_id}: visibility: {exc.message}")
                        continue
                    if not verdict.ours:
                        report.kept_foreign += 1
                        continue
                    closed_at = verdict.closed_at
                    if closed_at is None or now - closed_at < inp.grace:
                        report.kept_live += 1
                        continue
                    ago = _ago(now - closed_at)
                    orphan = ReapedTrainer(
                        backend=backend,
                        trainer_job_id=job.job_id,
                        state=job.state.value,
                        workflow_id=verdict.workflow_id,
                        reason=f"{verdict.why} {ago} ago",
                    )
                    if inp.dry_run:
                        report.would_delete.append(orphan)
                        continue
                    try:
                        await platform.delete_job(job.job_id)
                    except NotFound:
                        continue
                    except PlatformError as exc:
                        report.errors.append(f"{job.job_id}: delete: {exc}")
                        continue
                    report.deleted.append(orphan)
                    logger.warning(
                        "reaper.deleted",
                        backend=backend,
                        trainer_job_id=job.job_id,
                        owner=verdict.workflow_id,
                        reason=orphan.reason,
                    )
            except PlatformError as exc:
                report.errors.append(f"{backend}: listing trainer jobs: {exc}")
        report.finished_at = datetime.now(UTC)
        logger.info(
            "reaper.done",
            checked=report.checked,
            deleted=len(report.deleted),
            would_delete=len(report.would_delete),
            kept_live=report.kept_live,
            kept_foreign=report.kept_foreign,
            errors=len(report.errors),
        )
        return report


def _ago(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
