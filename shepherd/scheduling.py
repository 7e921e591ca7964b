"""Who gets a trainer slot: Shepherd's admission of jobs to a backend's capacity.

A backend profile declares its **capacity** (``slots``: trainers it may hold at once, and the
capability tags it offers). **Queues** — a team's share — each have a **quota** (slots they are
entitled to), may **borrow** slots other queues leave idle up to a limit, and a **weight** for
sharing what is contended. A job waits in Shepherd, not on the platform, until it is
**admitted**; it holds its slot through recoveries and gives it back when its trainer goes for
good or for a while (a pause).

This module is the decision alone, pure and deterministic (the scheduler workflow,
workflows/scheduler.py, runs it over its state; the CLI reads the same state):

* **Order.** Within a queue: highest priority first, then arrival. Between queues: a queue
  under its quota before one that would borrow, then the higher priority, then the queue
  using least of its share (slots held / weight), then arrival.
* **Admission.** A free slot goes to the first request in that order whose queue may take
  it: under its quota, or borrowing within its ``borrow_limit``; and only where the backend
  has every capability the job requires.
* **Pools.** A backend whose trainers are not all alike declares its slots per accelerator
  type or training shape (``Capacity.pools``): a job is admitted only to a slot of its own
  pool, and a job waiting for one pool never holds up its queue's jobs for another.
* **Preemption.** A request that cannot be admitted for want of a slot reclaims one: from the
  lowest-priority *preemptible* holder of its own queue with a lower priority, or — when its
  queue is under its quota — from a holder of a queue that is borrowing; where the backend has
  pools, from a holder of the same pool (unless the job's pool has room, and what it lacks is
  the backend's or its queue's). Never from a job that
  has not checkpointed since it was admitted (the declared minimum) or was preempted less than
  ``PREEMPT_MIN_INTERVAL`` ago; one preemption at a time per waiting job; the slot it frees is
  reserved for the job it was freed for.
"""

from __future__ import annotations

import base64
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator
from temporalio.common import Priority

#: A job is preempted for another at most once in this long: a job that keeps being taken
#: from would make no progress (each preemption costs it a checkpoint, a trainer's boot and
#: the steps since its last checkpoint).
PREEMPT_MIN_INTERVAL = timedelta(minutes=10)
#: The queue of a job whose spec names none.
DEFAULT_QUEUE = "default"
#: A pool's name: an accelerator type (``NVIDIA_H100_80GB``) or a training shape
#: (``accounts/<a>/trainingShapes/<s>``); never a space or a comma (workers advertise them).
POOL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$")
POOL_RULE = (
    "an accelerator type or a training shape (1-200 letters, digits, '.', '_', ':', '/', '-')"
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class QueueConfig(_Model):
    """A team's share of a backend's capacity."""

    name: str
    #: Slots the queue is entitled to (its nominal quota).
    quota: int = Field(ge=0, le=100_000)
    #: Slots beyond its quota it may use while other queues leave them idle (reclaimed, by
    #: preemption, when their owners need them).
    borrow_limit: int = Field(default=0, ge=0, le=100_000)
    #: Its share of contended capacity, relative to the other queues'.
    weight: float = Field(default=1.0, gt=0, le=1000)


class Capacity(_Model):
    """What a backend may hold at once, and what it offers."""

    slots: int = Field(ge=0, le=100_000)
    capabilities: list[str] = Field(default_factory=list)
    #: Slots per accelerator type or training shape, where the backend's trainers are not
    #: all alike (``slots`` caps them together): a job is admitted only to a slot of its own
    #: pool (:func:`pool_of` its spec). Empty: every slot serves every job.
    pools: dict[str, int] = Field(default_factory=dict)

    @field_validator("pools")
    @classmethod
    def _pools(cls, pools: dict[str, int]) -> dict[str, int]:
        if problem := pools_problem(pools):
            raise ValueError(problem)
        return pools


def pools_problem(pools: dict[str, int]) -> str | None:
    """Why pools are refused (None: they are fine)."""
    for name, slots in pools.items():
        if not POOL_NAME.match(name):
            return f"pools: {name!r} is not {POOL_RULE}"
        if isinstance(slots, bool) or not isinstance(slots, int) or not 0 <= slots <= 100_000:
            return f"pools: {name!r} has {slots!r} slots (a whole number, 0 to 100000)"
    return None


class Ask(_Model):
    """A job's request for a slot."""

    #: The job's workflow id, and the job's number for this request (a new one after each
    #: time it gave its slot back): a late word about an older request is told apart.
    job: str
    seq: int
    queue: str = DEFAULT_QUEUE
    priority: int = 5
    preemptible: bool = False
    capabilities: list[str] = Field(default_factory=list)
    #: The kind of trainer it needs (:func:`pool_of` its spec; None: it names none).
    pool: str | None = None
    #: What the scheduler last told the job of its place (:func:`places_to_tell`: its
    #: position and what it waits for, or the range it stands in; None: nothing yet).
    told: str | None = None
    #: The scheduler's order of arrival (set when it arrives; a job requeued after a
    #: preemption keeps its own).
    arrival: int = 0
    asked_at: datetime | None = None


class Holder(_Model):
    """A job that holds a slot."""

    job: str
    seq: int
    queue: str
    priority: int
    preemptible: bool
    arrival: int
    granted_at: datetime
    pool: str | None = None
    #: It checkpointed since it was admitted: it may be preempted (it loses at most the
    #: steps since).
    checkpointed: bool = False


class Yielding(_Model):
    """A preemption under way: ``victim`` gives its slot back for ``for_job``."""

    victim: str
    for_job: str
    reason: str
    asked_at: datetime


#: How many of each line a scheduler tells their exact place by default (the rest hear the
#: range they stand in, ``PLACE_RANGES``): a backend profile's ``PLACES_FIRST``.
PLACES_FIRST = 10


class SchedulerState(_Model):
    """Everything the scheduler of one backend knows (carried across continue-as-new)."""

    backend: str
    capacity: Capacity
    queues: dict[str, QueueConfig] = Field(default_factory=dict)
    holders: dict[str, Holder] = Field(default_factory=dict)
    waiting: list[Ask] = Field(default_factory=list)
    yielding: dict[str, Yielding] = Field(default_factory=dict)
    #: A slot a preemption freed, kept for the job it was freed for (job -> victim).
    reserved: dict[str, str] = Field(default_factory=dict)
    #: When each job was last preempted (the rate limit).
    preempted_at: dict[str, datetime] = Field(default_factory=dict)
    next_arrival: int = 1
    #: How often the scheduler asks which of its jobs closed without a word (terminated):
    #: their slots come back within this (seconds).
    holder_check_s: float = Field(default=30.0, gt=0, le=3600)
    #: How often the waiting jobs are told their places (or ranges), at most
    #: (seconds; ``places_first``, below).
    places_every_s: float = Field(default=30.0, gt=0, le=3600)
    #: Waiting jobs of each line told their exact place (the rest: the range they stand in).
    places_first: int = Field(default=PLACES_FIRST, ge=0, le=10_000)
    #: Counters (metrics): admissions, preemptions by cause, and per queue the seconds its
    #: jobs held slots (of those given back) and waited for them (of those admitted).
    admitted_total: int = 0
    preemptions: dict[str, int] = Field(default_factory=dict)
    held_seconds: dict[str, float] = Field(default_factory=dict)
    waited_seconds: dict[str, float] = Field(default_factory=dict)
    admitted: dict[str, int] = Field(default_factory=dict)
    #: A summary's (:func:`summarised`): how many wait in each queue, of whom ``waiting``
    #: lists only the first. Empty in the state itself, whose ``waiting`` is everyone.
    waiting_count: dict[str, int] = Field(default_factory=dict)

    def waiting_in(self) -> dict[str, int]:
        """How many jobs wait in each queue."""
        if self.waiting_count:
            return dict(self.waiting_count)
        counts: dict[str, int] = {}
        for a in self.waiting:
            counts[a.queue] = counts.get(a.queue, 0) + 1
        return counts

    def queue(self, name: str) -> QueueConfig:
        """``name``'s config. Where no queue is declared, every queue is entitled to the
        whole capacity; where some are, one nobody declared has no quota and only borrows
        what the others leave idle."""
        if name in self.queues:
            return self.queues[name]
        if not self.queues:
            return QueueConfig(name=name, quota=self.capacity.slots)
        return QueueConfig(name=name, quota=0, borrow_limit=self.capacity.slots)

    def usage(self) -> dict[str, int]:
        used: dict[str, int] = {}
        for h in self.holders.values():
            used[h.queue] = used.get(h.queue, 0) + 1
        return used

    def pool_usage(self) -> dict[str, int]:
        """Slots held in each pool (none where the backend declares no pools)."""
        used: dict[str, int] = {}
        if self.capacity.pools:
            for h in self.holders.values():
                if h.pool is not None:
                    used[h.pool] = used.get(h.pool, 0) + 1
        return used


@dataclass
class Plan:
    """What the scheduler does now: grant these requests, ask these holders to yield."""

    grants: list[Ask]
    yields: list[Yielding]


def quota_problem(queues: dict[str, QueueConfig], capacity: Capacity) -> str | None:
    """Quotas are entitlements: together they may not promise more slots than there are
    (a queue under its quota reclaims borrowed slots; two could not both be owed one)."""
    total = sum(q.quota for q in queues.values())
    if total > capacity.slots:
        each = ", ".join(f"{n} {q.quota}" for n, q in sorted(queues.items()))
        return (
            f"quota: the queues' quotas ({each}) add up to {total}, more than the backend's "
            f"{capacity.slots} slots"
        )
    return None


def missing_capabilities(ask: Ask, capacity: Capacity) -> list[str]:
    if not ask.capabilities:
        return []  # (most jobs need none: no sets for each of thousands waiting, each decision)
    return sorted(set(ask.capabilities) - set(capacity.capabilities))


def unservable(ask: Ask, capacity: Capacity, backend: str) -> str | None:
    """What the backend lacks to serve ``ask`` at all, in words (None: nothing)."""
    if missing := missing_capabilities(ask, capacity):
        return f"a backend with {', '.join(missing)} (backend {backend!r} has not)"
    if capacity.pools and ask.pool not in capacity.pools:
        kind = f"pool {ask.pool!r}" if ask.pool else "no accelerator type or training shape"
        return (
            f"a slot of its own kind: backend {backend!r} has slots for "
            f"{', '.join(sorted(capacity.pools))} only, the job names {kind}"
        )
    return None


def pool_of(training_shape: str | None, accelerator_type: str | None) -> str | None:
    """The pool a job's trainer takes a slot of: its training shape (without a version: a
    shape's versions run on the same trainers), else its accelerator type."""
    if training_shape:
        return training_shape.split("/versions/")[0]
    return accelerator_type or None


def _order(state: SchedulerState, asks: Iterable[Ask], used: dict[str, int]) -> list[Ask]:
    """``asks`` in the order they are served (see the module's doc)."""

    def key(a: Ask) -> tuple[bool, int, float, int]:
        q = state.queue(a.queue)
        borrowing = used.get(a.queue, 0) >= q.quota
        return (borrowing, -a.priority, used.get(a.queue, 0) / q.weight, a.arrival)

    return sorted(asks, key=key)


def _may_take(state: SchedulerState, ask: Ask, used: dict[str, int]) -> bool:
    """Whether ``ask``'s queue may take one more slot (free slots aside)."""
    q = state.queue(ask.queue)
    return used.get(ask.queue, 0) < q.quota + q.borrow_limit


@dataclass
class _Free:
    """Slots free now: the backend's, and each pool's (where it declares pools). A slot
    reserved for a job (a preemption freed it) is not free."""

    slots: int
    pools: dict[str, int]

    def has_room(self, ask: Ask) -> bool:
        return self.slots > 0 and self.pool_has_room(ask)

    def pool_has_room(self, ask: Ask) -> bool:
        return not self.pools or self.pools.get(ask.pool or "", 0) > 0

    def take(self, ask: Ask) -> None:
        self.slots -= 1
        if self.pools and ask.pool in self.pools:
            self.pools[ask.pool] -= 1


def plan(state: SchedulerState, now: datetime) -> Plan:
    """Grants and preemptions for now (``state`` is not changed).

    It runs at every decision, and again for each when the scheduler's history is replayed
    (after its worker's cache let it go): with thousands waiting, a pass over the line is
    ~10 ms, so the line is only read where it can change something — a free slot to fill,
    a slot reserved for a job, a holder that may be preempted."""
    if not state.waiting:
        return Plan(grants=[], yields=[])
    used = state.usage()
    cap = state.capacity
    reserved = [a for a in state.waiting if a.job in state.reserved] if state.reserved else []
    free = _Free(cap.slots - len(state.holders) - len(state.reserved), {})
    if cap.pools:
        held = state.pool_usage()
        for a in reserved:
            if a.pool is not None:
                held[a.pool] = held.get(a.pool, 0) + 1
        free.pools = {p: n - held.get(p, 0) for p, n in cap.pools.items()}
    grants: list[Ask] = []
    # (Granted jobs are skipped by name: removing them from a copy of the line compared
    # every request field by field.)
    granted: set[str] = set()
    # A slot a preemption freed goes to the job it was freed for.
    for ask in reserved:
        grants.append(ask)
        used[ask.queue] = used.get(ask.queue, 0) + 1
        granted.add(ask.job)
    while free.slots > 0:
        admissible = [
            a
            for a in _heads(state, state.waiting, granted)
            if _may_take(state, a, used) and free.has_room(a)
        ]
        if not admissible:
            break
        ask = _order(state, admissible, used)[0]
        grants.append(ask)
        used[ask.queue] = used.get(ask.queue, 0) + 1
        granted.add(ask.job)
        free.take(ask)
    if not any(_may_make_way(state, h, now) for h in state.holders.values()):
        return Plan(grants=grants, yields=[])
    return Plan(grants=grants, yields=_preemptions(state, granted, used, now, free))


def _may_make_way(state: SchedulerState, h: Holder, now: datetime) -> bool:
    """Whether ``h`` may be asked to make way now, for a job that outranks it."""
    if h.job in state.yielding or not h.preemptible or not h.checkpointed:
        return False
    last = state.preempted_at.get(h.job)
    return last is None or now - last >= PREEMPT_MIN_INTERVAL


def _heads(state: SchedulerState, waiting: list[Ask], skip: set[str] | None = None) -> list[Ask]:
    """The first request of each queue (highest priority, then arrival) that this backend
    can serve at all (one that needs a capability it lacks never holds its queue up) — of
    each queue and pool, where the backend declares pools (a job waiting for a busy pool
    holds up nobody waiting for another)."""
    heads: dict[tuple[str, str | None], Ask] = {}
    cap = state.capacity
    pools = bool(cap.pools)
    for a in waiting:  # (the hot loop: thousands per decision, so nothing it can skip)
        if skip and a.job in skip:
            continue
        if (a.capabilities or pools) and unservable(a, cap, state.backend):
            continue
        key = (a.queue, a.pool if pools else None)
        best = heads.get(key)
        if best is None or (-a.priority, a.arrival) < (-best.priority, best.arrival):
            heads[key] = a
    return list(heads.values())


def _preemptions(
    state: SchedulerState, granted: set[str], used: dict[str, int], now: datetime, free: _Free
) -> list[Yielding]:
    """For each queue's first request still waiting, the holder that makes way for it: a
    lower-priority one of its own queue (whether the backend or the queue's quota is full),
    or, when no slot is free and its queue is under its quota, one of a queue that borrows.
    Where the backend has pools, only a holder of the job's own pool frees a slot it can
    use, unless its pool has room (what it lacks then is the backend's slot or its queue's
    quota). At most one preemption under way per waiting job."""
    yields: list[Yielding] = []
    taken = set(state.yielding)  # holders already making way
    wanting = {y.for_job for y in state.yielding.values()} | set(state.reserved)
    for ask in _order(state, _heads(state, state.waiting, granted), used):
        if ask.job in wanting:
            continue
        q = state.queue(ask.queue)
        entitled = used.get(ask.queue, 0) < q.quota
        any_pool = free.pool_has_room(ask)
        no_slot = not free.has_room(ask)
        victims = []
        for h in state.holders.values():
            if h.job in taken or not _may_make_way(state, h, now):
                continue
            if not any_pool and h.pool != ask.pool:
                continue
            hq = state.queue(h.queue)
            if h.queue == ask.queue and h.priority < ask.priority:
                victims.append((h, f"priority: {ask.job} (priority {ask.priority}) needs the slot"))
            elif no_slot and h.queue != ask.queue and entitled and used.get(h.queue, 0) > hq.quota:
                victims.append(
                    (
                        h,
                        f"reclaim: queue {ask.queue!r} needs its quota back for {ask.job} "
                        f"(queue {h.queue!r} borrows beyond its quota of {hq.quota})",
                    )
                )
        if not victims:
            continue
        # The lowest priority; of equals, the one admitted last (it has done the least).
        victim, why = min(victims, key=lambda v: (v[0].priority, -v[0].granted_at.timestamp()))
        taken.add(victim.job)
        used[victim.queue] -= 1
        yields.append(Yielding(victim=victim.job, for_job=ask.job, reason=why, asked_at=now))
    return yields


def _in_line(a: Ask) -> tuple[int, int]:
    """A request's place within its queue: the highest priority first, then arrival."""
    return (-a.priority, a.arrival)


def lines(state: SchedulerState) -> dict[str, list[Ask]]:
    """Each queue's waiting jobs in their order of admission (priority, then arrival)."""
    out: dict[str, list[Ask]] = {}
    for ask in state.waiting:
        out.setdefault(ask.queue, []).append(ask)
    for line in out.values():
        line.sort(key=_in_line)
    return out


def placement(state: SchedulerState, job: str) -> Placement | None:
    """Where a waiting job stands: its place in its queue's line (1-based), the line's
    length and what it waits for (None: it does not wait). Only its own queue is sorted."""
    mine = next((a for a in state.waiting if a.job == job), None)
    if mine is None:
        return None
    line = sorted((a for a in state.waiting if a.queue == mine.queue), key=_in_line)
    i, ahead = next((i, ahead) for i, a, ahead in _with_ahead(state, line) if a is mine)
    return Placement(
        queue=mine.queue, position=i + 1, length=len(line), waits_for=_waits_for(state, mine, ahead)
    )


def _with_ahead(state: SchedulerState, line: list[Ask]) -> Iterator[tuple[int, Ask, int]]:
    """Each request of a line (in order) with its index and how many ahead of it go first:
    all of them, or where the backend has pools, those waiting for its pool."""
    by_pool: dict[str | None, int] = {}
    for i, ask in enumerate(line):
        yield i, ask, by_pool.get(ask.pool, 0) if state.capacity.pools else i
        by_pool[ask.pool] = by_pool.get(ask.pool, 0) + 1


def position(state: SchedulerState, job: str) -> tuple[int, int] | None:
    """A waiting job's place in its queue and the queue's length (None: it does not wait)."""
    p = placement(state, job)
    return None if p is None else (p.position, p.length)


def waits_for(state: SchedulerState, job: str) -> str | None:
    """What a waiting job waits for, in words (None: it does not wait)."""
    p = placement(state, job)
    return None if p is None else p.waits_for


def _waits_for(state: SchedulerState, ask: Ask, ahead: int) -> str:
    if lacking := unservable(ask, state.capacity, state.backend):
        return lacking
    if ask.job in state.reserved or any(y.for_job == ask.job for y in state.yielding.values()):
        return "a slot being freed for it (a lower-priority job is checkpointing)"
    used = state.usage()
    q = state.queue(ask.queue)
    if ahead:
        return f"{ahead} job(s) ahead of it in queue {ask.queue!r} (higher priority, or earlier)"
    limit = q.quota + q.borrow_limit
    if used.get(ask.queue, 0) >= limit and limit < state.capacity.slots:
        return (
            f"its queue's quota: queue {ask.queue!r} holds {used.get(ask.queue, 0)} of "
            f"{q.quota} slots (+{q.borrow_limit} it may borrow)"
        )
    if ask.pool in state.capacity.pools:
        pool_slots = state.capacity.pools[ask.pool]
        if state.pool_usage().get(ask.pool, 0) >= pool_slots:
            return (
                f"the backend's capacity for {ask.pool}: all {pool_slots} of its slots of "
                f"{state.backend!r} are held"
            )
    if len(state.holders) + len(state.reserved) >= state.capacity.slots:
        return (
            f"the backend's capacity: all {state.capacity.slots} slots of {state.backend!r} "
            "are held"
        )
    return "its turn (a slot is free: it is being admitted)"


# ----------------------------------------------------------------- the job <-> scheduler words


class SchedulerInput(_Model):
    """The scheduler workflow's one argument: its state (a new one's seed, or carried)."""

    state: SchedulerState
    #: The waiting jobs, carried apart from ``state`` as zlib-compressed JSON (base64): a
    #: waiting job's request is ~175 bytes of JSON, so 10,000 of them would come near
    #: Temporal's 2 MB limit on a payload (the continue-as-new input); packed, ~10x less.
    waiting_packed: str | None = None

    @classmethod
    def carry(cls, state: SchedulerState) -> SchedulerInput:
        """The input that carries ``state`` across continue-as-new."""
        rows = TypeAdapter(list[Ask]).dump_json(state.waiting)
        packed = base64.b64encode(zlib.compress(rows, 6)).decode()
        return cls(state=state.model_copy(update={"waiting": []}), waiting_packed=packed)

    def unpacked(self) -> SchedulerState:
        if self.waiting_packed is None:
            return self.state
        rows = zlib.decompress(base64.b64decode(self.waiting_packed))
        waiting = TypeAdapter(list[Ask]).validate_json(rows)
        return self.state.model_copy(update={"waiting": [*waiting, *self.state.waiting]})


class Release(_Model):
    """Signal to the scheduler: ``job`` gives its slot (or its place in line) back."""

    job: str
    seq: int
    #: Preempted for another: it asks again at once, keeping its place (its arrival).
    requeue: bool = False


class Checkpointed(_Model):
    """Signal to the scheduler: ``job`` checkpointed since it was admitted (it may be
    preempted from now on)."""

    job: str
    seq: int


class SlotGrant(_Model):
    """Signal to a job: it is admitted to a slot (for its request ``seq``)."""

    seq: int
    backend: str
    queue: str
    #: Its place of arrival (kept if it is requeued to make way for another).
    arrival: int = 0


class MakeWay(_Model):
    """Signal to a job: give the slot back for ``for_job`` (checkpoint, let the trainer go,
    wait for the next turn)."""

    seq: int
    for_job: str
    reason: str


class PlaceNotice(_Model):
    """Signal to a waiting job: where it stands (for its request ``seq``), as of ``at``.
    ``within``: it stands somewhere from ``placement.position`` to this (a job further back
    than the first of its line is told the range, as it changes)."""

    seq: int
    placement: Placement
    at: datetime
    within: int | None = None


class JobNotice(_Model):
    """The scheduler's word to one job (activity ``tell_jobs``): its slot, make way, or its
    place in line."""

    job: str
    slot_granted: SlotGrant | None = None
    make_way: MakeWay | None = None
    place: PlaceNotice | None = None


class Placement(_Model):
    """Where a waiting job stands (the scheduler's ``where`` query)."""

    queue: str
    position: int
    length: int
    waits_for: str
    #: Seconds until it should be admitted, from the running jobs' progress (a client's
    #: estimate: None where the running jobs do not say, or more must finish than run now).
    starts_in_s: float | None = None


#: The scheduler's workflow type.
SCHEDULER_TYPE = "ShepherdScheduler"


def placements(state: SchedulerState, *, first: int | None = None) -> list[tuple[str, Placement]]:
    """Where every waiting job stands (or the ``first`` of each queue), queue by queue."""
    out = []
    for name, line in sorted(lines(state).items()):
        for i, ask, ahead in _with_ahead(state, line[:first]):
            place = Placement(
                queue=name,
                position=i + 1,
                length=len(line),
                waits_for=_waits_for(state, ask, ahead),
            )
            out.append((ask.job, place))
    return out


#: The ranges a job further back than the first of its line is told it stands in: powers of
#: ten, so a job crosses a few of them on its way to the front. Each notice is a workflow task
#: of the job's (a signal and three more history events); with finer ranges and 50 exact
#: places a job of 1,000 waiting heard about six (docs/scale.md). ``status``, ``list`` and
#: ``watch`` ask the scheduler for the exact place.
PLACE_RANGES = (100, 1_000, 10_000, 100_000, 1_000_000)
#: The ranges before them: a scheduler whose history told these replays with them (patch
#: ``coarse-places``).
FINE_PLACE_RANGES = (100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 1_000_000)


def place_range(
    position: int, first: int, ranges: tuple[int, ...] = PLACE_RANGES
) -> tuple[int, int]:
    """The range a job at ``position`` (beyond the ``first``) stands in: (from, to)."""
    low = first
    for high in ranges:
        if position <= high and high > first:
            return low + 1, high
        low = max(low, high)
    return low + 1, position


def places_to_tell(
    state: SchedulerState,
    first: int,
    now: datetime,
    *,
    further: int,
    ranges: tuple[int, ...] = PLACE_RANGES,
) -> list[JobNotice]:
    """The place notices due, each waiting job's ``told`` brought up to date with them: to
    each of the first ``first`` of each line whose place (position, what it waits for)
    changed since it was last told; and to jobs further back whose range (``PLACE_RANGES``)
    changed, the nearest ``further`` of them at most (the rest hear it the next time: a
    burst of thousands joining is not told at once). A line's length alone is not news: it
    changes with every ask."""
    notices: list[JobNotice] = []
    for name, line in sorted(lines(state).items()):
        for i, ask, ahead in _with_ahead(state, line):
            if i < first:
                place = Placement(
                    queue=name,
                    position=i + 1,
                    length=len(line),
                    waits_for=_waits_for(state, ask, ahead),
                )
                said, within = f"{place.position}|{place.waits_for}", None
            else:
                low, within = place_range(i + 1, first, ranges)
                said = f"{low}-{within}"
                if ask.told == said or further <= 0:
                    continue
                further -= 1
                waits = f"the {low - 1} job(s) or more ahead of it in queue {name!r}"
                place = Placement(queue=name, position=low, length=len(line), waits_for=waits)
            if ask.told != said:
                ask.told = said
                notice = PlaceNotice(seq=ask.seq, placement=place, at=now, within=within)
                notices.append(JobNotice(job=ask.job, place=notice))
    return notices


def summarised(state: SchedulerState, first: int) -> SchedulerState:
    """``state`` with only the first ``first`` jobs waiting in each queue listed (and how
    many wait in each counted): what an operator's view and the metrics read (the whole
    line of 10,000 waiting jobs is 1.6 MB, too much to query every few seconds)."""
    queued = lines(state)
    return state.model_copy(
        update={
            "waiting": [a for line in queued.values() for a in line[: max(0, first)]],
            "waiting_count": {q: len(line) for q, line in queued.items()},
        }
    )


def details(state: SchedulerState, *, first: int = 10) -> str:
    """The scheduler's page in the Web UI (its current details, markdown): capacity, each
    queue's use, and the first jobs waiting in each with what they wait for."""
    used = state.usage()
    waiting = state.waiting_in()
    head = (
        f"**{state.backend}**: {len(state.holders)} of {state.capacity.slots} slots held, "
        f"{sum(waiting.values())} waiting, {state.admitted_total} admitted"
    )
    if state.capacity.pools:
        held = state.pool_usage()
        head += "; pools " + ", ".join(
            f"{p} {held.get(p, 0)}/{n}" for p, n in sorted(state.capacity.pools.items())
        )
    rows = ["| queue | quota | in use | waiting |", "|---|---|---|---|"]
    for name in sorted({*state.queues, *used, *waiting}):
        q = state.queue(name)
        rows.append(f"| {name} | {q.quota} | {used.get(name, 0)} | {waiting.get(name, 0)} |")
    line = [
        f"- {p.queue} {p.position}/{p.length}: `{job}` waits for {p.waits_for}"
        for job, p in placements(state, first=first)
    ]
    return "\n".join([head, "", *rows, "", *line])


def task_priority(priority: int) -> Priority:
    """Temporal's task priority for a job of ``scheduling.priority`` (10, the most urgent ..
    0) -> priority key 1 .. 5 (lower runs first): which job's tasks a busy worker pool runs
    first — its first workflow task behind a burst of new jobs included."""
    return Priority(priority_key=5 - round(priority * 4 / 10))


#: The task priority of work on a trainer a job holds (its activities from the create on):
#: ahead of every job's intake and waits, as each second such a task waits a GPU idles. (It
#: does not cure the running jobs' stall while a burst of thousands is taken in: their
#: workflow tasks wait there, docs/scale.md "Admission".)
HOLDING_PRIORITY = Priority(priority_key=1)


def scheduler_id(backend: str) -> str:
    """The scheduler workflow of a backend."""
    return f"shepherd-scheduler-{backend}"
