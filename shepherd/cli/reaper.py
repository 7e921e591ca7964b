"""``shepherd reaper install | status | run``: the reaper deletes the trainers of jobs that
ended without their cleanup (shepherd/reaper.py)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Annotated, Any

import typer
from rich.table import Table

from shepherd.cli.common import fail, run, shepherd
from shepherd.cli.render import console, print_json
from shepherd.reaper import (
    REAPER_GRACE,
    REAPER_PERIOD,
    SCHEDULE_ID,
    WORKFLOW_TYPE,
    ReaperInput,
    ReaperReport,
    install,
    state,
)
from shepherd.spec import parse_duration

app = typer.Typer(
    help="Delete trainers whose job ended without its cleanup (terminated, reset).",
    no_args_is_help=True,
)
JsonOption = Annotated[bool, typer.Option("--json", help="Print data as JSON.")]
GraceOption = Annotated[
    str, typer.Option(help="Delete a trainer once its job has been closed this long.")
]


def _duration(value: str, flag: str) -> timedelta:
    try:
        return parse_duration(value)
    except Exception:
        fail(f"{flag} {value!r}: must be a duration such as 90s, 15m, 6h", 2)


def _defaults() -> tuple[str, str]:
    def text(d: timedelta) -> str:
        return f"{int(d.total_seconds() // 60)}m"

    return text(REAPER_PERIOD), text(REAPER_GRACE)


def _report(report: ReaperReport | None, title: str) -> None:
    if report is None:
        console.print(f"[bold]{title}[/bold]: running, or failed (see the Web UI)")
        return
    verb = "would delete" if report.dry_run else "deleted"
    found = report.would_delete if report.dry_run else report.deleted
    when = report.finished_at.isoformat(timespec="seconds") if report.finished_at else "-"
    console.print(
        f"[bold]{title}[/bold] at {when}: checked {report.checked}, {verb} {len(found)}, "
        f"kept {report.kept_live} of live or just-ended jobs and {report.kept_foreign} "
        f"not Shepherd's (grace {report.grace_s:.0f}s)"
    )
    if found:
        table = Table("trainer", "state", "job", "why", "backend")
        for t in found:
            table.add_row(t.trainer_job_id, t.state, t.workflow_id or "-", t.reason, t.backend)
        console.print(table)
    for error in report.errors:
        console.print(f"  [red]error:[/red] {error}")


@app.command("install")
def install_cmd(
    every: Annotated[str | None, typer.Option(help="How often it runs.")] = None,
    grace: Annotated[str | None, typer.Option(help="See `reaper run --grace`.")] = None,
    paused: Annotated[bool, typer.Option(help="Create it paused.")] = False,
) -> None:
    """Create (or update) the Schedule that runs the reaper on this task queue's workers."""
    default_every, default_grace = _defaults()
    period = _duration(every or default_every, "--every")
    wait = _duration(grace or default_grace, "--grace")

    async def go() -> None:
        sh = await shepherd()
        await install(sh.client, sh.task_queue, every=period, grace=wait, paused=paused)
        console.print(
            f"schedule {SCHEDULE_ID}: every {period}, deleting trainers of jobs closed for "
            f"{wait} (task queue {sh.task_queue})"
        )

    run(go())


@app.command("status")
def status_cmd(as_json: JsonOption = False) -> None:
    """The reaper's Schedule and what its latest passes deleted."""

    async def go() -> None:
        sh = await shepherd()
        found = await state(sh.client)
        if as_json:
            print_json(found.model_dump(mode="json"))
            return
        if not found.installed:
            console.print(
                "the reaper is not installed: `shepherd reaper install` (shepherd dev does it)"
            )
            raise typer.Exit(1)
        every = f"every {found.every_s:.0f}s" if found.every_s else "-"
        console.print(
            f"[bold]{SCHEDULE_ID}[/bold]  {every}  task queue {found.task_queue}"
            + ("  [yellow]paused[/yellow]" if found.paused else "")
        )
        nexts = ", ".join(t.isoformat(timespec="seconds") for t in found.next_runs)
        console.print(f"  next runs: {nexts or '-'}")
        if not found.recent:
            console.print("  no pass yet")
        for workflow_id, report in found.recent:
            _report(report, workflow_id)

    run(go())


@app.command("run")
def run_cmd(
    dry_run: Annotated[
        bool, typer.Option(help="Show what it would delete; delete nothing.")
    ] = False,
    grace: GraceOption = _defaults()[1],
    as_json: JsonOption = False,
) -> None:
    """One pass now (on this task queue's workers), and what it did."""
    wait = _duration(grace, "--grace")

    async def go() -> None:
        sh = await shepherd()
        report: Any = await sh.client.execute_workflow(
            WORKFLOW_TYPE,
            ReaperInput(grace=wait, dry_run=dry_run),
            id=f"{SCHEDULE_ID}-manual-{uuid.uuid4().hex[:8]}",
            task_queue=sh.task_queue,
            result_type=ReaperReport,
        )
        if as_json:
            print_json(report.model_dump(mode="json"))
        else:
            _report(report, "dry run" if dry_run else "pass")

    run(go())
