"""Typed wire models of the trainer platform contract (trainer-api.md).

Control-plane fields are camelCase on the wire (protobuf-JSON style) and snake_case in
Python; data-plane fields follow Tinker's snake_case. Models accept fields they do not
know, so a newer hosted platform never breaks the client.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from shepherd.platform import rules
from shepherd.states import JobState


class WireModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields kept, not rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=False
    )

    def wire(self) -> dict[str, Any]:
        """The JSON body for this model, with unset optional fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class DataPlaneModel(BaseModel):
    model_config = ConfigDict(extra="allow")

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


# --------------------------------------------------------------------------- control plane


class Account(WireModel):
    name: str

    @property
    def account_id(self) -> str:
        return self.name.removeprefix("accounts/")


class TrainingConfig(WireModel):
    base_model: str | None = None
    lora_rank: int | None = None
    learning_rate: float | None = None
    max_context_length: int | None = None
    region: str | None = None
    custom_image_tag: str | None = None
    accelerator_type: str | None = None
    accelerator_count: int | None = None
    extra_args: list[str] | None = None


class CreateTrainerJobRequest(WireModel):
    """Body of ``POST .../rlorTrainerJobs``; the id and shape go in the query string."""

    display_name: str | None = None
    service_mode: bool = True
    keep_alive: bool = False
    dataset: str | None = None
    training_config: TrainingConfig
    node_count: int | None = None
    hot_load_deployment_id: str | None = None
    forward_only: bool | None = None
    preemptible: bool | None = None
    inactivity_timeout: str | None = None
    trainer_replica_count: int | None = None


class JobStatus(WireModel):
    code: str = "OK"
    message: str = ""


class TrainerJob(WireModel):
    name: str
    display_name: str | None = None
    state: JobState = JobState.UNSPECIFIED
    status: JobStatus = Field(default_factory=JobStatus)
    create_time: datetime | None = None
    update_time: datetime | None = None
    training_config: TrainingConfig = Field(default_factory=TrainingConfig)
    service_mode: bool | None = None
    training_shape_ref: str | None = None
    forward_only: bool | None = None
    dataset: str | None = None
    preemptible: bool | None = None
    inactivity_timeout: str | None = None

    @property
    def job_id(self) -> str:
        return self.name.rsplit("/", 1)[-1]

    @property
    def account_id(self) -> str:
        m = rules.JOB_NAME_RE.match(self.name)
        return m.group("account") if m else ""


class TrainerJobList(WireModel):
    rlor_trainer_jobs: list[TrainerJob] = Field(default_factory=list)
    next_page_token: str = ""


class Checkpoint(WireModel):
    name: str
    create_time: datetime | None = None
    checkpoint_type: str | None = None
    promotable: bool = False
    step: int | None = None

    @property
    def checkpoint_id(self) -> str:
        return self.name.rsplit("/", 1)[-1]


class CheckpointList(WireModel):
    checkpoints: list[Checkpoint] = Field(default_factory=list)
    next_page_token: str = ""


class TrainerLogEntry(WireModel):
    """One line of a trainer's output (localplane extension, trainer-api.md §7)."""

    #: When the platform wrote it (None: a line the platform did not stamp).
    time: datetime | None = None
    #: The trainer process it came from: 1 for the job's first start, +1 per resume.
    run: int = 0
    text: str = ""


class TrainerLogPage(WireModel):
    log_entries: list[TrainerLogEntry] = Field(default_factory=list)
    #: Where the next read starts; also once caught up, to get the lines written since.
    next_page_token: str = ""
    #: Every line written so far was returned.
    caught_up: bool = True


class TrainerShardingScheme(WireModel):
    pipeline_parallelism: int | None = None


class ShapeSnapshot(WireModel):
    trainer_image_tag: str | None = None
    max_supported_context_length: int | None = None
    node_count: int | None = None
    deployment_shape_version: str | None = None
    deployment_image_tag: str | None = None
    accelerator_type: str | None = None
    accelerator_count: int | None = None
    base_model_weight_precision: str | None = None
    trainer_sharding_scheme: TrainerShardingScheme | None = None
    trainer_mode: str | None = None


class TrainingShapeVersion(WireModel):
    name: str
    snapshot: ShapeSnapshot = Field(default_factory=ShapeSnapshot)


class TrainingShapeVersionList(WireModel):
    training_shape_versions: list[TrainingShapeVersion] = Field(default_factory=list)
    next_page_token: str = ""


class PeftDetails(WireModel):
    base_model: str | None = None
    r: int | None = None
    target_modules: list[str] | None = None


class Model(WireModel):
    name: str
    state: str = "STATE_UNSPECIFIED"
    kind: str | None = None
    base_model: str | None = None
    peft_details: PeftDetails | None = None
    checkpoint: str | None = None
    create_time: datetime | None = None

    @property
    def model_id(self) -> str:
        return self.name.rsplit("/", 1)[-1]


class PromoteCheckpointRequest(BaseModel):
    """Body of ``POST .../checkpoints/{c}:promote``. The contract spells these snake_case."""

    model_config = ConfigDict(extra="allow")

    output_model: str
    trainer_job_id: str
    base_model: str | None = None
    async_promotion: bool | None = None


class OperationError(WireModel):
    code: int | None = None
    status: str | None = None
    message: str = ""


class Operation(WireModel):
    name: str
    done: bool = False
    response: Model | None = None
    error: OperationError | None = None


class PromoteCheckpointResponse(WireModel):
    model: Model | None = None
    operation: Operation | None = None


class JobEvent(WireModel):
    """One state change from the watch stream or a webhook (localplane extension, §6)."""

    #: Monotonic sequence number; resume a stream after it with ``Last-Event-ID``.
    id: int
    type: str = "rlorTrainerJob.stateChanged"
    name: str
    previous_state: JobState | None = None
    state: JobState
    event_time: datetime
    job: TrainerJob

    @property
    def job_id(self) -> str:
        return self.name.rsplit("/", 1)[-1]


# ----------------------------------------------------------------------------- data plane


class ModelData(DataPlaneModel):
    model_name: str | None = None
    #: What ``get_tokenizer()`` loads: a Hugging Face id, or a local directory.
    tokenizer_id: str | None = None


class TrainerModelInfo(DataPlaneModel):
    """``get_info`` of one model on a trainer. localplane adds fields for tests
    (``weights_digest``, ``optim_steps``), which clients must not rely on."""

    model_id: str
    model_data: ModelData = Field(default_factory=ModelData)
    model_name: str | None = None
    is_lora: bool | None = None
    lora_rank: int | None = None
    weights_digest: str | None = None
    optim_steps: int | None = None
