"""The ``shepherd`` command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

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
def _root() -> None:
    """Run GPU training jobs as durable Temporal workflows."""


@app.command()
def plane(
    port: Annotated[int, typer.Option(envvar="SHEPHERD_PLANE_PORT", help="Port (0: any free port).")] = 8300,
    host: Annotated[str, typer.Option(envvar="SHEPHERD_PLANE_HOST")] = "127.0.0.1",
    data_dir: Annotated[Path, typer.Option(envvar="SHEPHERD_PLANE_DATA_DIR", help="State: SQLite, checkpoints, models.")] = Path(".shepherd/plane"),
    api_key: Annotated[str | None, typer.Option(envvar="SHEPHERD_PLANE_API_KEY", help="The dev account's key (generated when not given).", show_default=False)] = None,
    admin_key: Annotated[str | None, typer.Option(envvar="SHEPHERD_PLANE_ADMIN_KEY", help="The admin API's key (generated when not given).", show_default=False)] = None,
    account: Annotated[str, typer.Option(envvar="SHEPHERD_PLANE_ACCOUNT_ID")] = "dev",
    capacity: Annotated[int | None, typer.Option(help="Trainer slots.")] = None,
    boot_delay: Annotated[float | None, typer.Option(help="Seconds a trainer spends in CREATING.")] = None,
    config: Annotated[str | None, typer.Option(help="Operating config as JSON, e.g. '{\"routeLagSeconds\": {\"min\": 0, \"max\": 5}}'.")] = None,
    ready_file: Annotated[Path | None, typer.Option(help="Write {url, port, pid} here once serving.")] = None,
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


if __name__ == "__main__":
    app()
