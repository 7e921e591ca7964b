"""structlog, configured once per process: JSON lines for services, readable console
output for humans. Standard-library loggers (uvicorn, temporalio, httpx) are routed
through the same processors so a service's output is one consistent stream."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import structlog

_SHARED: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    structlog.processors.StackInfoRenderer(),
]


def configure_logging(*, json: bool | None = None, level: str | int | None = None) -> None:
    """Set up structlog and stdlib logging for this process.

    ``json`` defaults to the ``SHEPHERD_LOG_FORMAT`` env var (``json``/``console``), else
    JSON when stderr is not a terminal. ``level`` defaults to ``SHEPHERD_LOG_LEVEL`` or INFO.
    """
    if json is None:
        fmt = os.environ.get("SHEPHERD_LOG_FORMAT", "").lower()
        json = fmt == "json" if fmt in ("json", "console") else not sys.stderr.isatty()
    if level is None:
        level = os.environ.get("SHEPHERD_LOG_LEVEL", "INFO").upper()

    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            *_SHARED,
            structlog.processors.format_exc_info
            if json
            else structlog.processors.ExceptionPrettyPrinter(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_SHARED,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                *([structlog.processors.format_exc_info] if json else []),
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Per-request access lines are noise at INFO; our own request logs say more.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)


def get_logger(name: str | None = None, **bound: Any) -> structlog.stdlib.BoundLogger:
    return structlog.stdlib.get_logger(name).bind(**bound)
