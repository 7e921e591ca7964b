"""``make demo``: the main job end to end on the embedded stack.

Starts the Temporal dev server (with its Web UI), localplane and a worker; submits
``examples/quickstart.yaml``; midway, preempts the trainer like a spot reclaim and makes the
gateway's route propagate slowly (the route race); shows live progress; ends COMPLETED with
the promoted model and the Web UI link to the run; stops everything. Exit code 0 only when
the job completed, the model is READY and no trainer is left running.
"""

from __future__ import annotations

import asyncio
import socket
import tempfile
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from temporalio.client import WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from localplane.admin import PlaneAdmin
from shepherd.cli.render import steps
from shepherd.jobs import start_job
from shepherd.models import JobStatus
from shepherd.phases import Phase
from shepherd.spec import load_spec
from shepherd.temporal import TemporalSettings, connect
from workers.devstack import SIGNALS, DevStack, Stopping, free_port, run_until_signalled
from workers.main import WORKFLOWS

QUICKSTART = Path(__file__).resolve().parent.parent / "examples" / "quickstart.yaml"


def _port(preferred: int) -> int:
    """The usual port when free (so the usual URLs work), else any free one."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            return free_port()


async def _run(stack: DevStack, console: Console, spec_path: Path) -> bool:
    assert stack.temporal and stack.plane
    spec = load_spec(spec_path)
    client = await connect(TemporalSettings(address=stack.temporal.address))
    handle = await start_job(client, spec, task_queue=stack.task_queue)
    ui_link = f"{stack.temporal.ui_url}/namespaces/default/workflows/{handle.id}"
    console.print(
        f"submitted [bold]{handle.id}[/bold]  ({spec_path.name}, {spec.total_steps} steps)"
    )
    console.print(f"Web UI: {ui_link}")
    chaos_at = spec.total_steps // 3
    injected = False
    result_task = asyncio.ensure_future(handle.result())
    columns = (
        TextColumn("{task.fields[phase]:<13}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn(
            "step {task.completed:.0f}/{task.total:.0f}  loss {task.fields[loss]}  {task.fields[note]}"
        ),
        TimeElapsedColumn(),
    )
    async with PlaneAdmin(stack.plane.url, stack.plane.admin_key) as admin:
        with Progress(*columns, console=console, transient=False) as progress:
            bar = progress.add_task(
                "job", total=spec.total_steps, phase="PENDING", loss="-", note=""
            )
            status = JobStatus()
            while not result_task.done():
                status = await handle.query("status", result_type=JobStatus)
                note = f"recoveries {len(status.recoveries)}" if status.recoveries else ""
                loss = f"{status.last_loss:.3f}" if status.last_loss is not None else "-"
                progress.update(
                    bar, completed=status.step, phase=status.phase.value, loss=loss, note=note
                )
                if not injected and status.step >= chaos_at and status.phase is Phase.TRAINING:
                    injected = True
                    # Every gateway replica learns the resumed trainer's route late...
                    await admin.set_faults(routeLagSeconds={"min": 1.0, "max": 3.0})
                    # ...after a spot reclaim of the trainer.
                    await admin.preempt(status.trainer_job_id or "")
                    progress.console.print(
                        f"[yellow]injected: preemption of {status.trainer_job_id} at step {status.step}, route lag 1-3 s[/yellow]"
                    )
                await asyncio.wait({result_task}, timeout=0.3)
            try:
                final = result_task.result()
            except WorkflowFailureError as exc:
                final = await handle.query("status", result_type=JobStatus)
                progress.update(bar, completed=final.step, phase=final.phase.value)
                console.print(f"[red]job failed: {exc.cause}[/red]")
                return False
            progress.update(
                bar,
                completed=final.step,
                phase=final.phase.value,
                note=f"recoveries {len(final.recoveries)}",
            )
        stats = await admin.stats()
    # What durability rests on: the job's history rebuilds it, event for event, on this code.
    history = await handle.fetch_history()
    replayed = await Replayer(
        workflows=WORKFLOWS, data_converter=pydantic_data_converter
    ).replay_workflow(history, raise_on_replay_failure=False)
    job_stats = stats["jobs"].get(f"accounts/dev/rlorTrainerJobs/{final.trainer_job_id}", {})
    console.print()
    console.print(
        f"[bold green]{final.phase.value}[/bold green]  {final.step}/{final.total_steps} steps"
    )
    for r in final.recoveries:
        console.print(
            f"  recovery {r.number}: {r.reason} at step {r.at_step} -> resumed from step {r.resumed_from_step} "
            f"({steps(r.steps_redone or 0)} redone, {r.duration_s:.1f}s)"
        )
    console.print(
        f"  route 404s served by the gateway for this trainer: {job_stats.get('route404s', 0)}"
    )
    if final.best:
        console.print(
            f"  best checkpoint: {final.best.name} ({final.eval_metric} {final.best.metric:.4f})"
        )
    if final.model:
        console.print(f"  model: [bold]{final.model.name}[/bold] ({final.model.state})")
    console.print(f"  trainers still running on the plane: {stats['liveTrainers']}")
    if replayed.replay_failure is None:
        console.print(f"  history: {len(history.events)} events, replays against this code")
    else:
        console.print(f"[red]  history does not replay: {replayed.replay_failure}[/red]")
    console.print(f"  Web UI: {ui_link}")
    return (
        final.phase is Phase.COMPLETED
        and final.model is not None
        and final.model.state == "READY"
        and stats["liveTrainers"] == 0
        and replayed.replay_failure is None
    )


def main(state_dir: Path | None = None, keep: bool = False, spec_path: Path = QUICKSTART) -> int:
    # Before anything starts: stopped at any moment, the demo stops what it had started.
    SIGNALS.install()
    console = Console(soft_wrap=True)
    tmp = None if state_dir else tempfile.TemporaryDirectory(prefix="shepherd-demo-")
    stack = DevStack(
        state_dir or Path(tmp.name),  # type: ignore[union-attr]
        temporal_port=_port(7233),
        ui_port=_port(8233),
        plane_port=_port(8300),
    )
    console.print("starting Temporal (with its Web UI), localplane and a worker ...")
    ok = False
    try:
        stack.start()
        info = stack.info()
        console.print(
            f"  Temporal {info['temporal']}  ·  Web UI {info['ui']}  ·  localplane {info['plane']}"
        )
        ok = asyncio.run(_run(stack, console, spec_path))
        if keep:
            console.print("the stack stays up for the Web UI; Ctrl-C stops it")
            run_until_signalled(stack.dead)
    except Stopping:
        console.print("[yellow]stopped by a signal[/yellow]")
    finally:
        SIGNALS.begin_stop()
        console.print("stopping the worker, localplane and Temporal ...")
        stack.stop()
        if tmp is not None:
            tmp.cleanup()
    console.print(
        "[bold green]demo succeeded[/bold green]" if ok else "[bold red]demo failed[/bold red]"
    )
    return 0 if ok else 1
