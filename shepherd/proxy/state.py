"""What the proxy remembers of a program: its sessions, models, sampling sessions and
futures (the program's ids), and for each the trainer generation it is live in.

Plain records; the behaviour is the proxy's parts, over :mod:`shepherd.proxy.core`. The
tables are bounded (:mod:`shepherd.proxy.settings`).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

from shepherd.models import CheckpointRecord
from shepherd.proxy.settings import (
    DEDUPE_WINDOW,
    MAX_KEPT_RESULTS,
    RESULT_KEEP_AFTER_READ_S,
    RESULT_TTL_S,
)
from shepherd.tinker_wire.dialects import canonical_digest

#: Operations that take a model's next ``seq_id`` (as on the trainer).
SEQUENCED = frozenset(
    {
        "forward",
        "forward_backward",
        "optim_step",
        "save_weights",
        "save_weights_for_sampler",
        "load_weights",
    }
)


def new_request_id() -> str:
    return f"pr-{secrets.token_hex(10)}"


@dataclass(eq=False)
class Op:
    """One operation a program submitted (or the proxy itself: its checkpoint saves), and
    the future the program polls. ``body`` is the JSON dialect with the *program's* ids;
    it is translated for each trainer generation when sent."""

    op: str
    body: dict[str, Any]
    #: Top-level body fields a resend may change (its addressing): not in its digest.
    ignore: tuple[str, ...] = ("type",)
    request_id: str = field(default_factory=new_request_id)
    model: Model | None = None
    sampler: Sampler | None = None
    #: The program's seq_id (sequenced operations).
    seq: int | None = None
    #: Shepherd's own (a checkpoint save): no program polls it, the redo log holds it not.
    internal: bool = False
    #: Ticket fields beyond ``request_id`` (``model_id``, ``sample_sequence_ids``).
    extra: dict[str, Any] = field(default_factory=dict)

    # ---- the program's answer (set once; a redo never changes it)
    result: dict[str, Any] | None = None
    error: str | None = None
    category: str | None = None
    finished: float | None = None
    first_read: float | None = None
    #: The result was dropped (too old); the record stays for dedupe.
    dropped: bool = False
    answered: asyncio.Event = field(default_factory=asyncio.Event)

    # ---- the model's log
    #: Position in its model's log (never reused, across generations); None: not logged.
    lpos: int | None = None
    #: optim_step: the model's step once it is applied, and its step's forward_backwards.
    step_after: int | None = None
    fbs: list[Op] = field(default_factory=list)
    #: The model's weights version when it was logged (saves and snapshots compare them).
    wver: int = 0

    # ---- the current trainer generation
    gen: int = 0
    #: How many times it was sent to a trainer (a redo of one sent before applies it again
    #: to a model restored from before it; one never sent is applied the first time).
    sends: int = 0
    trainer_request_id: str | None = None
    #: Set when the trainer of ``gen`` finished it (answered or failed).
    executed: asyncio.Event = field(default_factory=asyncio.Event)
    #: The outcome the trainer of ``gen`` gave (also for a redo of an answered operation).
    outcome_ok: bool | None = None
    trainer_result: dict[str, Any] | None = None
    #: asample: the trainer's sequence ids (provenance spans name the program's).
    trainer_sequence_ids: list[str] = field(default_factory=list)
    _digest: str | None = field(default=None, repr=False)

    @property
    def digest(self) -> str | None:
        """The body's canonical digest, made when a resend first needs it: resends are rare,
        and hashing every body on its way in cost ~1 ms of each step. None once the body
        was released unhashed (see :meth:`release`)."""
        if self._digest is None and self.body:
            self._digest = canonical_digest(self.body, ignore=self.ignore)
        return self._digest

    @property
    def done(self) -> bool:
        return self.answered.is_set()

    def ticket(self) -> dict[str, Any]:
        return {"request_id": self.request_id, **self.extra}

    def resolve(self, result: dict[str, Any]) -> None:
        if not self.done:
            self.result = result
            self.finished = time.monotonic()
            self.answered.set()

    def fail(self, message: str, category: str) -> None:
        if not self.done:
            self.error, self.category = message[:2000], category
            self.finished = time.monotonic()
            self.answered.set()

    def release(self) -> None:
        """Out of the redo log for good: its body is no longer needed. Its digest is kept
        while the program has not read its answer (a lost ticket is resent, and the resend
        must find this op); once it has, no SDK resends it."""
        if self.first_read is None:
            _ = self.digest
        self.body = {}
        self.fbs = []


@dataclass(eq=False)
class Session:
    """A program's session and its trainer session in the current generation."""

    program_id: str
    body: dict[str, Any]
    trainer_id: str | None = None
    gen: int = 0
    #: Counters of the trainer session (model and sampler numbers are the proxy's there).
    next_model_seq: int = 0
    next_sampler_seq: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    finished: bool = False


@dataclass(eq=False)
class Checkpoint:
    """One of Shepherd's checkpoints of a model: saved by two internal operations; the
    restore point once both are answered and every operation before it is too."""

    name: str
    step: int
    #: Log position of the first operation after it, and the weights version it holds.
    lpos: int
    wver: int
    trainer_job_id: str
    state_op: Op
    sampler_op: Op
    #: What ``load_weights`` is given to restore it (its control-plane resource name).
    ref: str
    record: CheckpointRecord

    @property
    def saved(self) -> bool:
        return self.state_op.outcome_ok is True and self.sampler_op.outcome_ok is True

    @property
    def failed(self) -> bool:
        return self.state_op.outcome_ok is False or self.sampler_op.outcome_ok is False


@dataclass(eq=False)
class Model:
    """A program's model (a training run): how it was made, its log since its last
    checkpoint, and where it lives now."""

    program_id: str
    session: Session
    #: The order the program made it in (0: its first). Shepherd's checkpoints of a model
    #: other than the first carry its number (``-m2``); which model is the job's is
    #: :meth:`~shepherd.proxy.core.Core.is_followed`'s to say.
    index: int
    create: Op
    ops: OrderedDict[int, Op] = field(default_factory=OrderedDict)
    #: The next program seq_id to forward (the program numbers from 1 after creation).
    next_seq: int = 1
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    broken: str | None = None
    closed: bool = False

    # ---- the current trainer generation
    trainer_id: str | None = None
    gen: int = 0
    next_tseq: int = 1

    # ---- the log
    lpos: int = 0
    #: Operations since the restore point, in order: the redo log.
    redo: list[Op] = field(default_factory=list)
    #: Weights versions (optim_steps and loads) logged so far.
    wver: int = 0
    #: Optimizer steps logged so far (the job's step for the job's model), counted on from
    #: ``step_base`` (the step of the checkpoint the program loaded its model from).
    step: int = 0
    step_base: int | None = None
    #: The trainer's count of the model's optimizer steps when it was made (a checkpoint's
    #: steps carry over): the trainer's count less this is the steps applied since.
    trainer_base: int = 0
    #: The last of its steps reported as a step event (while it is the job's model).
    reported_step: int = 0
    #: forward_backwards since the last optim_step logged (the next step's).
    cur_fbs: list[Op] = field(default_factory=list)
    #: optim_steps whose step event is still to be sent, in order.
    step_queue: list[Op] = field(default_factory=list)
    #: The restore point, and checkpoints issued after it.
    checkpoint: Checkpoint | None = None
    pending: list[Checkpoint] = field(default_factory=list)
    #: A digest fetch is under way / another is wanted after it.
    digest_busy: bool = False
    digest_again: bool = False

    def remember(self, op: Op) -> None:
        """Keep ``op`` in the dedupe window; the oldest answered ones fall out."""
        assert op.seq is not None
        self.ops[op.seq] = op
        while len(self.ops) > DEDUPE_WINDOW:
            seq, oldest = next(iter(self.ops.items()))
            if not oldest.done:
                break
            del self.ops[seq]


SamplerKind = Literal["base", "path", "snapshot", "remade"]


@dataclass(eq=False)
class Recipe:
    """How a snapshot's weights are made again on another trainer: from the model's restore
    point it followed (None: the model as the program made it), the operations between it and
    the snapshot, sent again to a scratch model (training is bit-reproducible)."""

    model: Model
    base: Checkpoint | None
    ops: list[Op]


@dataclass(eq=False)
class Sampler:
    """A program's sampling session and how to make it again on another trainer: from the
    base model, from a checkpoint path, or from the snapshot a model's redo log re-takes."""

    program_id: str
    session: Session
    kind: SamplerKind
    base_model: str | None = None
    #: ``path``: the trainer path of the checkpoint; the program's path it asked with.
    trainer_path: str | None = None
    program_path: str | None = None
    #: ``snapshot``: the model and the save that took it.
    model: Model | None = None
    snap_op: Op | None = None
    #: ``remade``: how its weights are made again after its snapshot left the redo log.
    recipe: Recipe | None = None
    #: Why it cannot be made again on a later trainer (a snapshot left the redo log at other
    #: weights than a checkpoint's, beyond the recipes kept); it stays live where it is.
    lost: str | None = None
    trainer_id: str | None = None
    gen: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: seq_id -> sample op (dedupe), and the ones not answered yet (sent again after a loss).
    calls: OrderedDict[int, Op] = field(default_factory=OrderedDict)
    pending: dict[str, Op] = field(default_factory=dict)

    def remember(self, op: Op) -> None:
        if op.seq is None:
            return
        self.calls[op.seq] = op
        while len(self.calls) > DEDUPE_WINDOW:
            seq, oldest = next(iter(self.calls.items()))
            if not oldest.done:
                break
            del self.calls[seq]


class FutureTable:
    """Every future a program may poll, by request id. Results are dropped by age and count
    (the record of an operation stays in its model's dedupe window)."""

    def __init__(self) -> None:
        self._ops: OrderedDict[str, Op] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ops)

    def add(self, op: Op) -> None:
        self._ops[op.request_id] = op
        if len(self._ops) > MAX_KEPT_RESULTS:
            self.sweep(time.monotonic())

    def get(self, request_id: str) -> Op | None:
        return self._ops.get(request_id)

    def discard(self, op: Op) -> None:
        self._ops.pop(op.request_id, None)

    def sweep(self, now: float) -> None:
        over = len(self._ops) - MAX_KEPT_RESULTS
        for request_id, op in list(self._ops.items()):
            if not op.done:
                continue  # never drop work not yet answered
            read_long_ago = op.first_read is not None and (
                now - op.first_read > RESULT_KEEP_AFTER_READ_S
            )
            too_old = op.finished is not None and now - op.finished > RESULT_TTL_S
            if over > 0 or read_long_ago or too_old:
                del self._ops[request_id]
                op.result = None
                op.dropped = True
                over -= 1
