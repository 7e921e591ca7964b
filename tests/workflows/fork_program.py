"""A plain training loop with the ``fireworks-ai`` fork's ``FiretitanServiceClient``, run as a
program job: ``python tests/workflows/fork_program.py steps=N``. It prints a JSON line per
step and, last, the digest of the weights it ended with (``get_info``'s localplane extension),
then closes its client as a user's script does: the job must promote exactly those weights."""

from __future__ import annotations

import json
import os
import sys

import httpx
from fireworks.training import sdk
from fireworks.training.sdk import FiretitanServiceClient

from tests.plane.sdk_support import BASE_MODEL, CORPUS, RESULT_TIMEOUT, byte_datums

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
    service = FiretitanServiceClient(
        base_url=os.environ["TINKER_BASE_URL"], api_key=os.environ["TINKER_API_KEY"]
    )
    try:
        training = service.create_training_client(base_model=BASE_MODEL, lora_rank=4, seed=0)
        data = byte_datums(sdk, CORPUS)
        adam = sdk.AdamParams(learning_rate=1e-2)
        for step in range(1, steps + 1):
            fb = training.forward_backward(data, "cross_entropy")
            optim = training.optim_step(adam)
            loss = fb.result(RESULT_TIMEOUT).metrics["loss:sum"]
            optim.result(RESULT_TIMEOUT)
            print(json.dumps({"step": step, "loss": loss}), flush=True)  # noqa: T201
        print(json.dumps({"final": True, "digest": digest(training.model_id)}), flush=True)  # noqa: T201
    finally:
        service.close()


if __name__ == "__main__":
    main(int(ARGS.get("steps", "6")))
