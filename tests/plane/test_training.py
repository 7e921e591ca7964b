"""Training is real (trainer-api.md §4): exactly-once steps, idempotent micro-batches,
atomic checkpoints, and bit-identical weights whether or not the trainer was killed and
restored from a checkpoint on the way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localplane.admin import PlaneAdmin
from shepherd.platform import AlreadyExists, FailedPrecondition, InvalidArgument, PermissionDenied
from shepherd.platform.models import ForwardBackwardRequest, OptimStepRequest
from shepherd.states import JobState
from tests.helpers import Account, running_trainer, train_steps, wait_state, warm

N, K = 12, 5


async def test_kill_and_restore_gives_identical_weights(
    account: Account, admin: PlaneAdmin
) -> None:
    straight = await running_trainer(account.client, "straight")
    await train_steps(straight, 1, N, micro_batches=2)
    expected = (await straight.get_info()).weights_digest

    restored = await running_trainer(account.client, "restored")
    await train_steps(restored, 1, K, micro_batches=2)
    saved = await restored.save_weights(f"step-{K}")
    assert saved.step == K
    await admin.preempt("restored", account=account.id)
    await wait_state(account.client, "restored", JobState.FAILED)
    await account.client.resume_job("restored")
    await wait_state(account.client, "restored", JobState.RUNNING)
    await warm(restored)
    loaded = await restored.load_weights(saved.name)
    assert loaded.step == K
    await train_steps(restored, K + 1, N, micro_batches=2)

    info = await restored.get_info()
    assert info.step == N
    assert info.weights_digest == expected
    for job in ("straight", "restored"):
        await account.client.delete_job(job)


async def test_optim_step_is_exactly_once(account: Account) -> None:
    trainer = await running_trainer(account.client, "once")
    await train_steps(trainer, 1, 3)
    digest = (await trainer.get_info()).weights_digest
    again = await trainer.optim_step(OptimStepRequest(step=3))
    first = await trainer.optim_step(OptimStepRequest(step=2))
    assert again.step == 3 and first.step == 2
    info = await trainer.get_info()
    assert info.step == 3 and info.weights_digest == digest

    with pytest.raises(FailedPrecondition) as gap:
        await trainer.optim_step(OptimStepRequest(step=5))
    assert gap.value.status_code == 409 and "step 3" in gap.value.message
    with pytest.raises(FailedPrecondition) as nothing:
        await trainer.optim_step(OptimStepRequest(step=4))
    assert "no forward_backward" in nothing.value.message
    with pytest.raises(FailedPrecondition) as stale:
        await trainer.forward_backward(ForwardBackwardRequest(step=2))
    assert stale.value.status_code == 409 and "already applied" in stale.value.message
    await account.client.delete_job("once")


async def test_forward_backward_is_idempotent_per_micro_batch(account: Account) -> None:
    plain = await running_trainer(account.client, "plain")
    await train_steps(plain, 1, 2, micro_batches=2)

    repeated = await running_trainer(account.client, "repeated")
    for step in (1, 2):
        answers = []
        # Out of order and repeated: the sum is taken in micro-batch order, once each.
        for mb in (1, 0, 1, 0):
            answers.append(
                await repeated.forward_backward(ForwardBackwardRequest(step=step, micro_batch=mb))
            )
        assert answers[0] == answers[2] and answers[1] == answers[3]
        await repeated.optim_step(OptimStepRequest(step=step))

    assert (await repeated.get_info()).weights_digest == (await plain.get_info()).weights_digest
    for job in ("plain", "repeated"):
        await account.client.delete_job(job)


async def test_checkpoints_are_atomic_idempotent_and_loadable_across_jobs(
    account: Account, admin: PlaneAdmin, data_dir: Path
) -> None:
    trainer = await running_trainer(account.client, "saver")
    await train_steps(trainer, 1, 3)
    saved = await trainer.save_weights("step-3")
    again = await trainer.save_weights("step-3")  # a retried save: same answer
    assert again == saved
    await train_steps(trainer, 4, 4)
    with pytest.raises(AlreadyExists):
        await trainer.save_weights("step-3")
    with pytest.raises(InvalidArgument) as bad:
        await trainer.save_weights("bad name!")
    assert "name" in bad.value.message

    directory = data_dir / "checkpoints" / account.id / "saver"
    assert sorted(p.name for p in directory.iterdir()) == ["step-3.json", "step-3.npz"]
    listed = await trainer.list_checkpoints()
    assert [c.name for c in listed] == [saved.name] and listed[0].step == 3
    digest_at_3 = json.loads((directory / "step-3.json").read_text())["digest"]

    # Any checkpoint of the same account loads, also one of a deleted job.
    await account.client.delete_job("saver")
    await wait_state(account.client, "saver", JobState.DELETED)
    other = await running_trainer(account.client, "loader")
    loaded = await other.load_weights(saved.name)
    assert loaded.step == 3 and (await other.get_info()).weights_digest == digest_at_3
    with pytest.raises(InvalidArgument) as missing:
        await other.load_weights(f"accounts/{account.id}/rlorTrainerJobs/saver/checkpoints/nope")
    assert "does not exist" in missing.value.message

    # Another account's checkpoint is not ours to load.
    stranger_id, _ = await admin.create_account()
    with pytest.raises(PermissionDenied):
        await other.load_weights(f"accounts/{stranger_id}/rlorTrainerJobs/x/checkpoints/y")
    await account.client.delete_job("loader")


async def test_training_learns_and_evaluates(account: Account) -> None:
    trainer = await running_trainer(account.client, "learner")
    before = await trainer.evaluate()
    await train_steps(trainer, 1, 30)
    after = await trainer.evaluate()
    assert before.step == 0 and after.step == 30
    assert after.eval_loss < before.eval_loss
    await account.client.delete_job("learner")


async def test_lora_trains_adapters_only(account: Account) -> None:
    full = await running_trainer(account.client, "full")
    lora = await running_trainer(
        account.client, "lora", training_config={"lora_rank": 4, "learning_rate": 1e-2}
    )
    full_info, lora_info = await full.get_info(), await lora.get_info()
    assert lora_info.lora_rank == 4 and "lora-r4" in lora_info.model_extra["stand_in_model"]
    assert (
        lora_info.model_extra["trainable_parameters"]
        < full_info.model_extra["trainable_parameters"]
    )
    before = await lora.evaluate()
    await train_steps(lora, 1, 20)
    assert (await lora.evaluate()).eval_loss < before.eval_loss
    for job in ("full", "lora"):
        await account.client.delete_job(job)


async def test_forward_only_shape_refuses_optimizer_steps(account: Account) -> None:
    from tests.helpers import job_request

    await account.client.create_job(
        "fwd",
        job_request(),
        training_shape="accounts/localplane/trainingShapes/tiny-cpu-forward-only",
    )
    await wait_state(account.client, "fwd", JobState.RUNNING)
    trainer = await account.client.trainer("fwd")
    await warm(trainer)
    answer = await trainer.forward_backward(ForwardBackwardRequest(step=1))
    assert answer.loss > 0
    with pytest.raises(FailedPrecondition) as refused:
        await trainer.optim_step(OptimStepRequest(step=1))
    assert "forward-only" in refused.value.message
    await account.client.delete_job("fwd")


async def test_jsonl_datasets_and_inline_examples(account: Account, tmp_path: Path) -> None:
    text = tmp_path / "chat.jsonl"
    text.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"text": "the trainer learns to spell shepherd"},
                {"prompt": "Q: what survives preemption? ", "completion": "A: checkpoints."},
                {
                    "messages": [
                        {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "hello"},
                    ]
                },
            ]
            * 20
        )
    )
    vectors = tmp_path / "vectors.jsonl"
    vectors.write_text(
        "\n".join(json.dumps({"x": [i % 3, i % 5, 1.0], "y": i % 2}) for i in range(60))
    )

    chat = await running_trainer(account.client, "chat", dataset=str(text))
    assert (await chat.get_info()).model_extra["dataset"] == str(text)
    await train_steps(chat, 1, 3)
    inline = await chat.forward_backward(
        ForwardBackwardRequest(step=4, batch={"examples": [{"text": "inline example"}]})
    )
    assert inline.num_examples == len("inline example")
    with pytest.raises(InvalidArgument) as too_long:
        await chat.forward_backward(
            ForwardBackwardRequest(
                step=4, micro_batch=1, batch={"examples": [{"text": "x" * 9000}]}
            )
        )
    assert (
        "batch.examples[0]" in too_long.value.message
        and "max_context_length" in too_long.value.message
    )

    vec = await running_trainer(account.client, "vec", dataset=f"file://{vectors}")
    await train_steps(vec, 1, 3)
    with pytest.raises(InvalidArgument) as wrong_shape:
        await vec.forward_backward(
            ForwardBackwardRequest(step=4, batch={"examples": [{"x": [1.0], "y": 0}]})
        )
    assert "batch.examples[0]" in wrong_shape.value.message
    for job in ("chat", "vec"):
        await account.client.delete_job(job)
