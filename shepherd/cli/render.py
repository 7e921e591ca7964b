"""How the CLI shows jobs, schedules and sweeps: rich for people, JSON for programs."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Iterable
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from shepherd.models import JobStatus
from shepherd.phases import Phase
from shepherd.reaper import duration_text

#: The width of output that goes to a pipe or a file (which has none): wide enough that
#: a table is never cut or folded there. Rich would otherwise assume 80 columns.
PIPE_WIDTH = 10_000


def _console(*, stderr: bool = False) -> Console:
    if Console(stderr=stderr).is_terminal or os.environ.get("COLUMNS"):
        return Console(stderr=stderr, soft_wrap=True)
    return Console(stderr=stderr, soft_wrap=True, width=PIPE_WIDTH)


console = _console()
err_console = _console(stderr=True)


def as_json(value: Any) -> str:
    if isinstance(value, BaseModel):
        return value.model_dump_json(indent=2)
    if isinstance(value, list):
        return json.dumps(
            [v.model_dump(mode="json") if isinstance(v, BaseModel) else v for v in value], indent=2
        )
    return json.dumps(value, indent=2, default=str)


def print_json(value: Any) -> None:
    sys.stdout.write(as_json(value) + "\n")


def print_yaml(data: Any) -> None:
    import yaml

    sys.stdout.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


def _fits(headers: list[str], rows: list[list[str]]) -> bool:
    """Whether a boxed table shows every cell whole in the terminal's width (rich would
    otherwise cut or wrap cells, ids included)."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    return sum(w + 3 for w in widths) + 1 <= console.width


def _table_or_records(headers: list[str], rows: list[list[str]], key: int = 0) -> None:
    """A table when it fits; else one record per row: its id (column ``key``) whole on a
    line of its own, so it can be copied, and the other columns indented below it."""
    if _fits(headers, rows):
        table = Table(*headers)
        for row in rows:
            table.add_row(*row)
        console.print(table)
        return
    for row in rows:
        console.print(row[key], highlight=False, markup=False, soft_wrap=True)
        rest = [
            f"{h} {v}" for i, (h, v) in enumerate(zip(headers, row, strict=True)) if i != key and v
        ]
        console.print("    " + " · ".join(rest), highlight=False, markup=False)


def steps(n: int) -> str:
    """``1 step``, ``3 steps``."""
    return f"{n} step" if n == 1 else f"{n} steps"


def _age(status: JobStatus) -> str:
    if not status.started_at or not status.updated_at:
        return "-"
    seconds = (status.updated_at - status.started_at).total_seconds()
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.1f}m"


def show_status(status: JobStatus) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    rows: list[tuple[str, str]] = [
        ("job", status.workflow_id),
        ("phase", f"[bold]{status.phase_label}[/bold]"),
        ("platform", f"{status.platform_state or '-'}  {status.platform_message}".rstrip()),
        ("trainer", f"{status.trainer_job_id or '-'} (generation {status.generation})"),
        ("step", f"{status.step}/{status.total_steps}"),
        ("loss", f"{status.last_loss:.4f}" if status.last_loss is not None else "-"),
        (status.eval_metric, f"{status.eval_value:.4f}" if status.eval_value is not None else "-"),
        ("best", _best(status)),
        ("checkpoints", str(len(status.checkpoints))),
        (
            "recoveries",
            f"{len(status.recoveries)} (preemptions {status.preemptions}, failures {status.failures}"
            + (
                f", platform restarts {status.platform_restarts})"
                if status.platform_restarts
                else ")"
            ),
        ),
        ("model", f"{status.model.name} ({status.model.state})" if status.model else "-"),
        ("elapsed", _age(status)),
        ("cleanup", status.cleanup),
    ]
    if status.following is not None:
        rows.insert(5, ("follows", status.following.describe()))
    if status.admission:
        rows.insert(3, ("admission", _admission(status)))
    if status.metrics:
        at = f" at its step {status.metrics_step}" if status.metrics_step is not None else ""
        shown = status.headline_metrics() or dict(list(status.metrics.items())[:4])
        rows.insert(
            7,
            (
                "program",
                ", ".join(f"{k} {v:.4g}" for k, v in shown.items())
                + f" ({len(status.metrics)} metrics{at})",
            ),
        )
    if status.labels:
        rows.insert(1, ("labels", ", ".join(f"{k}={v}" for k, v in sorted(status.labels.items()))))
    if status.error:
        rows.append(("error", f"[red]{status.error.type}: {status.error.message}[/red]"))
    for key, value in rows:
        table.add_row(f"[dim]{key}[/dim]", value)
    console.print(table)
    for r in status.recoveries:
        # A priority preemption says who the slot went to and why (the platform's own
        # messages are in `shepherd logs`).
        why = f": {escape(r.message)}" if r.reason == "priority" and r.message else ""
        console.print(
            f"  [dim]recovery {r.number}:[/dim] {r.reason} at step {r.at_step} -> step {r.resumed_from_step} "
            f"({steps(r.steps_redone or 0)} redone, {r.duration_s or 0:.1f}s, {r.action}){why}",
            soft_wrap=True,
        )
    for notice in status.notices:
        console.print(f"  [yellow]notice:[/yellow] {notice}", soft_wrap=True)
    for trying in status.retrying:
        console.print(f"  [yellow]retrying:[/yellow] {escape(trying)}", soft_wrap=True)


def _admission(status: JobStatus) -> str:
    """Where a job waiting in Shepherd's queue stands, and what it waits for."""
    p = status.placement
    if p is None:
        return status.admission or "-"
    when = (
        f"; starts in about {duration_text(p.starts_in_s)} (from the running jobs' progress)"
        if p.starts_in_s is not None
        else ""
    )
    return f"position {p.position} of {p.length} in queue {p.queue}: waits for {p.waits_for}{when}"


def _headline(status: JobStatus) -> str:
    """A program's first kept metric, as the program last wrote it (``reward 0.75``)."""
    for name, value in status.headline_metrics().items():
        return f"{name} {value:.4g}"
    return ""


def _best(status: JobStatus) -> str:
    if status.best is None:
        return "-"
    if not status.best_decided:
        return f"- ({status.eval_metric} is the same at every checkpoint: it decides nothing)"
    return f"{status.best.name} (step {status.best.step})"


def outcome_line(status: JobStatus) -> str:
    if status.phase is Phase.COMPLETED:
        model = f" · model {status.model.name}" if status.model else ""
        return f"[bold green]COMPLETED[/bold green] {status.step}/{status.total_steps} steps in {_age(status)}{model}"
    error = f": {status.error.type}: {status.error.message}" if status.error else ""
    return f"[bold red]{status.phase.value}[/bold red] at step {status.step}/{status.total_steps}{error}"


def progress_line(status: JobStatus) -> str:
    """One plain line per change of a watched job (for logs and pipes)."""
    parts = [f"{status.phase_label:<13}", f"step {status.step}/{status.total_steps}"]
    if status.last_loss is not None:
        parts.append(f"loss {status.last_loss:.4f}")
    if headline := _headline(status):
        parts.append(headline)
    if status.platform_state:
        parts.append(f"trainer {status.platform_state.removeprefix('JOB_STATE_')}")
    if status.recoveries:
        parts.append(f"recoveries {len(status.recoveries)}")
    if status.placement is not None:
        p = status.placement
        parts.append(f"queue {p.queue} {p.position}/{p.length}")
    return "  ".join(parts)


async def watch_progress(updates: AsyncIterator[JobStatus]) -> JobStatus:
    """A live bar: phase, step/total, loss, ETA, recoveries. Returns the final status."""
    columns = (
        TextColumn("{task.fields[phase]:<24}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn(
            "{task.completed:.0f}/{task.total:.0f}  loss {task.fields[loss]}  "
            "{task.fields[metric]}  {task.fields[recoveries]}"
        ),
        TimeRemainingColumn(),
        TimeElapsedColumn(),
    )
    final: JobStatus | None = None
    with Progress(*columns, console=console) as progress:
        bar = None
        async for status in updates:
            final = status
            if bar is None:
                bar = progress.add_task(
                    "job", total=1, phase="", loss="-", metric="", recoveries=""
                )
            progress.update(
                bar,
                # A program's total may come later than the first look (its start says it).
                total=max(1, status.total_steps, status.step),
                completed=status.step,
                metric=_headline(status),
                phase=status.phase_label,
                loss=f"{status.last_loss:.3f}" if status.last_loss is not None else "-",
                recoveries=f"recoveries {len(status.recoveries)}" if status.recoveries else "",
            )
    assert final is not None
    return final


def _place(row: Any) -> str:
    """``(2/5 team-a)``: a waiting job's place in its admission queue."""
    p = getattr(row, "placement", None)
    return f" ({p.position}/{p.length} {p.queue})" if p is not None else ""


def job_table(rows: Iterable[Any]) -> None:
    headers = ["job", "name", "phase", "step", "labels", "trainer", "started"]
    cells = [
        [
            r.workflow_id,
            r.name or "-",
            (r.phase or r.execution_status or "-") + _place(r),
            "-" if r.step is None else str(r.step),
            ", ".join(f"{k}={v}" for k, v in sorted(r.labels.items())) or "-",
            r.trainer_job_id or "-",
            r.start_time.strftime("%Y-%m-%d %H:%M:%S") if r.start_time else "-",
        ]
        for r in rows
    ]
    _table_or_records(headers, cells)


def checkpoint_table(status: JobStatus) -> None:
    cells = [
        [
            c.name,
            str(c.step),
            "-" if c.metric is None else f"{c.metric:.4f}",
            "*" if status.best_decided and status.best and status.best.name == c.name else "",
        ]
        for c in status.checkpoints
    ]
    _table_or_records(["checkpoint", "step", status.eval_metric, "best"], cells)
