"""Programs: an unmodified Tinker program runs inside one long activity, behind the job's
data-plane proxy (shepherd/proxy), while the workflow keeps owning the trainer.

``run_program`` starts the proxy, tells the workflow where this run can be reached (the
worker's own *control queue*: a task queue only this worker process polls), starts the
program as a subprocess (its own process group, killed with the worker) whose
``TINKER_BASE_URL``/``TINKER_API_KEY`` are the proxy's, forwards what the proxy reports
(steps, losses, checkpoints, a trainer it saw die) to the workflow as signals, heartbeats,
and ends with the program: exit 0 completes the job's training, another exit status fails
the job with the tail of the program's stderr. A cancel stops the program (SIGTERM to its
process group, SIGKILL after ``policies.PROGRAM_STOP_GRACE``).

The workflow steers the proxy through the control activities, on that control queue:
``program_attach`` (a trainer is ready: serve from it, restoring the program's model after a
death or a pause), ``program_detach`` (the trainer is gone: hold the program's requests),
``program_checkpoint`` (a pause: checkpoint now, then hold).

A worker's death kills the program with it (``PR_SET_PDEATHSIG``); the heartbeat timeout then
retries the activity on another worker, which starts the program again in the same durable
log directory: a program that resumes from its own checkpoints goes on from there.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.base import ClientProvider, keepalive, log, lost, snapshot
from shepherd import programs
from shepherd.models import (
    CheckpointRecord,
    ProgramAttachInput,
    ProgramAttachResult,
    ProgramControlInput,
    ProgramProgress,
    ProgramResult,
    ProgramStarted,
    RunProgramInput,
)
from workflows import policies

if TYPE_CHECKING:  # the proxy (and its web server) loads in the worker that runs a program
    from shepherd.platform import PlatformClient
    from shepherd.proxy import ProgramProxy, ProxyEvent, ProxySettings

#: Lines of the program's stderr kept for the error of a failed program.
STDERR_TAIL = 40


class Backends(ClientProvider, Protocol):
    @property
    def profiles(self) -> Mapping[str, Any]: ...


@dataclass
class _Run:
    """One program run on this worker: its proxy, and what the workflow has yet to be told."""

    proxy: ProgramProxy
    events: asyncio.Queue[Any]
    #: The job's platform (the proxy's control plane): what a lost trainer's state is.
    platform: PlatformClient
    step: int = 0
    last_loss: float | None = None
    losses: list[tuple[int, float]] = field(default_factory=list)
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    trainer_lost: str | None = None
    dirty: bool = False


#: Tells the reporter to flush and end (put on the run's event queue).
_STOP = object()


def _read_exit(directory: Path) -> dict[str, Any] | None:
    """What an earlier attempt wrote when the program exited 0 (None: it never did)."""
    try:
        data = json.loads((directory / programs.EXIT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("code") == 0 else None


def _write_exit(directory: Path, data: dict[str, Any]) -> None:
    path = directory / programs.EXIT_FILE
    staging = path.with_suffix(".tmp")
    staging.write_text(json.dumps(data))
    staging.replace(path)  # atomic: a reader sees the old record or the new one


async def _exited_before(
    handle: Any, name: str, directory: Path, exited: dict[str, Any]
) -> ProgramResult:
    """A later attempt of a program that exited 0: report its final checkpoint, or fail the
    job when the worker died before it was saved (an older one would be the wrong model)."""
    raw = exited.get("checkpoint")
    step = int(exited.get("step") or 0)
    if raw is None:
        raise ApplicationError(
            f"program {name!r} exited 0, but its worker died before Shepherd saved the weights "
            f"it ended with; the program's own checkpoints are in {directory}",
            type=policies.PROGRAM_FAILED,
            non_retryable=True,
        )
    record = CheckpointRecord.model_validate(raw)
    await handle.signal("program_progress", ProgramProgress(step=step, checkpoints=[record]))
    log(program=name).info("program.already_exited", step=step, checkpoint=record.name)
    return ProgramResult(exit_code=0, step=step)


def _die_with_worker() -> None:
    """In the child, before exec: SIGKILL when the worker process dies (Linux), so a
    crashed worker never leaves a program training on behind it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ProgramActivities:
    def __init__(self, clients: Backends, control_queue: str) -> None:
        self.clients = clients
        #: The task queue only this worker process polls (workers/main.py).
        self.control_queue = control_queue
        self._runs: dict[str, _Run] = {}

    # ------------------------------------------------------------------ the run

    def _environment(self, proxy: ProgramProxy, program: programs.Program) -> dict[str, str]:
        """The worker's environment without any platform key (or Temporal credential),
        with the proxy as the program's Tinker endpoint."""
        secret = {"TEMPORAL_API_KEY", "TEMPORAL_TLS_KEY", "SHEPHERD_PLANE_ADMIN_KEY"}
        for profile in self.clients.profiles.values():
            name = getattr(profile, "api_key_env", None)
            if name:
                secret.add(name)
        env = {k: v for k, v in os.environ.items() if k not in secret}
        env.update(program.env)
        env.update(
            {
                "TINKER_BASE_URL": proxy.url,
                "TINKER_API_KEY": proxy.api_key,
                "PYTHONUNBUFFERED": "1",
            }
        )
        return env

    @activity.defn(name="run_program")
    async def run_program(self, inp: RunProgramInput) -> ProgramResult:
        info = activity.info()
        workflow_id = info.workflow_id or ""
        try:
            program = programs.resolve(inp.program)
            program.check_args(inp.args)
        except programs.ProgramError as exc:
            raise ApplicationError(
                str(exc), type=programs.INVALID_PROGRAM, non_retryable=True
            ) from None
        directory = programs.log_dir(workflow_id)
        if inp.seed_from and programs.seed_log_dir(directory, programs.log_dir(inp.seed_from)):
            log(program=inp.program).info("program.seeded", from_job=inp.seed_from)
        directory.mkdir(parents=True, exist_ok=True)
        handle = activity.client().get_workflow_handle(workflow_id)
        exited = _read_exit(directory)
        if exited is not None:
            # An earlier attempt saw the program exit 0 and its worker died after: the
            # program is done, and is never started again.
            return await _exited_before(handle, inp.program, directory, exited)
        from shepherd.proxy import ProgramProxy

        events: asyncio.Queue[Any] = asyncio.Queue()
        platform = self.clients.client(inp.backend)
        proxy = ProgramProxy(
            platform,
            _proxy_settings(inp, program, directory),
            on_event=events.put,
        )
        run = _Run(proxy=proxy, events=events, platform=platform)
        progress: dict[str, Any] = {}
        # Everything, the proxy's start and close included, runs under the heartbeat: code
        # after the program's exit that outlived the heartbeat timeout would have the
        # attempt timed out and the program started again.
        async with keepalive(progress, policies.KEEPALIVE):
            await run.proxy.start()
            self._runs[workflow_id] = run
            try:
                return await self._drive(handle, inp, program, directory, run, progress)
            finally:
                self._runs.pop(workflow_id, None)
                await run.proxy.close()

    async def _drive(
        self,
        handle: Any,
        inp: RunProgramInput,
        program: programs.Program,
        directory: Path,
        run: _Run,
        progress: dict[str, Any],
    ) -> ProgramResult:
        """Start the program, forward what its proxy reports, and end with it."""
        from shepherd.proxy import ProxyError

        logger = log(program=inp.program)
        await handle.signal(
            "program_started",
            ProgramStarted(
                control_queue=self.control_queue,
                attempt=activity.info().attempt,
                total_steps=program.total_steps(inp.args),
            ),
        )
        argv = program.command(sys.executable, inp.args, directory)
        logger.info("program.starting", argv=argv[1:], log_dir=str(directory))
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._environment(run.proxy, program),
            # Relative paths in its arguments mean what they mean to the worker.
            cwd=os.getcwd(),
            start_new_session=True,
            preexec_fn=_die_with_worker,
        )
        progress["program_pid"] = proc.pid
        tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        output = directory / programs.OUTPUT_FILE
        pumps = [
            asyncio.ensure_future(_pump(proc.stdout, "stdout", output, None)),
            asyncio.ensure_future(_pump(proc.stderr, "stderr", output, tail)),
        ]
        reporter = asyncio.ensure_future(self._report(handle, run))
        warned: float | None = None
        try:
            try:
                while proc.returncode is None:
                    progress.update(step=run.step, loss=run.last_loss)
                    warned = _warn_if_idle(run.proxy, output, logger, warned)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(1.0):
                            await proc.wait()
            except asyncio.CancelledError:
                await _stop(proc, policies.PROGRAM_STOP_GRACE.total_seconds())
                logger.info("program.stopped", reason="cancelled")
                raise
            finally:
                if proc.returncode is None:  # an error above: never leave it running
                    await _stop(proc, policies.PROGRAM_STOP_GRACE.total_seconds())
                await asyncio.gather(*pumps, return_exceptions=True)
            code = proc.returncode
            logger.info("program.exited", code=code)
            if code != 0:
                # The job's status shows what the program got done before it failed.
                await self._last_report(handle, run, reporter)
                said = "\n".join(tail) or "(nothing on stderr)"
                raise ApplicationError(
                    f"program {inp.program!r} exited with status {code}; its stderr ends:\n{said}"[
                        -4000:
                    ],
                    type=policies.PROGRAM_FAILED,
                    non_retryable=True,
                )
            _write_exit(directory, {"code": 0, "step": run.step})
            # The weights the program ended with, as a Shepherd checkpoint: what promotion
            # takes (the last checkpoint taken on the way may be steps behind).
            try:
                final = await run.proxy.final_checkpoint()
            except ProxyError as exc:
                await self._last_report(handle, run, reporter)
                raise ApplicationError(
                    f"program {inp.program!r} exited 0, but Shepherd could not checkpoint the "
                    f"weights it ended with: {exc}",
                    type=policies.PROGRAM_FAILED,
                    non_retryable=True,
                ) from None
            if final is not None:
                run.checkpoints.append(final)
                run.dirty = True
            _write_exit(
                directory,
                {
                    "code": 0,
                    "step": run.step,
                    "checkpoint": final.model_dump(mode="json") if final else None,
                },
            )
            await self._last_report(handle, run, reporter)
            return ProgramResult(exit_code=code, step=run.step)
        finally:
            if not reporter.done():  # an error path: the reporter ends with the attempt
                reporter.cancel()
                await asyncio.gather(reporter, return_exceptions=True)

    async def _report(self, handle: Any, run: _Run) -> None:
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
                    event = await run.events.get()
            if event is _STOP:
                await self._flush(handle, run)
                return
            if event is not None and self._absorb(run, event):
                await self._flush(handle, run)
                last = time.monotonic()
                continue
            if run.dirty and time.monotonic() - last >= every:
                await self._flush(handle, run)
                last = time.monotonic()

    async def _last_report(self, handle: Any, run: _Run, reporter: asyncio.Future[None]) -> None:
        """The program ended: what the proxy reported since the last signal reaches the
        workflow. The reporter is told to stop (never cancelled) and flushes on its way out."""
        await run.proxy.drain_events()
        run.events.put_nowait(_STOP)
        await reporter

    @staticmethod
    def _absorb(run: _Run, event: ProxyEvent) -> bool:
        """Take ``event`` into the run's progress; True if it must reach the workflow now."""
        if event.kind == "step":
            run.step = max(run.step, event.step)
            if event.loss is not None:
                run.last_loss = event.loss
                run.losses.append((event.step, event.loss))
            run.dirty = True
            return False
        if event.kind == "checkpoint":
            run.checkpoints.append(event.record)
            run.dirty = True
            return True
        if event.kind == "trainer_lost":
            run.trainer_lost = f"{event.reason} (the job is {event.state or 'unknown'})"
            run.dirty = True
            return True
        return False

    @staticmethod
    async def _flush(handle: Any, run: _Run) -> None:
        if not run.dirty:
            return
        sent = ProgramProgress(
            step=run.step,
            last_loss=run.last_loss,
            losses=run.losses,
            checkpoints=run.checkpoints,
            trainer_lost=run.trainer_lost,
            restore_point=run.proxy.restore_point,
        )
        run.losses, run.checkpoints, run.trainer_lost, run.dirty = [], [], None, False
        await handle.signal("program_progress", sent)

    # ------------------------------------------------------------ the controls

    def _run(self) -> _Run:
        workflow_id = activity.info().workflow_id or ""
        run = self._runs.get(workflow_id)
        if run is None:
            # This worker no longer runs the program (it ended, or another attempt runs
            # elsewhere): the workflow waits for the attempt that does.
            raise ApplicationError(
                f"no program of {workflow_id} runs on this worker",
                type=policies.PROGRAM_GONE,
                non_retryable=True,
            )
        return run

    @activity.defn(name="program_attach")
    async def program_attach(self, inp: ProgramAttachInput) -> ProgramAttachResult:
        from shepherd.proxy import ProxyError

        run = self._run()
        try:
            done = await run.proxy.attach(inp.trainer_job_id)
        except ProxyError as exc:
            # The trainer was lost while its models were restored: the workflow recovers it,
            # told what the platform says of it (a preemption counts as one).
            raise await self._lost(inp.trainer_job_id, str(exc)) from None
        return ProgramAttachResult(
            restored_from=done.restored_from.name if done.restored_from else None,
            ops_redone=done.ops_redone,
            optimizer_steps_redone=done.optimizer_steps_redone,
            seconds=done.seconds,
            digests_match=done.digests_match,
        )

    @activity.defn(name="program_detach")
    async def program_detach(self, inp: ProgramControlInput) -> None:
        self._run().proxy.detach(inp.reason)

    @activity.defn(name="program_checkpoint")
    async def program_checkpoint(self, inp: ProgramControlInput) -> CheckpointRecord | None:
        from shepherd.proxy import ProxyError

        run = self._run()
        trainer = run.proxy.trainer_job_id or ""
        try:
            return await run.proxy.checkpoint_now()
        except ProxyError as exc:
            raise await self._lost(trainer, str(exc)) from None

    async def _lost(self, trainer_job_id: str, said: str) -> ApplicationError:
        """The proxy saw the trainer go: the loss with the platform's view of the job."""
        run = self._run()
        try:
            job = snapshot(await run.platform.get_job(trainer_job_id))
        except Exception:  # noqa: BLE001 - the proxy's word is still the news
            return ApplicationError(said, type=policies.TRAINER_LOST, non_retryable=True)
        return lost(job)


def _proxy_settings(
    inp: RunProgramInput, program: programs.Program, directory: Path
) -> ProxySettings:
    from shepherd.proxy import ProxySettings

    s = inp.settings
    return ProxySettings(
        trainer_base_model=s.base_model,
        base_model_aliases=tuple(program.model_names(inp.args)),
        lora_rank=s.lora_rank,
        checkpoint_every=s.checkpoint_every,
        call_timeout_s=s.call_timeout_s,
        route_race_retries=s.route_race_retries,
        route_race_window_s=s.route_race_window_s,
        state_dir=str(directory),
    )


def _warn_if_idle(
    proxy: ProgramProxy, output: Path, logger: Any, warned: float | None
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
    stamp = datetime.now(UTC).isoformat(timespec="milliseconds")
    with output.open("a", encoding="utf-8") as sink:
        sink.write(json.dumps({"t": stamp, "stream": "shepherd", "line": text}) + "\n")
    logger.warning("program.idle", idle_s=round(idle), trainer_job_id=proxy.trainer_job_id)
    return now


async def _pump(
    stream: asyncio.StreamReader | None,
    name: str,
    output: Path,
    tail: collections.deque[str] | None,
) -> None:
    """The program's output, line by line, into its log file (stamped; ``shepherd logs``
    shows it tagged [program]); stderr's last lines also into ``tail``."""
    if stream is None:
        return
    with output.open("a", encoding="utf-8") as sink:
        while line := await stream.readline():
            text = line.decode("utf-8", "replace").rstrip("\n")
            if tail is not None:
                tail.append(text)
            stamp = datetime.now(UTC).isoformat(timespec="milliseconds")
            sink.write(json.dumps({"t": stamp, "stream": name, "line": text}) + "\n")
            sink.flush()


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
