"""``shepherd sweep submit | status | watch | cancel``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from shepherd.cli.common import EXIT_FAILED, run, shepherd, ui_link
from shepherd.cli.render import console, print_json
from shepherd.sweep import SweepStatus

app = typer.Typer(help="Hyperparameter sweeps: trials are job workflows.", no_args_is_help=True)
JsonOption = Annotated[bool, typer.Option("--json", help="Print data as JSON.")]


def show(status: SweepStatus) -> None:
    console.print(
        f"[bold]{status.workflow_id}[/bold]  {status.phase}  {status.method}, {status.goal} {status.metric}, "
        f"{len(status.trials)}/{status.max_trials} trials x{status.parallelism}"
    )
    names = sorted({k for t in status.trials for k in t.params})
    table = Table("trial", *names, status.metric, "state", "step")
    for t in status.trials:
        star = " *" if status.best == t.index else ""
        values = [
            f"{t.params[n]:.4g}" if isinstance(t.params.get(n), float) else str(t.params.get(n))
            for n in names
        ]
        table.add_row(
            f"{t.index}{star}",
            *values,
            "-" if t.metric is None else f"{t.metric:.4f}",
            t.state,
            str(t.step),
        )
    console.print(table)
    best = status.best_trial
    if best is not None:
        console.print(
            f"best: trial {best.index} ({status.metric} {best.metric:.4f})  {best.params}"
        )
    if status.model:
        console.print(f"promoted: {status.model}")
    if status.error:
        console.print(f"[red]{status.phase}:[/red] ", end="")
        console.print(status.error, markup=False, highlight=False)


async def _follow(handle, as_json: bool) -> SweepStatus:
    final = None
    async for status in handle.watch():
        final = status
        if as_json:
            print(status.model_dump_json())
        else:
            done = sum(t.state in ("completed", "stopped", "failed") for t in status.trials)
            console.print(
                f"{status.phase}: {done}/{status.max_trials} done, {sum(t.state == 'running' for t in status.trials)} running"
            )
    assert final is not None
    if not as_json:
        show(final)
    return final


@app.command()
def submit(
    sweep: Annotated[Path, typer.Argument(help="The sweep spec (YAML/JSON).")],
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Override a base-spec field (repeatable).")
    ] = None,
    watch: Annotated[bool, typer.Option("--watch", "-w")] = False,
    as_json: JsonOption = False,
) -> None:
    """Validate a sweep and start it."""

    async def go() -> None:
        from shepherd.client import load_sweep_spec

        spec = load_sweep_spec(sweep, overrides)  # before connecting: a bad file needs no server
        sh = await shepherd()
        handle = await sh.submit_sweep(spec)
        if as_json and not watch:
            print_json({"workflow_id": handle.id, "ui": ui_link(handle.id)})
        elif not as_json:
            console.print(
                f"submitted sweep [bold]{handle.id}[/bold]  ·  {ui_link(handle.id)}",
                highlight=False,
            )
        if watch:
            final = await _follow(handle, as_json)
            if final.phase != "COMPLETED":
                raise typer.Exit(EXIT_FAILED)

    run(go())


@app.command()
def status(
    workflow_id: str,
    plot: Annotated[
        bool, typer.Option("--plot", help="Draw every trial's eval curve on one terminal plot.")
    ] = False,
    png: Annotated[
        Path | None,
        typer.Option("--png", help="Write that plot to this PNG file (needs the 'plots' extra)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """A table of trials (parameters, metric, state) and the best; with --plot or --png,
    every trial's metric at its evaluated checkpoints on one plot."""
    from shepherd.cli import plots

    plots.check_options(plot=plot, png=png, as_json=as_json)

    async def go() -> None:
        st = await (await shepherd()).get_sweep(workflow_id).status()
        print_json(st) if as_json else show(st)
        plots.show(plots.sweep_panels(st), plot=plot, png=png, title=workflow_id, quiet=as_json)

    run(go())


@app.command()
def watch(workflow_id: str, as_json: JsonOption = False) -> None:
    """Follow a sweep until it ends."""

    async def go() -> None:
        final = await _follow((await shepherd()).get_sweep(workflow_id), as_json)
        if final.phase != "COMPLETED":
            raise typer.Exit(EXIT_FAILED)

    run(go())


@app.command()
def cancel(workflow_id: str, as_json: JsonOption = False) -> None:
    """Cancel the sweep and every running trial (their trainers are deleted). A sweep that
    has already ended is left alone, and the command says how it ended (exit 1)."""

    async def go() -> None:
        await (await shepherd()).get_sweep(workflow_id).cancel()
        if as_json:
            print_json({"workflow_id": workflow_id, "cancel_requested": True})
        else:
            console.print(f"cancel requested for {workflow_id}")

    run(go())
