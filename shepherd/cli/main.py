"""The ``shepherd`` command line.

The CLI is the one place in ``shepherd/`` that launches the other parts (the Temporal
server, localplane, workers); it imports them lazily, only in the commands that run them.
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from shepherd.logging import configure_logging

app = typer.Typer(
    name="shepherd",
    help="Run GPU training jobs as durable Temporal workflows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _root(
    address: Annotated[
        str | None, typer.Option(envvar="TEMPORAL_ADDRESS", help="Temporal frontend, host:port.")
    ] = None,
    namespace: Annotated[str | None, typer.Option(envvar="TEMPORAL_NAMESPACE")] = None,
    task_queue: Annotated[
        str | None, typer.Option(envvar="SHEPHERD_TASK_QUEUE", help="The workers' task queue.")
    ] = None,
) -> None:
    """Run GPU training jobs as durable Temporal workflows."""
    from shepherd.cli.common import CONNECTION

    CONNECTION.address, CONNECTION.namespace, CONNECTION.task_queue = address, namespace, task_queue


@app.command()
def plane(
    port: Annotated[
        int, typer.Option(envvar="SHEPHERD_PLANE_PORT", help="Port (0: any free port).")
    ] = 8300,
    host: Annotated[str, typer.Option(envvar="SHEPHERD_PLANE_HOST")] = "127.0.0.1",
    data_dir: Annotated[
        Path,
        typer.Option(envvar="SHEPHERD_PLANE_DATA_DIR", help="State: SQLite, checkpoints, models."),
    ] = Path(".shepherd/plane"),
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="SHEPHERD_PLANE_API_KEY",
            help="The dev account's key (generated when not given).",
            show_default=False,
        ),
    ] = None,
    admin_key: Annotated[
        str | None,
        typer.Option(
            envvar="SHEPHERD_PLANE_ADMIN_KEY",
            help="The admin API's key (generated when not given).",
            show_default=False,
        ),
    ] = None,
    account: Annotated[str, typer.Option(envvar="SHEPHERD_PLANE_ACCOUNT_ID")] = "dev",
    capacity: Annotated[int | None, typer.Option(help="Trainer slots.")] = None,
    boot_delay: Annotated[
        float | None, typer.Option(help="Seconds a trainer spends in CREATING.")
    ] = None,
    config: Annotated[
        str | None,
        typer.Option(
            help='Operating config as JSON, e.g. \'{"routeLagSeconds": {"min": 0, "max": 5}}\'.'
        ),
    ] = None,
    ready_file: Annotated[
        Path | None, typer.Option(help="Write {url, port, pid} here once serving.")
    ] = None,
) -> None:
    """Run localplane, the embedded trainer platform."""
    from localplane.config import PlaneSettings
    from localplane.server import serve

    configure_logging()
    initial = json.loads(config) if config else {}
    if capacity is not None:
        initial["capacity"] = capacity
    if boot_delay is not None:
        initial["bootDelaySeconds"] = boot_delay
    settings = PlaneSettings(
        host=host,
        port=port,
        data_dir=data_dir,
        api_key=api_key,
        admin_key=admin_key,
        account_id=account,
        ready_file=ready_file,
        initial_config=initial,
    )
    serve(settings)


def _register_user_commands() -> None:
    from shepherd.cli import jobs, logs, queues, reaper, schedules, sweeps

    jobs.register(app)
    logs.register(app)
    app.add_typer(queues.app, name="queues")
    app.add_typer(schedules.app, name="schedule")
    app.add_typer(sweeps.app, name="sweep")
    app.add_typer(reaper.app, name="reaper")


_register_user_commands()

# The connection options are accepted after a command's name too (`shepherd list --address
# HOST:PORT`), not only before it, where click alone looks for a group's options. Each
# command that talks to Temporal gets them as options of its own (so its --help shows them);
# given there, they win over the ones before the name.

#: Commands that never talk to Temporal's frontend as a client (they run parts, or check a
#: file offline); `worker` has its own --task-queue.
_OFFLINE = {"plane", "server", "worker", "dev", "demo", "validate"}
#: Commands for which the task queue means something: they start work on the workers' queue.
_ON_A_QUEUE = {
    ("submit",),
    ("retry",),
    ("sweep", "submit"),
    ("schedule", "create"),
    ("reaper", "install"),
    ("reaper", "run"),
}
_PANEL = "Connection (also before the command)"
_CONNECTION_OPTIONS: dict[str, tuple[str, Any]] = {
    "address": (
        "connection_address",
        Annotated[
            str | None,
            typer.Option(
                "--address",
                help="Temporal frontend, host:port (env TEMPORAL_ADDRESS).",
                rich_help_panel=_PANEL,
                show_default=False,
            ),
        ],
    ),
    "namespace": (
        "connection_namespace",
        Annotated[
            str | None,
            typer.Option(
                "--namespace",
                help="Temporal namespace (env TEMPORAL_NAMESPACE).",
                rich_help_panel=_PANEL,
                show_default=False,
            ),
        ],
    ),
    "task_queue": (
        "connection_task_queue",
        Annotated[
            str | None,
            typer.Option(
                "--task-queue",
                help="The workers' task queue (env SHEPHERD_TASK_QUEUE).",
                rich_help_panel=_PANEL,
                show_default=False,
            ),
        ],
    ),
}


def _with_connection(command: Callable[..., Any], fields: list[str]) -> Callable[..., Any]:
    """``command`` with the connection options ``fields`` as options of its own."""
    from shepherd.cli.common import CONNECTION

    @functools.wraps(command)
    def connected(*args: Any, **kwargs: Any) -> Any:
        for field in fields:
            value = kwargs.pop(_CONNECTION_OPTIONS[field][0])
            if value is not None:
                setattr(CONNECTION, field, value)
        return command(*args, **kwargs)

    signature = inspect.signature(command, eval_str=True)
    added = [
        inspect.Parameter(
            _CONNECTION_OPTIONS[f][0],
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=_CONNECTION_OPTIONS[f][1],
        )
        for f in fields
    ]
    params = list(signature.parameters.values())
    connected.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*params, *added]
    )
    connected.__annotations__ = {
        **{p.name: p.annotation for p in params},
        **{p.name: p.annotation for p in added},
        "return": signature.return_annotation,
    }
    return connected


def _add_connection_options(typer_app: typer.Typer, path: tuple[str, ...] = ()) -> None:
    for info in typer_app.registered_commands:
        assert info.callback is not None
        name = info.name or info.callback.__name__.replace("_", "-")
        where = (*path, name)
        if not path and name in _OFFLINE:
            continue
        fields = ["address", "namespace"] + (["task_queue"] if where in _ON_A_QUEUE else [])
        info.callback = _with_connection(info.callback, fields)
    for group in typer_app.registered_groups:
        assert group.typer_instance is not None and group.name is not None
        _add_connection_options(group.typer_instance, (*path, group.name))


_add_connection_options(app)

STATE_DIR = Path(".shepherd")


def _banner(lines: list[tuple[str, str]]) -> None:
    from rich.console import Console

    console = Console(stderr=False, soft_wrap=True)
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        console.print(f"  [bold]{key.ljust(width)}[/bold]  {value}", highlight=False)
    console.print("Press Ctrl-C to stop.", style="dim")


@app.command()
def server(
    port: Annotated[
        int,
        typer.Option("--port", envvar="SHEPHERD_TEMPORAL_PORT", help="Temporal frontend (gRPC)."),
    ] = 7233,
    ui_port: Annotated[
        int, typer.Option(envvar="SHEPHERD_UI_PORT", help="Temporal Web UI.")
    ] = 8233,
    state_dir: Annotated[
        Path, typer.Option(envvar="SHEPHERD_STATE_DIR", help="SQLite database and logs.")
    ] = STATE_DIR,
    headless: Annotated[bool, typer.Option(help="No Web UI.")] = False,
) -> None:
    """Run the Temporal dev server (SQLite under the state dir, Shepherd's search attributes)."""
    from workers.devstack import SIGNALS, TemporalServer, run_until_signalled

    SIGNALS.install()  # before anything starts: a stop during start-up leaks nothing
    configure_logging()
    temporal = TemporalServer(state_dir, port=port, ui_port=ui_port, headless=headless).start()
    try:
        lines = [("Temporal", temporal.address)]
        if not headless:
            lines.append(("Web UI", temporal.ui_url))
        _banner(lines)
        why = run_until_signalled(
            lambda: "Temporal" if temporal.proc and temporal.proc.poll() is not None else None
        )
    finally:
        temporal.stop()
    if why != "signal":
        raise typer.Exit(1)


@app.command()
def worker(
    task_queue: Annotated[
        list[str] | None,
        typer.Option(
            "--task-queue",
            "-q",
            help="Task queue(s) to poll (default $SHEPHERD_TASK_QUEUE or 'shepherd').",
        ),
    ] = None,
    ready_file: Annotated[
        Path | None, typer.Option(help="Write {pid, task_queues} here once polling.")
    ] = None,
) -> None:
    """Run a worker: the lifecycle workflow and its activities. Connects to $TEMPORAL_ADDRESS;
    backends come from $SHEPHERD_BACKENDS / $SHEPHERD_BACKEND_<NAME>_* (see workers/config.py)."""
    from workers.main import main as run

    run(task_queues=task_queue or None, ready_file=ready_file)


@app.command()
def dev(
    temporal_port: Annotated[int, typer.Option(envvar="SHEPHERD_TEMPORAL_PORT")] = 7233,
    ui_port: Annotated[int, typer.Option(envvar="SHEPHERD_UI_PORT")] = 8233,
    plane_port: Annotated[int, typer.Option(envvar="SHEPHERD_PLANE_PORT")] = 8300,
    state_dir: Annotated[Path, typer.Option(envvar="SHEPHERD_STATE_DIR")] = STATE_DIR,
    task_queue: Annotated[str, typer.Option(envvar="SHEPHERD_TASK_QUEUE")] = "shepherd",
    ready_file: Annotated[
        Path | None, typer.Option(help="Write the stack's addresses here once everything is up.")
    ] = None,
) -> None:
    """Start the whole embedded stack in the foreground: the Temporal dev server with its Web UI,
    localplane and a worker. Ctrl-C (or SIGTERM) stops all of them."""
    from localplane.plane import ADMIN_KEY_FILE, API_KEY_FILE
    from shepherd import diskroom
    from shepherd.cli.common import STACK_FILE, fail
    from workers.devstack import (
        SIGNALS,
        DevStack,
        StackRunning,
        Stopping,
        lock_state_dir,
        run_until_signalled,
        write_ready,
    )

    try:
        lock = lock_state_dir(state_dir, STACK_FILE)  # noqa: F841 - held while the stack runs
    except StackRunning as exc:
        fail(str(exc))
    # Before anything starts: stopped at any moment, the stack stops what it had started.
    SIGNALS.install()
    configure_logging()
    wrote_stack_file = False
    stack = DevStack(
        state_dir,
        temporal_port=temporal_port,
        ui_port=ui_port,
        plane_port=plane_port,
        task_queue=task_queue,
    )
    try:
        stack.start()
        info = stack.info()
        assert stack.plane is not None
        typer.echo("Shepherd dev stack is up")
        _banner(
            [
                ("Temporal", f"{info['temporal']}  (export TEMPORAL_ADDRESS={info['temporal']})"),
                ("Web UI", f"{info['ui']}  (other shells: export SHEPHERD_UI_URL={info['ui']})"),
                ("localplane", info["plane"]),
                ("worker", f"task queue {task_queue!r} (pid {info['pids']['worker']})"),
                # The key on the terminal of whoever started the stack, never into a file
                # that stdout is redirected to; the admin key stays in its file.
                (
                    "dev API key",
                    f"{stack.plane.api_key}  (in {stack.plane.data_dir / API_KEY_FILE})"
                    if sys.stdout.isatty()
                    else f"in {stack.plane.data_dir / API_KEY_FILE}",
                ),
                ("admin key", f"in {stack.plane.data_dir / ADMIN_KEY_FILE}"),
                ("logs", info["logs"]),
            ]
        )
        write_ready(ready_file, info)
        write_ready(state_dir / STACK_FILE, info)  # the CLI's Web UI links follow this stack
        wrote_stack_file = True
        # A full disk there stalls everything and only this process can say why.
        disk = diskroom.Watch(state_dir, lambda said: typer.echo(said, err=True))
        why = run_until_signalled(stack.dead, tick=disk.check)
    except Stopping:
        why = "signal"
    except (RuntimeError, TimeoutError, OSError) as exc:
        # A part would not start (a port taken by something else ...): said in one line;
        # what had started is stopped below.
        why = f"the stack could not start: {exc}"
    finally:
        SIGNALS.begin_stop()
        typer.echo("stopping the worker, localplane and Temporal ...")
        if wrote_stack_file:
            (state_dir / STACK_FILE).unlink(missing_ok=True)
        stack.stop()
    if why.startswith("the stack could not start"):
        typer.echo(f"error: {why}; see {state_dir / 'logs'}", err=True)
        raise typer.Exit(1)
    if why != "signal":
        typer.echo(f"{why} exited unexpectedly; see {state_dir / 'logs'}", err=True)
        raise typer.Exit(1)
    typer.echo("stopped.")


@app.command()
def demo(
    state_dir: Annotated[
        Path | None, typer.Option(help="Keep the stack's state here (default: a temporary dir).")
    ] = None,
    keep: Annotated[
        bool, typer.Option(help="Leave the stack up afterwards (for the Web UI) until Ctrl-C.")
    ] = False,
    spec: Annotated[
        Path | None, typer.Option(help="Another spec than examples/quickstart.yaml.")
    ] = None,
) -> None:
    """Run the quickstart job end to end on the embedded stack, with a preemption and a route
    race injected midway; exit 0 only on success."""
    from workers.demo import QUICKSTART
    from workers.demo import main as run_demo

    configure_logging(level="WARNING")
    raise typer.Exit(run_demo(state_dir=state_dir, keep=keep, spec_path=spec or QUICKSTART))


def main() -> None:
    """The ``shepherd`` entry point.

    Once a command has finished (services stopped, output written), the process exits
    without interpreter teardown: the Temporal client's native threads can outlive the event
    loop and abort CPython's finalization (temporalio/sdk-python#300), which would turn a
    success into a crash.
    """
    import os
    import sys

    try:
        app()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
