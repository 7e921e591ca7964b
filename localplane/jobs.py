"""Trainer jobs: the state machine of trainer-api.md §3, capacity slots, and the trainer
processes behind RUNNING jobs.

Every state change goes through :meth:`JobService._transition`, which persists it and
publishes the event, so the watch stream sees every transition in order. A trainer is an
OS process per running job (like a pod); the service owns it from spawn to exit and
decides from *why* it exited what the job's next state is.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import secrets
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from localplane import logs as trainer_logs
from localplane.config import PlaneConfig
from localplane.errors import AlreadyExists, FailedPrecondition, NotFound
from localplane.events import EventBus
from localplane.forks import ForkedTrainer, Zygote
from localplane.gateway import Gateway
from localplane.storage import JobRecord, Storage
from localplane.trainer.config import TrainerConfig
from localplane.trainer.server import EXIT_IDLE, READY_PREFIX
from localplane.validation import ValidCreate
from shepherd.platform import rules
from shepherd.states import JobState

log = structlog.stdlib.get_logger("localplane.jobs")

#: A trainer that does not announce itself within this long is killed and the job FAILED.
TRAINER_START_TIMEOUT_S = 120.0
#: Grace between SIGTERM and SIGKILL when stopping a trainer.
STOP_GRACE_S = 3.0
MSG_PREEMPTED = "trainer preempted: its node was reclaimed (spot preemption); resume the job to get a new trainer"
MSG_RESTARTED = (
    "trainer lost: the platform restarted while it was running; resume the job to get a new trainer"
)


def now_rfc3339() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _set_parent_death_signal() -> None:
    # Runs in the child before exec: if the plane dies (even by SIGKILL), its trainers die
    # with it instead of leaking like orphaned pods.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


#: A trainer process: forked by the zygote, or (without one) the plane's own child.
TrainerProcess = ForkedTrainer | asyncio.subprocess.Process


@dataclass(eq=False)
class Trainer:
    account: str
    job: str
    generation: int
    process: TrainerProcess | None = None
    port: int | None = None
    #: Why the plane is stopping it: None (it died by itself), "delete", "preempt", "stop".
    intent: str | None = None
    stop_state: JobState | None = None
    stop_message: str = ""
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    @property
    def url(self) -> str | None:
        return f"http://127.0.0.1:{self.port}" if self.port else None

    @property
    def name(self) -> str:
        return f"accounts/{self.account}/rlorTrainerJobs/{self.job}"


class JobService:
    def __init__(
        self,
        storage: Storage,
        events: EventBus,
        gateway: Gateway,
        data_dir: Path,
        config: Callable[[], PlaneConfig],
        keys_file: Callable[[str], Path],
    ) -> None:
        self.storage = storage
        self.events = events
        self.gateway = gateway
        self.data_dir = data_dir
        self._config = config
        self._keys_file = keys_file
        self.trainers: dict[tuple[str, str], Trainer] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = False
        #: Trainers are forked from it (localplane/forks.py); started with the plane.
        self._zygote = Zygote(data_dir, _set_parent_death_signal)
        self._zygote_starting: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Reconcile what a previous run left behind, then start scheduling."""
        for rec in self.storage.jobs_in([JobState.CREATING, JobState.RUNNING, JobState.DELETING]):
            self._reap_orphan(rec)
            if rec.state is JobState.DELETING:
                self._transition(rec, JobState.DELETED, "deleted")
            else:
                self._transition(rec, JobState.FAILED, MSG_RESTARTED, code="UNAVAILABLE")
        if self._config().fork_trainers:
            self._zygote_starting = self._spawn(self._start_zygote())  # the plane serves meanwhile
        self.schedule()

    async def _start_zygote(self) -> None:
        try:
            await self._zygote.start()
        except (OSError, TimeoutError) as exc:  # trainers are then started from scratch
            log.warning("trainer.zygote_failed", error=str(exc))

    async def stop(self) -> None:
        """Stop every trainer (the next start marks their jobs FAILED: platform restarted)."""
        self._stopping = True
        trainers = list(self.trainers.values())
        for t in trainers:
            if t.process and t.process.returncode is None:
                t.intent = t.intent or "shutdown"
                t.process.kill()
        for t in trainers:
            if t.process:
                await t.process.wait()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._zygote.stop()

    def _reap_orphan(self, rec: JobRecord) -> None:
        """Kill a trainer a crashed plane left running, if that pid is still ours."""
        if not rec.pid:
            return
        try:
            cmdline = Path(f"/proc/{rec.pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return
        if "localplane.trainer" in cmdline and f"{rec.account_id}-{rec.job_id}-" in cmdline:
            try:
                os.kill(rec.pid, signal.SIGKILL)
                log.warning("trainer.orphan_killed", pid=rec.pid, job=rec.name)
            except ProcessLookupError:
                pass

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---------------------------------------------------------- transitions

    def payload(self, rec: JobRecord) -> dict[str, Any]:
        spec = rec.spec
        out: dict[str, Any] = {
            "name": rec.name,
            "displayName": spec.get("displayName", ""),
            "state": rec.state.value,
            "status": {"code": rec.status_code, "message": rec.status_message},
            "createTime": rec.create_time,
            "updateTime": rec.update_time,
            # Keys starting with "_" are the plane's own notes (parsed extraArgs), not wire fields.
            **{k: v for k, v in spec.items() if k != "displayName" and not k.startswith("_")},
        }
        if rec.training_shape_ref:
            out["trainingShapeRef"] = rec.training_shape_ref
        return out

    def _transition(
        self, rec: JobRecord, state: JobState, message: str, *, code: str = "OK"
    ) -> None:
        # A record not yet transitioned (no update time) is being created: no previous state.
        previous = rec.state if rec.update_time else None
        rec.state = state
        rec.status_code = code
        rec.status_message = message
        rec.update_time = now_rfc3339()
        if state is not JobState.PENDING:
            rec.queue_seq = None
        self.storage.save_job(rec)
        self.events.publish(
            rec.account_id,
            rec.job_id,
            {
                "name": rec.name,
                "previousState": previous.value if previous else None,
                "state": state.value,
                "eventTime": rec.update_time,
                "job": self.payload(rec),
            },
        )
        log.info(
            "job.state",
            job=rec.name,
            state=state.short,
            previous=previous.short if previous else None,
            message=message,
        )

    def _count(self, name: str, rec: JobRecord | None = None, by: int = 1) -> None:
        self.storage.incr(name, "", by)
        if rec is not None:
            self.storage.incr(name, rec.name, by)

    # ------------------------------------------------------------- requests

    def require(self, account: str, job_id: str) -> JobRecord:
        rec = self.storage.get_job(account, job_id)
        if rec is None:
            raise NotFound(f"rlorTrainerJob accounts/{account}/rlorTrainerJobs/{job_id} not found")
        return rec

    def create(self, account: str, valid: ValidCreate, shape_ref: str | None) -> dict[str, Any]:
        job_id = valid.job_id or f"job-{secrets.token_hex(5)}"
        existing = self.storage.get_job(account, job_id)
        if existing is not None:
            self._count("createConflicts", existing)
            raise AlreadyExists(
                f"rlorTrainerJob {existing.name} already exists (state {existing.state.value})"
                + ("; a deleted id is never reused" if existing.state.is_gone() else "")
            )
        spec = dict(valid.spec)
        spec["_trainer"] = valid.trainer_options  # internal: parsed extraArgs
        created = now_rfc3339()
        rec = JobRecord(
            account_id=account,
            job_id=job_id,
            state=JobState.PENDING,
            create_time=created,
            update_time="",
            spec=spec,
            training_shape_ref=valid.shape.name if valid.shape else shape_ref,
            queue_seq=self.storage.next_queue_seq(),
        )
        self.storage.insert_job(rec)
        self._count("creates", rec)
        self._transition(rec, JobState.PENDING, "waiting for capacity")
        self.schedule()
        return self.payload(self.require(account, job_id))

    def resume(self, account: str, job_id: str) -> dict[str, Any]:
        rec = self.require(account, job_id)
        if not rec.state.is_resumable():
            allowed = ", ".join(
                s.short for s in sorted(JobState, key=list(JobState).index) if s.is_resumable()
            )
            raise FailedPrecondition(
                f"rlorTrainerJob {rec.name} is {rec.state.value}; resume is only allowed from {allowed}"
            )
        rec.queue_seq = self.storage.next_queue_seq()
        self._count("resumes", rec)
        self._transition(rec, JobState.PENDING, "resume requested; waiting for capacity")
        self.schedule()  # synchronous: the response already shows PENDING or CREATING
        return self.payload(self.require(account, job_id))

    def delete(self, account: str, job_id: str) -> dict[str, Any]:
        rec = self.require(account, job_id)
        self._count("deleteCalls", rec)
        if rec.state.is_gone():
            return self.payload(rec)  # deleting twice is fine
        self._count("deletes", rec)
        trainer = self.trainers.get((account, job_id))
        self._transition(rec, JobState.DELETING, "delete requested")
        self.gateway.remove_route(account, job_id)
        if trainer is not None:
            self._stop_trainer(trainer, "delete")
        else:
            self._transition(rec, JobState.DELETED, "deleted")
        self.schedule()
        return self.payload(self.require(account, job_id))

    # ------------------------------------------------------- admin actions

    def preempt(self, rec: JobRecord) -> dict[str, Any]:
        trainer = self.trainers.get((rec.account_id, rec.job_id))
        if trainer is None or not rec.state.holds_trainer():
            raise FailedPrecondition(
                f"rlorTrainerJob {rec.name} is {rec.state.value}: no trainer to preempt"
            )
        self._count("preemptions", rec)
        trainer.intent = "preempt"
        # The node is gone: from now on the route answers 404, as a dead trainer's does, not a
        # connection reset while the process is still being torn down.
        self.gateway.remove_route(rec.account_id, rec.job_id)
        if trainer.process and trainer.process.returncode is None:
            trainer.process.kill()  # a spot reclaim gives no grace period
        return self.payload(rec)

    def stop_as(self, rec: JobRecord, state: JobState, message: str) -> dict[str, Any]:
        """Stop a job's trainer the way the platform would (user cancel on the console,
        platform pause, completion) and leave the job in ``state``."""
        allowed = {
            JobState.CANCELLED,
            JobState.PAUSED,
            JobState.COMPLETED,
            JobState.IDLE,
            JobState.FAILED,
        }
        if state not in allowed:
            raise FailedPrecondition("state: must be one of " + ", ".join(s.value for s in allowed))
        trainer = self.trainers.get((rec.account_id, rec.job_id))
        if rec.state.is_gone():
            raise FailedPrecondition(f"rlorTrainerJob {rec.name} is {rec.state.value}")
        message = message or f"stopped by the platform ({state.short.lower()})"
        if trainer is None:
            self._transition(rec, state, message)
            self.schedule()
        else:
            trainer.stop_state, trainer.stop_message = state, message
            self._stop_trainer(trainer, "stop")
        return self.payload(self.require(rec.account_id, rec.job_id))

    # -------------------------------------------------------------- capacity

    def live_trainers(self) -> int:
        return len(self.trainers)

    def schedule(self) -> None:
        """Grant free slots to PENDING jobs, first come first served."""
        free = self._config().capacity - len(self.trainers)
        if free <= 0 or self._stopping:
            return
        # Only the jobs that get a slot are read: thousands may be waiting.
        for rec in self.storage.jobs_in([JobState.PENDING], limit=free):
            rec.generation += 1
            trainer = Trainer(rec.account_id, rec.job_id, rec.generation)
            self.trainers[(rec.account_id, rec.job_id)] = trainer
            self._transition(rec, JobState.CREATING, "slot granted; starting the trainer")
            trainer.tasks.append(self._spawn(self._run_trainer(trainer, rec)))

    # --------------------------------------------------------------- trainers

    def _trainer_config(self, rec: JobRecord) -> TrainerConfig:
        spec = rec.spec
        tc = spec["trainingConfig"]
        options = spec.get("_trainer", {})
        compute_ms = options.get("compute_delay_ms", self._config().compute_delay_ms)
        return TrainerConfig(
            account=rec.account_id,
            job=rec.job_id,
            generation=rec.generation,
            data_dir=self.data_dir,
            base_model=tc["baseModel"],
            lora_rank=tc["loraRank"],
            learning_rate=tc["learningRate"],
            max_context_length=tc["maxContextLength"],
            seed=options.get("seed", 0),
            retrieve_hold_s=options.get("retrieve_hold_seconds", 20.0),
            seq_gap_timeout_s=options.get("seq_gap_timeout_seconds", rules.SEQ_GAP_HOLD_S),
            protobuf=self._config().trainer_protobuf,
            compute_delay_s=compute_ms / 1000.0,
            inactivity_timeout_s=rules.parse_duration(spec["inactivityTimeout"]) or 0.0,
            forward_only=spec["forwardOnly"],
            keys_file=self._keys_file(rec.account_id),
        )

    async def _start_process(self, argv: list[str]) -> TrainerProcess:
        """Forked from the zygote; started from scratch when there is none (it failed to
        start, or died: the next start tries a new one)."""
        if not self._config().fork_trainers:
            return await self._exec_trainer(argv)
        if self._zygote_starting is None or (
            self._zygote_starting.done() and not self._zygote.alive and not self._stopping
        ):
            self._zygote_starting = self._spawn(self._start_zygote())
        await asyncio.shield(self._zygote_starting)
        with contextlib.suppress(OSError):
            return await self._zygote.fork(argv)
        return await self._exec_trainer(argv)

    @staticmethod
    async def _exec_trainer(argv: list[str]) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "localplane.trainer",
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=_set_parent_death_signal,
            start_new_session=True,  # Ctrl-C on the plane's terminal is the plane's to handle
        )

    async def _run_trainer(self, t: Trainer, rec: JobRecord) -> None:
        """Own one trainer process from spawn to exit."""
        run_dir = trainer_logs.run_dir(self.data_dir, rec.account_id, rec.job_id, t.generation)
        run_dir.mkdir(parents=True, exist_ok=True)
        config_path = run_dir / "config.json"
        config_path.write_text(self._trainer_config(rec).to_json())
        boot_deadline = asyncio.get_running_loop().time() + self._config().boot_delay_seconds
        argv = [
            "--config",
            str(config_path),
            # Marks the process as this job's trainer (orphan reaping after a crash).
            f"--tag={rec.account_id}-{rec.job_id}-{t.generation}",
        ]
        try:
            t.process = await self._start_process(argv)
        except OSError as exc:
            self._on_exit(t, -1, f"trainer failed to start: {exc}")
            return
        self._count("trainersStarted", rec)
        self.storage.set_pid(rec.account_id, rec.job_id, t.process.pid)
        if t.intent is not None:  # deleted/stopped while spawning
            t.process.kill()
        watchdog = self._spawn(self._start_watchdog(t))
        assert t.process.stdout is not None
        # A local append-only file: a blocking open here costs microseconds. Unbuffered (one
        # write per line): a line that cannot be written (a full disk) is lost alone, and the
        # trainer's output is still read — unread, its pipe would fill and stall the trainer.
        lost = 0
        with open(run_dir / trainer_logs.LOG_FILE, "ab", buffering=0) as log_file:  # noqa: ASYNC230
            async for line in t.process.stdout:
                try:
                    log_file.write(trainer_logs.stamp(line, now_rfc3339()))
                except OSError as exc:
                    lost += 1
                    if lost == 1:
                        log.warning("trainer.log_lost", job=t.name, error=str(exc))
                if t.port is None and line.startswith(READY_PREFIX.encode()):
                    t.port = int(json.loads(line[len(READY_PREFIX) :])["port"])
                    watchdog.cancel()
                    self._spawn(self._become_running(t, boot_deadline))
            code = await t.process.wait()
        watchdog.cancel()
        self._on_exit(t, code, None)

    async def _start_watchdog(self, t: Trainer) -> None:
        await asyncio.sleep(TRAINER_START_TIMEOUT_S)
        if t.port is None and t.process and t.process.returncode is None:
            log.error("trainer.start_timeout", job=t.name)
            t.process.kill()

    async def _become_running(self, t: Trainer, boot_deadline: float) -> None:
        delay = boot_deadline - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)  # the emulated boot delay
        if self.trainers.get((t.account, t.job)) is not t or t.intent is not None:
            return
        if t.process is None or t.process.returncode is not None:
            return
        rec = self.storage.get_job(t.account, t.job)
        if rec is None or rec.state is not JobState.CREATING or rec.generation != t.generation:
            return
        assert t.url is not None
        self.gateway.add_route(t.account, t.job, t.url, t.generation)
        self._transition(rec, JobState.RUNNING, "trainer is up")

    def _stop_trainer(self, t: Trainer, intent: str) -> None:
        t.intent = intent
        if t.process is None or t.process.returncode is not None:
            return
        t.process.terminate()
        self._spawn(self._kill_after_grace(t))

    async def _kill_after_grace(self, t: Trainer) -> None:
        await asyncio.sleep(STOP_GRACE_S)
        if t.process and t.process.returncode is None:
            t.process.kill()

    def _on_exit(self, t: Trainer, code: int, reason: str | None) -> None:
        key = (t.account, t.job)
        if self.trainers.get(key) is t:
            del self.trainers[key]
        route = self.gateway.route(t.account, t.job)
        if route is not None and route.generation == t.generation:
            self.gateway.remove_route(t.account, t.job)
        self._count("trainersExited")
        rec = self.storage.get_job(t.account, t.job)
        if rec is not None and rec.generation == t.generation:
            rec.pid = None
            self._after_exit(rec, t, code, reason)
        self.schedule()

    def _after_exit(self, rec: JobRecord, t: Trainer, code: int, reason: str | None) -> None:
        if t.intent == "shutdown":
            return  # the plane is stopping; its next start reconciles the job
        if rec.state is JobState.DELETING:
            self._transition(rec, JobState.DELETED, "deleted")
            return
        if not rec.state.holds_trainer():
            self.storage.save_job(rec)
            return
        if t.intent == "stop" and t.stop_state is not None:
            self._transition(rec, t.stop_state, t.stop_message)
            return
        if code == EXIT_IDLE:
            timeout = rec.spec["inactivityTimeout"]
            self._transition(
                rec,
                JobState.IDLE,
                f"trainer stopped after {timeout} of inactivity; resume the job to continue",
            )
            return
        if t.intent == "preempt":
            message, status = MSG_PREEMPTED, "UNAVAILABLE"
        elif reason:
            message, status = reason, "INTERNAL"
        elif t.port is None:
            message, status = f"trainer failed to start (exit code {code}); see its log", "INTERNAL"
        else:
            message, status = f"trainer crashed (exit code {code})", "INTERNAL"
        settle = self._config().death_settle_seconds
        if settle > 0 and rec.state is JobState.RUNNING:
            # The hosted platform takes a while to notice; clients must tolerate this.
            self._transition(rec, JobState.CREATING, "trainer lost; the platform is reconciling")
            self._spawn(
                self._settle(rec.account_id, rec.job_id, rec.generation, settle, message, status)
            )
            return
        self._transition(rec, JobState.FAILED, message, code=status)

    async def _settle(
        self, account: str, job: str, generation: int, delay: float, message: str, status: str
    ) -> None:
        await asyncio.sleep(delay)
        rec = self.storage.get_job(account, job)
        if (
            rec
            and rec.generation == generation
            and rec.state is JobState.CREATING
            and (account, job) not in self.trainers
        ):
            self._transition(rec, JobState.FAILED, message, code=status)
