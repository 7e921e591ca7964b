"""``TrainingJob``: the whole life of one training job as one durable workflow.

validate → resolve the shape → create the trainer (id derived from the workflow, so a
retried create finds the same job) → wait for placement, then RUNNING (polling by retries,
raced against platform events pushed as signals) → warm the route up → load a checkpoint
where needed → train in chunks, checkpointing every N steps and tracking the best → on a
trainer death, recover (wait for a resumable state, resume, wait, warm up, reload) → evaluate
→ promote → and **always** delete the trainer, also on failure and cancellation.

Deterministic code only: no I/O, clocks or randomness here; every side effect is an
activity whose timeouts and retries are declared in ``workflows.policies``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import Priority, RawValue
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    FailureError,
    TimeoutError,
    is_cancelled_exception,
)

with workflow.unsafe.imports_passed_through():
    from activities.checkpoints import CheckpointActivities
    from activities.claims import MODEL_CLAIMED, ClaimActivities, ClaimInput
    from activities.preflight import PreflightActivities
    from activities.promotion import PromotionActivities
    from activities.provisioning import ProvisioningActivities
    from activities.readiness import ReadinessActivities
    from activities.recovery import RecoveryActivities
    from activities.training import TrainingActivities
    from shepherd import search_attributes as sa
    from shepherd.curves import add_point
    from shepherd.models import (
        MAX_NOTICES,
        CarriedFlags,
        CheckCheckpointInput,
        CheckpointRecord,
        ChunkResult,
        CreateTrainerInput,
        ErrorInfo,
        EvaluateInput,
        JobInput,
        JobStatus,
        LoopSettings,
        ModelInfo,
        OpenModelInput,
        OpenModelResult,
        PauseRequest,
        PauseResult,
        PlatformEvent,
        PlatformJob,
        PreflightInput,
        PromoteInput,
        PruneCheckpointsInput,
        PublishInput,
        RecoveryRecord,
        ResolveShapeInput,
        ResumeRequest,
        SaveCheckpointInput,
        TrainChunkInput,
        TrainerRef,
        TrainerSession,
        TrialProgress,
        WarmUpInput,
        WarmUpResult,
    )
    from shepherd.phases import Phase
    from shepherd.platform import rules
    from shepherd.spec import JobSpec, SpecError, resolve_templates
    from shepherd.states import JobState
    from shepherd.trainer_ids import trainer_prefix
    from workflows import policies, versions
    from workflows.flow import DEAD as _DEAD
    from workflows.flow import PLACED as _PLACED
    from workflows.flow import RESUMABLE_OR_RUNNING as _RESUMABLE_OR_RUNNING
    from workflows.flow import RUNNING as _RUNNING
    from workflows.flow import BadSignal as _BadSignal
    from workflows.flow import Lost as _Lost
    from workflows.flow import PauseNow as _PauseNow
    from workflows.flow import Terminal as _Terminal
    from workflows.flow import required
    from workflows.policies import ActivityPolicy, Policies
    from workflows.programs import ProgramSeam

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

#: The steps of bringing a trainer up; during a recovery they show as RECOVERING.
_COMING_UP = frozenset({Phase.QUEUED, Phase.SCHEDULING, Phase.PREPARING})
#: A trainer that died with these codes was refused by the platform (its configuration, its
#: data): another trainer would die the same way, so the job fails at once, in its words.
_REFUSED_CODES = {"INVALID_ARGUMENT", "FAILED_PRECONDITION"}
#: Recoveries caused by the infrastructure, paid from the preemption budget.
_INFRA_REASONS = {"preemption", "platform_restart", "idle"}


def classify(job: PlatformJob | None) -> str:
    """Why a trainer died, from the platform's own words."""
    if job is None:
        return "failure"
    state = JobState(job.state)
    message = job.message.lower()
    if state.is_gone():
        return "deleted"
    if state is JobState.IDLE:
        return "idle"
    if "restart" in message:
        return "platform_restart"
    if job.status_code == "UNAVAILABLE" or any(
        w in message for w in ("preempt", "reclaim", "spot")
    ):
        return "preemption"
    if job.status_code in _REFUSED_CODES:
        return "refused"
    return "failure"


def _root(err: BaseException) -> BaseException:
    while isinstance(err, ActivityError) and err.cause is not None:
        err = err.cause
    return err


@workflow.defn(name="TrainingJob")
class TrainingJobWorkflow(ProgramSeam):
    @workflow.init
    def __init__(self, inp: JobInput) -> None:
        self.spec = inp.spec
        self.pol = self._policies(legacy=False)
        #: The run follows the current lifecycle (workflows/versions.py); decided in ``run``.
        self._current = True
        #: A legacy run written by code that had every legacy patch (versions.LAST_LEGACY).
        self._legacy_complete = False
        self.s: JobStatus = inp.carried or JobStatus(
            name=self.spec.name,
            labels=self.spec.labels,
            backend=self.spec.backend,
            total_steps=self.spec.total_steps,
            eval_metric=self.spec.checkpoint.metric,
            parent_workflow_id=inp.parent_workflow_id,
        )
        flags = inp.carried_flags
        self._carried = inp.carried is not None
        self._templated = inp.templated
        self._visible = inp.search_attributes
        self._report_to = inp.report_progress_to
        self._trainer_live = flags.trainer_live
        self._serving = flags.serving
        self._shape_version = flags.shape_version
        self._to_load = flags.to_load
        self._prefix = flags.prefix
        self._preemptible = (
            self.spec.preemptible if flags.preemptible is None else flags.preemptible
        )
        self._prune_unsupported = flags.prune_unsupported
        self._pauses = flags.pauses
        self._event_state = flags.event_state
        self._event_message = ""
        self._event_id = flags.event_id
        #: The model on the live trainer (Tinker API) and its next seq_id; None until opened.
        self._session: TrainerSession | None = flags.session
        #: Platform update time of the freshest state observed by polling; older events are stale.
        self._observed_at: datetime | None = None
        #: The promotion under way (from its request until the model is READY): a cancel
        #: meanwhile takes the model back (``_finish``).
        self._promotion: PromoteInput | None = None
        self._pause_requested = False
        self._resume_requested = False
        self._resume_checkpoint: str | None = None
        #: The resume update already checked its checkpoint.
        self._resume_checked = False
        self._phase_since = workflow.now()
        self._published_phase: Phase | None = None
        #: What the lifecycle is doing; the public phase differs only while recovering.
        self._stage: Phase = self.s.phase
        #: A recovery is bringing the trainer back: its QUEUED/SCHEDULING/PREPARING show as
        #: RECOVERING (with the step in ``status.stage``), since that is what the user waits for.
        self._recovering = False
        self._queue = self.spec.scheduling.queue
        # spec priority 10 (most urgent) .. 0 -> Temporal priority key 1 .. 5 (lower runs first)
        self._priority = Priority(priority_key=5 - round(self.spec.scheduling.priority * 4 / 10))

    def _policies(self, *, legacy: bool) -> Policies:
        return Policies.for_spec(
            self.spec.policies,
            chunk_steps=self.spec.steps_per_chunk,
            legacy=legacy,
            checkpoint_every=self.spec.checkpoint.every_steps,
            max_runtime=self.spec.scheduling.max_runtime,
        )

    # ================================================================== run

    @workflow.run
    async def run(self, inp: JobInput) -> JobStatus:
        # First of all, in the run's first workflow task: which lifecycle this run follows.
        self._current = workflow.patched(versions.REPLAY_SAFE)
        if not self._current:
            self.pol = self._policies(legacy=True)
        info = workflow.info()
        self.s.workflow_id = info.workflow_id
        if self.s.started_at is None:
            self.s.started_at = workflow.now()
        if self._prefix is None:
            self._prefix = trainer_prefix(
                self.spec.name,
                info.workflow_id,
                info.run_id,
                # The event bridge finds the workflow from such an id, without visibility.
                owner_in_id=self._current or workflow.patched("trainer-id-names-its-workflow"),
            )
        if not self._carried:
            updates = [
                sa.JOB_NAME.value_set(self.spec.name),
                sa.LABELS.value_set(self.spec.label_keywords()),
            ]
            if inp.parent_workflow_id:
                updates.append(sa.PARENT.value_set(inp.parent_workflow_id))
            self._upsert(updates)
        self._publish(force=True)
        try:
            await self._with_deadline(self._lifecycle)
        except (asyncio.CancelledError, ActivityError) as err:
            # A cancel request reaches an awaited activity as ActivityError(CancelledError).
            if not is_cancelled_exception(err):
                root = _root(err)
                error = ErrorInfo(
                    type=getattr(root, "type", None) or type(root).__name__,
                    message=getattr(root, "message", None) or str(root),
                )
                await self._finish(Phase.FAILED, error)
                raise ApplicationError(error.message, type=error.type, non_retryable=True) from None
            await self._finish(Phase.CANCELLED, None)
            raise
        except _Terminal as t:
            await self._finish(t.phase, ErrorInfo(type=t.type, message=t.message))
            raise ApplicationError(t.message, type=t.type, non_retryable=True) from None
        except ApplicationError as err:
            # A local activity's own failure (see _act): the job fails as for any other.
            if not self._adopted(versions.LOCAL_FAILURES_HANDLED):
                raise
            error = ErrorInfo(type=err.type or "ApplicationError", message=err.message)
            await self._finish(Phase.FAILED, error)
            raise ApplicationError(error.message, type=error.type, non_retryable=True) from None
        await self._finish(Phase.COMPLETED, None)
        return self.s

    async def _with_deadline(self, body: Callable[[], Awaitable[None]]) -> None:
        limit = self.spec.scheduling.max_runtime
        if limit is None:
            await body()
            return
        started = required(self.s.started_at, "the job's start time")
        remaining = limit - (workflow.now() - started)
        main = asyncio.ensure_future(body())
        timer = asyncio.ensure_future(
            workflow.sleep(max(remaining, timedelta(seconds=1)), summary="max runtime")
        )
        try:
            done, _ = await workflow.wait([main, timer], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # The workflow's cancel hits this coroutine only; stop the lifecycle too.
            timer.cancel()
            main.cancel()
            await workflow.wait([main])
            raise
        if main in done:
            timer.cancel()
            main.result()
            return
        main.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await main
        self._stop_if_cancelled()  # a cancel request while the lifecycle stopped is the outcome
        raise _Terminal(
            Phase.FAILED,
            "MaxRuntimeExceeded",
            f"the job ran longer than scheduling.max_runtime ({limit})",
        )

    async def _lifecycle(self) -> None:
        if not self._carried:
            if self._templated:
                self._fill_templates()
                if await self._patched("claim-templated-model-id"):
                    await self._claim_model()
            if self._adopted(versions.PREFLIGHT):
                await self._preflight()
            if self.spec.trainer.training_shape and self._shape_version is None:
                shape = await self._act(
                    ProvisioningActivities.resolve_shape,
                    ResolveShapeInput(
                        backend=self.spec.backend, shape=self.spec.trainer.training_shape
                    ),
                    self.pol.lookup,
                    "resolve the training shape",
                )
                self._shape_version = shape.version
            if self.spec.training.resume_from and not self.s.checkpoints:
                self._to_load = self.spec.training.resume_from
                checks = await self._patched("check-checkpoint-before-provisioning")
                if checks and (problem := await self._checkpoint_problem(self._to_load)):
                    raise _Terminal(
                        Phase.FAILED, "InvalidCheckpoint", f"training.resume_from: {problem}"
                    )
            if self.spec.output.promote != "none" and await self._patched(
                "check-model-before-provisioning"
            ):
                await self._check_model_free()
        lost: _Lost | None = None
        while True:
            self._stop_if_cancelled()
            try:
                if lost is not None:
                    current, lost = lost, None
                    await self._recover(current)
                if self._pause_requested:
                    await self._pause()
                if not self._trainer_live:
                    await self._provision()
                # The one seam: what runs while a trainer is held.
                if self.spec.training.program is not None:
                    await self._run_program()
                else:
                    await self._train()
                break
            except _Lost as exc:
                lost = exc
            except _PauseNow:
                continue
        await self._final_evaluation()
        await self._promote()
        if self.spec.output.hot_load_deployment and self._adopted(versions.PUBLISHES):
            await self._publish_to_deployment()

    async def _preflight(self) -> None:
        """What only a worker can check (the loop, the metric it reports, the dataset,
        the base model), before anything is provisioned: a failure ends the job here,
        naming every field (activities/preflight.py)."""
        c, tr = self.spec.checkpoint, self.spec.training
        program = tr.program is not None
        await self._act(
            PreflightActivities.preflight,
            PreflightInput(
                backend=self.spec.backend,
                base_model=self.spec.trainer.base_model,
                # A program's job: the program (and its arguments) instead of the loop, the
                # metric and the dataset (a program reads its own data).
                loop=None if program else tr.loop,
                program=tr.program,
                args=dict(tr.args),
                metric=None if program or not c.evaluate else c.metric,
                dataset=None if program else tr.dataset,
                validation_split=tr.validation_split,
                deployments={
                    field: name
                    for field, name in (
                        ("trainer.hot_load_deployment", self.spec.trainer.hot_load_deployment),
                        ("output.hot_load_deployment", self.spec.output.hot_load_deployment),
                    )
                    if name
                },
            ),
            self.pol.lookup,
            "preflight: loop, metric, dataset, base model",
        )

    def _fill_templates(self) -> None:
        """A scheduled run: fill the spec's templates with this run's scheduled time."""
        info = workflow.info()
        when = info.typed_search_attributes.get(sa.SCHEDULED_START) or info.start_time
        try:
            self.spec = resolve_templates(self.spec, when, strict=False)
        except SpecError as exc:
            raise _Terminal(Phase.FAILED, "InvalidSpec", str(exc)) from None
        self._templated = False
        self.s.labels = self.spec.labels
        self._upsert([sa.LABELS.value_set(self.spec.label_keywords())])

    async def _claim_model(self) -> None:
        """A scheduled run's model id is known only now: claim it as a submission would,
        before anything is provisioned, so a second live job with the same id fails here and
        not at promotion. Set after the check (under the claim lock, see activities/claims.py),
        so that of two runs starting together one wins."""
        model_id = self.spec.output.model_id
        if self.spec.output.promote == "none" or not model_id or not self._visible:
            return  # nothing is promoted, or no search attributes to claim with
        try:
            lock = await self._act(
                ClaimActivities.take_model_claim,
                ClaimInput(model_id=model_id),
                self.pol.lookup,
                f"claim output model {model_id}",
            )
        except ActivityError as err:
            root = _root(err)
            if getattr(root, "type", None) == MODEL_CLAIMED:
                raise _Terminal(
                    Phase.FAILED, MODEL_CLAIMED, getattr(root, "message", str(root))
                ) from None
            raise
        self._upsert([sa.OUTPUT_MODEL.value_set(model_id)])
        await self._act(
            ClaimActivities.settle_model_claim, lock, self.pol.lookup, "publish the model claim"
        )

    # ====================================================== provisioning

    def _ref(self) -> TrainerRef:
        trainer = required(self.s.trainer_job_id, "the trainer's id")
        return TrainerRef(backend=self.spec.backend, trainer_job_id=trainer)

    async def _provision(self) -> None:
        """A new trainer job (a new id: deleted ids are never reused), ready to train."""
        self.s.generation = 0 if self.s.trainer_job_id is None else self.s.generation + 1
        self.s.trainer_job_id = f"{self._prefix}-g{self.s.generation}"
        self._event_state, self._observed_at, self._serving = None, None, False
        self._session = None
        self._upsert([sa.TRAINER_JOB_ID.value_set(self.s.trainer_job_id)])
        self._set_phase(Phase.QUEUED)
        t = self.spec.trainer
        policy = self.pol.create_trainer
        if not self._current and await self._patched(versions.LAST_LEGACY):
            policy = dataclasses.replace(policy, local=True)  # as it ran then
            self._legacy_complete = True
        if self._current:
            # From the create request on, the trainer may exist: a cancel waits for the
            # create to end and cleanup deletes the id (a trainer created after its delete
            # would be nobody's).
            self._trainer_live = True
        job = await self._act(
            ProvisioningActivities.create_trainer,
            CreateTrainerInput(
                backend=self.spec.backend,
                trainer_job_id=self.s.trainer_job_id,
                trainer=t,
                shape_version=self._shape_version,
                seed=self.spec.training.seed,
                preemptible=self._preemptible,
                display_name=(t.display_name or self.s.workflow_id)[: rules.MAX_DISPLAY_NAME_LEN],
            ),
            policy,
            f"create trainer {self.s.trainer_job_id}",
            wait_for_cancel=self._current,
        )
        self._trainer_live = True  # from here on, cleanup must delete it
        self._observe(job)
        await self._come_up()

    async def _come_up(self) -> None:
        """From a created or resumed job to a warmed-up trainer at the right step."""
        await self._await_state(
            ReadinessActivities.wait_for_placement,
            _PLACED,
            self.pol.wait_placement,
            "PendingTimeout",
            "placement",
        )
        self._set_phase(Phase.SCHEDULING)
        await self._await_state(
            ReadinessActivities.wait_for_running,
            _RUNNING,
            self.pol.wait_running,
            "ReadyTimeout",
            "RUNNING",
        )
        self._set_phase(Phase.PREPARING)
        self._session = None  # a (re)started trainer holds no model
        if self.spec.training.program is not None:
            # The program's proxy opens (or restores) its model once it is handed the
            # trainer (workflows/programs.py); the route is warmed up for it here.
            warm: WarmUpResult = await self._act(
                ReadinessActivities.warm_up,
                WarmUpInput(
                    backend=self.spec.backend,
                    trainer_job_id=self._ref().trainer_job_id,
                    probes=self.pol.warmup_probes,
                ),
                self.pol.warm_up,
                f"warm up the route ({self.pol.warmup_probes} probes)",
                timeout_type="WarmUpTimeout",
            )
            self.s.route_races += warm.route_races
            self._serving = True
            self._to_load = None
            self._publish()
            return
        t = self.spec.trainer
        model = OpenModelInput(
            backend=self.spec.backend,
            trainer_job_id=self._ref().trainer_job_id,
            base_model=t.base_model,
            lora_rank=t.lora_rank,
            seed=self.spec.training.seed,
            checkpoint=self._to_load,
            call_timeout_s=self._call_timeout_s(),
        )
        opening = (
            f"load {self._to_load.rsplit('/', 1)[-1]}" if self._to_load else "create the model"
        )
        if self._current:
            # One activity: open the model (it needs no warm route: it re-sends a request
            # after a route 404, so it runs while the route propagates), then the warm-up
            # probes (after its calls, so consecutive probes prove every replica).
            model.warm_up_probes = self.pol.warmup_probes
            opened = await self._act(
                TrainingActivities.open_model,
                model,
                self.pol.open_model,
                f"{opening}, warm up the route ({self.pol.warmup_probes} probes)",
                timeout_type="WarmUpTimeout",
            )
            self.s.route_races += opened.route_races
        else:
            opened = await self._legacy_open_and_warm_up(model, opening)
        self._session = opened.session
        self._serving = True
        self.s.step = opened.step
        self._to_load = None
        self._publish()

    async def _legacy_open_and_warm_up(
        self, model: OpenModelInput, opening: str
    ) -> OpenModelResult:
        """Legacy runs: the model and the warm-up as two local activities, in the order the
        run's patch says."""
        warm_up = functools.partial(
            self._act,
            ReadinessActivities.warm_up,
            WarmUpInput(
                backend=self.spec.backend,
                trainer_job_id=self._ref().trainer_job_id,
                probes=self.pol.warmup_probes,
            ),
            self.pol.warm_up,
            f"warm up the route ({self.pol.warmup_probes} probes)",
            timeout_type="WarmUpTimeout",
        )
        open_model = functools.partial(
            self._act, TrainingActivities.open_model, model, self.pol.open_model, opening
        )
        if await self._patched("open-model-before-warm-up"):
            opened = await open_model()
            warm = await warm_up()
        else:
            warm = await warm_up()
            opened = await open_model()
        self.s.route_races += warm.route_races + opened.route_races
        return opened

    def _call_timeout_s(self) -> float:
        return self.pol.step_timeout.total_seconds()

    def _loop_settings(self) -> LoopSettings:
        tr = self.spec.training
        return LoopSettings(
            loop=tr.loop,
            dataset=tr.dataset,
            batch_size=tr.batch_size,
            micro_batches=tr.micro_batches,
            seed=tr.seed,
            learning_rate=self.spec.trainer.learning_rate,
            max_context_length=self.spec.trainer.max_context_length
            or policies.DEFAULT_MAX_CONTEXT_LENGTH,
            validation_split=tr.validation_split,
            total_steps=self.spec.total_steps,
        )

    def _model(self) -> TrainerSession:
        return required(self._session, "the model open on the trainer")

    async def _await_state(
        self,
        poll: Callable[[Any, TrainerRef], Awaitable[PlatformJob]],
        targets: set[str],
        policy: ActivityPolicy,
        timeout_type: str,
        what: str,
        *,
        death_is_loss: bool = True,
    ) -> PlatformJob | None:
        """Wait for the trainer to reach ``targets``: a polling activity (retries are the
        poll interval) raced against platform events, whichever knows first."""
        if self._event_state in targets:
            return None

        def event_says() -> bool:
            if self._cancel_seen():
                return True
            if self._pause_requested and self._stage is not Phase.RECOVERING:
                return True
            if self._event_state in targets:
                return True
            return death_is_loss and self._event_state in _DEAD

        self._stop_if_cancelled()
        options = await self._options(policy)
        handle = workflow.start_activity_method(
            poll, self._ref(), **options, summary=f"wait for {what}"
        )
        waiter = asyncio.ensure_future(workflow.wait_condition(event_says))
        await self._race(handle, waiter)
        if handle.done():
            waiter.cancel()
            try:
                job = handle.result()
            except ActivityError as err:
                self._raise_mapped(err, timeout_type, what)
            self._observe(job)
            return job
        handle.cancel()
        with contextlib.suppress(ActivityError):
            await handle
        # The poll's cancellation is expected; a cancel request meanwhile surfaces as it.
        self._stop_if_cancelled()
        if self._pause_requested and self._stage is not Phase.RECOVERING:
            raise _PauseNow()
        if self._event_state in targets:
            return None
        raise self._death_event()

    # ========================================================== training

    async def _train(self) -> None:
        total = self.spec.total_steps
        every = self.spec.checkpoint.every_steps
        chunk = self.spec.steps_per_chunk
        while self.s.step < total:
            if self._pause_requested:
                raise _PauseNow()
            next_checkpoint = (self.s.step // every + 1) * every
            first, last = self.s.step + 1, min(self.s.step + chunk, next_checkpoint, total)
            self._set_phase(Phase.TRAINING)
            result = await self._run_chunk(first, last)
            self.s.step = result.last_step
            if result.last_loss is not None:
                self.s.last_loss = result.last_loss
            loss = result.mean_loss if result.mean_loss is not None else result.last_loss
            if loss is not None:
                add_point(self.s.loss_curve, result.last_step, loss)
            self.s.route_races += result.route_races
            self._upsert([sa.STEP.value_set(self.s.step)])
            self._publish()
            if last % every == 0 or last == total:
                await self._checkpoint(f"step-{last:08d}")
            await self._maybe_continue_as_new()

    def _death_event(self) -> _Lost:
        job = PlatformJob(
            trainer_job_id=self._ref().trainer_job_id,
            state=self._event_state or "",
            message=self._event_message,
        )
        kind = policies.TRAINER_GONE if JobState(job.state).is_gone() else policies.TRAINER_LOST
        said = f": {job.message}" if job.message else ""
        return _Lost(kind, job, f"platform event: {job.state}{said}")

    async def _run_chunk(self, first: int, last: int) -> ChunkResult:
        # Reacting to a death event mid-chunk is newer than some running workflows.
        watch_deaths = await self._patched("chunk-stops-on-death-event")

        def died() -> bool:
            return watch_deaths and self._event_state in _DEAD

        if died():
            raise self._death_event()  # known dead: do not even schedule the chunk
        self._stop_if_cancelled()
        options = await self._options(self.pol.train_chunk)
        handle = workflow.start_activity_method(
            TrainingActivities.train_chunk,
            TrainChunkInput(
                backend=self.spec.backend,
                trainer_job_id=self._ref().trainer_job_id,
                base_model=self.spec.trainer.base_model,
                session=self._model(),
                first_step=first,
                last_step=last,
                settings=self._loop_settings(),
                route_race_retries=self.pol.route_race_retries,
                route_race_window_s=self.pol.route_race_window.total_seconds(),
                step_timeout_s=self.pol.step_timeout.total_seconds(),
            ),
            **options,
            # A pause stops the chunk at a step boundary before the checkpoint is taken.
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"train steps {first}-{last}",
        )
        # A pause, or the platform's word that the trainer died, stops the chunk early.
        stop = asyncio.ensure_future(
            workflow.wait_condition(lambda: self._pause_requested or died() or self._cancel_seen())
        )
        await self._race(handle, stop)
        if not handle.done() and died() and await self._patched("chunk-reports-its-own-death"):
            # Let the chunk see the death itself: a running attempt stops at once, one
            # between retries starts and meets the dead route; either reports the exact
            # step reached (a cancel between attempts carries no progress).
            with contextlib.suppress(asyncio.TimeoutError):
                await workflow.wait_condition(
                    lambda: handle.done(), timeout=policies.CHUNK_DEATH_REPORT_GRACE
                )
        if not handle.done():
            handle.cancel()
        else:
            stop.cancel()
        try:
            result = await handle
        except ActivityError as err:
            # A cancel request surfaces here as the chunk's own cancellation (when we were
            # stopping the chunk anyway): it is the job's cancel, not a pause or a death.
            self._stop_if_cancelled()
            # A cancel we asked for (the activity was between attempts, so no partial result).
            if is_cancelled_exception(err) and self._pause_requested:
                raise _PauseNow() from None
            if is_cancelled_exception(err) and died():
                # Cancelled between attempts: the last attempt's heartbeat (carried by the
                # cancellation) says how far the dead trainer got.
                lost = self._death_event()
                lost.applied_step = self._heartbeat_step(err)
                raise lost from None
            self._raise_mapped(err, "ChunkTimeout", "training")
        self._model().next_seq = result.next_seq
        if not result.partial:
            return result
        self.s.step = max(self.s.step, result.last_step)
        self._stop_if_cancelled()  # the chunk stopped for the job's cancel
        if died():
            lost = self._death_event()
            lost.applied_step = result.last_step
            raise lost
        raise _PauseNow()

    def _heartbeat_step(self, err: ActivityError) -> int | None:
        """The step in the last heartbeat of a cancelled chunk (for this model), if any."""
        details = getattr(err.cause, "details", None) or ()
        beat = details[0] if details and isinstance(details[0], dict) else {}
        if beat.get("model_id") != self._model().model_id:
            return None
        step = beat.get("step")
        return step if isinstance(step, int) else None

    async def _checkpoint(self, name: str, *, evaluate: bool | None = None) -> CheckpointRecord:
        self._set_phase(Phase.CHECKPOINTING)
        saved = await self._act(
            CheckpointActivities.save_checkpoint,
            SaveCheckpointInput(
                backend=self.spec.backend,
                trainer_job_id=self._ref().trainer_job_id,
                base_model=self.spec.trainer.base_model,
                session=self._model(),
                name=name,
                step=self.s.step,
                call_timeout_s=self._call_timeout_s(),
            ),
            self.pol.data_plane_call,
            f"save checkpoint {name}",
        )
        self._model().next_seq = saved.next_seq
        record = saved.record
        record.saved_at = workflow.now()
        if self.spec.checkpoint.evaluate if evaluate is None else evaluate:
            record.metric = await self._evaluate()
            best = self.s.best
            better = (
                best is None
                or best.metric is None
                or (
                    record.metric < best.metric
                    if self.spec.checkpoint.mode == "min"
                    else record.metric > best.metric
                )
            )
            if better:
                self.s.best = record
            if self._report_to:
                await self._report(record)
        self.s.checkpoints = [c for c in self.s.checkpoints if c.name != record.name] + [record]
        self.s.checkpoints.sort(key=lambda c: (c.step, c.saved_at or workflow.now()))
        await self._prune()
        self._publish()
        return record

    async def _report(self, record: CheckpointRecord) -> None:
        """Best effort: a sweep that is gone must not fail its trial."""
        if not self._report_to or record.metric is None:
            return
        self._stop_if_cancelled()
        try:
            await workflow.get_external_workflow_handle(self._report_to).signal(
                "trial_progress",
                TrialProgress(
                    workflow_id=self.s.workflow_id, step=record.step, metric=record.metric
                ),
            )
        except FailureError as exc:
            workflow.logger.warning("progress report to %s failed: %s", self._report_to, exc)

    async def _evaluate(self) -> float:
        result = await self._act(
            TrainingActivities.evaluate,
            EvaluateInput(
                backend=self.spec.backend,
                trainer_job_id=self._ref().trainer_job_id,
                base_model=self.spec.trainer.base_model,
                session=self._model(),
                step=self.s.step,
                settings=self._loop_settings(),
                call_timeout_s=self._call_timeout_s(),
            ),
            self.pol.data_plane_call,
            "evaluate",
        )
        self._model().next_seq = result.next_seq
        metric = self.spec.checkpoint.metric
        if metric not in result.metrics:
            raise _Terminal(
                Phase.FAILED,
                policies.METRIC_MISSING,
                f"checkpoint.metric: the trainer's evaluation reports {sorted(result.metrics)}, not {metric!r}",
            )
        self.s.eval_value = result.metrics[metric]
        add_point(self.s.eval_curve, self.s.step, self.s.eval_value)
        return result.metrics[metric]

    async def _prune(self) -> None:
        """Keep the last K checkpoints, the best and the one a pause saved."""
        if self._prune_unsupported:
            return
        keep = {c.name for c in self.s.checkpoints[-self.spec.checkpoint.keep_last :]}
        keep |= {c.name for c in (self.s.best,) if c} | {
            n
            for n in (self.s.paused_checkpoint, self._to_load, self._program_restore_point)
            if n
        }
        doomed = [c for c in self.s.checkpoints if c.name not in keep]
        if not doomed:
            return
        names = [n for c in doomed for n in (c.name, c.sampler) if n]
        result = await self._act(
            CheckpointActivities.prune_checkpoints,
            PruneCheckpointsInput(backend=self.spec.backend, checkpoints=names),
            self.pol.prune,
            f"prune {len(doomed)} old checkpoint(s)",
        )
        self._prune_unsupported = result.unsupported
        gone = set(result.deleted)
        self.s.checkpoints = [c for c in self.s.checkpoints if c.name not in gone]

    # ========================================================== recovery

    async def _recover(self, lost: _Lost) -> None:
        job = lost.job
        at_step = max(self.s.step, lost.applied_step or 0)
        reason = "deleted" if lost.kind == policies.TRAINER_GONE else classify(job)
        if lost.kind not in (policies.TRAINER_LOST, policies.TRAINER_GONE):
            reason = "failure"
        if reason == "refused" and await self._patched("refused-trainer-fails-at-once"):
            raise _Terminal(
                Phase.FAILED,
                "TrainerRefused",
                f"trainer {self.s.trainer_job_id} failed for a reason a new one would meet "
                f"again: {job.message if job else lost.detail}",
            )
        if reason == "deleted":
            self._trainer_live = False
            raise _Terminal(
                Phase.FAILED,
                "TrainerDeleted",
                f"trainer {self.s.trainer_job_id} was deleted outside Shepherd ({job.state if job else '?'})",
            )
        if reason in _INFRA_REASONS:
            # A platform restart is no preemption (and no reason to leave spot capacity);
            # it is paid from the same infrastructure budget.
            if reason == "platform_restart" and self._adopted(versions.RESTARTS_APART):
                self.s.platform_restarts += 1
            else:
                self.s.preemptions += 1
            infra = self.s.preemptions + self.s.platform_restarts
            if infra > self.pol.max_preemptions:
                restarts = self.s.platform_restarts
                raise _Terminal(
                    Phase.PREEMPTED,
                    "PreemptionBudgetExhausted",
                    f"{self.s.preemptions} preemptions"
                    + (f" and {restarts} platform restarts" if restarts else "")
                    + f" exceed policies.max_preemptions ({self.pol.max_preemptions}); "
                    f"retry from checkpoint {self._recovery_checkpoint() or '(none)'}",
                )
        else:
            self.s.failures += 1
            if self.s.failures > self.pol.max_failures:
                raise _Terminal(
                    Phase.FAILED,
                    "TrainerFailed",
                    f"{self.s.failures} trainer failures exceed policies.max_failures ({self.pol.max_failures}); last: {lost.detail}",
                )
        started = workflow.now()
        record = RecoveryRecord(
            number=len(self.s.recoveries) + 1,
            reason=reason,
            platform_state=job.state if job else "",
            message=(job.message if job and job.message else lost.detail)[:500],
            at_step=at_step,
            started_at=started,
        )
        self.s.recoveries.append(record)
        self._serving = False
        self._session = None
        if job is not None and job.trainer_job_id == self.s.trainer_job_id:
            self._observe(job)
        else:
            self._event_state = None  # unknown: ask the platform, do not trust an old event
        self._set_phase(Phase.RECOVERING)
        self._recovering = await self._patched("phase-stays-recovering")
        self._to_load = self._recovery_checkpoint()
        fallback = self.pol.fallback_to_on_demand_after
        if self._preemptible and fallback is not None and self.s.preemptions >= fallback:
            # Keep getting reclaimed: continue on a non-preemptible trainer instead.
            record.action = "new-trainer"
            await self._delete_trainer()
            self._preemptible = False
            await self._provision()
        else:
            state = await self._await_state(
                ReadinessActivities.wait_for_resumable,
                _RESUMABLE_OR_RUNNING,
                self.pol.wait_resumable,
                "RecoveryTimeout",
                "a resumable state",
                death_is_loss=False,
            )
            current = state.state if state else self._event_state
            if current != JobState.RUNNING.value:
                resumed = await self._act(
                    RecoveryActivities.resume_trainer,
                    self._ref(),
                    self.pol.resume_trainer,
                    "resume the trainer",
                )
                self._observe(resumed)
            if self._recovering:  # (only the stage changes: no command)
                self._set_phase(Phase.QUEUED)
            await self._come_up()
        self._recovering = False
        record.resumed_from_step = self.s.step
        record.steps_redone = max(0, at_step - self.s.step)
        record.duration_s = (workflow.now() - started).total_seconds()
        self._publish()

    def _recovery_checkpoint(self) -> str | None:
        if self.spec.checkpoint.resume_from == "best" and self.s.best:
            return self.s.best.name
        if self.s.checkpoints:
            return max(self.s.checkpoints, key=lambda c: c.step).name
        return self.spec.training.resume_from

    # ============================================================ pausing

    async def _pause(self) -> None:
        self._pauses += 1
        if self.spec.training.program is not None:
            record = await self._program_checkpoint() if self._serving else None
            self.s.paused_checkpoint = record.name if record else self._recovery_checkpoint()
            if record:
                self.s.step = record.step
        elif self._trainer_live and self._serving:
            try:
                record = await self._checkpoint(f"pause-{self._pauses}", evaluate=False)
                self.s.step = record.step
                self.s.paused_checkpoint = record.name
            except _Lost:
                self.s.paused_checkpoint = self._recovery_checkpoint()
        else:
            self.s.paused_checkpoint = self._recovery_checkpoint()
        self._to_load = self.s.paused_checkpoint
        await self._delete_trainer()  # no GPU is held while paused
        self._pause_requested = False
        self._set_phase(Phase.PAUSED)
        checks = await self._patched("check-resume-checkpoint")
        while True:
            await workflow.wait_condition(lambda: self._resume_requested or self._cancel_seen())
            self._stop_if_cancelled()
            chosen, self._resume_checkpoint = self._resume_checkpoint, None
            # A resume by signal has no answer: a bad checkpoint keeps the job PAUSED and
            # says why in its status (the resume update answered already, when it checked).
            unchecked = chosen and checks and not self._resume_checked
            if unchecked and (problem := await self._checkpoint_problem(chosen or "")):
                self._resume_requested = False
                self._notice(f"resume refused: {problem}")
                continue
            self._resume_requested = self._resume_checked = False
            if chosen:
                self._to_load = chosen
            return

    # ====================================================== the finish

    async def _final_evaluation(self) -> None:
        self._set_phase(Phase.EVALUATING)
        last = self.s.last_checkpoint
        # A program evaluates itself; its final checkpoint carries its last training loss.
        program = self.spec.training.program is not None
        if not program and not (last and last.step == self.s.step and last.metric is not None):
            await self._evaluate()
        # The checkpoint is all promotion needs: give the GPUs back now.
        await self._delete_trainer()

    async def _promote(self) -> None:
        output = self.spec.output
        if output.promote == "none":
            return
        chosen = self.s.best if output.promote == "best" else self.s.last_checkpoint
        if chosen is None:
            program = self.spec.training.program
            raise _Terminal(
                Phase.FAILED,
                policies.NO_CHECKPOINT,
                f"output.promote: {output.promote!r}, but the job has no checkpoint to promote"
                + (
                    f" (program {program!r} made no model: set output.promote to 'none' for "
                    "a program that trains nothing)"
                    if program
                    else ""
                ),
            )
        model_id = required(output.model_id, "output.model_id")
        self._set_phase(Phase.EXPORTING)
        request = PromoteInput(
            backend=self.spec.backend,
            trainer_job_id=chosen.trainer_job_id,
            # The promotable (sampler) twin of the chosen checkpoint, as hosted trainers need.
            checkpoint=chosen.sampler or chosen.name,
            model_id=model_id,
            base_model=self.spec.trainer.base_model,
        )
        if self._current:
            self._promotion = request
        # A cancel waits for the promote call to end, so that taking the model back comes
        # after it: a promotion the platform finishes later would bring the model back.
        model: ModelInfo = await self._act(
            PromotionActivities.promote_checkpoint,
            request,
            self.pol.promote,
            f"promote {chosen.name.rsplit('/', 1)[-1]}",
            wait_for_cancel=self._current,
        )
        if model.state != "READY":
            model = await self._act(
                PromotionActivities.wait_for_model,
                request,
                self.pol.wait_model,
                "wait for the model",
            )
        self._promotion = None
        self.s.model = model
        self._upsert([sa.MODEL.value_set(model.name)])

    async def _publish_to_deployment(self) -> None:
        """Serve the job's result: hot-load the promoted checkpoint (or, promoting none, the
        best or last) onto ``output.hot_load_deployment``."""
        deployment = required(self.spec.output.hot_load_deployment, "the deployment to publish to")
        output = self.spec.output
        chosen = self.s.best if output.promote == "best" else self.s.last_checkpoint
        chosen = chosen or self.s.best or self.s.last_checkpoint
        if chosen is None:
            return
        self.s.deployment = await self._act(
            PromotionActivities.publish_to_deployment,
            PublishInput(
                backend=self.spec.backend,
                deployment=deployment,
                checkpoint=chosen.sampler or chosen.name,
                base_model=self.spec.trainer.base_model,
            ),
            self.pol.publish,
            f"hot-load {chosen.name.rsplit('/', 1)[-1]} onto {deployment}",
        )
        self._publish()

    async def _checkpoint_problem(self, checkpoint: str) -> str | None:
        """Why a trainer of this job cannot start from ``checkpoint`` (None: it can)."""
        t = self.spec.trainer
        checked = await self._act(
            CheckpointActivities.check_checkpoint,
            CheckCheckpointInput(
                backend=self.spec.backend,
                checkpoint=checkpoint,
                base_model=t.base_model,
                lora_rank=t.lora_rank,
            ),
            self.pol.lookup,
            f"check checkpoint {checkpoint.rsplit('/', 1)[-1]}",
        )
        return checked.problem

    async def _check_model_free(self) -> None:
        """A taken output model id fails the job before any GPU is spent on it."""
        required(self.spec.output.model_id, "output.model_id")
        probe = PromoteInput(
            backend=self.spec.backend,
            trainer_job_id="",
            checkpoint="",
            model_id=self.spec.output.model_id,
            base_model=self.spec.trainer.base_model,
        )
        try:
            await self._act(
                PromotionActivities.check_model_free,
                probe,
                self.pol.lookup,
                "check the output model id",
            )
        except ActivityError as err:
            if getattr(_root(err), "type", None) == policies.MODEL_EXISTS:
                raise _Terminal(
                    Phase.FAILED, policies.MODEL_EXISTS, getattr(_root(err), "message", "")
                ) from None
            raise

    async def _delete_trainer(self) -> None:
        if not self._trainer_live or self.s.trainer_job_id is None:
            return
        self.s.cleanup = "deleting"
        deleted = await self._act(
            ProvisioningActivities.delete_trainer,
            self._ref(),
            self.pol.delete_trainer,
            "delete the trainer",
            cleanup=True,
        )
        if deleted is not None:
            self._observe(deleted)
        self._trainer_live = self._serving = False
        self._session = None
        self.s.cleanup = "done"

    async def _finish(self, phase: Phase, error: ErrorInfo | None) -> None:
        """Always give the trainer back, then record the outcome. A failing cleanup is
        reported on its own and never replaces the job's outcome."""
        self.s.error = error
        try:
            await self._stop_program()  # before its trainer goes (it would only meet errors)
            await self._delete_trainer()
            if phase is Phase.CANCELLED and self._promotion is not None:
                await self._act(
                    PromotionActivities.retract_model,
                    self._promotion,
                    self.pol.retract_model,
                    "take the promoted model back",
                    cleanup=True,
                )
        except ActivityError as err:
            self.s.cleanup = f"failed: {getattr(_root(err), 'message', str(err))}"
        if self.s.cleanup == "pending":
            self.s.cleanup = "done"
        self._set_phase(phase)

    # =========================================================== helpers

    def _upsert(self, updates: list[Any]) -> None:
        # Off for namespaces without Shepherd's attributes, where an upsert fails every task.
        if self._visible:
            workflow.upsert_search_attributes(updates)

    @staticmethod
    async def _race(activity: asyncio.Task[Any], waiter: asyncio.Task[Any]) -> None:
        """Wait for whichever finishes first. A workflow cancel arriving meanwhile cancels
        both, so no activity keeps working for a job that is being cleaned up."""
        try:
            await workflow.wait([activity, waiter], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            activity.cancel()
            waiter.cancel()
            raise

    async def _options(self, policy: ActivityPolicy) -> dict[str, Any]:
        queue = self._queue
        if policy.waits and await self._patched("polls-on-the-waits-queue"):
            queue = policies.waits_queue(queue or workflow.info().task_queue)
        return {**policy.options(), "task_queue": queue, "priority": self._priority}

    async def _act(
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
            self._stop_if_cancelled()
        try:
            if policy.local:  # legacy runs only (workflows/versions.py)
                return await workflow.execute_local_activity_method(
                    fn, arg, **policy.options(), summary=summary
                )
            options = await self._options(policy)
            if wait_for_cancel:
                options["cancellation_type"] = (
                    workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
                )
            return await workflow.execute_activity_method(fn, arg, **options, summary=summary)
        except ActivityError as err:
            self._raise_mapped(err, timeout_type, summary)
        except ApplicationError as err:
            # A local activity's failure reaches the workflow as the activity's own
            # ApplicationError, not wrapped in an ActivityError (temporalio 1.35): it used to
            # pass every handler below, so the job failed with its phase never set and no
            # cleanup run (a refused create showed QUEUED for ever; a failed open_model
            # leaked its trainer).
            if not (policy.local and self._adopted(versions.LOCAL_FAILURES_HANDLED)):
                raise
            self._raise_mapped(err, timeout_type, summary)

    async def _patched(self, patch_id: str) -> bool:
        """A patch of the code before the current lifecycle (versions.LEGACY_PATCHES):
        applied in every current run; in a legacy run, decided where it always was.

        A legacy run may have met the SDK's late local-activity result (versions.py): its
        history then holds the commands that followed a local activity in the workflow task
        after the one that replay hands the result over in. A patch first decided there
        would read False on replay (its marker not yet in sight) although the run recorded
        it; a run whose writer had every legacy patch recorded every first call's marker,
        so replay waits until the marker is in sight, which is where the run decided it."""
        if self._current:
            return True
        if (
            self._legacy_complete
            and workflow.unsafe.is_replaying()
            and not versions.marker_in_sight(patch_id)
        ):
            await workflow.wait_condition(
                lambda: versions.marker_in_sight(patch_id) or not workflow.unsafe.is_replaying()
            )
        return workflow.patched(patch_id)

    def _cancel_seen(self) -> bool:
        """For the lifecycle's waits: a cancel request ends them (current runs; a legacy
        run's waits end as they always did)."""
        return self._current and workflow.cancellation_reason() is not None

    def _stop_if_cancelled(self) -> None:
        """A cancel request is final: nothing but cleanup is sent after it.

        The SDK delivers a cancel request by cancelling whatever the workflow awaits at that
        moment. When that is an activity the workflow itself is cancelling (a race it just
        decided, a chunk it stops for a pause), the cancel surfaces as that activity's
        cancellation, which the workflow expects and handles, and the request is gone: the
        job went on training (issue 16). So every command the lifecycle sends is preceded by
        this check of the request itself (``workflow.cancellation_reason``), which no await
        can absorb."""
        if workflow.cancellation_reason() is None:
            return
        if self._adopted(versions.CANCEL_CHECKED):
            raise asyncio.CancelledError("the job was cancelled")

    def _adopted(self, patch_id: str) -> bool:
        """A change made with or after the current lifecycle (versions.ADOPTED): on in every
        current run; a legacy run takes it up where it first meets it live, and keeps its
        recorded behaviour on replay."""
        return self._current or workflow.patched(patch_id)

    def _raise_mapped(self, err: FailureError, timeout_type: str, what: str) -> NoReturn:
        mapped = self._mapped(err, timeout_type, what)
        if mapped is err:
            raise err  # unchanged, cause and all (``from`` would rewrite its cause)
        raise mapped from None

    def _mapped(self, err: FailureError, timeout_type: str, what: str) -> BaseException:
        """An activity failure as the workflow's next move: a lost trainer (recovery), a
        terminal error, or — kept intact, cause and all, so a cancellation stays
        recognisable — the original failure."""
        if is_cancelled_exception(err):
            return err
        root = _root(err)
        kind = getattr(root, "type", None)
        if kind in (policies.TRAINER_LOST, policies.TRAINER_GONE):
            details: Sequence[Any] = getattr(root, "details", ()) or ()
            job = (
                PlatformJob.model_validate(details[0])
                if details and isinstance(details[0], dict)
                else None
            )
            extra = details[1] if len(details) > 1 and isinstance(details[1], dict) else {}
            return _Lost(
                kind,
                job,
                getattr(root, "message", str(root)),
                applied_step=extra.get("applied_step"),
            )
        if kind in (policies.TRAINER_BEHIND, policies.ROUTE_RACE_EXHAUSTED):
            return _Lost(kind, None, getattr(root, "message", str(root)))
        if isinstance(root, TimeoutError):
            return _Terminal(
                Phase.FAILED,
                timeout_type,
                f"{what}: gave up after the declared timeout ({root.type.name if root.type else 'timeout'})",
            )
        if (
            self._trainer_live
            and isinstance(root, ApplicationError)
            and not root.non_retryable
            and kind not in policies.PERMANENT
        ):
            # Transient errors outlasted the retry policy on a live trainer: a genuine failure,
            # recovered from inside the lifecycle loop (before a trainer exists, it just fails).
            return _Lost("TransientErrors", None, f"{what}: {root.message}")
        return err

    def _observe(self, job: PlatformJob) -> None:
        if job.trainer_job_id != self.s.trainer_job_id:
            return
        if self._current and self._stale(job.update_time):
            # A poll's answer is a moment ago; an event since (the death of a trainer whose
            # RUNNING the poll saw, say) is the truth now.
            return
        self.s.platform_state = job.state
        self.s.platform_message = job.message
        self._event_state, self._event_message = job.state, job.message
        if job.update_time is not None:
            self._observed_at = job.update_time

    def _stale(self, when: datetime | None) -> bool:
        """Whether a state the platform reported as of ``when`` is older than the freshest
        state the workflow holds (from a poll or, in current runs, an event)."""
        return bool(self._observed_at and when and when < self._observed_at)

    def _set_phase(self, phase: Phase) -> None:
        now = workflow.now()
        elapsed = (now - self._phase_since).total_seconds()
        self.s.timings[self.s.phase.value] = round(
            self.s.timings.get(self.s.phase.value, 0.0) + elapsed, 3
        )
        self._phase_since = now
        self._stage = phase
        if self._recovering and phase in _COMING_UP:
            self.s.stage, phase = phase, Phase.RECOVERING
        else:
            self._recovering = self._recovering and phase is Phase.RECOVERING
            self.s.stage = None
        self.s.phase = phase
        self._publish()

    def _publish(self, *, force: bool = False) -> None:
        self.s.updated_at = workflow.now()
        if force or self._published_phase is not self.s.phase:
            self._upsert([sa.PHASE.value_set(self.s.phase.value)])
            self._published_phase = self.s.phase
        workflow.set_current_details(self.s.summary())

    async def _maybe_continue_as_new(self) -> None:
        """Start afresh with the state carried over before the history grows large."""
        info = workflow.info()
        if not (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self.spec.policies.max_history_events
        ):
            return
        if self._pause_requested or self._resume_requested:
            return  # a pause waits for its answer; continue once it is handled
        await workflow.wait_condition(workflow.all_handlers_finished)
        self.s.continued_as_new += 1
        self._set_phase(self.s.phase)  # close the phase's timing
        workflow.continue_as_new(
            JobInput(
                spec=self.spec,
                parent_workflow_id=self.s.parent_workflow_id,
                carried=self.s,
                report_progress_to=self._report_to,
                carried_flags=CarriedFlags(
                    trainer_live=self._trainer_live,
                    serving=self._serving,
                    shape_version=self._shape_version,
                    to_load=self._to_load,
                    prefix=self._prefix,
                    preemptible=self._preemptible,
                    prune_unsupported=self._prune_unsupported,
                    pauses=self._pauses,
                    event_state=self._event_state,
                    event_id=self._event_id,
                    session=self._session,
                ),
            )
        )

    # ====================================================== messages

    @workflow.query(name="status")
    def query_status(self) -> JobStatus:
        return self.s

    @workflow.query(name="spec")
    def query_spec(self) -> JobSpec:
        """The spec this job runs (after schedule templates were resolved)."""
        return self.spec

    @workflow.signal(name="platform_event")
    def platform_event(self, event: PlatformEvent) -> None:
        if event.trainer_job_id != self.s.trainer_job_id or event.event_id <= self._event_id:
            return
        if self._stale(event.event_time):
            return  # older than what a poll already showed (e.g. the death before a resume)
        self._event_id = event.event_id
        if self._current and event.event_time is not None:
            self._observed_at = event.event_time  # newer than any poll's answer before it
        self._event_state, self._event_message = event.state, event.message
        self.s.platform_state, self.s.platform_message = event.state, event.message

    def _pause_problem(self) -> str | None:
        phase = self.s.phase
        if phase.is_terminal():
            return f"the job has finished ({phase.value})"
        if phase is Phase.PAUSED or self._pause_requested:
            return "the job is already paused (or pausing)"
        if phase in (Phase.PENDING, Phase.EVALUATING, Phase.EXPORTING):
            return f"the job cannot be paused while {phase.value}"
        return None

    def _resume_problem(self, request: ResumeRequest | None) -> str | None:
        if self.s.phase is not Phase.PAUSED and not self._pause_requested:
            return f"the job is not paused ({self.s.phase.value})"
        if self._resume_requested:
            return "a resume is already in progress"
        if (
            request
            and request.checkpoint
            and not rules.CHECKPOINT_NAME_RE.match(request.checkpoint)
        ):
            return "checkpoint: must be accounts/<a>/rlorTrainerJobs/<j>/checkpoints/<c>"
        return None

    def _signal_input(self, name: str, raw: RawValue | None, model: type[M]) -> M | None:
        """A signal's input, read here rather than by the SDK, which would drop a bad one
        with only a log line: a bad input becomes a notice in the status and a warning."""
        if raw is None:
            return None
        try:
            data = workflow.payload_converter().from_payload(raw.payload)
            return None if data is None else model.model_validate(data)
        except Exception as exc:  # noqa: BLE001 - any unreadable input is the sender's error
            detail = str(exc).splitlines()
            self._notice(f"signal {name} ignored: unreadable input ({' '.join(detail[:3])})")
            raise _BadSignal() from None

    def _notice(self, text: str) -> None:
        workflow.logger.warning(text)
        self.s.notices = [*self.s.notices, text[:300]][-MAX_NOTICES:]
        self._publish()

    @workflow.signal(name="pause")
    # Exactly RawValue (the SDK passes the payload through only then); None: no input.
    def pause_signal(self, request: RawValue = None) -> None:  # type: ignore[assignment]
        """Pause from the Web UI or ``temporal workflow signal --name pause``."""
        try:
            self._signal_input("pause", request, PauseRequest)
        except _BadSignal:
            return
        if problem := self._pause_problem():
            self._notice(f"signal pause ignored: {problem}")
            return
        self._pause_requested = True

    @workflow.signal(name="resume")
    # Exactly RawValue (the SDK passes the payload through only then); None: no input.
    def resume_signal(self, request: RawValue = None) -> None:  # type: ignore[assignment]
        """Resume from the Web UI or ``temporal workflow signal --name resume``."""
        try:
            parsed = self._signal_input("resume", request, ResumeRequest)
        except _BadSignal:
            return
        if problem := self._resume_problem(parsed):
            self._notice(f"signal resume ignored: {problem}")
            return
        self._resume_requested = True
        self._resume_checkpoint = parsed.checkpoint if parsed else None

    @workflow.update(name="request_pause")
    async def request_pause(self, request: PauseRequest) -> PauseResult:
        """Checkpoint, delete the trainer, wait. Returns the checkpoint saved."""
        self._pause_requested = True
        await workflow.wait_condition(
            lambda: self.s.phase is Phase.PAUSED or self.s.phase.is_terminal()
        )
        return PauseResult(checkpoint=self.s.paused_checkpoint, step=self.s.step)

    @request_pause.validator
    def _validate_pause(self, request: PauseRequest) -> None:
        if problem := self._pause_problem():
            raise ValueError(problem)

    @workflow.update(name="request_resume")
    async def request_resume(self, request: ResumeRequest) -> JobStatus:
        """Provision a new trainer and continue (from ``checkpoint`` when given)."""
        if request.checkpoint and await self._patched("check-resume-checkpoint"):
            # Before anything is provisioned; refused, the job stays PAUSED.
            if problem := await self._checkpoint_problem(request.checkpoint):
                raise ApplicationError(
                    f"resume refused: {problem}", type="InvalidCheckpoint", non_retryable=True
                )
            self._resume_checked = True
        self._resume_requested = True
        self._resume_checkpoint = request.checkpoint
        await workflow.wait_condition(
            lambda: self.s.phase is not Phase.PAUSED and not self._resume_requested
        )
        return self.s

    @request_resume.validator
    def _validate_resume(self, request: ResumeRequest) -> None:
        if problem := self._resume_problem(request):
            raise ValueError(problem)
