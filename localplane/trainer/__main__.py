"""Entry point of a trainer process: ``python -m localplane.trainer --config FILE``."""

from __future__ import annotations

import os

# Single-threaded BLAS: bit-identical results run after run (multi-threaded reductions may
# sum in a different order), and a trainer per job should not claim every core anyway.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
from pathlib import Path  # noqa: E402

import structlog  # noqa: E402

from localplane.errors import PlaneError  # noqa: E402
from localplane.trainer.core import TrainerConfig  # noqa: E402
from localplane.trainer.server import serve  # noqa: E402
from shepherd.logging import configure_logging  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(prog="localplane.trainer")
    parser.add_argument("--config", required=True, type=Path)
    # Ignored here; it names the job in the process list so a restarted plane can reap orphans.
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
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
