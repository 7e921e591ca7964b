"""One job's state and the moves every part of its lifecycle makes: run an activity under its
declared policy, set the phase, publish the status, notice a cancel, read the platform.

:class:`JobContext` is what each step of the lifecycle (admission, the trainer, what runs
while it is held, recovery, pausing, the finish) reads and changes; it is built once by the
workflow (workflows/job.py), whose signals, queries and updates write its flags. Nothing here
decides what the job does next: that is the steps' business.

Deterministic code only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, NoReturn, TypeVar

from temporalio import workflow
from temporalio.common import Priority
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    FailureError,
    TimeoutError,
    is_cancelled_exception,
)

with workflow.unsafe.imports_passed_through():
    import workflows.policies as policies
    from shepherd import search_attributes as sa
    from shepherd.models import (
        MAX_NOTICES,
        CarriedFlags,
        JobInput,
        JobStatus,
        PlatformJob,
        ProgramCarry,
        PromoteInput,
        TrainerRef,
        TrainerSession,
    )
    from shepherd.phases import Phase
    from shepherd.scheduling import HOLDING_PRIORITY, task_priority
    from shepherd.states import JobState
    from workflows.flow import Lost, Terminal, required
    from workflows.policies import ActivityPolicy, Policies

T = TypeVar("T")

#: The steps of bringing a trainer up; during a recovery they show as RECOVERING.
COMING_UP = frozenset({Phase.QUEUED, Phase.SCHEDULING, Phase.PREPARING})


def root_cause(err: BaseException) -> BaseException:
    """The failure an activity error wraps (its innermost cause)."""
    while isinstance(err, ActivityError) and err.cause is not None:
        err = err.cause
    return err


class JobContext:
    """The job's state (``s`` is what ``status`` shows; the rest is the lifecycle's own), and
    the shared moves of its steps."""

    def __init__(self, inp: JobInput) -> None:
        self.spec = inp.spec
        self.pol = Policies.for_spec(
            self.spec.policies,
            chunk_steps=self.spec.steps_per_chunk,
            checkpoint_every=self.spec.checkpoint.every_steps,
            max_runtime=self.spec.scheduling.max_runtime,
        )
        self.s: JobStatus = inp.carried or JobStatus(
            name=self.spec.name,
            labels=self.spec.labels,
            backend=self.spec.backend,
            total_steps=self.spec.total_steps,
            eval_metric=self.spec.checkpoint.metric,
            parent_workflow_id=inp.parent_workflow_id,
        )
        flags = inp.carried_flags
        #: A run continued from an earlier one (continue-as-new): admission is done.
        self.carried = inp.carried is not None
        #: The spec still holds ``{scheduled_time}`` templates (a schedule's run).
        self.templated = inp.templated
        #: The namespace has Shepherd's search attributes (upserts are safe).
        self.visible = inp.search_attributes
        #: A sweep to report checkpoints' metrics to.
        self.report_to = inp.report_progress_to
        #: A trainer may exist (cleanup must delete it), and it serves the job's work.
        self.trainer_live = flags.trainer_live
        self.serving = flags.serving
        self.shape_version = flags.shape_version
        #: The checkpoint the next trainer starts from (None: a fresh model).
        self.to_load = flags.to_load
        self.prefix = flags.prefix
        self.preemptible = self.spec.preemptible if flags.preemptible is None else flags.preemptible
        self.prune_unsupported = flags.prune_unsupported
        self.pauses = flags.pauses
        #: The trainer's state as platform events (or the freshest poll) say.
        self.event_state = flags.event_state
        self.event_message = flags.event_message
        self.event_id = flags.event_id
        #: Platform update time of the freshest state observed; older reports are stale.
        self.observed_at: datetime | None = flags.observed_at
        #: A loop's model on the live trainer (Tinker API) and its next seq_id.
        self.session: TrainerSession | None = flags.session
        #: The promotion under way (from its request until the model is READY): a cancel
        #: meanwhile takes the model back.
        self.promotion: PromoteInput | None = None
        self.pause_requested = False
        self.resume_requested = False
        self.resume_checkpoint: str | None = None
        #: The resume update already checked its checkpoint.
        self.resume_checked = False
        self.phase_since = workflow.now()
        self.published_phase: Phase | None = None
        #: The step the job list shows (its search attribute), as last set by this run.
        self.published_step: int | None = None
        #: What the lifecycle is doing; the public phase differs only while recovering.
        self.stage: Phase = self.s.stage or self.s.phase
        #: A recovery is bringing the trainer back: its QUEUED/SCHEDULING/PREPARING show as
        #: RECOVERING (with the step in ``status.stage``), since that is what the user waits for.
        self.recovering = flags.recovering
        #: What the work carries across continue-as-new (set by the workflow).
        self.carry_work: Callable[[], ProgramCarry | None] = lambda: None
        #: The task queue of the job's activities (None: the workflow's own).
        self.queue = self.spec.scheduling.task_queue
        #: The job's side of its admission to a slot (workflows/slot.py).
        self.slot = flags.slot
        self.priority = task_priority(self.spec.scheduling.priority)

    # ------------------------------------------------------------------ the trainer

    def ref(self) -> TrainerRef:
        trainer = required(self.s.trainer_job_id, "the trainer's id")
        return TrainerRef(backend=self.spec.backend, trainer_job_id=trainer)

    def model(self) -> TrainerSession:
        return required(self.session, "the model open on the trainer")

    def call_timeout_s(self) -> float:
        return self.pol.step_timeout.total_seconds()

    def observe(self, job: PlatformJob) -> None:
        """A poll's (or an activity's) view of the trainer, unless an event since is newer."""
        if job.trainer_job_id != self.s.trainer_job_id:
            return
        if self.stale(job.update_time):
            # A poll's answer is a moment ago; an event since (the death of a trainer whose
            # RUNNING the poll saw, say) is the truth now.
            return
        self.s.platform_state = job.state
        self.s.platform_message = job.message
        self.event_state, self.event_message = job.state, job.message
        if job.update_time is not None:
            self.observed_at = job.update_time

    def stale(self, when: datetime | None) -> bool:
        """Whether a state the platform reported as of ``when`` is older than the freshest
        state the workflow holds (from a poll or an event)."""
        return bool(self.observed_at and when and when < self.observed_at)

    def death_event(self) -> Lost:
        """The trainer's death as the platform's events told it."""
        job = PlatformJob(
            trainer_job_id=self.ref().trainer_job_id,
            state=self.event_state or "",
            message=self.event_message,
        )
        kind = policies.TRAINER_GONE if JobState(job.state).is_gone() else policies.TRAINER_LOST
        said = f": {job.message}" if job.message else ""
        return Lost(kind, job, f"platform event: {job.state}{said}")

    # ------------------------------------------------------------------ activities

    def options(self, policy: ActivityPolicy) -> dict[str, Any]:
        """``policy`` as activity options, on the job's queue (a poll on its waits queue)."""
        queue = self.queue
        if policy.waits:
            queue = policies.waits_queue(queue or workflow.info().task_queue)
        return {**policy.options(), "task_queue": queue, "priority": self.task_priority()}

    def task_priority(self) -> Priority:
        """Temporal's priority for the job's next activity: its own (``scheduling.priority``)
        until it holds a trainer, then ahead of every job that holds none."""
        return HOLDING_PRIORITY if self.trainer_live else self.priority

    async def act(
        self,
        fn: Callable[[Any, Any], Awaitable[T]],
        arg: Any,
        policy: ActivityPolicy,
        summary: str,
        *,
        timeout_type: str = "Timeout",
        cleanup: bool = False,
        wait_for_cancel: bool = False,
    ) -> T:
        """Run one activity under ``policy``. ``cleanup``: sent even after a cancel request.
        ``wait_for_cancel``: a cancel waits until the activity has ended (it may have had its
        effect), instead of leaving it behind."""
        if not cleanup:
            self.stop_if_cancelled()
        options = self.options(policy)
        if wait_for_cancel:
            options["cancellation_type"] = (
                workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
            )
        try:
            return await workflow.execute_activity_method(fn, arg, **options, summary=summary)
        except ActivityError as err:
            self.raise_mapped(err, timeout_type, summary)

    @staticmethod
    async def race(activity: asyncio.Task[Any], waiter: asyncio.Task[Any]) -> None:
        """Wait for whichever finishes first. A workflow cancel arriving meanwhile cancels
        both, so no activity keeps working for a job that is being cleaned up."""
        try:
            await workflow.wait([activity, waiter], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            activity.cancel()
            waiter.cancel()
            raise

    def raise_mapped(self, err: FailureError, timeout_type: str, what: str) -> NoReturn:
        mapped = self.mapped(err, timeout_type, what)
        if mapped is err:
            raise err  # unchanged, cause and all (``from`` would rewrite its cause)
        raise mapped from None

    def mapped(self, err: FailureError, timeout_type: str, what: str) -> BaseException:
        """An activity failure as the workflow's next move: a lost trainer (recovery), a
        terminal error, or — kept intact, cause and all, so a cancellation stays
        recognisable — the original failure."""
        if is_cancelled_exception(err):
            return err
        root = root_cause(err)
        kind = getattr(root, "type", None)
        if kind in (policies.TRAINER_LOST, policies.TRAINER_GONE):
            details: Sequence[Any] = getattr(root, "details", ()) or ()
            job = (
                PlatformJob.model_validate(details[0])
                if details and isinstance(details[0], dict)
                else None
            )
            extra = details[1] if len(details) > 1 and isinstance(details[1], dict) else {}
            return Lost(
                kind,
                job,
                getattr(root, "message", str(root)),
                applied_step=extra.get("applied_step"),
            )
        if kind in (policies.TRAINER_BEHIND, policies.ROUTE_RACE_EXHAUSTED):
            return Lost(kind, None, getattr(root, "message", str(root)))
        if isinstance(root, TimeoutError):
            return Terminal(
                Phase.FAILED,
                timeout_type,
                f"{what}: gave up after the declared timeout "
                f"({root.type.name if root.type else 'timeout'})",
            )
        if (
            self.trainer_live
            and isinstance(root, ApplicationError)
            and not root.non_retryable
            and kind not in policies.PERMANENT
        ):
            # Transient errors outlasted the retry policy on a live trainer: a genuine failure,
            # recovered from inside the lifecycle loop (before a trainer exists, it just fails).
            return Lost("TransientErrors", None, f"{what}: {root.message}")
        return err

    def close_recovery_record(self) -> None:
        """The trainer serves again: the last recovery's record (a platform's preemption, or
        the scheduler's) gets how far back the job went and how long it took."""
        if not self.s.recoveries or self.s.recoveries[-1].duration_s is not None:
            return
        record = self.s.recoveries[-1]
        record.resumed_from_step = self.s.step
        record.steps_redone = max(0, record.at_step - self.s.step)
        record.duration_s = (workflow.now() - record.started_at).total_seconds()
        self.publish()

    # ------------------------------------------------------------------ cancellation

    def cancel_seen(self) -> bool:
        """For the lifecycle's waits: a cancel request ends them."""
        return workflow.cancellation_reason() is not None

    def stop_if_cancelled(self) -> None:
        """A cancel request is final: nothing but cleanup is sent after it.

        The SDK delivers a cancel request by cancelling whatever the workflow awaits at that
        moment. When that is an activity the workflow itself is cancelling (a race it just
        decided, a chunk it stops for a pause), the cancel surfaces as that activity's
        cancellation, which the workflow expects and handles, and the request is gone: the
        job went on training (issue 16). So every command the lifecycle sends is preceded by
        this check of the request itself (``workflow.cancellation_reason``), which no await
        can absorb."""
        if workflow.cancellation_reason() is not None:
            raise asyncio.CancelledError("the job was cancelled")

    # ------------------------------------------------------------------ what is shown

    def upsert(self, updates: list[Any]) -> None:
        # Off for namespaces without Shepherd's attributes, where an upsert fails every task.
        if self.visible:
            workflow.upsert_search_attributes(updates)

    def publish_step(self, *, force: bool = False) -> None:
        """The job's step in the job list (``shepherd list``, the Web UI's columns): a
        loop's after each chunk (always: the histories it recorded so), a program's at each
        progress report that moved it."""
        if force or self.published_step != self.s.step:
            self.upsert([sa.STEP.value_set(self.s.step)])
            self.published_step = self.s.step

    def set_phase(self, phase: Phase) -> None:
        now = workflow.now()
        elapsed = (now - self.phase_since).total_seconds()
        self.s.timings[self.s.phase.value] = round(
            self.s.timings.get(self.s.phase.value, 0.0) + elapsed, 3
        )
        self.phase_since = now
        self.stage = phase
        if self.recovering and phase in COMING_UP:
            self.s.stage, phase = phase, Phase.RECOVERING
        else:
            self.recovering = self.recovering and phase is Phase.RECOVERING
            self.s.stage = None
        self.s.phase = phase
        self.publish()

    def publish(self, *, force: bool = False) -> None:
        self.s.updated_at = workflow.now()
        if force or self.published_phase is not self.s.phase:
            self.upsert([sa.PHASE.value_set(self.s.phase.value)])
            self.published_phase = self.s.phase
        workflow.set_current_details(self.s.summary())

    def notice(self, text: str) -> None:
        workflow.logger.warning(text)
        self.s.notices = [*self.s.notices, text[:300]][-MAX_NOTICES:]
        self.publish()

    # ------------------------------------------------------------------ continue-as-new

    def history_long(self) -> bool:
        """Time to continue-as-new (docs/history.md): the history holds
        ``policies.max_history_events`` events or ``HISTORY_BYTES_CAP`` bytes, or the server
        suggests it — unless a pause or a resume waits for its answer (continued once it is
        handled). Every wait of the lifecycle that may last (a slot, a pause, a program, a
        chunk) wakes for it, so a job continues before the server's warning whatever phase
        it is in."""
        if self.pause_requested or self.resume_requested:
            return False
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self.spec.policies.max_history_events
            or info.get_current_history_size() >= policies.HISTORY_BYTES_CAP
        )

    async def maybe_continue_as_new(self) -> None:
        """Start afresh with the state carried over, when :meth:`history_long`."""
        if not self.history_long():
            return
        await workflow.wait_condition(workflow.all_handlers_finished)
        self.s.continued_as_new += 1
        self.set_phase(self.stage)  # close the phase's timing
        workflow.continue_as_new(
            JobInput(
                spec=self.spec,
                parent_workflow_id=self.s.parent_workflow_id,
                carried=self.s,
                report_progress_to=self.report_to,
                carried_flags=CarriedFlags(
                    trainer_live=self.trainer_live,
                    serving=self.serving,
                    shape_version=self.shape_version,
                    to_load=self.to_load,
                    prefix=self.prefix,
                    preemptible=self.preemptible,
                    prune_unsupported=self.prune_unsupported,
                    pauses=self.pauses,
                    event_state=self.event_state,
                    event_message=self.event_message,
                    observed_at=self.observed_at,
                    event_id=self.event_id,
                    session=self.session,
                    recovering=self.recovering,
                    program=self.carry_work(),
                    slot=self.slot,
                ),
            )
        )
