"""examples/programs/tinker_sft.py on a volume that fills up (issue 32): ``fill=after`` runs
the script, then fills its log directory's volume to the last byte and exits 0 (a program
whose logs filled a small volume as it ended); ``fill=before`` fills it first, so the script's
own first write (its checkpoint list) fails. ``report=PATH``: its stdout lines also go there,
off the full volume, for the test to read."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any, TextIO

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "programs" / "tinker_sft.py"


def fill(directory: Path) -> None:
    """Write until the volume refuses: in large pieces, then small, then byte by byte."""
    with open(directory / "filler", "ab", buffering=0) as sink:
        for size in (1 << 16, 1 << 12, 1):
            while True:
                try:
                    if not sink.write(b"\0" * size):
                        break
                except OSError:
                    break


class Tee:
    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.streams[0], name)


if __name__ == "__main__":
    args = dict(arg.split("=", 1) for arg in sys.argv[1:] if "=" in arg)
    log_dir = Path(args["log_dir"])
    if args.get("fill") == "before":
        fill(log_dir)
    with open(args["report"], "a", encoding="utf-8") as report:
        sys.stdout = Tee(sys.__stdout__, report)  # type: ignore[assignment]
        runpy.run_path(str(SCRIPT), run_name="__main__")
        sys.stdout.flush()
        sys.stdout = sys.__stdout__
    if args.get("fill") == "after":
        fill(log_dir)
        print("the volume is full; exiting 0", flush=True)  # noqa: T201
