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
    duration_text,
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
    str | None,
    typer.Option(
        help="Delete a trainer once its job has been closed this long (default: the "
        f"installed reaper's grace, else {duration_text(REAPER_GRACE.total_seconds())}).",
        show_default=False,
    ),
]


def _duration(value: str, flag: str) -> timedelta:
    try:
        return parse_duration(value)
    except Exception:
        fail(f"{flag} {value!r}: must be a duration such as 90s, 15m, 6h", 2)


def _defaults() -> tuple[str, str]:
    return duration_text(REAPER_PERIOD.total_seconds()), duration_text(REAPER_GRACE.total_seconds())


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
        f"not Shepherd's (grace {duration_text(report.grace_s)})"
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
            f"schedule {SCHEDULE_ID}: every {duration_text(period.total_seconds())}, deleting "
            f"trainers of jobs closed for {duration_text(wait.total_seconds())} "
            f"(task queue {sh.task_queue})"
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
        every = f"every {duration_text(found.every_s)}" if found.every_s else "every -"
        grace = f"grace {duration_text(found.grace_s)}" if found.grace_s is not None else "grace -"
        console.print(
            f"[bold]{SCHEDULE_ID}[/bold]  {every}  {grace}  task queue {found.task_queue}"
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
    grace: GraceOption = None,
    as_json: JsonOption = False,
) -> None:
    """One pass now (on this task queue's workers), and what it did. Without --grace it
    uses the installed reaper's grace, so it deletes what the next scheduled pass would."""
    wait = _duration(grace, "--grace") if grace is not None else None

    async def go() -> None:
        sh = await shepherd()
        chosen, source = wait, "--grace"
        if chosen is None:
            installed = (await state(sh.client, last=0)).grace_s
            chosen, source = (
                (timedelta(seconds=installed), "the installed reaper's")
                if installed is not None
                else (REAPER_GRACE, "the default: no reaper is installed")
            )
        if not as_json:
            console.print(
                f"grace {duration_text(chosen.total_seconds())} ({source})", highlight=False
            )
        report: Any = await sh.client.execute_workflow(
            WORKFLOW_TYPE,
            ReaperInput(grace=chosen, dry_run=dry_run),
            id=f"{SCHEDULE_ID}-manual-{uuid.uuid4().hex[:8]}",
            task_queue=sh.task_queue,
            result_type=ReaperReport,
        )
        if as_json:
            print_json(report.model_dump(mode="json"))
        else:
            _report(report, "dry run" if dry_run else "pass")

    run(go())
