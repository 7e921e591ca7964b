"""One pydantic input and output model per workflow, activity, signal and update (style.md
§2), and the job's status — the single state model the lifecycle workflow keeps.

Nothing here holds a secret: backends are referred to by *name*; URLs and keys live in the
worker's configuration.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shepherd.curves import CurvePoint
from shepherd.phases import Phase
from shepherd.scheduling import Ask, Checkpointed, MakeWay, Placement, Release
from shepherd.spec import JobSpec, TrainerSpec


class Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


# ----------------------------------------------------------------------------- activities


class TrainerRef(Model):
    """A trainer job on a backend."""

    backend: str
    trainer_job_id: str


class ResolveShapeInput(Model):
    backend: str
    shape: str


class ShapeInfo(Model):
    version: str
    max_context_length: int | None = None
    accelerator_type: str | None = None
    accelerator_count: int | None = None
    node_count: int | None = None
    trainer_mode: str | None = None


class CreateTrainerInput(Model):
    backend: str
    trainer_job_id: str
    trainer: TrainerSpec
    shape_version: str | None = None
    seed: int
    preemptible: bool
    display_name: str


class PlatformJob(Model):
    """What the platform says about a trainer job right now."""

    trainer_job_id: str
    state: str
    status_code: str = "OK"
    message: str = ""
    update_time: datetime | None = None


class WarmUpInput(Model):
    backend: str
    trainer_job_id: str
    probes: int
    #: Started when the trainer was placed, before RUNNING: 404s are its boot until the
    #: control plane says RUNNING (activities/base.py, ``RouteWait``).
    booting: bool = False


class WarmUpResult(Model):
    probes: int
    #: Route 404s seen (and waited out) on the way.
    route_races: int = 0


class TrainerSession(Model):
    """The model Shepherd trains on a running trainer (Tinker API): its session, its
    model id, and the ``seq_id`` its next sequenced operation takes. Every activity that
    talks to the model starts from here and hands back the new ``next_seq``."""

    session_id: str
    model_id: str
    next_seq: int = 1
    tokenizer_id: str | None = None


class OpenModelInput(Model):
    backend: str
    trainer_job_id: str
    base_model: str
    lora_rank: int
    seed: int
    #: A checkpoint resource name to create the model from (weights and optimizer state).
    checkpoint: str | None = None
    call_timeout_s: float
    #: Then this many consecutive warm-up probes over the route (current runs warm up in
    #: the same activity; 0: legacy runs, which warmed up in one of its own).
    warm_up_probes: int = 0
    #: As ``WarmUpInput.booting``.
    booting: bool = False


class CheckCheckpointInput(Model):
    backend: str
    checkpoint: str
    #: What the job's trainer will be: a checkpoint of another base model or LoRA rank
    #: cannot be loaded into it.
    base_model: str
    lora_rank: int


class CheckCheckpointResult(Model):
    #: Why this checkpoint cannot be resumed from (None: it can).
    problem: str | None = None
    step: int = 0


class OpenModelResult(Model):
    session: TrainerSession
    #: The step the model is at: the checkpoint's, or 0 for a fresh model.
    step: int
    weights_digest: str | None = None
    #: Route 404s met while opening it (it runs beside the warm-up probes).
    route_races: int = 0


class LoopSettings(Model):
    """What a training loop is told about the job (``shepherd.loops.LoopContext``)."""

    loop: str
    dataset: str
    batch_size: int
    micro_batches: int
    seed: int
    learning_rate: float
    max_context_length: int
    validation_split: float
    total_steps: int


class TrainChunkInput(Model):
    backend: str
    trainer_job_id: str
    base_model: str
    session: TrainerSession
    first_step: int
    last_step: int
    settings: LoopSettings
    route_race_retries: int
    route_race_window_s: float
    #: Per-call timeout of training calls (one step may be slow on a real GPU).
    step_timeout_s: float


class ChunkResult(Model):
    last_step: int
    #: The ``seq_id`` the model's next operation takes.
    next_seq: int
    last_loss: float | None = None
    mean_loss: float | None = None
    #: Steps this chunk found already applied (a retried attempt, or work redone).
    steps_skipped: int = 0
    route_races: int = 0
    #: Cancelled before ``last_step`` (a pause, or a death the workflow heard of first):
    #: ``last_step`` is the last step really applied.
    partial: bool = False


class SaveCheckpointInput(Model):
    backend: str
    trainer_job_id: str
    base_model: str
    session: TrainerSession
    #: The checkpoint id: ``save_weights`` (resumable) under it, and
    #: ``save_weights_for_sampler`` (promotable) under ``<name>-sampler``.
    name: str
    step: int
    call_timeout_s: float


class FollowedModel(Model):
    """The model of a program's that its job follows (``training.follow``): its steps are
    the job's, its checkpoints the job's, and it is what the job promotes."""

    #: 1-based, in the order the program made its models.
    number: int
    base_model: str | None = None
    lora_rank: int | None = None
    #: The checkpoint the program made it from (None: created afresh).
    loaded_from: str | None = None

    def describe(self) -> str:
        how = f"from {self.loaded_from}" if self.loaded_from else "created afresh"
        rank = f"LoRA rank {self.lora_rank}" if self.lora_rank else "full-parameter"
        return f"the program's model {self.number} ({rank}, {how})"


class CheckpointRecord(Model):
    #: Resource name of the resumable (state) checkpoint.
    name: str
    step: int
    trainer_job_id: str
    #: A program's job: the number of the program's model it is of (None: the job's one).
    model: int | None = None
    #: Resource name of the promotable (sampler) checkpoint of the same weights.
    sampler: str | None = None
    metric: float | None = None
    saved_at: datetime | None = None


class SaveCheckpointResult(Model):
    record: CheckpointRecord
    next_seq: int


class PreflightInput(Model):
    """What a job's first activity checks on a worker before any trainer exists
    (activities/preflight.py)."""

    backend: str
    base_model: str
    #: The loop the job runs (None when it runs a program instead).
    loop: str | None = None
    #: The program the job runs, and its arguments (checked against its registration).
    program: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    #: Deployments the spec names, by field (``trainer.hot_load_deployment`` ...): they exist.
    deployments: dict[str, str] = Field(default_factory=dict)
    #: The metric the job tracks (None: nothing is evaluated).
    metric: str | None = None
    dataset: str | None = None
    validation_split: float = 0.1
    #: The job's first ask for a slot, sent once every check passed if the backend declares
    #: its capacity (one activity and one workflow task fewer in every job's intake).
    ask: Ask | None = None


class PreflightResult(Model):
    """What the preflight learned that the job shows from its start."""

    #: A program's total of optimizer steps, from its arguments (its registration says which).
    total_steps: int | None = None
    #: The backend declares its capacity: the job waits for admission in Shepherd.
    admission: bool = False
    #: The input's ``ask`` reached the backend's scheduler (False: the job asks itself).
    asked: bool = False


class PublishInput(Model):
    """Hot-load a sampler checkpoint onto a serving deployment (``output.hot_load_deployment``)."""

    backend: str
    deployment: str
    #: The sampler checkpoint's resource name (the snapshot's identity).
    checkpoint: str
    base_model: str


class DeploymentSnapshot(Model):
    """What a deployment serves after the job published to it."""

    deployment: str
    identity: str
    weights_digest: str | None = None


# ---------------------------------------------------------------------------- programs


class ProgramSettings(Model):
    """What the job's data-plane proxy is told (shepherd/proxy; activities/programs.py)."""

    #: What the job's trainer was created for; a program's model must be that.
    base_model: str
    lora_rank: int
    #: A Shepherd checkpoint every so many optimizer steps (``checkpoint.every_steps``).
    checkpoint_every: int
    call_timeout_s: float
    route_race_retries: int
    route_race_window_s: float
    #: The program's own metrics (its metrics file) the job keeps curves of; the worker adds
    #: those the program's registration names.
    metrics: list[str] = Field(default_factory=list)
    #: Which of the program's models the job follows (``training.follow``).
    follow: str = "last"


class RunProgramInput(Model):
    backend: str
    program: str
    args: dict[str, Any] = Field(default_factory=dict)
    settings: ProgramSettings
    #: The job this one retries (its parent): the program's first start copies that job's
    #: log directory (shepherd/programs.py ``seed_log_dir``).
    seed_from: str | None = None
    #: How many times the workflow has started the program (this start included): its
    #: ``program_started`` signals say which start they come from.
    generation: int = 0
    #: Take over the program this worker already runs for the job (a later run of the
    #: workflow, after continue-as-new); never start one.
    adopt: bool = False


class ProgramStarted(Model):
    """Signal: an attempt of the program runs, reachable on ``control_queue``."""

    control_queue: str
    attempt: int
    #: The workflow's start (``RunProgramInput.generation``) this attempt belongs to.
    generation: int = 0
    #: The program's total of optimizer steps, when its arguments say (its registration).
    total_steps: int | None = None
    #: A later run of the workflow took over the running program (nothing restarted).
    adopted: bool = False
    #: Adopted: the trainer its proxy serves from now (None: none).
    attached: str | None = None


class MetricPoint(Model):
    """One record of a program's metrics file: its step (the program's own) and values."""

    step: int
    values: dict[str, float]


class ProgramProgress(Model):
    """Signal: what the program's proxy saw since the last one."""

    step: int = 0
    last_loss: float | None = None
    #: (step, mean loss of its forward_backward calls), in order.
    losses: list[tuple[int, float]] = Field(default_factory=list)
    checkpoints: list[CheckpointRecord] = Field(default_factory=list)
    #: The proxy saw the trainer gone (verified with the control plane).
    trainer_lost: str | None = None
    #: The checkpoint the proxy would restore the job's model from now (kept by pruning).
    restore_point: str | None = None
    #: The program's own metrics since the last signal (its metrics file), the kept ones:
    #: (the program's step, {name: value}), in order.
    metrics: list[MetricPoint] = Field(default_factory=list)
    #: Every metric of the newest record the program wrote, and its step.
    latest_metrics: dict[str, float] = Field(default_factory=dict)
    metrics_step: int | None = None
    #: The job follows another of the program's models from now on (``step`` is its step).
    following: FollowedModel | None = None
    #: What the worker could not do for the program (its log or exit record on a full
    #: disk), for the job's status.
    problems: list[str] = Field(default_factory=list)
    #: The program exited 0 (the last report of its run; its final checkpoint is in it).
    exited: bool = False


class ProgramResult(Model):
    exit_code: int
    step: int


class ProgramAttachInput(Model):
    trainer_job_id: str


class ProgramAttachResult(Model):
    """What an attach did (the proxy's AttachResult)."""

    model_config = ConfigDict(extra="allow")

    #: The Shepherd checkpoint the program's model was restored from (None: none was due).
    restored_from: str | None = None
    ops_redone: int = 0
    optimizer_steps_redone: int = 0
    seconds: float = 0.0
    #: The restored weights equal the lost trainer's at the same step (None: no digest).
    digests_match: bool | None = None


class ProgramControlInput(Model):
    reason: str = ""


class EvaluateInput(Model):
    backend: str
    trainer_job_id: str
    base_model: str
    session: TrainerSession
    step: int
    settings: LoopSettings
    call_timeout_s: float


class EvaluateResult(Model):
    step: int
    metrics: dict[str, float]
    next_seq: int


class PruneCheckpointsInput(Model):
    backend: str
    checkpoints: list[str]


class PruneCheckpointsResult(Model):
    deleted: list[str] = Field(default_factory=list)
    #: The backend has no delete call: nothing was pruned (kept, not lost).
    unsupported: bool = False


class PromoteInput(Model):
    backend: str
    trainer_job_id: str
    checkpoint: str
    model_id: str
    base_model: str
    #: The spec field that names the model (for messages).
    field: str = "output.model_id"


class ModelInfo(Model):
    name: str
    state: str
    kind: str | None = None
    checkpoint: str | None = None


# ---------------------------------------------------------------------- signals / updates


class PlatformEvent(Model):
    """A platform state change pushed to the workflow by the worker's event bridge."""

    trainer_job_id: str
    state: str
    message: str = ""
    event_id: int = 0
    event_time: datetime | None = None


class PauseRequest(Model):
    reason: str = ""


class PauseResult(Model):
    checkpoint: str | None
    step: int


class ResumeRequest(Model):
    #: Resume from this checkpoint (a resource name); default: the one saved at pause.
    checkpoint: str | None = None


# ------------------------------------------------------------------------------ status


class RecoveryRecord(Model):
    number: int
    #: preemption | failure | idle | platform_restart | deleted
    reason: str
    platform_state: str
    message: str
    at_step: int
    resumed_from_step: int | None = None
    steps_redone: int | None = None
    started_at: datetime
    duration_s: float | None = None
    #: How the trainer came back: "resume" or "new-trainer" (fallback to on-demand).
    action: str = "resume"
    #: A program's job: the restored weights are the lost trainer's at the same step (the
    #: trainer's weights digests compared; None: the trainer reports none).
    weights_verified: bool | None = None


class ErrorInfo(Model):
    type: str
    message: str


MAX_NOTICES = 10


class JobStatus(Model):
    """Everything a user asks about a job: the answer of the ``status`` query."""

    workflow_id: str = ""
    name: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    phase: Phase = Phase.PENDING
    #: While RECOVERING: the step of bringing the trainer back (QUEUED, SCHEDULING, PREPARING).
    stage: Phase | None = None
    platform_state: str | None = None
    platform_message: str = ""
    backend: str = ""
    trainer_job_id: str | None = None
    #: Trainer generation: a new trainer job id is provisioned after a pause or fallback.
    generation: int = 0
    step: int = 0
    total_steps: int = 0
    last_loss: float | None = None
    eval_metric: str = "eval_loss"
    eval_value: float | None = None
    #: The loss of each chunk (its mean, at its last step) and ``eval_metric`` at each
    #: evaluation; bounded (``shepherd.curves``).
    loss_curve: list[CurvePoint] = Field(default_factory=list)
    eval_curve: list[CurvePoint] = Field(default_factory=list)
    #: A program's own metrics (its metrics file): the newest value of each (at most 64),
    #: the program's step they were written at, and the curves the job keeps (by the
    #: program's step; ``training.metrics``, the tracked metric, the registration's).
    metrics: dict[str, float] = Field(default_factory=dict)
    metrics_step: int | None = None
    metric_curves: dict[str, list[CurvePoint]] = Field(default_factory=dict)
    #: A program's job: the program's model it follows (its steps, checkpoints, promotion).
    following: FollowedModel | None = None
    #: Waiting for admission in Shepherd's queue (what it waits in); ``placement`` is its
    #: place and what it waits for, which a client reads from the backend's scheduler.
    admission: str | None = None
    placement: Placement | None = None
    #: Times the scheduler had the job make way for a more urgent one (apart from the
    #: platform's preemptions: ``recoveries`` lists them as ``priority``).
    priority_preemptions: int = 0
    checkpoints: list[CheckpointRecord] = Field(default_factory=list)
    best: CheckpointRecord | None = None
    preemptions: int = 0
    #: Trainers lost because the platform restarted (not preemptions; the same budget).
    platform_restarts: int = 0
    failures: int = 0
    route_races: int = 0
    recoveries: list[RecoveryRecord] = Field(default_factory=list)
    #: Seconds spent per phase.
    timings: dict[str, float] = Field(default_factory=dict)
    started_at: datetime | None = None
    updated_at: datetime | None = None
    model: ModelInfo | None = None
    #: The deployment the job published its checkpoint to (``output.hot_load_deployment``).
    deployment: DeploymentSnapshot | None = None
    error: ErrorInfo | None = None
    cleanup: str = "pending"
    paused_checkpoint: str | None = None
    parent_workflow_id: str | None = None
    continued_as_new: int = 0
    #: Signals the job refused or could not read (newest last, at most ``MAX_NOTICES``):
    #: a signal has no reply, so this is where a sender learns it was ignored.
    notices: list[str] = Field(default_factory=list)
    #: What the job is trying again and why (its steps failed and wait for their next
    #: attempt: a platform answering errors, a full disk ...). Filled by the client from
    #: Temporal's pending activities, never by the workflow.
    retrying: list[str] = Field(default_factory=list)

    @property
    def phase_label(self) -> str:
        """The phase, with the recovery's step while RECOVERING: ``RECOVERING (SCHEDULING)``."""
        return f"{self.phase.value} ({self.stage.value})" if self.stage else self.phase.value

    @property
    def best_decided(self) -> bool:
        """Whether the tracked metric tells the best checkpoint apart: not when every
        checkpoint it measured has the same value (then ``best`` is only the latest of
        equals, and is not shown as best)."""
        if self.best is None:
            return False
        values = {p.value for p in self.eval_curve} | {
            c.metric for c in self.checkpoints if c.metric is not None
        }
        measured = len(self.eval_curve) + sum(c.metric is not None for c in self.checkpoints)
        return len(values) > 1 or measured <= 1

    def headline_metrics(self) -> dict[str, float]:
        """The newest value of each program metric the job keeps a curve of (the tracked one
        first)."""
        kept = sorted(self.metric_curves, key=lambda name: name != self.eval_metric)
        return {name: self.metrics[name] for name in kept if name in self.metrics}

    def followed_checkpoints(self) -> list[CheckpointRecord]:
        """The checkpoints of the model the job follows (a loop's: all of them; a program's
        that trained several models: those of the one ``following`` names)."""
        if self.following is None:
            return self.checkpoints
        return [c for c in self.checkpoints if c.model in (None, self.following.number)]

    def remaining_s(self) -> float | None:
        """Seconds of training left, at the pace of its training so far (None: it has not
        trained yet, or does not know its total)."""
        trained = self.timings.get(Phase.TRAINING.value, 0.0)
        if self.step <= 0 or not self.total_steps or trained <= 0:
            return None
        return max(0.0, (self.total_steps - self.step) * trained / self.step)

    @property
    def last_checkpoint(self) -> CheckpointRecord | None:
        mine = self.followed_checkpoints()
        return mine[-1] if mine else None

    def summary(self) -> str:
        """One readable paragraph for the Web UI's current details."""
        parts = [f"**{self.phase_label}** · step {self.step}/{self.total_steps}"]
        if self.last_loss is not None:
            parts.append(f"loss {self.last_loss:.4f}")
        if self.eval_value is not None:
            parts.append(f"{self.eval_metric} {self.eval_value:.4f}")
        lines = [" · ".join(parts)]
        if shown := self.headline_metrics():
            at = f" (its step {self.metrics_step})" if self.metrics_step is not None else ""
            lines.append(f"program{at}: " + " · ".join(f"{k} {v:.4g}" for k, v in shown.items()))
        if self.admission:
            lines.append(self.admission)
        if self.notices:
            lines.append(f"⚠ {self.notices[-1]}")
        if self.following is not None and self.following.number > 1:
            lines.append(f"follows {self.following.describe()}")
        if self.trainer_job_id:
            lines.append(
                f"trainer `{self.trainer_job_id}` ({(self.platform_state or '?').removeprefix('JOB_STATE_')})"
            )
        if self.best and self.best_decided:
            lines.append(
                f"best checkpoint: {self.best.name.rsplit('/', 1)[-1]} (step {self.best.step})"
            )
        if self.recoveries:
            last = self.recoveries[-1]
            lines.append(
                f"recoveries: {len(self.recoveries)} (last: {last.reason} at step {last.at_step})"
            )
        if self.model:
            lines.append(f"model: {self.model.name}")
        if self.error:
            lines.append(f"error: {self.error.type}: {self.error.message}")
        return "\n".join(lines)


class TrialProgress(Model):
    """A trial's evaluated checkpoint, signalled to its sweep (for early stopping)."""

    workflow_id: str
    step: int
    metric: float


class ProgramCarry(Model):
    """A program job's view of its program, carried across continue-as-new (the program
    itself runs on, on its worker: activities/program_run.py)."""

    #: The worker's control queue (None: no program runs, or none has said where yet).
    control_queue: str | None = None
    #: The workflow's starts of the program so far, and the newest (generation, attempt)
    #: that said it runs.
    generation: int = 0
    started: tuple[int, int] = (0, 0)
    #: The trainer the program's proxy serves from.
    attached: str | None = None
    restore_point: str | None = None
    #: A checkpoint arrived that pruning has not looked at yet.
    prune: bool = False
    #: The program's worker said it exited 0 (its final checkpoint told with it).
    exited: bool = False


class SlotHold(Model):
    """A job's side of its admission (carried across continue-as-new)."""

    #: The job's backend has a scheduler (its profile declares slots): the job waits for
    #: admission before each trainer.
    enabled: bool = False
    #: The job's request number, and whether it was asked / granted.
    seq: int = 0
    asked: bool = False
    held: bool = False
    #: Its place of arrival (kept when it is requeued after making way for another).
    arrival: int = 0
    #: When it asked (for the admission-wait metric).
    asked_at: datetime | None = None
    #: It told the scheduler it checkpointed since it was admitted.
    noted: bool = False
    #: The scheduler asked it to make way (for another job) while it held its slot.
    make_way: MakeWay | None = None


class CarriedFlags(Model):
    """The lifecycle's internal state carried across continue-as-new (with the status)."""

    trainer_live: bool = False
    serving: bool = False
    shape_version: str | None = None
    to_load: str | None = None
    prefix: str | None = None
    #: None: the spec decides (a fallback to on-demand sets False).
    preemptible: bool | None = None
    prune_unsupported: bool = False
    pauses: int = 0
    event_state: str | None = None
    #: What the platform said with that state (a death's reason: a preemption is told by it),
    #: and as of when: the freshest state the workflow holds.
    event_message: str = ""
    observed_at: datetime | None = None
    event_id: int = 0
    session: TrainerSession | None = None
    #: A recovery was bringing the trainer back.
    recovering: bool = False
    #: The job's admission to a slot (workflows/slot.py).
    slot: SlotHold = Field(default_factory=lambda: SlotHold())
    #: A program job's program (None: a loop's job).
    program: ProgramCarry | None = None


class AskForSlotInput(Model):
    """A job's request for a slot, to its backend's scheduler (activities/scheduling.py)."""

    backend: str
    ask: Ask


class SlotNoteInput(Model):
    """A job's word to its backend's scheduler: its slot given back, or a checkpoint."""

    backend: str
    release: Release | None = None
    checkpointed: Checkpointed | None = None
    #: A job that gives its slot back to wait again: its own task priority key, which its
    #: workflow's tasks go back to (they went ahead of the intake while it held the slot).
    priority_key: int | None = None


class JobInput(Model):
    """The lifecycle workflow's one argument."""

    spec: JobSpec
    parent_workflow_id: str | None = None
    #: The spec holds ``{scheduled_time:...}`` templates to fill with the run's scheduled time.
    templated: bool = False
    #: Keep Shepherd's search attributes up to date. Off only for a namespace where they are
    #: not registered (upserting one would fail every workflow task); such jobs cannot be
    #: found by phase or label.
    search_attributes: bool = True
    #: A parent (a sweep) that wants each evaluated checkpoint as a ``trial_progress`` signal.
    report_progress_to: str | None = None
    #: State carried across continue-as-new (None on a fresh start).
    carried: JobStatus | None = None
    #: Internal state carried across continue-as-new.
    carried_flags: CarriedFlags = Field(default_factory=CarriedFlags)
