"""A program that trains three models in turn, as the tinker-cookbook's RLHF pipeline does:
an SFT model, a reward model, then a policy loaded from the SFT model's state (weights
only) and trained on. Run as a program job: ``python -m tests.workflows.pipeline_program
sft=4 rm=3 rl=4``. It prints a JSON line per optimizer step (``stage``, ``step`` — the
stage's own, from 1 — ``loss``, ``digest``) and, at its end, each stage's final digest."""

from __future__ import annotations

import json
import sys

import tinker
from tinker import types

from tests.plane.sdk_support import byte_datums
from tests.workflows.fork_program import digest

ARGS = dict(arg.split("=", 1) for arg in sys.argv[1:] if "=" in arg)
BASE = "accounts/fireworks/models/qwen3-8b"
DATA = {
    "sft": ["hello world\n", "hello there\n"],
    "rm": ["good answer\n", "bad answer\n"],
    "rl": ["world hello\n", "there hello\n"],
}


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)  # noqa: T201 - the program's output


def stage(name: str, training: tinker.TrainingClient, steps: int) -> str | None:
    data = byte_datums(types, DATA[name])
    for step in range(1, steps + 1):
        loss = training.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
        training.optim_step(types.AdamParams(learning_rate=0.01)).result()
        say(stage=name, step=step, loss=loss, digest=digest(training.model_id))
    return digest(training.model_id)


def main() -> None:
    ends = {}
    with tinker.ServiceClient() as service:
        sft = service.create_lora_training_client(base_model=BASE, rank=4, seed=0).result()
        ends["sft"] = stage("sft", sft, int(ARGS.get("sft", "4")))
        sft_state = sft.save_state("sft-final").result().path
        reward = service.create_lora_training_client(base_model=BASE, rank=4, seed=1).result()
        ends["rm"] = stage("rm", reward, int(ARGS.get("rm", "3")))
        policy = service.create_training_client_from_state(sft_state).result()
        ends["rl"] = stage("rl", policy, int(ARGS.get("rl", "4")))
    say(final=ends)


if __name__ == "__main__":
    main()
