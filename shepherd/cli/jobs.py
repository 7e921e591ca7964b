"""``shepherd validate | submit | status | watch | list | pause | resume | cancel | retry |
checkpoints``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from shepherd.cli.common import EXIT_FAILED, EXIT_INVALID, fail, run, shepherd, ui_link
from shepherd.cli.render import (
    checkpoint_table,
    console,
    job_table,
    outcome_line,
    print_json,
    print_yaml,
    progress_line,
    show_status,
    watch_progress,
)
from shepherd.phases import Phase

SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a field: path.to.field=value (repeatable)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print data as JSON.")]


async def _follow(job: Any, as_json: bool) -> None:
    """Watch until the end; exit non-zero unless the job completed."""
    if as_json:
        async for status in job.watch():
            print(status.model_dump_json())
            final = status
    else:
        told: set[str] = set()
        if console.is_terminal:
            final = await watch_progress(job.watch())
        else:
            # A log or a pipe gets a plain line per change (a live bar shows only its end).
            async for status in job.watch():
                console.print(progress_line(status), soft_wrap=True)
                final = status
                for notice in (n for n in status.notices if n not in told):
                    told.add(notice)
                    console.print(f"notice: {notice}", soft_wrap=True)
        for notice in (n for n in final.notices if n not in told):
            console.print(f"[yellow]notice:[/yellow] {notice}", soft_wrap=True)
        console.print(outcome_line(final))
    if final.phase is not Phase.COMPLETED:
        raise typer.Exit(EXIT_FAILED)


def _is_sweep(data: dict[str, Any]) -> bool:
    return "parameters" in data and ("base" in data or "spec" in data)


def register(app: typer.Typer) -> None:
    @app.command()
    def validate(
        spec: Annotated[Path, typer.Argument(help="A job spec or a sweep file (YAML or JSON).")],
        overrides: SetOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Check a spec without connecting anywhere: print it normalised (every default
        filled in) and exit 0, or print every problem with its field and exit 2."""

        async def go() -> None:
            from datetime import UTC, datetime

            from shepherd.client import load_job_spec
            from shepherd.spec import load_spec_data, resolve_templates
            from shepherd.sweep import load_sweep

            if _is_sweep(load_spec_data(spec)):
                normalised: Any = load_sweep(spec, overrides=overrides)
            else:
                normalised = load_job_spec(spec, overrides)
                resolve_templates(normalised, datetime.now(UTC))  # templates must fill too
            data = normalised.model_dump(mode="json")
            print_json(data) if as_json else print_yaml(data)

        run(go())

    @app.command()
    def submit(
        spec: Annotated[Path, typer.Argument(help="The job spec (YAML or JSON).")],
        overrides: SetOption = None,
        watch: Annotated[
            bool, typer.Option("--watch", "-w", help="Follow progress until the end.")
        ] = False,
        workflow_id: Annotated[
            str | None, typer.Option("--id", help="Workflow id (default job-<name>-<suffix>).")
        ] = None,
        rerun: Annotated[
            bool,
            typer.Option(
                "--rerun",
                help="With --id of a job that has ended: start a new run under that id "
                "(never while it runs).",
            ),
        ] = False,
        dry_run: Annotated[
            bool,
            typer.Option(
                "--dry-run",
                help="Make every check (spec, id, backend, output model) and start nothing.",
            ),
        ] = False,
        as_json: JsonOption = False,
    ) -> None:
        """Validate a spec and start the job (nothing is started when the spec is invalid,
        its --id is taken, or its output model id is claimed by another live job)."""
        if rerun and workflow_id is None:
            fail("--rerun needs --id: the id of the job to run again", 2)

        async def go() -> None:
            from shepherd.client import load_job_spec
            from shepherd.jobs import check_workflow_id

            # Before connecting: bad input needs no server.
            job_spec = load_job_spec(spec, overrides)
            if workflow_id is not None:
                check_workflow_id(workflow_id)
            sh = await shepherd()
            if dry_run:
                plan = await sh.plan(job_spec, workflow_id=workflow_id, rerun=rerun)
                if as_json:
                    print_json(plan)
                    return
                claim = f"; claims output model {plan.claims_model!r}" if plan.claims_model else ""
                console.print(
                    f"would start [bold]{plan.workflow_id}[/bold] on task queue "
                    f"{plan.task_queue!r}{claim} (dry run: nothing started)",
                    highlight=False,
                )
                print_yaml(plan.spec.model_dump(mode="json"))
                return
            job = await sh.submit(job_spec, workflow_id=workflow_id, rerun=rerun)
            if as_json and not watch:
                print_json({"workflow_id": job.id, "ui": ui_link(job.id)})
            elif not as_json:
                console.print(
                    f"submitted [bold]{job.id}[/bold]  ·  {ui_link(job.id)}", highlight=False
                )
            if watch:
                await _follow(job, as_json)

        run(go())

    @app.command()
    def status(
        workflow_id: str,
        plot: Annotated[
            bool,
            typer.Option("--plot", help="Draw the training loss and eval curves in the terminal."),
        ] = False,
        png: Annotated[
            Path | None,
            typer.Option(
                "--png", help="Write the curves to this PNG file (needs the 'plots' extra)."
            ),
        ] = None,
        metric: Annotated[
            str | None,
            typer.Option(
                "--metric",
                help="With --plot/--png: draw this one of the program's own metrics "
                "(e.g. env/all/reward/total).",
            ),
        ] = None,
        as_json: JsonOption = False,
    ) -> None:
        """The job's status: phase, platform state, step, loss, the program's metrics,
        checkpoints, recoveries, error; its curves with --plot or --png (and always in
        --json)."""
        from shepherd.cli import plots

        plots.check_options(plot=plot, png=png, as_json=as_json)
        if metric is not None and not (plot or png):
            fail("--metric says which curve --plot or --png draws: add one of them", EXIT_INVALID)

        async def go() -> None:
            st = await (await shepherd()).get(workflow_id).status()
            if metric is not None:
                plots.keep_metric(st, metric)
            print_json(st) if as_json else show_status(st)
            panels = plots.job_panels(st, metric)
            plots.show(panels, plot=plot, png=png, title=workflow_id, quiet=as_json)

        run(go())

    @app.command()
    def watch(workflow_id: str, as_json: JsonOption = False) -> None:
        """Follow a job until it ends (JSON: one status per line)."""

        async def go() -> None:
            await _follow((await shepherd()).get(workflow_id), as_json)

        run(go())

    @app.command("list")
    def list_jobs(
        label: Annotated[
            list[str] | None, typer.Option("--label", "-l", help="key=value (repeatable).")
        ] = None,
        phase: Annotated[str | None, typer.Option(help="e.g. TRAINING, COMPLETED.")] = None,
        name: Annotated[str | None, typer.Option(help="The spec's name.")] = None,
        limit: Annotated[int, typer.Option(min=1)] = 50,
        as_json: JsonOption = False,
    ) -> None:
        """Jobs by label and phase (Temporal visibility over Shepherd's search attributes)."""
        labels = {}
        for item in label or []:
            key, sep, value = item.partition("=")
            if not sep or not key:
                fail(f"--label {item!r}: must be key=value", 2)
            labels[key] = value
        if phase is not None and phase.upper() not in Phase.__members__:
            fail(f"--phase {phase!r}: must be one of {', '.join(Phase.__members__)}", 2)

        async def go() -> None:
            rows = await (await shepherd()).list(
                labels=labels, phase=phase.upper() if phase else None, name=name, limit=limit
            )
            print_json(rows) if as_json else job_table(rows)

        run(go())

    @app.command()
    def pause(
        workflow_id: str, reason: Annotated[str, typer.Option()] = "", as_json: JsonOption = False
    ) -> None:
        """Checkpoint, delete the trainer (no GPU held), wait for resume."""

        async def go() -> None:
            result = await (await shepherd()).get(workflow_id).pause(reason)
            print_json(result) if as_json else console.print(
                f"paused at step {result.step} · checkpoint {result.checkpoint}"
            )

        run(go())

    @app.command()
    def resume(
        workflow_id: str,
        checkpoint: Annotated[
            str | None, typer.Option(help="Resume from this checkpoint (default: the pause's).")
        ] = None,
        as_json: JsonOption = False,
    ) -> None:
        """Provision a new trainer and continue from the pause's (or the given) checkpoint."""

        async def go() -> None:
            st = await (await shepherd()).get(workflow_id).resume(checkpoint)
            print_json(st) if as_json else console.print(
                # The same words and numbers as `status` (the new trainer is provisioned
                # before the answer comes back).
                f"resumed: {st.phase.value} · trainer {st.trainer_job_id or '-'} "
                f"(generation {st.generation})"
            )

        run(go())

    @app.command()
    def cancel(
        workflow_id: str, reason: Annotated[str, typer.Option()] = "", as_json: JsonOption = False
    ) -> None:
        """Cancel; cleanup still runs (the trainer is deleted, checkpoints are kept). A job
        that has already ended is left alone, and the command says how it ended (exit 1)."""

        async def go() -> None:
            await (await shepherd()).get(workflow_id).cancel(reason)
            if as_json:
                print_json({"workflow_id": workflow_id, "cancel_requested": True})
            else:
                console.print(f"cancel requested for {workflow_id}")

        run(go())

    @app.command()
    def retry(
        workflow_id: str,
        from_checkpoint: Annotated[
            str | None, typer.Option(help="Default: the job's best, else last checkpoint.")
        ] = None,
        overrides: SetOption = None,
        watch: Annotated[bool, typer.Option("--watch", "-w")] = False,
        as_json: JsonOption = False,
    ) -> None:
        """A new job from a checkpoint of this one, with changed resources, linked to it."""

        async def go() -> None:
            from shepherd.client import apply_overrides

            apply_overrides({}, overrides)  # their syntax, before connecting
            job = (
                await (await shepherd())
                .get(workflow_id)
                .retry(from_checkpoint=from_checkpoint, overrides=overrides)
            )
            if as_json and not watch:
                print_json({"workflow_id": job.id, "parent": workflow_id})
            elif not as_json:
                console.print(
                    f"retrying as [bold]{job.id}[/bold] (parent {workflow_id})  ·  {ui_link(job.id)}",
                    highlight=False,
                )
            if watch:
                await _follow(job, as_json)

        run(go())

    @app.command()
    def checkpoints(workflow_id: str, as_json: JsonOption = False) -> None:
        """The job's checkpoints (kept ones), with their step and metric."""

        async def go() -> None:
            job = (await shepherd()).get(workflow_id)
            st = await job.status()
            print_json(st.checkpoints) if as_json else checkpoint_table(st)

        run(go())
