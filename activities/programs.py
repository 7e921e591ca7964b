"""Programs: an unmodified Tinker program runs behind the job's data-plane proxy
(shepherd/proxy), while the workflow keeps owning the trainer.

``run_program`` starts the program on this worker — its proxy, its subprocess, the reports
to the workflow (activities/program_run.py: a :class:`~activities.program_run.ProgramRun`,
which lives in the worker, not in the activity) — and *holds* it until it ends: exit 0
completes the job's training, another exit status fails the job with the tail of the
program's stderr. When the job's workflow continues-as-new, the next run's ``run_program``
(``adopt``, on this worker's hold queue) takes the running program over; the program never
notices. A holder cancelled by its workflow stops the program (SIGTERM to its process group,
SIGKILL after ``policies.PROGRAM_STOP_GRACE``); so does one whose workflow is closed for
good (terminated from outside), within the heartbeat timeout.

The workflow steers the proxy through the control activities, on the worker's control
queue: ``program_attach`` (a trainer is ready: serve from it, restoring the program's model
after a death or a pause), ``program_detach`` (the trainer is gone: hold the program's
requests), ``program_checkpoint`` (a pause: checkpoint now, then hold).

A worker's death kills the program with it (``PR_SET_PDEATHSIG``); the heartbeat timeout
tells the workflow, which starts the program again on another worker in the same durable
log directory: a program that resumes from its own checkpoints goes on from there.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError

from activities.base import ClientProvider, keepalive, log, lost, snapshot
from activities.program_run import ProgramRun, read_exit
from shepherd import programs
from shepherd.models import (
    CheckpointRecord,
    ProgramAttachInput,
    ProgramAttachResult,
    ProgramControlInput,
    ProgramProgress,
    ProgramResult,
    RunProgramInput,
)
from workflows import policies

if TYPE_CHECKING:  # the proxy (and its web server) loads in the worker that runs a program
    from shepherd.proxy import ProxySettings


class Backends(ClientProvider, Protocol):
    @property
    def profiles(self) -> Mapping[str, Any]: ...


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


class ProgramActivities:
    def __init__(self, clients: Backends, control_queue: str) -> None:
        self.clients = clients
        #: The task queue only this worker process polls (workers/main.py).
        self.control_queue = control_queue
        #: The programs this worker runs, by their job's workflow id (held or not).
        self._runs: dict[str, ProgramRun] = {}

    # ------------------------------------------------------------------ the run

    def _environment(self, program: programs.Program) -> dict[str, str]:
        """The worker's environment without any platform key (or Temporal credential);
        the proxy's endpoint is added by the run."""
        secret = {"TEMPORAL_API_KEY", "TEMPORAL_TLS_KEY", "SHEPHERD_PLANE_ADMIN_KEY"}
        for profile in self.clients.profiles.values():
            name = getattr(profile, "api_key_env", None)
            if name:
                secret.add(name)
        env = {k: v for k, v in os.environ.items() if k not in secret}
        env.update(program.env)
        return env

    @activity.defn(name="run_program")
    async def run_program(self, inp: RunProgramInput) -> ProgramResult:
        """Start the program (or adopt the one this worker runs for the job) and hold it
        until it ends."""
        info = activity.info()
        workflow_id = info.workflow_id or ""
        run = self._runs.get(workflow_id)
        if run is None and inp.adopt:
            # The program died with this worker's process, or ended and was forgotten: the
            # workflow starts it again (or reads its exit record) on any worker.
            raise ApplicationError(
                f"the program of {workflow_id} no longer runs on this worker",
                type=policies.PROGRAM_GONE,
                non_retryable=True,
            )
        if run is None:
            started = await self._start(inp, workflow_id)
            if isinstance(started, ProgramResult):
                return started
            run = started
        else:
            # A later run of the workflow (continue-as-new), or a start that landed here:
            # the program goes on as it is, and the workflow learns what it serves from.
            log(program=inp.program).info("program.adopted", generation=run.generation)
            await run.announce(info.attempt, adopted=True)
        return await self._hold(run, info)

    async def _start(self, inp: RunProgramInput, workflow_id: str) -> ProgramRun | ProgramResult:
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
        exited = read_exit(directory)
        if exited is not None:
            # An earlier attempt saw the program exit 0 and its worker died after: the
            # program is done, and is never started again.
            return await _exited_before(handle, inp.program, directory, exited)
        from shepherd.proxy import ProgramProxy

        run: ProgramRun
        platform = self.clients.client(inp.backend)
        proxy = ProgramProxy(
            platform,
            _proxy_settings(inp, program, directory),
            on_event=lambda event: run.events.put(event),
        )
        run = ProgramRun(
            workflow_id=workflow_id,
            name=inp.program,
            program=program,
            args=dict(inp.args),
            directory=directory,
            proxy=proxy,
            platform=platform,
            handle=handle,
            environment=self._environment(program),
            generation=inp.generation,
            control_queue=self.control_queue,
            metrics=inp.settings.metrics,
        )
        self._runs[workflow_id] = run
        run.start(activity.info().attempt)
        return run

    async def _hold(self, run: ProgramRun, info: activity.Info) -> ProgramResult:
        """Wait for the program's end under this activity's heartbeat (which carries its
        progress); let go, stop it, or leave it to the next run, as the cancel says."""
        task = run.task
        if task is None:  # (started just above: never)
            raise ApplicationError("the program run never started", type=policies.PROGRAM_GONE)
        me = object()
        run.holder = me
        # Everything, the proxy's start and close included, runs under the heartbeat: code
        # after the program's exit that outlived the heartbeat timeout would have the
        # attempt timed out and the program started again.
        async with keepalive(run.beat, policies.KEEPALIVE):
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.cancelled() or run.holder is not me:
                    await self._let_go(run, me, info)
                    raise
                # The run was stopped under this holder (the worker shuts down, say).
                raise ApplicationError(
                    f"the program was stopped: {run.stopped or 'cancelled'}",
                    type=policies.PROGRAM_GONE,
                    non_retryable=True,
                ) from None
            finally:
                if task.done():
                    self._forget(run, later=not task.cancelled())

    async def _let_go(self, run: ProgramRun, me: object, info: activity.Info) -> None:
        """This holder is cancelled: stop the program, or leave it to a later run."""
        if run.holder is not me:
            return  # a later run's activity holds it now
        details = activity.cancellation_details()
        if details is not None and details.not_found:
            # Our run is closed. Continued-as-new: the next run adopts the program (it is
            # stopped if none does). Closed for good (terminated, timed out): stop it.
            status = await _run_status(info)
            if status in (WorkflowExecutionStatus.CONTINUED_AS_NEW, None):
                run.orphan(policies.PROGRAM_ADOPT_GRACE.total_seconds())
                return
            reason = f"its workflow run is {status.name}"
        elif details is not None and details.timed_out:
            reason = "its activity timed out (another attempt takes over)"
        elif details is not None and details.worker_shutdown:
            reason = "the worker is shutting down"
        else:
            reason = "cancelled"
        run.holder = None
        self._forget(run)
        await run.stop(reason)

    def _forget(self, run: ProgramRun, *, later: bool = False) -> None:
        """Drop the run (``later``: after ``PROGRAM_RESULT_KEPT``, so that a next run's
        activity can still collect the result its holder could not deliver)."""

        def drop() -> None:
            if self._runs.get(run.workflow_id) is run:
                del self._runs[run.workflow_id]

        if later:
            asyncio.get_running_loop().call_later(
                policies.PROGRAM_RESULT_KEPT.total_seconds(), drop
            )
        else:
            drop()

    # ------------------------------------------------------------ the controls

    def _run(self) -> ProgramRun:
        workflow_id = activity.info().workflow_id or ""
        run = self._runs.get(workflow_id)
        if run is None or run.task is None or run.task.done():
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
        follow=s.follow,
    )


async def _run_status(info: activity.Info) -> WorkflowExecutionStatus | None:
    """The status of the workflow run an activity belongs to (None: it could not be read)."""
    handle = activity.client().get_workflow_handle(
        info.workflow_id or "", run_id=info.workflow_run_id
    )
    try:
        async with asyncio.timeout(policies.PROGRAM_ORPHAN_CHECK.total_seconds() * 2):
            return (await handle.describe()).status
    except Exception:  # noqa: BLE001 - unknown: the orphan's watch decides
        return None
