"""``Sweep``: a parent workflow that runs trials as child job workflows (full lifecycle, all
the guarantees) under a parallelism cap, stops losing trials early by the median rule, picks
the best by the metric and can promote it. Cancelling the sweep cancels every trial, and
each trial's own cleanup deletes its trainer.

Deterministic code only.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributePair
from temporalio.exceptions import ChildWorkflowError, is_cancelled_exception
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from activities.promotion import PromotionActivities
    from activities.sweeps import SweepActivities
    from shepherd import search_attributes as sa
    from shepherd.jobs import job_search_attributes, static_summary
    from shepherd.models import JobInput, JobStatus, ModelInfo, PromoteInput, TrialProgress
    from shepherd.phases import Phase
    from shepherd.sweep import (
        SuggestInput,
        SweepInput,
        SweepSpec,
        SweepStatus,
        TrialState,
        better,
        grid_points,
        random_point,
        should_stop,
        trial_spec,
    )
    from workflows.job import TrainingJobWorkflow
    from workflows.policies import Policies

_SUGGEST = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=5)


@workflow.defn(name="Sweep")
class SweepWorkflow:
    @workflow.init
    def __init__(self, inp: SweepInput) -> None:
        self.sweep: SweepSpec = inp.sweep
        self.s = SweepStatus(
            name=self.sweep.name,
            method=self.sweep.method,
            metric=self.sweep.metric,
            goal=self.sweep.goal,
            max_trials=self.sweep.max_trials,
            parallelism=self.sweep.parallelism,
        )
        self._grid = grid_points(self.sweep) if self.sweep.method == "grid" else None
        self._by_workflow: dict[str, int] = {}
        self._to_stop: set[int] = set()

    @workflow.run
    async def run(self, inp: SweepInput) -> SweepStatus:
        self.s.workflow_id = workflow.info().workflow_id
        workflow.upsert_search_attributes(
            [sa.SWEEP.value_set(self.s.workflow_id), sa.JOB_NAME.value_set(self.sweep.name)]
        )
        running: dict[int, Any] = {}
        try:
            if self.sweep.promote_best is not None and workflow.patched(
                "sweep-checks-model-before-trials"
            ):
                await self._check_model_free()
            await self._trials(running)
            await self._promote()
        except asyncio.CancelledError:
            # Cancel every trial and let each clean its trainer up before we finish.
            for handle in running.values():
                handle.cancel()
            if running:
                await workflow.wait(list(running.values()))
            for index in running:
                self.s.trials[index].state = "cancelled"
            self.s.phase = Phase.CANCELLED.value
            self._publish()
            raise
        except Exception as err:
            # The sweep fails (e.g. promotion refused): say so, and why, before it ends.
            root: BaseException = err
            while getattr(root, "cause", None) is not None:
                root = root.cause  # type: ignore[attr-defined]
            kind = getattr(root, "type", None) or type(root).__name__
            self.s.phase = Phase.FAILED.value
            self.s.error = f"{kind}: {getattr(root, 'message', None) or root}"[:500]
            self._publish()
            raise
        self.s.phase = Phase.COMPLETED.value
        self._publish()
        return self.s

    # ------------------------------------------------------------------- trials

    async def _trials(self, running: dict[int, Any]) -> None:
        total = (
            min(self.sweep.max_trials, len(self._grid))
            if self._grid is not None
            else self.sweep.max_trials
        )
        next_index = 0
        while next_index < total or running:
            while len(running) < self.sweep.parallelism and next_index < total:
                running[next_index] = await self._start(next_index)
                next_index += 1
            stop_wanted = asyncio.ensure_future(
                workflow.wait_condition(lambda: bool(self._to_stop))
            )
            await workflow.wait(
                [*running.values(), stop_wanted], return_when=asyncio.FIRST_COMPLETED
            )
            stop_wanted.cancel()
            for index in sorted(self._to_stop):
                if index in running and self.s.trials[index].state == "running":
                    self.s.trials[index].state = "stopping"
                    running[index].cancel()
            self._to_stop.clear()
            for index in [i for i, h in running.items() if h.done()]:
                self._finished(index, running.pop(index))
            self._publish()

    async def _params(self, index: int) -> dict[str, Any]:
        if self._grid is not None:
            return self._grid[index]
        if self.sweep.method == "random":
            return random_point(self.sweep, index)
        history = [
            (t.params, t.metric)
            for t in self.s.trials
            if t.state in ("completed", "stopped") and t.metric is not None
        ]
        return await workflow.execute_activity_method(
            SweepActivities.suggest_trial,
            SuggestInput(
                parameters=self.sweep.parameters,
                minimize=self.sweep.minimize,
                seed=self.sweep.seed,
                index=index,
                history=history,
            ),
            start_to_close_timeout=timedelta(minutes=2),
            retry_policy=_SUGGEST,
            summary=f"suggest trial {index} (TPE, {len(history)} finished)",
        )

    async def _start(self, index: int) -> Any:
        params = await self._params(index)
        spec = trial_spec(self.sweep, index, params)
        workflow_id = f"{self.s.workflow_id}-t{index}"
        trial = TrialState(index=index, params=params, workflow_id=workflow_id, state="pending")
        self.s.trials.append(trial)
        self._by_workflow[workflow_id] = index
        attrs = job_search_attributes(
            spec,
            SearchAttributePair(sa.SWEEP, self.s.workflow_id),
            SearchAttributePair(sa.PARENT, self.s.workflow_id),
        )
        handle = await workflow.start_child_workflow(
            TrainingJobWorkflow.run,
            JobInput(
                spec=spec,
                parent_workflow_id=self.s.workflow_id,
                report_progress_to=self.s.workflow_id,
            ),
            id=workflow_id,
            task_queue=spec.scheduling.task_queue or workflow.info().task_queue,
            # If the sweep is closed any other way, its trials still clean up after themselves.
            parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
            search_attributes=attrs,
            static_summary=f"trial {index} of sweep {self.sweep.name}: " + static_summary(spec),
        )
        trial.state = "running"  # the child exists from here on
        self._publish()
        return handle

    def _finished(self, index: int, handle: Any) -> None:
        trial = self.s.trials[index]
        try:
            status: JobStatus = handle.result()
        except (ChildWorkflowError, asyncio.CancelledError) as err:
            if trial.state == "stopping" and is_cancelled_exception(err):
                trial.state = "stopped"
                trial.metric = self._best_reported(trial)
            else:
                trial.state = "failed"
                trial.error = str(getattr(err, "cause", None) or err)[:300]
            return
        trial.state = "completed"
        trial.step = status.step
        if status.best is not None and status.best.metric is not None:
            trial.metric = status.best.metric
            trial.best_checkpoint = status.best.sampler or status.best.name
            trial.best_trainer_job_id = status.best.trainer_job_id
        best = self.s.best_trial
        if trial.metric is not None and (
            best is None
            or best.metric is None
            or better(trial.metric, best.metric, minimize=self.sweep.minimize)
        ):
            self.s.best = index

    def _best_reported(self, trial: TrialState) -> float | None:
        if not trial.reports:
            return None
        values = list(trial.reports.values())
        return min(values) if self.sweep.minimize else max(values)

    # ------------------------------------------------------------------ promote

    async def _check_model_free(self) -> None:
        """A taken ``promote_best.model_id`` fails the sweep before any trial runs (as a
        job's output model fails the job before its trainer)."""
        assert self.sweep.promote_best is not None
        base = self.sweep.base
        policies = Policies.for_spec(base.policies, chunk_steps=base.steps_per_chunk)
        await workflow.execute_activity_method(
            PromotionActivities.check_model_free,
            PromoteInput(
                backend=base.backend,
                trainer_job_id="",
                checkpoint="",
                model_id=self.sweep.promote_best.model_id,
                base_model=base.trainer.base_model,
                field="promote_best.model_id",
            ),
            **policies.lookup.options(),
            task_queue=base.scheduling.task_queue or workflow.info().task_queue,
            summary="check the promote_best model id",
        )

    async def _promote(self) -> None:
        best = self.s.best_trial
        if self.sweep.promote_best is None or best is None or best.best_checkpoint is None:
            return
        base = self.sweep.base
        policies = Policies.for_spec(base.policies, chunk_steps=base.steps_per_chunk)
        request = PromoteInput(
            backend=base.backend,
            trainer_job_id=best.best_trainer_job_id or "",
            checkpoint=best.best_checkpoint,
            model_id=self.sweep.promote_best.model_id,
            base_model=base.trainer.base_model,
            field="promote_best.model_id",
        )
        model: ModelInfo = await workflow.execute_activity_method(
            PromotionActivities.promote_checkpoint,
            request,
            **policies.promote.options(),
            summary=f"promote trial {best.index}",
        )
        if model.state != "READY":
            model = await workflow.execute_activity_method(
                PromotionActivities.wait_for_model,
                request,
                **policies.wait_model.options(),
                summary="wait for the model",
            )
        self.s.model = model.name
        workflow.upsert_search_attributes([sa.MODEL.value_set(model.name)])

    # ----------------------------------------------------------------- messages

    def _publish(self) -> None:
        done = sum(t.state in ("completed", "stopped", "failed") for t in self.s.trials)
        best = self.s.best_trial
        line = f"**{self.s.phase}** · {done}/{self.s.max_trials} trials done, {sum(t.state == 'running' for t in self.s.trials)} running"
        if best is not None and best.metric is not None:
            line += (
                f"\nbest: trial {best.index} {self.sweep.metric} {best.metric:.4f} {best.params}"
            )
        if self.s.model:
            line += f"\nmodel: {self.s.model}"
        workflow.set_current_details(line)

    @workflow.query(name="status")
    def query_status(self) -> SweepStatus:
        return self.s

    @workflow.signal(name="trial_progress")
    def trial_progress(self, progress: TrialProgress) -> None:
        index = self._by_workflow.get(progress.workflow_id)
        if index is None:
            return
        trial = self.s.trials[index]
        trial.reports[progress.step] = progress.metric
        trial.step = max(trial.step, progress.step)
        rule = self.sweep.early_stopping
        if rule is None:
            return
        # New information at this step may condemn any running trial that reported here —
        # also one that reported earlier than the others (trials run at different speeds).
        step = progress.step
        at_step = [t for t in self.s.trials if step in t.reports]
        for t in at_step:
            if t.state != "running" or t.index in self._to_stop:
                continue
            others = [o.reports[step] for o in at_step if o.index != t.index]
            if should_stop(rule, t.reports[step], step, others, minimize=self.sweep.minimize):
                self._to_stop.add(t.index)
