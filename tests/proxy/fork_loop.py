"""A short training loop with the ``fireworks-ai`` fork's ``FiretitanServiceClient`` (JSON
dialect), run as a program: ``python -m tests.proxy.fork_loop STEPS``. It prints a JSON line
per step (the loss) and one for the checkpoint it saves and restores by its logical name."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from fireworks.training import sdk
from fireworks.training.sdk import FiretitanServiceClient

from tests.plane.sdk_support import BASE_MODEL, CORPUS, RESULT_TIMEOUT, byte_datums


def service_from_env() -> FiretitanServiceClient:
    return FiretitanServiceClient(
        base_url=os.environ["TINKER_BASE_URL"], api_key=os.environ["TINKER_API_KEY"]
    )


def train(service: FiretitanServiceClient, steps: int) -> tuple[Any, list[Any]]:
    """A LoRA trained ``steps`` steps on the corpus, a JSON line per step; (client, data)."""
    training = service.create_training_client(base_model=BASE_MODEL, lora_rank=4, seed=0)
    data = byte_datums(sdk, CORPUS)
    adam = sdk.AdamParams(learning_rate=1e-2)
    for step in range(1, steps + 1):
        fb = training.forward_backward(data, "cross_entropy")
        optim = training.optim_step(adam)
        loss = fb.result(RESULT_TIMEOUT).metrics["loss:sum"]
        optim.result(RESULT_TIMEOUT)
        print(json.dumps({"step": step, "loss": loss}), flush=True)  # noqa: T201
    return training, data


def main(steps: int) -> None:
    service = service_from_env()
    try:
        training, data = train(service, steps)
        training.save_state("fork-final").result(RESULT_TIMEOUT)
        after = training.forward(data, "cross_entropy").result(RESULT_TIMEOUT).metrics["loss:sum"]
        other = service.create_training_client(base_model=BASE_MODEL, lora_rank=4, seed=1)
        other.load_state_with_optimizer("fork-final").result(RESULT_TIMEOUT)
        loaded = other.forward(data, "cross_entropy").result(RESULT_TIMEOUT).metrics["loss:sum"]
        print(json.dumps({"forward_after": after, "forward_loaded": loaded}), flush=True)  # noqa: T201
    finally:
        service.close()


if __name__ == "__main__":
    main(int(sys.argv[1]))
