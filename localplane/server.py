"""Run localplane as a process: bind, serve, announce, stop cleanly on SIGINT/SIGTERM."""

from __future__ import annotations

import json
import os
import sys

import structlog

from localplane import serving
from localplane.app import create_app
from localplane.config import PlaneSettings
from localplane.plane import API_KEY_FILE, Plane
from localplane.serving import ReadyServer, bind

log = structlog.stdlib.get_logger("localplane")


def serve(settings: PlaneSettings, *, announce: bool = True) -> None:
    """Serve until SIGINT/SIGTERM; every trainer is stopped before this returns."""
    plane = Plane(settings)
    app = create_app(plane)
    sock = bind(settings.host, settings.port)
    port = sock.getsockname()[1]
    url = f"http://{settings.host}:{port}"

    def ready() -> None:
        log.info("plane.ready", url=url, data_dir=str(plane.data_dir), account=settings.account_id)
        if settings.ready_file:
            tmp = settings.ready_file.with_suffix(".tmp")
            tmp.write_text(
                json.dumps(
                    {"url": url, "port": port, "pid": os.getpid(), "accountId": settings.account_id}
                )
            )
            os.replace(tmp, settings.ready_file)
        if announce:
            print(f"localplane serving at {url}  (account: {settings.account_id})", file=sys.stdout)  # noqa: T201 - for the person who started it
            if settings.api_key is None:
                # Shown to the person who started the plane, on their terminal; stdout that
                # goes to a file (a log) gets only where the key is.
                key_file = plane.data_dir / API_KEY_FILE
                shown = (
                    f"{plane.api_key}  (also in {key_file})"
                    if sys.stdout.isatty()
                    else f"in {key_file}"
                )
                print(f"dev API key: {shown}", file=sys.stdout)  # noqa: T201
            sys.stdout.flush()

    server = serving.config(
        app,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
        lifespan="on",
    )
    ReadyServer(server, ready).run(sockets=[sock])
