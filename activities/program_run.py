"""One program's run on a worker, for as long as the program runs — longer than any one
activity that holds it.

A program job's workflow continues-as-new when its history grows long (a run of weeks writes
far more events than Temporal keeps in one history); the ``run_program`` activity of the run
that ended is abandoned by Temporal, but the program must not notice. So the program, its
data-plane proxy and what the workflow has yet to be told live here, in the worker process,
under a :class:`ProgramRun` keyed by the job's workflow id; an activity only *holds* it:

* the first ``run_program`` starts it; the activity of each later run *adopts* it, on this
  worker's own hold queue (``policies.hold_queue``: only this worker polls it), and the
  activity it replaces lets go when Temporal tells it that its run is closed;
* a holder cancelled by its workflow (a cancel, the job's end) stops the program; a holder
  whose run is closed stops it too, unless the run continued-as-new — then the program is
  *orphaned* until the next run's activity adopts it, and stopped if none does within
  ``policies.PROGRAM_ADOPT_GRACE`` or the workflow turns out closed (terminated from the
  Web UI, say): nothing runs on for a job that is gone.

The program itself is a subprocess in its own process group that dies with the worker
(``PR_SET_PDEATHSIG``); a worker's death still restarts it elsewhere (from its own
checkpoints), as before.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from shepherd import programs
from shepherd.models import (
    CheckpointRecord,
    FollowedModel,
    MetricPoint,
    ProgramProgress,
    ProgramResult,
    ProgramStarted,
)
from shepherd.program_metrics import METRICS_FILE_ENV, MetricsTail
from shepherd.spec import MAX_KEPT_METRICS
from shepherd.terminal_text import readable
from workflows import policies

if TYPE_CHECKING:  # the proxy (and its web server) loads in the worker that runs a program
    from shepherd.platform import PlatformClient
    from shepherd.proxy import ProgramProxy, ProxyEvent

#: Lines of the program's stderr kept for the error of a failed program.
STDERR_TAIL = 40

#: Tells the reporter to flush and end (put on the run's event queue).
_STOP = object()


def read_exit(directory: Path) -> dict[str, Any] | None:
    """What an earlier attempt wrote when the program exited 0 (None: it never did)."""
    try:
        data = json.loads((directory / programs.EXIT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("code") == 0 else None


def _write_exit(directory: Path, data: dict[str, Any]) -> str | None:
    """Record the program's exit 0 (None), or say why it could not be (a full disk, say):
    the program's work is done either way, and the run goes on to its end."""
    path = directory / programs.EXIT_FILE
    staging = path.with_suffix(".tmp")
    try:
        staging.write_text(json.dumps(data))
        staging.replace(path)  # atomic: a reader sees the old record or the new one
    except OSError as exc:
        with contextlib.suppress(OSError):
            staging.unlink(missing_ok=True)
        return (
            f"the program's exit could not be recorded in {path} ({_why(exc)}); "
            "its end is known to its workflow only"
        )
    return None


def _why(exc: OSError) -> str:
    """An OSError's cause in words, with its errno's name ("No space left on device (ENOSPC)")."""
    name = errno.errorcode.get(exc.errno or 0)
    said = exc.strerror or str(exc)
    return f"{said} ({name})" if name else said


class OutputLog:
    """The program's output file (``programs.OUTPUT_FILE``: stamped lines, what ``shepherd
    logs`` shows). A write that fails (a full disk) is said once — in the worker's log and in
    the job's status — and the lines after it are dropped: the program must never block on
    a pipe nobody drains, nor its run fail for its log."""

    def __init__(self, path: Path, logger: Any) -> None:
        self.path = path
        self._log = logger
        self._sink: Any = None
        #: Why the file could not be written (None: it could).
        self.failed: str | None = None

    def write(self, stream: str, text: str) -> None:
        if self.failed is not None:
            return
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds")
        try:
            if self._sink is None:
                self._sink = self.path.open("a", encoding="utf-8")
            self._sink.write(json.dumps({"t": stamp, "stream": stream, "line": text}) + "\n")
            self._sink.flush()
        except OSError as exc:
            self.failed = (
                f"the program's output could not be written to {self.path} ({_why(exc)}); "
                "its later lines are not kept"
            )
            self._log.warning("program.output_unwritable", path=str(self.path), error=_why(exc))
            self.close()

    def close(self) -> None:
        sink, self._sink = self._sink, None
        if sink is not None:
            with contextlib.suppress(OSError):
                sink.close()


def _die_with_worker() -> None:
    """In the child, before exec: SIGKILL when the worker process dies (Linux), so a
    crashed worker never leaves a program training on behind it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def workflow_gone(exc: BaseException) -> bool:
    """Whether a client call failed because the workflow (every run of it) is closed."""
    return isinstance(exc, RPCError) and exc.status == RPCStatusCode.NOT_FOUND


class ProgramRun:
    """A program, its proxy, and what its workflow has yet to be told."""

    def __init__(
        self,
        *,
        workflow_id: str,
        name: str,
        program: programs.Program,
        args: dict[str, Any],
        directory: Path,
        proxy: ProgramProxy,
        platform: PlatformClient,
        handle: WorkflowHandle[Any, Any],
        environment: dict[str, str],
        generation: int,
        control_queue: str,
        metrics: list[str],
    ) -> None:
        self.workflow_id = workflow_id
        self.name = name
        self.program = program
        self.args = args
        self.directory = directory
        self.proxy = proxy
        #: The job's platform (the proxy's control plane): what a lost trainer's state is.
        self.platform = platform
        #: The job's workflow, whichever run is current (signals reach the current run).
        self.handle = handle
        self.generation = generation
        #: Where the workflow steers this worker's programs (attach, detach, checkpoint).
        self.control_queue = control_queue
        self._environment = environment
        self.events: asyncio.Queue[Any] = asyncio.Queue()
        #: The program's own metrics: its file, and the names the job keeps curves of.
        self.metrics_file = program.metrics_path(directory)
        self._metrics = MetricsTail(self.metrics_file)
        self._kept = list(dict.fromkeys([*metrics, *program.metrics]))[:MAX_KEPT_METRICS]
        self.log = structlog.stdlib.get_logger("shepherd.program").bind(
            workflow_id=workflow_id, program=name, generation=generation
        )
        #: The heartbeat details of whichever activity holds the run (updated in place).
        self.beat: dict[str, Any] = {}
        #: The activity holding the run now (a token of its own; None: orphaned).
        self.holder: object | None = None
        #: The program's whole life (its result, or the error that fails the job).
        self.task: asyncio.Task[ProgramResult] | None = None
        #: Why it was stopped (None: it was not).
        self.stopped: str | None = None
        # What the workflow has not been told yet.
        self.step = 0
        self.last_loss: float | None = None
        self.losses: list[tuple[int, float]] = []
        self.checkpoints: list[CheckpointRecord] = []
        self.trainer_lost: str | None = None
        self.metric_points: list[MetricPoint] = []
        #: The program's model the job follows now, once the proxy says it changed.
        self.following: FollowedModel | None = None
        self.latest_metrics: dict[str, float] = {}
        self.metrics_step: int | None = None
        self._records = 0
        self.dirty = False
        #: The workflow is closed for good (a signal found no run): nobody is told anything.
        self.unheard = False
        #: What the worker could not do for the program (a full disk), for the job's status.
        self.problems: list[str] = []
        self._told: set[str] = set()
        #: The program exited 0 (told to the workflow with the last report).
        self.exited = False

    # ------------------------------------------------------------------ life

    def start(self, attempt: int) -> None:
        """The program's life, as a task of the worker's (no activity's)."""
        self.task = asyncio.ensure_future(self._life(attempt))
        self.task.set_name(f"program {self.workflow_id}")

    def attached(self) -> str | None:
        """The trainer the proxy serves the program from now (None: none)."""
        return self.proxy.trainer_job_id

    async def announce(self, attempt: int, *, adopted: bool) -> None:
        """Tell the workflow where this run is steered, and (adopted) what it serves from."""
        await self.handle.signal(
            "program_started",
            ProgramStarted(
                control_queue=self.control_queue,
                attempt=attempt,
                generation=self.generation,
                total_steps=self.program.total_steps(self.args),
                adopted=adopted,
                attached=self.attached() if adopted else None,
            ),
        )

    async def stop(self, reason: str) -> None:
        """Stop the program (SIGTERM to its group, SIGKILL after the grace) and its proxy."""
        if self.task is None or self.task.done():
            return
        self.stopped = reason
        self.task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait({self.task})
        self.log.info("program.stopped", reason=reason)

    def orphan(self, stop_after: float) -> None:
        """No activity holds the run (its workflow continued-as-new): the next run's activity
        adopts it; if none does within ``stop_after`` seconds, or the workflow is found
        closed meanwhile, the program is stopped."""
        self.holder = None
        self.log.info("program.orphaned", adopt_within_s=stop_after)
        asyncio.ensure_future(self._watch_orphan(stop_after))

    async def _watch_orphan(self, stop_after: float) -> None:
        deadline = time.monotonic() + stop_after
        every = policies.PROGRAM_ORPHAN_CHECK.total_seconds()
        while self.holder is None and self.task is not None and not self.task.done():
            if time.monotonic() >= deadline:
                await self.stop("no run of its workflow adopted it")
                return
            try:
                described = await self.handle.describe()
                if described.status != WorkflowExecutionStatus.RUNNING:
                    status = described.status.name if described.status else "closed"
                    await self.stop(f"its workflow is {status}")
                    return
            except RPCError as exc:
                if workflow_gone(exc):
                    await self.stop("its workflow is gone")
                    return
            await asyncio.sleep(every)

    async def _life(self, attempt: int) -> ProgramResult:
        try:
            await self.proxy.start()
            return await self._drive(attempt)
        finally:
            await self.proxy.close()

    async def _drive(self, attempt: int) -> ProgramResult:
        """Start the program, forward what its proxy reports, and end with it."""
        from shepherd.proxy import ProxyError

        await self.announce(attempt, adopted=False)
        argv = self.program.command(sys.executable, self.args, self.directory)
        self.log.info("program.starting", argv=argv[1:], log_dir=str(self.directory))
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**self._environment, **self._proxy_env()},
            # Relative paths in its arguments mean what they mean to the worker.
            cwd=os.getcwd(),
            start_new_session=True,
            preexec_fn=_die_with_worker,
        )
        self.beat["program_pid"] = proc.pid
        tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        output = OutputLog(self.directory / programs.OUTPUT_FILE, self.log)
        pumps = [
            asyncio.ensure_future(_pump(proc.stdout, "stdout", output, None)),
            asyncio.ensure_future(_pump(proc.stderr, "stderr", output, tail)),
        ]
        reporter = asyncio.ensure_future(self._report())
        warned: float | None = None
        try:
            try:
                while proc.returncode is None:
                    self._read_metrics()
                    self.beat.update(step=self.step, loss=self.last_loss)
                    warned = _warn_if_idle(self.proxy, output, self.log, warned)
                    self._problem(output.failed)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(1.0):
                            await proc.wait()
            except asyncio.CancelledError:
                await _stop(proc, policies.PROGRAM_STOP_GRACE.total_seconds())
                raise
            finally:
                if proc.returncode is None:  # an error above: never leave it running
                    await _stop(proc, policies.PROGRAM_STOP_GRACE.total_seconds())
                await asyncio.gather(*pumps, return_exceptions=True)
                output.close()
            code = proc.returncode
            self.log.info("program.exited", code=code)
            self._problem(output.failed)
            if code != 0:
                # The job's status shows what the program got done before it failed.
                await self._last_report(reporter)
                said = "\n".join(tail) or "(nothing on stderr)"
                # (The tail is kept in memory: a log file that could not be written does
                # not cut it short; that it could not is said first.)
                also = f" ({output.failed})" if output.failed else ""
                raise ApplicationError(
                    _clip(
                        f"program {self.name!r} exited with status {code}{also}; "
                        f"its stderr ends:\n{said}"
                    ),
                    type=policies.PROGRAM_FAILED,
                    non_retryable=True,
                )
            self.exited = True
            unrecorded = _write_exit(self.directory, {"code": 0, "step": self.step})
            self._problem(unrecorded)
            # The weights the program ended with, as a Shepherd checkpoint: what promotion
            # takes (the last checkpoint taken on the way may be steps behind).
            try:
                final = await self.proxy.final_checkpoint()
            except ProxyError as exc:
                await self._last_report(reporter)
                raise ApplicationError(
                    f"program {self.name!r} exited 0, but Shepherd could not checkpoint the "
                    f"weights it ended with: {exc}",
                    type=policies.PROGRAM_FAILED,
                    non_retryable=True,
                ) from None
            if final is not None:
                self.checkpoints.append(final)
                self.dirty = True
            if unrecorded is None:  # (else said once: this one would fail as that did)
                self._problem(
                    _write_exit(
                        self.directory,
                        {
                            "code": 0,
                            "step": self.step,
                            "checkpoint": final.model_dump(mode="json") if final else None,
                        },
                    )
                )
            self.dirty = True  # the workflow hears that the program exited 0
            await self._last_report(reporter)
            return ProgramResult(exit_code=code, step=self.step)
        finally:
            if not reporter.done():  # an error path: the reporter ends with the run
                reporter.cancel()
                await asyncio.gather(reporter, return_exceptions=True)

    def _problem(self, said: str | None) -> None:
        """Something the worker could not do for the program: the job's status says it."""
        if said is not None and said not in self.problems and said not in self._told:
            self.problems.append(said)
            self.log.warning("program.problem", said=said)
            self.dirty = True

    def _proxy_env(self) -> dict[str, str]:
        return {
            "TINKER_BASE_URL": self.proxy.url,
            "TINKER_API_KEY": self.proxy.api_key,
            "PYTHONUNBUFFERED": "1",
            METRICS_FILE_ENV: str(self.metrics_file),
        }

    def _read_metrics(self) -> None:
        """What the program wrote to its metrics file since the last look."""
        for record in self._metrics.read():
            step = record.step if record.step is not None else self._records
            self._records += 1
            self.latest_metrics, self.metrics_step = record.values, step
            kept = {k: v for k, v in record.values.items() if k in self._kept}
            if kept:
                self.metric_points.append(MetricPoint(step=step, values=kept))
                # Unsent only while signals fail (a server outage): the curve keeps the last.
                del self.metric_points[: -policies.PROGRAM_SIGNAL_LOSSES]
            self.dirty = True

    # ------------------------------------------------------------------ reporting

    async def _report(self) -> None:
        """Forward the proxy's events to the workflow: checkpoints and a lost trainer at
        once, steps and losses at most every ``PROGRAM_PROGRESS_EVERY`` (each signal is a
        history event). Ends, after a last flush, when it reads :data:`_STOP`."""
        every = policies.PROGRAM_PROGRESS_EVERY.total_seconds()
        last = 0.0
        while True:
            event: Any = None
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow the
            # cancellation that meets its inner get() completing, and whoever awaits this
            # task then waits for ever (the job's heartbeat timed out on every exit).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every):
                    event = await self.events.get()
            if event is _STOP:
                await self._flush()
                return
            if event is not None and self._absorb(event):
                await self._flush()
                last = time.monotonic()
                continue
            if self.dirty and time.monotonic() - last >= every:
                await self._flush()
                last = time.monotonic()

    async def _last_report(self, reporter: asyncio.Future[None]) -> None:
        """The program ended: what the proxy reported since the last signal reaches the
        workflow. The reporter is told to stop (never cancelled) and flushes on its way out."""
        await self.proxy.drain_events()
        self.events.put_nowait(_STOP)
        await reporter

    def _absorb(self, event: ProxyEvent) -> bool:
        """Take ``event`` into the run's progress; True if it must reach the workflow now."""
        if event.kind == "step":
            self.step = max(self.step, event.step)
            if event.loss is not None:
                self.last_loss = event.loss
                self.losses.append((event.step, event.loss))
                # Unsent only while signals fail (a server outage): the curve keeps the last.
                del self.losses[: -policies.PROGRAM_SIGNAL_LOSSES]
            self.dirty = True
            return False
        if event.kind == "checkpoint":
            self.checkpoints.append(event.record)
            self.dirty = True
            return True
        if event.kind == "follow":
            self.following, self.step = event.model, event.step
            self.dirty = True
            return True
        if event.kind == "trainer_lost":
            state = event.state or "unknown"
            said = "" if state in event.reason else f" (the job is {state})"
            self.trainer_lost = f"{event.reason}{said}"
            self.dirty = True
            return True
        return False

    async def _flush(self) -> None:
        """One ``program_progress`` signal with everything not yet told. What a signal that
        failed carried is kept and sent with the next one (a server restart, say); a
        workflow that is closed for good hears nothing more."""
        # A checkpoint's metric is the program's newest measure when it is told: read it.
        self._read_metrics()
        if not self.dirty or self.unheard:
            return
        sent = ProgramProgress(
            step=self.step,
            last_loss=self.last_loss,
            losses=self.losses,
            checkpoints=self.checkpoints,
            trainer_lost=self.trainer_lost,
            restore_point=self.proxy.restore_point,
            metrics=self.metric_points,
            latest_metrics=self.latest_metrics,
            metrics_step=self.metrics_step,
            following=self.following,
            problems=self.problems,
            exited=self.exited,
        )
        try:
            await self.handle.signal("program_progress", sent)
        except RPCError as exc:
            if workflow_gone(exc):
                self.unheard = True
                self.log.info("program.workflow_gone", step=self.step)
            else:
                self.log.warning("program.signal_failed", error=str(exc)[:300])
            return
        self.losses, self.checkpoints, self.trainer_lost, self.dirty = [], [], None, False
        self.metric_points, self.following = [], None
        self._told.update(self.problems)
        self.problems = []


def _warn_if_idle(
    proxy: ProgramProxy, output: OutputLog, logger: Any, warned: float | None
) -> float | None:
    """Say so (in the program's log, which ``shepherd logs`` shows, and the worker's) when the
    program has sent its RUNNING trainer nothing for ``PROGRAM_IDLE_WARNING``, and again at
    each such interval; returns when it last said it."""
    limit = policies.PROGRAM_IDLE_WARNING.total_seconds()
    idle = proxy.idle_for()
    now = time.monotonic()
    if idle is None or idle < limit:
        return None if idle is not None and idle < limit else warned
    if warned is not None and now - warned < limit:
        return warned
    text = (
        f"the program has sent its trainer {proxy.trainer_job_id} nothing for "
        f"{idle / 60:.0f} min; the trainer is RUNNING (its GPUs are held) — is it waiting on "
        "something else, or stuck?"
    )
    output.write("shepherd", text)
    logger.warning("program.idle", idle_s=round(idle), trainer_job_id=proxy.trainer_job_id)
    return now


async def _pump(
    stream: asyncio.StreamReader | None,
    name: str,
    output: OutputLog,
    tail: collections.deque[str] | None,
) -> None:
    """The program's output, line by line, into its log file (stamped; ``shepherd logs``
    shows it tagged [program]); stderr's last lines also into ``tail``. Read to the end
    whether or not the file can be written."""
    if stream is None:
        return
    async for line in _lines(stream):
        text = line.decode("utf-8", "replace").rstrip("\n")
        if tail is not None:
            tail.append(readable(text))  # the error message of a failed program
        output.write(name, text)


def _clip(message: str, limit: int = 4000) -> str:
    """An error message within ``limit`` characters: its head (what failed and why) and the
    end of the stderr tail (where a traceback says its cause)."""
    if len(message) <= limit:
        return message
    head = message.split("\n", 1)[0][: limit // 4]
    return f"{head}\n…\n{message[-(limit - len(head) - 3) :]}"


async def _lines(stream: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """The stream's lines. A line longer than the reader's limit (64 KiB: a progress bar
    redrawn with ``\r`` for a minute, which never writes a newline) comes in pieces of its
    own: ``readline`` would raise, the pump would die, and the program would block for ever
    on a full pipe."""
    while True:
        try:
            yield await stream.readuntil(b"\n")
        except asyncio.IncompleteReadError as end:  # the end: the last line, if any
            if end.partial:
                yield end.partial
            return
        except asyncio.LimitOverrunError as over:
            yield await stream.readexactly(over.consumed)


async def _stop(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM to the program's process group; SIGKILL after ``grace_s``."""
    if proc.returncode is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            async with asyncio.timeout(wait):
                await proc.wait()
            return
        except TimeoutError:
            continue
