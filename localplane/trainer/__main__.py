"""Entry point of a trainer process: ``python -m localplane.trainer --config FILE``."""

from __future__ import annotations

import os

# Single-threaded BLAS: bit-identical results run after run (multi-threaded reductions may
# sum in a different order), and a trainer per job should not claim every core anyway.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import setproctitle  # noqa: E402
import structlog  # noqa: E402

from localplane.errors import PlaneError  # noqa: E402
from localplane.trainer import zygote  # noqa: E402
from localplane.trainer.config import TrainerConfig  # noqa: E402
from localplane.trainer.server import serve  # noqa: E402
from shepherd.logging import configure_logging  # noqa: E402


def _as_started(argv: list[str]) -> list[str]:
    """A forked trainer looks like one started with its arguments: the process list is how a
    restarted plane finds orphans."""
    setproctitle.setproctitle(" ".join([sys.executable, "-m", "localplane.trainer", *argv]))
    return argv


def main() -> None:
    parser = argparse.ArgumentParser(prog="localplane.trainer")
    parser.add_argument("--config", type=Path)
    # Ignored here; it names the job in the process list so a restarted plane can reap orphans.
    parser.add_argument("--tag", default="")
    # The plane's fork server (the value marks the plane's data directory): localplane/forks.py.
    parser.add_argument("--zygote", default=None)
    parser.add_argument("--control-fd", type=int, default=None)
    args = parser.parse_args()
    if args.zygote is not None:
        if args.control_fd is None:
            parser.error("--zygote needs --control-fd")
        handed = zygote.serve(args.control_fd)
        if handed is None:
            return
        args = parser.parse_args(_as_started(handed))
    if args.config is None:
        parser.error("--config is required")
    cfg = TrainerConfig.from_json(args.config.read_text())
    configure_logging(json=True)
    structlog.contextvars.bind_contextvars(
        trainer_job_id=cfg.job, account=cfg.account, generation=cfg.generation
    )
    try:
        serve(cfg)
    except PlaneError as exc:
        structlog.stdlib.get_logger("localplane.trainer").error(
            "trainer.start_failed", error=exc.message
        )
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
