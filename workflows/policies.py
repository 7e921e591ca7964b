"""Every wait, retry and timeout of the job lifecycle, declared in one place.

"Where is the warm-up policy declared?" — here. Each activity call states its timeouts and
``RetryPolicy``; waiting on the platform is polling *by retries* (the activity raises a
benign, retryable error while the platform is not there yet, and ``backoff_coefficient=1.0``
makes the retry interval the poll interval). A job's ``spec.policies`` overrides the knobs
documented in :class:`shepherd.spec.PoliciesSpec`.

Deterministic code only: imported by the workflow.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from temporalio.common import RetryPolicy

from shepherd.platform.client import (  # noqa: F401 - declared there (the data plane's)
    DATA_PLANE_RESEND_PAUSE_S,
    DATA_PLANE_SILENCE_S,
)
from shepherd.reaper import REAPER_GRACE, REAPER_PERIOD  # noqa: F401 - declared there
from shepherd.spec import PoliciesSpec
from shepherd.temporal import SERVER_CALL_RETRY  # noqa: F401 - declared there (a worker's)

# --------------------------------------------------------------------- error types
# ApplicationError types raised by activities; the workflow branches on them.

#: The platform is not there yet (benign; retried by the poll policy).
NOT_READY = "NotReady"
#: The trainer died (FAILED, IDLE, CANCELLED ...): go to recovery, no retry budget burned.
TRAINER_LOST = "TrainerLost"
#: The trainer job was deleted (or is being deleted) outside Shepherd.
TRAINER_GONE = "TrainerGone"
#: A data-plane 404 while the control plane says RUNNING: the gateway route race.
ROUTE_RACE = "RouteRace"
#: The route race outlasted its budget.
ROUTE_RACE_EXHAUSTED = "RouteRaceExhausted"
#: The trainer's step is behind what Shepherd applied: its progress was lost.
TRAINER_BEHIND = "TrainerBehind"
#: The platform rejected the request itself (4xx): retrying cannot help.
INVALID_REQUEST = "InvalidRequest"
UNAUTHENTICATED = "Unauthenticated"
PERMISSION_DENIED = "PermissionDenied"
NOT_FOUND = "NotFound"
FAILED_PRECONDITION = "FailedPrecondition"
#: The output model id is taken by a model of another checkpoint.
MODEL_EXISTS = "ModelExists"
#: A trainer id Shepherd derived is taken by a job that is not this workflow's.
TRAINER_ID_TAKEN = "TrainerIdTaken"
#: The worker has no such backend profile, or its credentials are missing.
BACKEND_MISCONFIGURED = "BackendMisconfigured"
#: The evaluation did not report the metric the spec tracks.
METRIC_MISSING = "MetricMissing"
#: A user training loop could not be loaded.
LOOP_ERROR = "LoopError"
#: The job's dataset cannot be read or parsed on the worker (its preflight).
INVALID_DATASET = "InvalidDataset"
#: The base model does not exist on the backend, or is another account's (its preflight).
INVALID_BASE_MODEL = "InvalidBaseModel"

#: A program exited with a non-zero status (its stderr's tail is the message).
PROGRAM_FAILED = "ProgramFailed"
#: The worker asked to steer a program no longer runs it (another attempt does).
PROGRAM_GONE = "ProgramGone"
#: Promotion was asked for, and the job has no checkpoint (a program that made no model).
NO_CHECKPOINT = "NoCheckpoint"

#: Errors no retry can fix, for every platform-calling activity.
PERMANENT = [
    TRAINER_LOST,
    TRAINER_GONE,
    ROUTE_RACE_EXHAUSTED,
    TRAINER_BEHIND,
    INVALID_REQUEST,
    UNAUTHENTICATED,
    PERMISSION_DENIED,
    FAILED_PRECONDITION,
    MODEL_EXISTS,
    TRAINER_ID_TAKEN,
    BACKEND_MISCONFIGURED,
    METRIC_MISSING,
    LOOP_ERROR,
    INVALID_DATASET,
    INVALID_BASE_MODEL,
    PROGRAM_FAILED,
    PROGRAM_GONE,
]


#: Longest datum (tokens) the built-in loop builds when the spec sets no max context
#: length: the platform's default for a trainer created without one (trainer-api.md §2).
DEFAULT_MAX_CONTEXT_LENGTH = 8192

# ------------------------------------------------------------- in-activity sequences
# Temporal retries are ~1 s apart on the dev server at best; these waits need finer spacing,
# so they run inside one activity, bounded here.

#: Warm-up: after a route 404 (the control plane says RUNNING) the next probe follows this
#: soon. Routes reach gateway replicas in tens to hundreds of milliseconds; a probe (and the
#: control-plane read that verifies its 404, at most every WARMUP_REVERIFY_AFTER) costs a
#: few milliseconds, so probing every 20 ms starts training within ~20 ms of the route
#: being everywhere, at a load that lasts only while the route propagates (5 ms measured
#: no better: bench/recovery.py section a).
WARMUP_PROBE_SPACING = timedelta(milliseconds=20)
#: Warm-up: a 404 is checked against the control plane (RUNNING: the route race; else the
#: trainer is gone), then trusted for this long, so fine probe spacing does not turn into a
#: control-plane read every 20 ms. A trainer that dies meanwhile is still noticed within it.
WARMUP_REVERIFY_AFTER = timedelta(milliseconds=500)
#: Warm-up: how long one attempt keeps probing before handing back to the activity's
#: retry policy (which then backs off in seconds: a route that takes this long is not a
#: race but a slow gateway).
WARMUP_ATTEMPT_BUDGET = timedelta(seconds=5)
#: Opening the model (or warming a program's route up) starts when the trainer is placed,
#: beside the wait for RUNNING (workflows/trainer.py, ``come_up``): a warm localplane trainer
#: boots in ~50 ms, and the RUNNING event's delivery plus a workflow task cost 0.15-0.4 s
#: of every handover under load (bench/scale.py). (Started at the create, for an admitted
#: job, it measured no better: on a busy worker the create's own workflow task comes about
#: when the placement's event does, and a queued trainer would be probed while it waits.)
#: Until the route exists each 404 is checked against the control plane, and the next try
#: follows BOOT_PROBE_SHARE of the time booted so far, at least BOOT_PROBE_FIRST, at most
#: BOOT_PROBE_CAP: the boot's end is seen at most a quarter of its length late (a forked
#: trainer's, within 20 ms), and a boot of minutes costs two requests a second. (Not a
#: doubling per try: the open and the probes share the wait, and a count of tries would
#: double twice as fast, 0.3 s late after a 0.1 s boot.)
BOOT_PROBE_FIRST = timedelta(milliseconds=20)
BOOT_PROBE_SHARE = 0.25
BOOT_PROBE_CAP = timedelta(seconds=1)
#: One attempt waits this long for a booting trainer before handing back to the activity's
#: retry policy (the workflow's own wait for RUNNING, under ``wait_running``, bounds the boot).
BOOT_ATTEMPT_BUDGET = timedelta(seconds=30)


#: A heartbeating activity (train, save, evaluate) sends its first heartbeat this long
#: after it starts, or at a quarter of its heartbeat timeout if that is sooner. Every
#: heartbeat the server records is a persistence write, and the SDK sends an attempt's first
#: one at once: the short calls of a 20-step job (two chunks, two saves, two evaluations,
#: each well under a second here) sent ~12 heartbeats, a quarter of the job's writes
#: (bench/scale.py). An attempt that ends sooner sends none; its retry then starts from the
#: attempt's own start, and the operations it sends again come back from the trainer's
#: dedupe (activities/training.py). A worker's death is still noticed within the heartbeat
#: timeout, which runs from the attempt's start.
HEARTBEAT_QUIET_START = timedelta(seconds=1)
#: From then on, a training step or an evaluation in flight heartbeats this often (at most a
#: quarter of the heartbeat timeout; the SDK sends at most one per 80 % of the timeout,
#: with the latest details), so the heartbeat a retry starts from is at most this old.
KEEPALIVE = timedelta(seconds=1)
#: A save (possibly minutes long on a real trainer) has no progress to report: only that
#: its worker lives.
SAVE_KEEPALIVE = timedelta(seconds=2)


def heartbeat_quiet_start(heartbeat_timeout: timedelta | None) -> timedelta:
    """How long an attempt with this heartbeat timeout waits before its first heartbeat."""
    if heartbeat_timeout is None:
        return HEARTBEAT_QUIET_START
    return min(HEARTBEAT_QUIET_START, heartbeat_timeout / 4)


#: When the platform reports a trainer dead mid-chunk, the chunk gets this long to notice
#: it itself before it is cancelled: the chunk's own report carries the exact step the
#: trainer reached (what a recovery record shows as lost work); a cancel between two of
#: its attempts carries none. Covers the chunk's first retry interval (1 s) plus the
#: verified 404 that ends it.
CHUNK_DEATH_REPORT_GRACE = timedelta(seconds=3)

#: After a delete is accepted (DELETING), wait this long, asking every
#: DELETE_CONFIRM_SPACING, for the platform to say DELETED (a trainer exits in about a
#: second; localplane gives it 3 s before SIGKILL). Past it the job ends anyway: the
#: delete was accepted, and the platform finishes it.
DELETE_CONFIRM_WAIT = timedelta(seconds=10)
DELETE_CONFIRM_SPACING = timedelta(milliseconds=200)

# ------------------------------------------------------------------- waiting at scale
# Polling by retries costs the Temporal server about three persistence writes per attempt,
# and a busy platform keeps most jobs waiting for a slot. The dev server's SQLite levels off
# near 90 writes/s, so N jobs polling every 5 s would need 0.6 N writes/s: 100 waiting jobs
# already take most of it and everything else (the jobs that hold a trainer) queues behind.
#
# Where the platform pushes its state changes (the worker's event bridge, backend profile
# ``events``), a wait is woken by the event and its poll only covers an event that got lost:
# after the first look it backs off (doubling, jittered so that jobs submitted together do
# not poll together) to a cap. Write load of W jobs waiting for a slot, once backed off:
# ~3 W / (0.875 x cap) writes/s, i.e. 2,000 waiting jobs ~11 writes/s with the 10 min cap.
# Waiting for a slot, the second look comes EVENT_FALLBACK_PLACEMENT_FIRST after the first:
# 1,000 jobs submitted at once that polled from the spec's 5 s doubling made ~5 polls each
# in their first 2.5 minutes (30 failed attempts/s at the peak, bench/scale.py), which is
# the very time their own starts fill the server's write queue and the first jobs that hold
# a trainer wait behind both. Waits for RUNNING (a slot is held: at most one per slot) start
# at the poll interval and cap at 30 s, so a lost RUNNING event idles a GPU for at most that
# long. Without events (e.g. the hosted service) polling stays the fixed
# ``spec.policies.poll_interval``.

#: The fallback poll's first delay while waiting for a slot, with events (the spec's poll
#: interval when that is longer). Placement comes first come, first served, so a job that
#: waits longer than this waits behind others anyway; a lost CREATING event is also covered
#: by the RUNNING event that follows it.
EVENT_FALLBACK_PLACEMENT_FIRST = timedelta(minutes=2)
#: Cap of the fallback poll while waiting for a slot, with events.
EVENT_FALLBACK_PLACEMENT_CAP = timedelta(minutes=10)
#: Cap of the fallback poll while a slot is held and the trainer boots, with events.
EVENT_FALLBACK_RUNNING_CAP = timedelta(seconds=30)
#: Each fallback delay is scaled by a factor drawn from [1 - J, 1 + J].
EVENT_FALLBACK_JITTER = 0.25
#: Without events, on a backend whose slots Shepherd admits: the second look for an admitted
#: job's placement comes this soon, doubling up to the spec's poll interval. The scheduler
#: admits a job when a slot is given back, which happens as that slot's trainer is deleted,
#: so the platform usually sees the new create a moment before the delete ends (~0.3 s on
#: localplane) and places it then; at the fixed 5 s poll every such handover waited 5 s
#: (bench/scale.py with SHEPHERD_BACKEND_LOCAL_EVENTS=false: p50 5.05 s). Five looks in the
#: first 1.5 s (0.1, 0.2, 0.4, 0.8 s apart), then the poll interval: a platform queue that is
#: really longer costs about five GETs more.
ADMITTED_PLACEMENT_FIRST = timedelta(milliseconds=100)

#: Polls run on their own task queue (the job's queue + this suffix), served by their own
#: worker slots, so a poll backlog never delays work that holds a trainer (train, checkpoint,
#: delete): those stay on the job's queue, where a workflow's own worker may start them
#: eagerly.
WAITS_QUEUE_SUFFIX = "-waits"


def waits_queue(task_queue: str) -> str:
    return f"{task_queue}{WAITS_QUEUE_SUFFIX}"


def boot_probe_spacing(booted_s: float) -> float:
    """Seconds until the next try at a booting trainer that has booted ``booted_s`` so far."""
    return min(
        BOOT_PROBE_CAP.total_seconds(),
        max(BOOT_PROBE_FIRST.total_seconds(), booted_s * BOOT_PROBE_SHARE),
    )


def fallback_poll_delay(attempt: int, first: timedelta, cap: timedelta, draw: float) -> timedelta:
    """Delay after poll attempt ``attempt`` (1-based) of an event-driven wait: ``first``
    doubling up to ``cap``, scaled by the jitter factor for ``draw`` in [0, 1)."""
    base = min(cap, first * 2 ** min(attempt - 1, 30))
    return base * (1 - EVENT_FALLBACK_JITTER + 2 * EVENT_FALLBACK_JITTER * draw)


@dataclass(frozen=True)
class ActivityPolicy:
    """How one activity runs: its timeouts and its retries."""

    start_to_close: timedelta
    retry: RetryPolicy
    schedule_to_close: timedelta | None = None
    heartbeat: timedelta | None = None
    #: How long it may wait for a worker (only where one particular worker must take it).
    schedule_to_start: timedelta | None = None
    #: A poll that holds no trainer: runs on the waits queue (``waits_queue``).
    waits: bool = False

    def options(self) -> dict[str, Any]:
        """Keyword arguments for ``workflow.execute_activity`` / ``start_activity``."""
        opts: dict[str, Any] = {
            "start_to_close_timeout": self.start_to_close,
            "retry_policy": self.retry,
        }
        if self.schedule_to_close is not None:
            opts["schedule_to_close_timeout"] = self.schedule_to_close
        if self.heartbeat is not None:
            opts["heartbeat_timeout"] = self.heartbeat
        if self.schedule_to_start is not None:
            opts["schedule_to_start_timeout"] = self.schedule_to_start
        return opts


def _poll(interval: timedelta, deadline: timedelta) -> ActivityPolicy:
    """Polling expressed as retries: one attempt per interval until the deadline."""
    return ActivityPolicy(
        waits=True,
        # One attempt is one GET; the client's own timeout (30 s) is shorter.
        start_to_close=timedelta(seconds=45),
        schedule_to_close=deadline,
        retry=RetryPolicy(
            initial_interval=interval,
            backoff_coefficient=1.0,
            maximum_interval=interval,
            maximum_attempts=0,
            non_retryable_error_types=PERMANENT,
        ),
    )


#: Asking for a slot (starting the scheduler the first time), telling it a checkpoint, and
#: giving the slot back: one RPC each to Temporal, idempotent; retried until it lands, as a
#: trainer's delete is (a slot never given back would be held for good — though the
#: scheduler also takes back the slots of closed jobs, every ``scheduler.HOLDER_CHECK``).
SLOT_MESSAGE = ActivityPolicy(
    start_to_close=timedelta(seconds=30),
    retry=RetryPolicy(
        initial_interval=timedelta(seconds=1),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=30),
        maximum_attempts=0,
    ),
)


# Transient platform errors (5xx, timeouts, connection resets) get a few quick retries and
# then slower ones: a blip passes in seconds, an outage in minutes.
_TRANSIENT = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=10,
    non_retryable_error_types=PERMANENT,
)


# A control-plane call that makes or brings back a trainer (create, resume), retried while
# the platform cannot be reached or answers 5xx: every 1, 2, 4 s, then every 5 s — it lands
# <= 5 s after the platform is back — for as long as the job lets a trainer take to come up
# (schedule-to-close: its ready_timeout, 15 min by default). _TRANSIENT's ten attempts
# (~2.5 min, 30 s apart at the end) were outlasted by a 3-minute partition mid-recovery: the
# recovery was counted a trainer failure (issue 32).
_PLATFORM_AWAY = replace(_TRANSIENT, maximum_interval=timedelta(seconds=5), maximum_attempts=0)


# After a route 404 outlasted one attempt's probing (WARMUP_ATTEMPT_BUDGET), the gateway
# is slow rather than racing: back off in seconds, until the warm-up timeout.
_WARM_UP_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=1.5,
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=0,
    non_retryable_error_types=PERMANENT,
)


# A chunk's first retry follows quickly: the usual cause is a dead worker (noticed by the
# heartbeat timeout), and the trainer is idle until the chunk runs again. Same total budget
# as _TRANSIENT (~2.5 min over 12 retries) for a platform blip.
_CHUNK_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=13,
    non_retryable_error_types=PERMANENT,
)


# ------------------------------------------------------------------------- programs

#: A cancelled (or failed) program gets this long between SIGTERM and SIGKILL: the
#: cookbook's recipes flush their logs and metrics files on the way out in well under it.
PROGRAM_STOP_GRACE = timedelta(seconds=10)
#: A running program's steps and losses reach the workflow (a signal, a history event) at
#: most this often; checkpoints and a lost trainer at once. ``watch`` sees every step
#: sooner, in the activity's heartbeat. Every 10 s is 8,640 events a day of training.
PROGRAM_PROGRESS_EVERY = timedelta(seconds=10)
#: A program that holds a RUNNING trainer and sends it nothing for this long is said to be
#: idle, in its log (``shepherd logs``) and the worker's, and again at each such interval:
#: the GPUs are billed while it thinks, waits on something else, or hangs. A training step
#: of a real model takes seconds to a few minutes; 10 minutes of nothing is worth a line.
PROGRAM_IDLE_WARNING = timedelta(minutes=10)
#: A program restarted after its worker died (the heartbeat timeout notices): the next
#: attempt starts on another worker at once; a program that keeps dying with its workers
#: (it is what kills them, say) fails the job after this many attempts.
PROGRAM_ATTEMPTS = 5
#: Losses one ``program_progress`` signal carries at most (they pile up only while signals
#: fail, a server outage say): the curve keeps the newest, as ``shepherd.curves`` would.
PROGRAM_SIGNAL_LOSSES = 500

# A program outlives the runs of its job's workflow: each continue-as-new leaves it running
# on its worker, and the next run's ``run_program`` adopts it there, on the worker's own hold
# queue (activities/program_run.py).

#: How long a program whose workflow run continued-as-new waits to be adopted before it is
#: stopped. The next run asks for it at once (adoption takes a second); its request waits at
#: most ``program_control``'s schedule-to-start (15 s) from the continue-as-new before the
#: workflow starts the program elsewhere, and the old holder notices the continue-as-new up
#: to 0.8 heartbeat timeouts after it: 10 s keeps a program that nobody adopts from running
#: beside its replacement for more than a few seconds at the default heartbeat timeout (4 s).
PROGRAM_ADOPT_GRACE = timedelta(seconds=10)
#: A program that ended is remembered this long, so that a next run's activity can collect a
#: result its holder could not deliver (its run had just continued-as-new). Past it, the
#: program's exit record answers (a program that exited 0 is never started again).
PROGRAM_RESULT_KEPT = timedelta(minutes=2)
#: An orphaned program asks this often whether its workflow still runs: a workflow
#: terminated meanwhile has it stopped within this (plus ``PROGRAM_STOP_GRACE``).
PROGRAM_ORPHAN_CHECK = timedelta(seconds=2)
#: Suffix of a worker's hold queue (its control queue + this): adopted programs' activities
#: hold a slot there each for as long as the program runs, apart from the short control
#: activities (attach, detach, checkpoint), which they must never starve.
HOLD_QUEUE_SUFFIX = "-hold"


def hold_queue(control_queue: str) -> str:
    return f"{control_queue}{HOLD_QUEUE_SUFFIX}"


# ------------------------------------------------------------------------- admission
# A job's words with its backend's scheduler (workflows/scheduler.py) are signals sent by
# activities: each is idempotent on the scheduler's side, so retried until it lands.

#: The scheduler's own activities (which of its jobs are closed): retried as any lookup.
SCHEDULER_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=10,
)
#: The scheduler's word to its jobs (``tell_jobs``): the same, until it lands — a grant not
#: delivered holds a slot nobody uses (a gone job is not an error: it is returned and dropped).
SCHEDULER_TELL_RETRY = replace(SCHEDULER_RETRY, maximum_attempts=0)
# --------------------------------------------------------------------- history budget
# Temporal warns at 10,240 events (or 10 MiB) of one run's history and terminates the
# workflow at 51,200 (50 MiB), with no cleanup. A job continues-as-new before the warning,
# whatever it is doing (docs/history.md): at ``policies.max_history_events``
# of the spec (10,000 by default), at the server's own suggestion, or at this many bytes.
HISTORY_BYTES_CAP = 8 * 1024 * 1024


# ------------------------------------------------------------------------ the reaper
# Trainers whose job workflow ended without its cleanup (terminated, reset, a bug): the
# reaper (shepherd/reaper.py) deletes them.

#: REAPER_PERIOD (how often it runs) and REAPER_GRACE (how long a job must have been over)
#: are declared beside the reaper's input, which the CLI reads without the workflows.
#: One pass over every backend: listing and deleting are idempotent, so a retry is safe; the
#: heartbeat (every page) notices a dead worker.
REAP = ActivityPolicy(
    start_to_close=timedelta(minutes=10), heartbeat=timedelta(seconds=30), retry=_TRANSIENT
)


@dataclass(frozen=True)
class Policies:
    """Every activity policy of one job, from its ``spec.policies``."""

    #: One control-plane read (a shape, a model id); a permanent answer is final.
    lookup: ActivityPolicy
    #: Create is idempotent by client-chosen id, so retrying it is always safe.
    create_trainer: ActivityPolicy
    #: Waiting for a capacity slot may take days on a busy platform (pending_timeout, 48 h).
    wait_placement: ActivityPolicy
    #: From slot to RUNNING is minutes (ready_timeout, 15 min).
    wait_running: ActivityPolicy
    #: After a death the platform may sit in a transitional state for a while.
    wait_resumable: ActivityPolicy
    #: Consecutive healthz probes (spaced by WARMUP_PROBE_SPACING within one attempt, for
    #: WARMUP_ATTEMPT_BUDGET); then a route 404 is retried with bounded backoff until the
    #: warm-up timeout, anything else surfaces at once.
    warm_up: ActivityPolicy
    #: One chunk of optimizer steps; the heartbeat detects a dead worker within seconds.
    train_chunk: ActivityPolicy
    #: save_weights / evaluate / load_weights: one data-plane call each.
    data_plane_call: ActivityPolicy
    #: Create the model on a (re)started trainer, from a checkpoint where one is due.
    open_model: ActivityPolicy
    #: ``open_model`` and ``warm_up`` started when the trainer is placed: the boot's time
    #: (up to ready_timeout) on top (BOOT_PROBE_FIRST).
    open_model_booting: ActivityPolicy
    warm_up_booting: ActivityPolicy
    #: Resume is idempotent in effect (a lost response is reconciled by the activity).
    resume_trainer: ActivityPolicy
    #: Promotion can take minutes on the hosted platform; waiting for the model is polling.
    promote: ActivityPolicy
    wait_model: ActivityPolicy
    #: Hot-loading onto a deployment: a load, then polling (by retries) until every replica
    #: serves it; a big model loads in minutes.
    publish: ActivityPolicy
    #: Housekeeping; failure only keeps an extra checkpoint.
    prune: ActivityPolicy
    #: Cleanup retries until it succeeds: a leaked trainer burns GPUs for days.
    delete_trainer: ActivityPolicy
    #: A cancel during promotion takes the model back, retried like cleanup (a model left
    #: behind says the cancelled job promoted), until the platform refuses for good.
    retract_model: ActivityPolicy
    #: A program's whole run: as long as the job may run; its heartbeat notices a dead
    #: worker, and the retry starts the program again on another one.
    run_program: ActivityPolicy
    #: Steering the program's proxy on its worker's own queue (attach may restore a model and
    #: redo up to a checkpoint interval of steps); a worker that does not take it within
    #: the schedule-to-start timeout is gone (its program restarts elsewhere).
    program_control: ActivityPolicy
    #: A later run of the workflow takes its program over on the worker that runs it (the
    #: worker's hold queue): a worker that does not take it within the schedule-to-start
    #: timeout is gone, and so is a program whose worker stops heartbeating; either way the
    #: workflow starts the program again (``run_program``), once.
    adopt_program: ActivityPolicy
    #: Budgets enforced by the workflow.
    max_preemptions: int
    max_failures: int
    fallback_to_on_demand_after: int | None
    warmup_probes: int
    route_race_retries: int
    route_race_window: timedelta
    step_timeout: timedelta

    @classmethod
    def for_spec(
        cls,
        p: PoliciesSpec,
        *,
        chunk_steps: int,
        checkpoint_every: int = 50,
        max_runtime: timedelta | None = None,
    ) -> Policies:
        # A save of a large checkpoint can take minutes; the heartbeat, not the
        # start-to-close timeout, is what notices a dead worker.
        data_plane = ActivityPolicy(
            start_to_close=p.step_timeout + timedelta(minutes=1),
            heartbeat=p.heartbeat_timeout,
            retry=_TRANSIENT,
        )
        # Opening the model (a few short calls, or a load that may take minutes on a real
        # trainer), then the warm-up probes, in one activity: a round trip less between
        # RUNNING and the first training step. Retried as warm-up is (a route not yet
        # everywhere is the usual cause), within the warm-up timeout plus one load.
        open_model = ActivityPolicy(
            start_to_close=p.step_timeout + timedelta(minutes=1),
            heartbeat=p.heartbeat_timeout,
            schedule_to_close=p.warmup_timeout + p.step_timeout + timedelta(minutes=1),
            retry=_WARM_UP_RETRY,
        )
        # One attempt is at most WARMUP_ATTEMPT_BUDGET of probes (each bounded by the
        # client's request timeout); its keepalive notices a dead worker.
        # Program jobs (a loop's job warms up inside open_model).
        warm_up = ActivityPolicy(
            start_to_close=timedelta(seconds=45),
            schedule_to_close=p.warmup_timeout,
            retry=_WARM_UP_RETRY,
        )

        def booting(policy: ActivityPolicy) -> ActivityPolicy:
            return replace(
                policy,
                schedule_to_close=(policy.schedule_to_close or timedelta(0)) + p.ready_timeout,
            )

        return cls(
            lookup=ActivityPolicy(start_to_close=timedelta(seconds=45), retry=_TRANSIENT),
            # One POST, idempotent by the trainer id.
            create_trainer=ActivityPolicy(
                start_to_close=timedelta(seconds=45),
                schedule_to_close=p.ready_timeout,
                retry=_PLATFORM_AWAY,
            ),
            wait_placement=_poll(p.poll_interval, p.pending_timeout),
            wait_running=_poll(p.poll_interval, p.ready_timeout),
            # Deaths settle in seconds; poll at least every 2 s, give up at the ready timeout.
            wait_resumable=_poll(min(p.poll_interval, timedelta(seconds=2)), p.ready_timeout),
            warm_up=warm_up,
            warm_up_booting=booting(warm_up),
            train_chunk=ActivityPolicy(
                # A chunk may legitimately take chunk_steps step-timeouts; the heartbeat,
                # not this, is what notices a dead worker.
                start_to_close=p.step_timeout * chunk_steps + timedelta(minutes=5),
                heartbeat=p.heartbeat_timeout,
                retry=_CHUNK_RETRY,
            ),
            data_plane_call=data_plane,
            open_model=open_model,
            open_model_booting=booting(open_model),
            resume_trainer=ActivityPolicy(
                start_to_close=timedelta(seconds=45),
                schedule_to_close=p.ready_timeout,
                retry=_PLATFORM_AWAY,
            ),
            promote=ActivityPolicy(start_to_close=timedelta(minutes=2), retry=_TRANSIENT),
            wait_model=_poll(timedelta(seconds=2), timedelta(hours=1)),
            publish=ActivityPolicy(
                start_to_close=timedelta(minutes=2),
                schedule_to_close=timedelta(minutes=30),
                retry=RetryPolicy(
                    initial_interval=timedelta(seconds=2),
                    backoff_coefficient=1.0,
                    maximum_interval=timedelta(seconds=2),
                    maximum_attempts=0,
                    non_retryable_error_types=PERMANENT,
                ),
            ),
            prune=ActivityPolicy(start_to_close=timedelta(minutes=2), retry=_TRANSIENT),
            delete_trainer=ActivityPolicy(
                start_to_close=timedelta(seconds=45),
                retry=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    backoff_coefficient=2.0,
                    maximum_interval=timedelta(seconds=60),
                    maximum_attempts=0,  # until it succeeds
                    non_retryable_error_types=[BACKEND_MISCONFIGURED],
                ),
            ),
            retract_model=ActivityPolicy(
                start_to_close=timedelta(seconds=45),
                retry=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    backoff_coefficient=2.0,
                    maximum_interval=timedelta(seconds=60),
                    maximum_attempts=0,
                    non_retryable_error_types=PERMANENT,
                ),
            ),
            run_program=ActivityPolicy(
                start_to_close=max_runtime or timedelta(days=30),
                heartbeat=p.heartbeat_timeout,
                retry=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    backoff_coefficient=2.0,
                    maximum_interval=timedelta(seconds=30),
                    maximum_attempts=PROGRAM_ATTEMPTS,
                    non_retryable_error_types=PERMANENT,
                ),
            ),
            adopt_program=ActivityPolicy(
                start_to_close=max_runtime or timedelta(days=30),
                heartbeat=p.heartbeat_timeout,
                schedule_to_start=timedelta(seconds=15),
                retry=RetryPolicy(maximum_attempts=1),
            ),
            program_control=ActivityPolicy(
                start_to_close=p.step_timeout * (checkpoint_every + 2) + timedelta(minutes=2),
                schedule_to_start=timedelta(seconds=15),
                heartbeat=None,
                retry=RetryPolicy(maximum_attempts=1),
            ),
            max_preemptions=p.max_preemptions,
            max_failures=p.max_failures,
            fallback_to_on_demand_after=p.fallback_to_on_demand_after,
            warmup_probes=p.warmup_probes,
            route_race_retries=p.route_race_retries,
            route_race_window=p.route_race_window,
            step_timeout=p.step_timeout,
        )


def route_race_delay(race: int, retries: int, window: timedelta) -> timedelta:
    """Delay before retry number ``race`` (1-based): doubling, the sum of all ``retries``
    delays filling ``window`` (4 retries in 30 s: 2, 4, 8, 16 s)."""
    unit = window.total_seconds() / max(1, (2**retries) - 1)
    return timedelta(seconds=max(1.0, unit * 2 ** (race - 1)))
