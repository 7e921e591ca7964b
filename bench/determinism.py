"""Benchmark (a long determinism stress run): ``--runs`` runs of ``--jobs`` jobs each, on a
worker with no workflow cache (every workflow task a full replay), with platform events,
queries, pause/resume/cancel signals and preemptions at random moments (tests/determinism.py
says what is checked). Each run uses its own seed (``--seed`` + run index).

Prints one JSON document: per run, its seed, the outcomes, the histories replayed and any
problem; exits 1 if any run found one.

Run: ``.venv/bin/python bench/determinism.py [--runs 5] [--jobs 30]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/ (the driver)

from tests.determinism import StressConfig, run_stress  # noqa: E402
from workers.config import BackendProfile, BackendRegistry  # noqa: E402

# isort: split
# bench/ is sys.path[0] when a script runs as `python bench/<name>.py`: not a package import.
from common import KEY_ENV, log, machine, no_plot, run_main, shepherd_stack  # noqa: E402


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    async with shepherd_stack({"capacity": max(16, args.jobs), "bootDelaySeconds": 0.0}) as st:
        profile = BackendProfile(name="local", url=st.plane.url, api_key_env=KEY_ENV, events=True)
        registry = BackendRegistry({"local": profile}, env={KEY_ENV: st.api_key})
        try:
            for i in range(args.runs):
                cfg = StressConfig(jobs=args.jobs, seed=args.seed + i, timeout_s=args.timeout)
                log(f"run {i + 1}/{args.runs}: {cfg.jobs} jobs, seed {cfg.seed}")
                report = await run_stress(st.client, st.admin, st.platform, registry, cfg)
                log(f"  {report}")
                runs.append({"seed": cfg.seed, **report.__dict__})
        finally:
            await registry.aclose()
    return {
        "benchmark": "determinism",
        "machine": machine(),
        "method": (
            "per run: a reference job, then --jobs jobs started together on a worker with "
            "max_cached_workflows=0; each job is maybe paused then resumed (signals), "
            "preempted while it trains, cancelled, at seeded random moments, while every job "
            "is queried every 0.1 s. Checked: cancelled jobs end CANCELLED with no model, the "
            "others COMPLETED with the reference's weights digest; no trainer left or created "
            "twice; every history replays against this code."
        ),
        "runs": runs,
        "histories_replayed": sum(r["histories_replayed"] for r in runs),
        "ok": all(not r["problems"] for r in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()

    async def run() -> dict[str, Any]:
        return await bench(args)

    report = run_main(run, lambda _: no_plot())
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
