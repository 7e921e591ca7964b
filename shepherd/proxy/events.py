"""What the proxy tells its owner: events as they happen (forwarded to the job's workflow as
signals), what an ``attach`` did, and the progress read from the wire."""

from __future__ import annotations

from collections import OrderedDict
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from shepherd.models import CheckpointRecord, FollowedModel
from shepherd.proxy.settings import PROGRESS_HISTORY


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True)


class StepEvent(_Event):
    """An optimizer step of the job's model was applied (its result came back)."""

    kind: Literal["step"] = "step"
    #: The job's step: optimizer steps of the job's model (counted on from the checkpoint a
    #: program loaded its model from, when the trainer says which step that was).
    step: int
    #: Mean of the step's ``forward_backward`` ``loss:sum`` metrics (None: no loss reported).
    loss: float | None = None
    #: The optimizer step's own metrics (``grad_norm:mean``, ``learning_rate:mean`` …).
    metrics: dict[str, float] = Field(default_factory=dict)
    trainer_job_id: str


class CheckpointEvent(_Event):
    """Shepherd's checkpoint (state with optimizer, and its promotable sampler twin) was
    saved."""

    kind: Literal["checkpoint"] = "checkpoint"
    record: CheckpointRecord


class TrainerLostEvent(_Event):
    """The proxy saw the trainer gone (a 404 the control plane says is not the route race,
    or a failing route while the job is not RUNNING); the program's requests wait until the
    next ``attach``."""

    kind: Literal["trainer_lost"] = "trainer_lost"
    trainer_job_id: str
    reason: str
    #: The job's state on the control plane when the proxy asked (None: it could not ask).
    state: str | None = None


class FollowEvent(_Event):
    """The job follows another of the program's models from now on (``follow: last``: a
    newer model trained): its steps, checkpoints and promotion are that model's."""

    kind: Literal["follow"] = "follow"
    model: FollowedModel
    #: That model's step (the job's step from now on).
    step: int


ProxyEvent = Annotated[
    StepEvent | CheckpointEvent | TrainerLostEvent | FollowEvent, Field(discriminator="kind")
]


class AttachResult(BaseModel):
    """What one :meth:`~shepherd.proxy.ProgramProxy.attach` did."""

    trainer_job_id: str
    #: The first attach only starts forwarding; later ones restore the program's models.
    first: bool
    #: The Shepherd checkpoint the job's model was restored from (None: created afresh as the
    #: program created it, or nothing to restore).
    restored_from: CheckpointRecord | None = None
    #: Models restored (each from its checkpoint, or re-created, then its redo log).
    models_restored: int = 0
    #: Operations sent again from the redo log, and how many of them were optimizer steps.
    ops_redone: int = 0
    optimizer_steps_redone: int = 0
    #: Sample requests the program still waited for, sent to this trainer (pending at the
    #: loss, or made while no trainer was attached); answers it had are never sent again.
    samples_redone: int = 0
    #: Program sampling sessions that could not be rebuilt (taken before the last checkpoint
    #: at other weights); a program that samples from one gets a clear 400.
    samplers_lost: int = 0
    #: Wall time of the attach, and the part of it spent redoing operations.
    seconds: float = 0.0
    redo_seconds: float = 0.0
    #: The job's model's weights digest right after the checkpoint was loaded, and after the
    #: redo (when the trainer reports one: localplane's ``get_info`` does).
    checkpoint_digest: str | None = None
    weights_digest: str | None = None
    #: Whether those digests equal the ones the lost trainer reported at the same steps
    #: (None: no digest of that step was recorded).
    digests_match: bool | None = None


class ProxyProgress(BaseModel):
    """Progress read from the wire. The proxy updates it in place; readers take a copy
    (``model_copy(deep=True)``) when they keep it."""

    #: Optimizer steps applied to the job's model (the job's step).
    step: int = 0
    last_loss: float | None = None
    #: Mean loss per step (the last :data:`~shepherd.proxy.settings.PROGRESS_HISTORY`).
    losses: OrderedDict[int, float] = Field(default_factory=OrderedDict)
    #: The job's model's weights digest after each step, when the trainer reports one.
    digests: OrderedDict[int, str] = Field(default_factory=OrderedDict)
    checkpoints: list[CheckpointRecord] = Field(default_factory=list)
    recoveries: list[AttachResult] = Field(default_factory=list)
    #: Route 404s the control plane said were the race (the request was sent again).
    route_races: int = 0
    #: Trainer losses the proxy saw or was told of.
    trainer_losses: int = 0
    #: When the trainer last answered one of the program's requests (``time.monotonic()``;
    #: None: not yet): how long a program has been waiting, e.g. across a recovery.
    answered_at: float | None = None

    def record_loss(self, step: int, loss: float) -> None:
        self.losses[step] = loss
        self.last_loss = loss
        while len(self.losses) > PROGRESS_HISTORY:
            self.losses.popitem(last=False)

    def record_digest(self, step: int, digest: str) -> None:
        self.digests[step] = digest
        while len(self.digests) > PROGRESS_HISTORY:
            self.digests.popitem(last=False)
