"""A plain ``tinker``-SDK fine-tuning script, as a user writes one: nothing in it knows about
Shepherd. It builds its client from ``TINKER_BASE_URL`` / ``TINKER_API_KEY``, trains a LoRA on a
few lines of text with cross-entropy, samples from the current weights now and then, and
saves the final weights for sampling. Every line it prints is JSON: a step's loss (and the
weights' digest where the trainer reports one), a sample, the final checkpoint.

Run it against any Tinker endpoint::

    TINKER_BASE_URL=... TINKER_API_KEY=tml-... python examples/programs/tinker_sft.py

Under Shepherd it runs unchanged as a program job: Shepherd points ``TINKER_BASE_URL`` at its
proxy, which keeps the run going through preemptions (shepherd/proxy).

Knobs, as ``key=value`` arguments (a Shepherd job's ``training.args``) or in the environment:
``steps`` / ``SFT_STEPS`` (12), ``lr`` / ``SFT_LR`` (0.01), ``rank`` / ``SFT_RANK`` (4),
``sample_every`` / ``SFT_SAMPLE_EVERY`` (4), ``base_model`` / ``SFT_BASE_MODEL``
(``accounts/fireworks/models/qwen3-8b``), ``save_every`` / ``SFT_SAVE_EVERY`` (4) and
``log_dir`` / ``SFT_LOG_DIR`` (none), and ``fail_after`` / ``SFT_FAIL_AFTER`` (0: never) to
try what a failure looks like: the script exits with an error once that step is done (and
saved, when due) — then ``shepherd retry`` the job with ``--set training.args.fail_after=0``.

With a ``log_dir`` it is *resumable*: every ``save_every`` steps, once the step's optimizer
step has been applied, it saves its state (weights and optimizer) and appends
``{"step", "state_path"}`` to ``<log_dir>/checkpoints.jsonl``; started again with the same
directory it loads the last one and goes on from the step after it. A checkpoint records
exactly the steps its weights hold: that is what makes a resume exactly-once.
"""

from __future__ import annotations

import json
import os
import sys

import httpx
import tinker
from tinker import types

ARGS = dict(arg.split("=", 1) for arg in sys.argv[1:] if "=" in arg)


def knob(key: str, default: str) -> str:
    return ARGS.get(key) or os.environ.get(f"SFT_{key.upper()}", default)


STEPS = int(knob("steps", "12"))
LEARNING_RATE = float(knob("lr", "0.01"))
RANK = int(knob("rank", "4"))
SAMPLE_EVERY = int(knob("sample_every", "4"))
BASE_MODEL = knob("base_model", "accounts/fireworks/models/qwen3-8b")
SAVE_EVERY = int(knob("save_every", "4"))
LOG_DIR = knob("log_dir", "")
FAIL_AFTER = int(knob("fail_after", "0"))
CORPUS = ["hello world\n", "hello there\n", "hello hello\n", "world hello\n"]
PROMPT = "hello"


def datum(tokens: list[int]) -> types.Datum:
    """Next-token prediction over a whole line."""
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(
                data=tokens[1:], dtype="int64", shape=[len(tokens) - 1]
            ),
            "weights": types.TensorData(
                data=[1.0] * (len(tokens) - 1), dtype="float32", shape=[len(tokens) - 1]
            ),
        },
    )


def weights_digest(model_id: str) -> str | None:
    """The trainer's digest of the model's weights: an extension some trainers (localplane)
    add to ``get_info``, which the SDK's typed answer drops, so it is asked for directly."""
    answer = httpx.post(
        f"{os.environ['TINKER_BASE_URL'].rstrip('/')}/api/v1/get_info",
        json={"model_id": model_id},
        headers={"X-Api-Key": os.environ["TINKER_API_KEY"]},
        timeout=60,
    )
    answer.raise_for_status()
    return answer.json().get("weights_digest")


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)  # noqa: T201 - the script's output


def main() -> None:
    with tinker.ServiceClient() as service:
        train(service)


def last_checkpoint() -> dict[str, object] | None:
    """The last entry of ``<log_dir>/checkpoints.jsonl``, if any."""
    if not LOG_DIR or not os.path.exists(os.path.join(LOG_DIR, "checkpoints.jsonl")):
        return None
    with open(os.path.join(LOG_DIR, "checkpoints.jsonl")) as saved:
        lines = [line for line in saved if line.strip()]
    return json.loads(lines[-1]) if lines else None


def train(service: tinker.ServiceClient) -> None:
    resume = last_checkpoint()
    if resume is not None:
        training = service.create_training_client_from_state_with_optimizer(
            str(resume["state_path"])
        ).result()
        first = int(str(resume["step"])) + 1
        say(resumed=resume["state_path"], step=first - 1)
    else:
        training = service.create_lora_training_client(
            base_model=BASE_MODEL, rank=RANK, seed=0
        ).result()
        first = 1
    # This base model's tokenizer is byte-level on localplane; a script for a real model
    # would use training.get_tokenizer().encode(...).
    data = [datum(list(line.encode())) for line in CORPUS]
    adam = types.AdamParams(learning_rate=LEARNING_RATE)
    for step in range(first, STEPS + 1):
        # Submit both, then wait: the trainer runs them back to back.
        forward_backward = training.forward_backward(data, "cross_entropy")
        optim = training.optim_step(adam)
        loss = forward_backward.result().metrics["loss:sum"]
        optim.result()
        say(step=step, loss=loss, digest=weights_digest(training.model_id))
        if step % SAMPLE_EVERY == 0:
            sampler = training.save_weights_and_get_sampling_client().result()
            sample = sampler.sample(
                types.ModelInput.from_ints(list(PROMPT.encode())),
                num_samples=2,
                sampling_params=types.SamplingParams(max_tokens=8, temperature=1.0),
            ).result()
            say(step=step, samples=[list(s.tokens) for s in sample.sequences])
        if LOG_DIR and step % SAVE_EVERY == 0:
            # After the step's optimizer step: the state holds exactly steps 1..step.
            saved = training.save_state(f"step{step}").result()
            with open(os.path.join(LOG_DIR, "checkpoints.jsonl"), "a") as record:
                record.write(json.dumps({"step": step, "state_path": saved.path}) + "\n")
        if step == FAIL_AFTER:
            sys.exit(f"fail_after={step}: stopping after step {step}, as asked")
    final = training.save_weights_for_sampler("final").result()
    say(final=final.path, digest=weights_digest(training.model_id))


if __name__ == "__main__":
    main()
