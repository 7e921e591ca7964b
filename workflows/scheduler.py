"""``ShepherdScheduler``: the admission of one backend's jobs to its capacity, as one
long-lived workflow (id ``shepherd-scheduler-<backend>``).

Jobs ask for a slot (``asks``, sent by the job's preflight or its ``ask_for_slot`` activity,
which start the scheduler with its seed the first time), give it back (``release``) and say
when they have checkpointed (``checkpointed``); the scheduler decides
(shepherd/scheduling.py: priority, quotas, borrowing, preemption) and tells them:
``slot_granted`` to a job admitted, ``make_way`` to a job that must give its slot to a more
urgent one. Operators read its state (``state``, ``where``) and change its queues and
capacity while jobs run (updates ``configure`` and ``set_capacity``, validated).

Why one workflow per backend: its state (who holds, who waits, in what order) survives any
worker's death by construction, every decision is made once and recorded (no slot granted
twice: a grant is in the state before the job hears of it), and Temporal serializes the
messages. It costs about ten history events per job admitted (the ask, the grant, the
release, their workflow tasks), so it continues-as-new every few hundred jobs with its state
carried; the state is a few dozen bytes per job. A job terminated from outside runs no
cleanup: every ``holder_check_s`` (30 s) the scheduler asks which of its holders and waiting jobs are
closed, and takes their slots and places back.

Deterministic code only.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import FailureError

with workflow.unsafe.imports_passed_through():
    import workflows.policies as policies
    import workflows.versions as versions
    from activities.scheduling import SchedulingActivities
    from shepherd.scheduling import (
        FINE_PLACE_RANGES,
        PLACE_RANGES,
        SCHEDULER_TYPE,
        Ask,
        Capacity,
        Checkpointed,
        Holder,
        JobNotice,
        MakeWay,
        Placement,
        QueueConfig,
        Release,
        SchedulerInput,
        SchedulerState,
        SlotGrant,
        details,
        placement,
        places_to_tell,
        plan,
        quota_problem,
        summarised,
    )
    from shepherd.spec import QUEUE_NAME

#: How often the Web UI's page of the scheduler is rewritten, at most.
DETAILS_EVERY = timedelta(seconds=2)
#: Waiting jobs listed per queue in a summary (the ``summary`` query: operators, metrics).
SUMMARY_FIRST = 20
#: The scheduler continues-as-new at this many history events (about 400 admissions).
MAX_HISTORY = 4000
#: Every ``places_every_s`` (30 s) at most, the waiting jobs hear where they stand (a job's
#: page in the Web UI shows it; ``status`` and ``list`` ask the scheduler themselves): the
#: first ``places_first`` (10) of each line their exact place, the rest the range they stand
#: in (``scheduling.PLACE_RANGES``) as it changes, this many of those per round at most (a
#: burst of thousands joining the line is told over a few minutes, not in one round).
PLACES_FURTHER = 200
#: The check for jobs closed without a word (every ``holder_check_s``) asks about the
#: holders each time (a closed holder keeps a GPU's slot), the waiting jobs every this many
#: checks: a closed waiting job keeps nobody out (its grant fails and the slot goes to the
#: next at once, ``_tell``), it only stands in the line's counts meanwhile; and with
#: thousands waiting, every check sent all their ids to the activity (10,000 ids: ~350 KB of
#: history per check, 100 visibility queries).
WAITING_CHECK_EVERY = 10


@workflow.defn(name=SCHEDULER_TYPE)
class SchedulerWorkflow:
    @workflow.init
    def __init__(self, inp: SchedulerInput) -> None:
        self.s: SchedulerState = inp.unpacked()
        #: Something changed since the last decision.
        self.dirty = True
        #: When the Web UI's page was last written (it is rewritten at most every DETAILS_EVERY).
        self.details_at: datetime | None = None
        #: The jobs in the line (``s.waiting``'s, and perhaps some that left it since).
        self.asked: set[str] = {a.job for a in self.s.waiting}
        #: Checks for closed jobs in this run (the waiting are asked about every
        #: WAITING_CHECK_EVERY-th, the first included).
        self.checks = 0
        #: The waiting are told their places (patch tell-places; set at the run's start).
        self.tells_places = False
        #: When places were last told, and when they are due again (None: nothing new).
        self.places_at: datetime | None = None
        self.places_due: datetime | None = None

    @workflow.run
    async def run(self, inp: SchedulerInput) -> None:
        self.tells_places = workflow.patched(versions.TELL_PLACES)
        last_check = workflow.now()
        while True:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self.dirty or self._long(), timeout=self._wake_in()
                )
            if self._long():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(SchedulerInput.carry(self.s))
            if workflow.now() - last_check >= self._check_every() and (
                self.s.holders or self.s.waiting
            ):
                last_check = workflow.now()
                await self._forget_closed()
            if self.dirty:
                self.dirty = False
                await self._decide()
                # Its page in the Web UI: who holds, who waits where, and for what. (Sorting
                # the whole line each decision would cost more than deciding, with thousands;
                # and a replay, whose pages nobody sees, sorts it for none: not a command.)
                now = workflow.now()
                due = self.details_at is None or now - self.details_at >= DETAILS_EVERY
                if due and not workflow.unsafe.is_replaying():
                    self.details_at = now
                    workflow.set_current_details(details(self.s))
                if self.tells_places:
                    every = timedelta(seconds=self.s.places_every_s)
                    self.places_due = (self.places_at or now - every) + every
            if self.places_due is not None and workflow.now() >= self.places_due:
                await self._tell_places()

    def _check_every(self) -> timedelta:
        """How often to ask which jobs closed without a word (``holder_check_s``)."""
        return timedelta(seconds=self.s.holder_check_s)

    def _wake_in(self) -> timedelta:
        """Until the next check for closed jobs, or the places due before it."""
        every = self._check_every()
        if self.places_due is None:
            return every
        return max(timedelta(milliseconds=1), min(every, self.places_due - workflow.now()))

    async def _tell_places(self) -> None:
        """The waiting jobs, their places or ranges (those that changed)."""
        now = workflow.now()
        self.places_at, self.places_due = now, None
        coarse = workflow.patched(versions.COARSE_PLACES)
        notices = places_to_tell(
            self.s,
            self.s.places_first,
            now,
            further=PLACES_FURTHER,
            ranges=PLACE_RANGES if coarse else FINE_PLACE_RANGES,
        )
        if notices:
            await self._send(notices)

    def _long(self) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested() or info.get_current_history_length() >= MAX_HISTORY
        )

    # ------------------------------------------------------------------ deciding

    async def _decide(self) -> None:
        now = workflow.now()
        decided = plan(self.s, now)
        notices: list[JobNotice] = []
        if decided.grants:  # (one pass over the line for them all: it may be thousands)
            granted = {ask.job for ask in decided.grants}
            self.s.waiting = [a for a in self.s.waiting if a.job not in granted]
        for ask in decided.grants:
            self.s.reserved.pop(ask.job, None)
            self.s.holders[ask.job] = Holder(
                job=ask.job,
                seq=ask.seq,
                queue=ask.queue,
                priority=ask.priority,
                preemptible=ask.preemptible,
                arrival=ask.arrival,
                granted_at=now,
                pool=ask.pool,
            )
            self.s.admitted_total += 1
            q = ask.queue
            self.s.admitted[q] = self.s.admitted.get(q, 0) + 1
            waited = (now - ask.asked_at).total_seconds() if ask.asked_at else 0.0
            self.s.waited_seconds[q] = self.s.waited_seconds.get(q, 0.0) + max(0.0, waited)
            grant = SlotGrant(
                seq=ask.seq, backend=self.s.backend, queue=ask.queue, arrival=ask.arrival
            )
            notices.append(JobNotice(job=ask.job, slot_granted=grant))
        for y in decided.yields:
            self.s.yielding[y.victim] = y
            cause = "reclaim" if y.reason.startswith("reclaim") else "priority"
            self.s.preemptions[cause] = self.s.preemptions.get(cause, 0) + 1
            holder = self.s.holders[y.victim]
            notice = MakeWay(seq=holder.seq, for_job=y.for_job, reason=y.reason)
            notices.append(JobNotice(job=y.victim, make_way=notice))
        if not notices:
            return
        if workflow.patched(versions.TELL_JOBS_BY_ACTIVITY):
            await self._send(notices)
            return
        await asyncio.gather(
            *(
                self._tell(n.job, "slot_granted", n.slot_granted)
                if n.slot_granted is not None
                else self._tell(n.job, "make_way", n.make_way)
                for n in notices
            )
        )

    async def _send(self, notices: list[JobNotice]) -> None:
        """Notices to jobs, through the ``tell_jobs`` activity; the jobs that are gone give
        back what they had."""
        gone: list[str] = await workflow.execute_activity_method(
            SchedulingActivities.tell_jobs,
            notices,
            start_to_close_timeout=timedelta(minutes=1),
            retry_policy=policies.SCHEDULER_TELL_RETRY,
            summary=f"tell {len(notices)} job(s)",
        )
        self._take_back(gone, "is gone")

    async def _tell(self, job: str, signal: str, what: object) -> None:
        """Signal a job; a job that is gone gives back what it had (it runs no cleanup)."""
        try:
            await workflow.get_external_workflow_handle(job).signal(signal, what)
        except FailureError as err:
            workflow.logger.info("job %s is gone (%s): its slot comes back", job, err.message)
            self._drop(job)

    def _drop(self, job: str) -> None:
        """``job`` holds nothing and waits for nothing any more."""
        held = self.s.holders.pop(job, None)
        if held is not None:
            seconds = (workflow.now() - held.granted_at).total_seconds()
            self.s.held_seconds[held.queue] = self.s.held_seconds.get(held.queue, 0.0) + seconds
        if job in self.asked:
            self.s.waiting = [a for a in self.s.waiting if a.job != job]
            self.asked.discard(job)
        self.s.reserved.pop(job, None)
        made_way = self.s.yielding.pop(job, None)
        if (
            held is not None
            and made_way is not None
            and made_way.for_job in {a.job for a in self.s.waiting}
        ):
            self.s.reserved[made_way.for_job] = job
        for victim, y in list(self.s.yielding.items()):
            if y.for_job == job:  # it left before the slot it was freed for came
                del self.s.yielding[victim]
        self.dirty = True

    async def _forget_closed(self) -> None:
        asked = set(self.s.holders)
        if self.checks % WAITING_CHECK_EVERY == 0:
            asked |= {a.job for a in self.s.waiting}
        self.checks += 1
        jobs = sorted(asked)
        closed: list[str] = await workflow.execute_activity_method(
            SchedulingActivities.closed_jobs,
            jobs,
            start_to_close_timeout=timedelta(minutes=2),
            retry_policy=policies.SCHEDULER_RETRY,
            summary=f"which of {len(jobs)} jobs are closed",
        )
        self._take_back(closed, "closed without giving its slot back")

    def _take_back(self, jobs: list[str], why: str) -> None:
        """What ``jobs`` held or waited for, taken back (they run no cleanup)."""
        for job in jobs:
            workflow.logger.info("job %s %s: taken back", job, why)
            self._drop(job)

    # ------------------------------------------------------------------ messages

    @workflow.signal(name="ask")
    def ask(self, ask: Ask) -> None:
        held = self.s.holders.get(ask.job)
        if held is not None and held.seq >= ask.seq:
            return  # already admitted for it (a retried ask): the grant was sent
        if held is not None:
            self._drop(ask.job)  # an older request it holds a slot for: given back
        # (Most asks are new: the line is only scanned for the job when it is in it. A scan
        # per ask made a burst of 10,000 asks quadratic.)
        if ask.job in self.asked:
            waiting = next((a for a in self.s.waiting if a.job == ask.job), None)
            if waiting is not None and waiting.seq >= ask.seq:
                return
            self.s.waiting = [a for a in self.s.waiting if a.job != ask.job]
        self.asked.add(ask.job)
        if not ask.arrival:  # a job requeued after a preemption keeps its place
            ask.arrival = self.s.next_arrival
            self.s.next_arrival += 1
        ask.asked_at = ask.asked_at or workflow.now()
        self.s.waiting.append(ask)
        self.dirty = True

    @workflow.signal(name="asks")
    def asks(self, asks: list[Ask]) -> None:
        """Several jobs' asks in one signal (a worker sends its asks so: activities/scheduling.py)."""
        for one in asks:
            self.ask(one)

    @workflow.signal(name="release")
    def release(self, release: Release) -> None:
        held = self.s.holders.get(release.job)
        if held is not None and held.seq > release.seq:
            return  # a late word about an older slot
        if release.requeue and release.job in self.s.yielding:
            self.s.preempted_at[release.job] = workflow.now()
        self._drop(release.job)

    @workflow.signal(name="checkpointed")
    def checkpointed(self, note: Checkpointed) -> None:
        held = self.s.holders.get(note.job)
        if held is not None and held.seq == note.seq:
            held.checkpointed = True
            self.dirty = True  # it may make way for a waiting job now

    @workflow.update(name="configure")
    async def configure(self, queue: QueueConfig) -> SchedulerState:
        self.s.queues[queue.name] = queue
        self.dirty = True
        return summarised(self.s, SUMMARY_FIRST)

    @configure.validator
    def _check_queue(self, queue: QueueConfig) -> None:
        others = {n: q for n, q in self.s.queues.items() if n != queue.name}
        if problem := queue_problem(queue) or quota_problem(
            {**others, queue.name: queue}, self.s.capacity
        ):
            raise ValueError(problem)

    @workflow.update(name="remove_queue")
    async def remove_queue(self, name: str) -> SchedulerState:
        self.s.queues.pop(name, None)
        self.dirty = True
        return summarised(self.s, SUMMARY_FIRST)

    @remove_queue.validator
    def _check_removal(self, name: str) -> None:
        if name not in self.s.queues:
            known = ", ".join(sorted(self.s.queues)) or "none"
            raise ValueError(f"queue {name!r} is not declared (declared: {known})")

    @workflow.update(name="set_capacity")
    async def set_capacity(self, capacity: Capacity) -> SchedulerState:
        self.s.capacity = capacity
        self.dirty = True
        return summarised(self.s, SUMMARY_FIRST)

    @set_capacity.validator
    def _check_capacity(self, capacity: Capacity) -> None:
        if problem := quota_problem(self.s.queues, capacity):
            raise ValueError(problem)

    @workflow.query(name="state")
    def state(self) -> SchedulerState:
        return self.s

    @workflow.query(name="summary")
    def summary(self, first: int = SUMMARY_FIRST) -> SchedulerState:
        """The state with only the first ``first`` jobs of each queue's line listed."""
        return summarised(self.s, first)

    @workflow.query(name="where")
    def where(self, job: str) -> Placement | None:
        return placement(self.s, job)


def queue_problem(queue: QueueConfig) -> str | None:
    """Why a queue's config is refused (None: it is fine)."""
    if not QUEUE_NAME.match(queue.name):
        return (
            f"queue {queue.name!r}: 1-200 characters of letters, digits, '.', '_', ':', '/' and '-'"
        )
    return None
