"""A plain tinker-SDK training loop that measures itself, run as a program job:
``python -m tests.workflows.scored_program steps=N peak=P``. After each optimizer step it
appends its metrics to the file Shepherd names in ``SHEPHERD_METRICS_FILE`` (a JSON line,
``{"step": <its step, from 0>, "score": ..., "loss": ..., "flat": 0.0}``, as the
tinker-cookbook writes ``metrics.jsonl``) and prints ``{"step", "digest"}``. Its ``score`` is
10 for the steps ``P-1 .. P+1`` and below 1 elsewhere: the best checkpoint by score (mode max)
is the one at step P, whichever step's value it is measured by; ``flat`` tells no step
apart."""

from __future__ import annotations

import json
import os
import sys

import tinker
from tinker import types

from tests.plane.sdk_support import byte_datums
from tests.workflows.fork_program import digest

ARGS = dict(arg.split("=", 1) for arg in sys.argv[1:] if "=" in arg)
CORPUS = ["hello world\n", "hello there\n"]


def main(steps: int, peak: int) -> None:
    metrics = os.environ["SHEPHERD_METRICS_FILE"]
    with tinker.ServiceClient() as service:
        training = service.create_lora_training_client(
            base_model="accounts/fireworks/models/qwen3-8b", rank=4, seed=0
        ).result()
        data = byte_datums(types, CORPUS)
        for step in range(1, steps + 1):
            loss = training.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
            training.optim_step(types.AdamParams(learning_rate=0.01)).result()
            score = 10.0 if abs(step - peak) <= 1 else step / 100
            with open(metrics, "a") as sink:
                record = {"step": step - 1, "score": score, "loss": loss, "flat": 0.0}
                sink.write(json.dumps(record) + "\n")
            print(json.dumps({"step": step, "digest": digest(training.model_id)}), flush=True)  # noqa: T201


if __name__ == "__main__":
    main(int(ARGS.get("steps", "12")), int(ARGS.get("peak", "8")))
