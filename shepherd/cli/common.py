"""What every CLI command shares: the connection options and one place that turns
failures into a one-line reason and an exit code.

Exit codes: 0 success · 1 the job (or request) failed · 2 invalid input (a bad spec or
option, or a submission refused: its id or output model id taken) · 3 Temporal unreachable ·
4 not found.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer
from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from shepherd.cli.render import err_console
from shepherd.spec import SpecError

T = TypeVar("T")

EXIT_FAILED, EXIT_INVALID, EXIT_UNREACHABLE, EXIT_NOT_FOUND = 1, 2, 3, 4


@dataclass
class Connection:
    address: str | None = None
    namespace: str | None = None
    task_queue: str | None = None


CONNECTION = Connection()


async def shepherd() -> Any:
    from shepherd.client import Shepherd

    return await Shepherd.connect(
        CONNECTION.address, CONNECTION.namespace, task_queue=CONNECTION.task_queue
    )


#: What a running ``shepherd dev`` writes into its state directory (its addresses), so the
#: CLI in another shell links to the Web UI port that stack really has.
STACK_FILE = "stack.json"


def dev_stack_info() -> dict[str, Any] | None:
    """The addresses a running ``shepherd dev`` wrote, when it is the stack this command
    talks to (the same Temporal address); else None."""
    path = _state_dir() / STACK_FILE
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    address = CONNECTION.address or os.environ.get("TEMPORAL_ADDRESS", "localhost:7233")
    if not isinstance(info, dict) or not same_address(info.get("temporal"), address):
        return None  # that stack is not the one this command talks to
    return info


def _why_unreachable() -> str:
    """The likely cause of a server that does not serve: the local dev stack's full disk
    (its database lives there), else the stack not running."""
    from shepherd import diskroom

    if dev_stack_info() is not None and (said := diskroom.shortage(_state_dir())):
        return f"{said}, where its database lives: free space there and it serves again"
    return "is `shepherd dev` running? (TEMPORAL_ADDRESS or --address)"


def _state_dir() -> Path:
    return Path(os.environ.get("SHEPHERD_STATE_DIR", ".shepherd"))


#: Names of this machine's loopback interface: the dev stack records 127.0.0.1, the
#: default address says localhost; both are the same server.
_LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]"}


def same_address(a: Any, b: Any) -> bool:
    """Whether two ``host:port`` addresses name the same server (loopback names alike)."""
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    (host_a, _, port_a), (host_b, _, port_b) = a.rpartition(":"), b.rpartition(":")
    if port_a != port_b:
        return False
    return host_a == host_b or (host_a in _LOOPBACK and host_b in _LOOPBACK)


def _dev_stack_ui() -> str | None:
    ui = (dev_stack_info() or {}).get("ui")
    return ui if isinstance(ui, str) else None


def ui_link(workflow_id: str) -> str:
    """The Web UI page of a workflow: ``SHEPHERD_UI_URL``, else the UI of the dev stack
    this command talks to, else the dev server's default port."""
    base = (os.environ.get("SHEPHERD_UI_URL") or _dev_stack_ui() or "http://localhost:8233").rstrip(
        "/"
    )
    namespace = CONNECTION.namespace or os.environ.get("TEMPORAL_NAMESPACE", "default")
    return f"{base}/namespaces/{namespace}/workflows/{workflow_id}"


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    err_console.print("[red]error:[/red] ", end="", highlight=False)
    # The message may quote user input ("[x]" would be read as markup).
    err_console.print(message, highlight=False, markup=False)
    raise typer.Exit(code)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; every failure ends as one line and an exit code."""
    from shepherd.client import JobEnded, JobFailed, JobNotFound, TemporalUnreachable

    try:
        return asyncio.run(coro)
    except SpecError as exc:
        err_console.print(str(exc), style="red", highlight=False, markup=False)
        raise typer.Exit(EXIT_INVALID) from None
    except JobNotFound as exc:
        fail(str(exc), EXIT_NOT_FOUND)
    except TemporalUnreachable as exc:
        fail(f"{exc}; {_why_unreachable()}", EXIT_UNREACHABLE)
    except (JobFailed, JobEnded) as exc:
        fail(str(exc), EXIT_FAILED)
    except WorkflowUpdateFailedError as exc:
        fail(
            f"refused: {exc.cause.message if exc.cause and hasattr(exc.cause, 'message') else exc}",
            EXIT_FAILED,
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            fail(f"not found: {exc.message}", EXIT_NOT_FOUND)
        if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
            fail(f"cannot reach Temporal ({exc.message}); {_why_unreachable()}", EXIT_UNREACHABLE)
        fail(f"{exc.status.name if exc.status else 'error'}: {exc.message}", EXIT_FAILED)
    except KeyError as exc:
        fail(str(exc.args[0]) if exc.args else "not found", EXIT_NOT_FOUND)
    except ValueError as exc:
        fail(str(exc), EXIT_INVALID)
    except RuntimeError as exc:
        if "connect" in str(exc).lower():
            fail(f"cannot reach Temporal: {exc}; {_why_unreachable()}", EXIT_UNREACHABLE)
        raise
