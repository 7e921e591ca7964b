"""``shepherd schedule create | list | describe | pause | unpause | trigger | backfill | delete``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from shepherd.cli.common import EXIT_FAILED, fail, run, shepherd
from shepherd.cli.render import console, print_json
from shepherd.schedules import OVERLAP, ScheduleInfo, check_name, parse_time
from shepherd.spec import parse_duration

app = typer.Typer(help="Recurring experiments (Temporal Schedules).", no_args_is_help=True)
JsonOption = Annotated[bool, typer.Option("--json", help="Print data as JSON.")]


def _duration(value: str | None, flag: str) -> timedelta | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except Exception:
        fail(f"{flag} {value!r}: must be a duration such as 90s, 15m, 6h, 1d", 2)


def _show(info: ScheduleInfo) -> None:
    console.print(
        f"[bold]{info.name}[/bold]  ({info.schedule_id})  {info.spec}  overlap={info.overlap}"
    )
    console.print(
        f"  paused: {info.paused}   note: {info.note or '-'}   runs so far: {info.total_runs}"
    )
    console.print("  next runs: " + (", ".join(t.isoformat() for t in info.next_runs) or "-"))
    if info.recent_runs:
        table = Table("run", "scheduled", "outcome")
        for r in info.recent_runs:
            table.add_row(
                r.workflow_id,
                r.scheduled_at.isoformat() if r.scheduled_at else "-",
                r.outcome or "-",
            )
        console.print(table)


@app.command()
def create(
    name: str,
    spec: Path,
    cron: Annotated[
        list[str] | None, typer.Option(help="Cron expression (repeatable), e.g. '0 3 * * *'.")
    ] = None,
    every: Annotated[str | None, typer.Option(help="Interval, e.g. 10m, 6h.")] = None,
    overlap: Annotated[
        str, typer.Option(help="skip | buffer_one | cancel_other | allow_all")
    ] = "skip",
    catchup_window: Annotated[
        str | None, typer.Option(help="How late a missed run may still start, e.g. 1h.")
    ] = None,
    jitter: Annotated[
        str | None, typer.Option(help="Random delay added to each run, e.g. 30s.")
    ] = None,
    paused: Annotated[bool, typer.Option("--paused", help="Create it paused.")] = False,
    note: Annotated[str, typer.Option()] = "",
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="path.to.field=value (repeatable).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Run SPEC on a cron or an interval; the spec may use {scheduled_time:%Y%m%d}-style templates."""
    if not cron and every is None:
        fail("give --cron EXPR or --every DURATION", 2)
    if overlap not in OVERLAP:
        fail(f"--overlap {overlap!r}: must be one of {', '.join(OVERLAP)}", 2)
    interval = _duration(every, "--every")
    window = _duration(catchup_window, "--catchup-window")
    spread = _duration(jitter, "--jitter")

    async def go() -> None:
        from shepherd.client import load_job_spec

        check_name(name)  # before connecting: bad input needs no server
        job_spec = load_job_spec(spec, overrides)
        sh = await shepherd()
        info = await sh.schedules.create(
            name,
            job_spec,
            cron=cron,
            every=interval,
            overlap=overlap,
            catchup_window=window,
            jitter=spread,
            paused=paused,
            note=note,
        )
        print_json(info) if as_json else _show(info)

    run(go())


@app.command("list")
def list_schedules(as_json: JsonOption = False) -> None:
    """Every Shepherd schedule."""

    async def go() -> None:
        infos = await (await shepherd()).schedules.list()
        if as_json:
            print_json(infos)
            return
        table = Table("schedule", "spec", "paused", "next run", "runs")
        for i in infos:
            table.add_row(
                i.name,
                i.spec,
                str(i.paused),
                i.next_runs[0].isoformat() if i.next_runs else "-",
                str(i.total_runs),
            )
        console.print(table)

    run(go())


@app.command()
def describe(name: str, as_json: JsonOption = False) -> None:
    """Next runs, and recent runs with their outcome."""

    async def go() -> None:
        info = await (await shepherd()).schedules.describe(name)
        print_json(info) if as_json else _show(info)

    run(go())


@app.command()
def pause(
    name: str, note: Annotated[str, typer.Option()] = "", as_json: JsonOption = False
) -> None:
    """Stop starting new runs (running ones go on)."""
    run(_then(lambda sh: sh.schedules.pause(name, note), name, "paused", as_json))


@app.command()
def unpause(
    name: str, note: Annotated[str, typer.Option()] = "", as_json: JsonOption = False
) -> None:
    run(_then(lambda sh: sh.schedules.unpause(name, note), name, "unpaused", as_json))


@app.command()
def trigger(
    name: str, overlap: Annotated[str | None, typer.Option()] = None, as_json: JsonOption = False
) -> None:
    """Start a run now."""
    if overlap is not None and overlap not in OVERLAP:
        fail(f"--overlap {overlap!r}: must be one of {', '.join(OVERLAP)}", 2)

    async def go() -> None:
        result = await (await shepherd()).schedules.trigger(name, overlap)
        if as_json:
            print_json({"schedule": name, "action": "triggered", **result.model_dump()})
        elif result.outcome == "started":
            console.print(f"triggered {name}: started {result.workflow_id}", highlight=False)
        else:
            console.print(f"triggered {name}: {result.outcome} ({result.detail})", highlight=False)
        if result.outcome in ("skipped", "dropped"):
            raise typer.Exit(EXIT_FAILED)

    run(go())


@app.command()
def backfill(
    name: str,
    start: Annotated[
        str, typer.Argument(metavar="FROM", help="ISO time, e.g. 2026-11-01T00:00:00Z")
    ],
    end: Annotated[str, typer.Argument(metavar="TO")],
    overlap: Annotated[str, typer.Option()] = "allow_all",
    as_json: JsonOption = False,
) -> None:
    """Run now every action the schedule would have taken between FROM and TO."""
    try:
        begin, finish = parse_time(start), parse_time(end)
    except ValueError as exc:
        fail(f"FROM/TO: {exc}", 2)
    if overlap not in OVERLAP:
        fail(f"--overlap {overlap!r}: must be one of {', '.join(OVERLAP)}", 2)
    run(
        _then(
            lambda sh: sh.schedules.backfill(name, begin, finish, overlap),
            name,
            "backfilled",
            as_json,
            f" from {begin} to {finish}",
        )
    )


@app.command()
def delete(name: str, as_json: JsonOption = False) -> None:
    """Delete the schedule (its past and running jobs are untouched)."""
    run(_then(lambda sh: sh.schedules.delete(name), name, "deleted", as_json))


async def _then(
    action: Callable[[Any], Awaitable[None]], name: str, done: str, as_json: bool, detail: str = ""
) -> None:
    await action(await shepherd())
    if as_json:
        print_json({"schedule": name, "action": done})
    else:
        console.print(f"{done} {name}{detail}", highlight=False)
