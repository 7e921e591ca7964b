"""A plain training loop with the ``fireworks-ai`` fork's ``FiretitanServiceClient``, run as a
program job: ``python tests/workflows/fork_program.py steps=N``. It prints a JSON line per
step and, last, the digest of the weights it ended with (``get_info``'s localplane extension),
then closes its client as a user's script does: the job must promote exactly those weights."""

from __future__ import annotations

import json
import os
import sys

import httpx

from tests.proxy.fork_loop import service_from_env, train

ARGS = dict(arg.split("=", 1) for arg in sys.argv[1:] if "=" in arg)


def digest(model_id: str) -> str | None:
    answer = httpx.post(
        f"{os.environ['TINKER_BASE_URL'].rstrip('/')}/api/v1/get_info",
        json={"model_id": model_id},
        headers={"X-Api-Key": os.environ["TINKER_API_KEY"]},
        timeout=60,
    )
    answer.raise_for_status()
    return answer.json().get("weights_digest")


def main(steps: int) -> None:
    service = service_from_env()
    try:
        training, _ = train(service, steps)
        print(json.dumps({"final": True, "digest": digest(training.model_id)}), flush=True)  # noqa: T201
    finally:
        service.close()


if __name__ == "__main__":
    main(int(ARGS.get("steps", "6")))
