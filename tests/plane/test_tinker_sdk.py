"""The unmodified `tinker` SDK (0.38) drives localplane end to end: a job created through the
control plane, a `tml-` key minted by the plane, a ServiceClient on the trainer's base URL —
pipelined training, save, restore, sampling, preemption and a resume through the control
plane — and the plane's stats show the SDK spoke the protobuf dialect.

Also the route race of trainer-api.md §5, shown with the real SDK: a 404 from a gateway
replica that has not learned a fresh route is fatal to it, although the trainer is healthy."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest
import tinker
from tinker import types

from tests.plane.sdk_support import (
    BASE_MODEL,
    CORPUS,
    RESULT_TIMEOUT,
    PlaneHttp,
    SdkAccount,
    byte_datums,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("hub_offline")]

ADAM = types.AdamParams(learning_rate=1e-2)


def _loss(result: types.ForwardBackwardOutput) -> float:
    return result.metrics["loss:sum"]


def _service(sdk_http: PlaneHttp, account: SdkAccount, job_id: str) -> tinker.ServiceClient:
    return tinker.ServiceClient(
        base_url=sdk_http.trainer_base_url(account, job_id), api_key=account.api_key
    )


def _running_trainer(sdk_http: PlaneHttp, prefix: str) -> tuple[SdkAccount, str]:
    """A new tinker-keyed account and a RUNNING LoRA trainer of it, its route warmed up (the
    SDK takes any 404 as final)."""
    account = sdk_http.new_account("tinker")
    job_id = f"{prefix}-{uuid.uuid4().hex[:8]}"
    sdk_http.create_job(account, job_id, lora_rank=4)
    sdk_http.wait_state(account, job_id, "JOB_STATE_RUNNING")
    sdk_http.warm(account, sdk_http.trainer_base_url(account, job_id))
    return account, job_id


def test_tinker_sdk_end_to_end(sdk_http: PlaneHttp) -> None:
    account = sdk_http.new_account("tinker")
    assert account.api_key.startswith("tml-")  # the SDK refuses anything else client-side
    job_id = f"tinker-{uuid.uuid4().hex[:8]}"
    sdk_http.create_job(account, job_id, lora_rank=4)
    sdk_http.wait_state(account, job_id, "JOB_STATE_RUNNING")
    # The SDK takes any 404 as final (§5), so warm the route before it sends its first request.
    sdk_http.warm(account, sdk_http.trainer_base_url(account, job_id))
    data = byte_datums(types, CORPUS)

    service = _service(sdk_http, account, job_id)
    try:
        training = service.create_lora_training_client(
            base_model=BASE_MODEL, rank=4, seed=0
        ).result(RESULT_TIMEOUT)
        tokenizer = training.get_tokenizer()
        assert tokenizer.encode("hello", add_special_tokens=False) == list(b"hello")

        # Pipelined, as tinker loops are written: every step is submitted before any is awaited.
        before = _loss(training.forward(data, "cross_entropy").result(RESULT_TIMEOUT))
        futures = []
        for _ in range(4):
            futures.append(training.forward_backward(data, "cross_entropy"))
            futures.append(training.optim_step(ADAM))
        results = [f.result(RESULT_TIMEOUT) for f in futures]
        step_losses = [_loss(r) for r in results[0::2]]
        assert step_losses[0] == pytest.approx(before)  # fwd/bwd ran strictly after forward
        assert all(a > b for a, b in zip(step_losses, step_losses[1:], strict=False)), step_losses
        logprobs = results[0].loss_fn_outputs[0]["logprobs"]
        assert logprobs.shape == [len(CORPUS[0]) - 1]

        saved = training.save_state("step-4").result(RESULT_TIMEOUT)
        assert saved.path.startswith("tinker://")
        after = _loss(training.forward(data, "cross_entropy").result(RESULT_TIMEOUT))
        assert after < before

        # Restore into a new model of the same session: same weights, same forward loss.
        restored = service.create_training_client_from_state_with_optimizer(saved.path).result(
            RESULT_TIMEOUT
        )
        assert restored.model_id != training.model_id
        assert _loss(restored.forward(data, "cross_entropy").result(RESULT_TIMEOUT)) == after

        # Sampling from a named sampler checkpoint: tokens, per-token logprobs, stop reasons.
        sampler_path = training.save_weights_for_sampler("sampler-4").result(RESULT_TIMEOUT).path
        sampler = training.create_sampling_client(sampler_path).result(RESULT_TIMEOUT)
        prompt = types.ModelInput.from_ints(tokenizer.encode("hel", add_special_tokens=False))
        params = types.SamplingParams(max_tokens=6, seed=7, temperature=1.0)
        answer = sampler.sample(prompt, num_samples=2, sampling_params=params).result(
            RESULT_TIMEOUT
        )
        assert len(answer.sequences) == 2
        for seq in answer.sequences:
            assert 1 <= len(seq.tokens) <= 6
            assert seq.stop_reason in ("stop", "length")
            assert seq.logprobs is not None and len(seq.logprobs) == len(seq.tokens)
            assert all(lp <= 0.0 for lp in seq.logprobs)
            assert seq.sequence_id
        again = sampler.sample(prompt, num_samples=2, sampling_params=params).result(RESULT_TIMEOUT)
        assert [s.tokens for s in again.sequences] == [s.tokens for s in answer.sequences]

        # The anonymous form: save_weights_and_get_sampling_client (sampling_session_id path).
        quick = training.save_weights_and_get_sampling_client().result(RESULT_TIMEOUT)
        greedy = types.SamplingParams(max_tokens=4, seed=1, temperature=0.0)
        assert len(quick.sample(prompt, 1, greedy).result(RESULT_TIMEOUT).sequences) == 1
    finally:
        service.close("success").result(RESULT_TIMEOUT)

    served = sdk_http.data_plane(account, job_id)
    # tinker sends forward_backward as protobuf; its other calls are JSON.
    assert served.get("protobuf:forward_backward", 0) + served.get("protobuf:forward", 0) >= 7
    assert served.get("json:forward_backward", 0) == 0
    assert served.get("json:optim_step", 0) >= 4

    # Preemption, then a resume through the control plane: a new trainer process and a new
    # session; the logical name still resolves, optimizer state included.
    sdk_http.preempt(account, job_id)
    sdk_http.wait_state(account, job_id, "JOB_STATE_FAILED")
    sdk_http.resume(account, job_id)
    sdk_http.wait_state(account, job_id, "JOB_STATE_RUNNING")
    sdk_http.warm(account, sdk_http.trainer_base_url(account, job_id))
    service = _service(sdk_http, account, job_id)
    try:
        resumed = service.create_training_client_from_state_with_optimizer("step-4").result(
            RESULT_TIMEOUT
        )
        assert _loss(resumed.forward(data, "cross_entropy").result(RESULT_TIMEOUT)) == after
        futures = [resumed.forward_backward(data, "cross_entropy"), resumed.optim_step(ADAM)]
        futures += [resumed.forward_backward(data, "cross_entropy"), resumed.optim_step(ADAM)]
        losses = [_loss(f.result(RESULT_TIMEOUT)) for f in futures[0::2]]
        for f in futures[1::2]:
            f.result(RESULT_TIMEOUT)
        assert losses[0] == pytest.approx(after)
        assert losses[1] < losses[0]
    finally:
        service.close("success").result(RESULT_TIMEOUT)
    sdk_http.delete_job(account, job_id)


def test_tinker_sdk_crashes_on_a_route_race_404(sdk_http: PlaneHttp) -> None:
    """Why clients warm a route up (§5): right after RUNNING, a gateway replica that has not
    learned the route answers 404, and the tinker SDK gives up at once — no retry — although
    the trainer is healthy, as the same call a moment later shows."""
    account = sdk_http.new_account("tinker")
    job_id = f"race-{uuid.uuid4().hex[:8]}"
    # Every replica learns a new route only 3 s after the trainer is up: deterministic.
    with sdk_http.faults(routeLagSeconds={"min": 3.0, "max": 3.0}):
        sdk_http.create_job(account, job_id, lora_rank=0)
        sdk_http.wait_state(account, job_id, "JOB_STATE_RUNNING")
        with pytest.raises(tinker.NotFoundError):
            # The first request (client/config) lands on a replica without the route: 404.
            _service(sdk_http, account, job_id).create_lora_training_client(
                base_model=BASE_MODEL, rank=0
            )
        assert sdk_http.route_404s(account, job_id) >= 1
        assert sdk_http.warm(account, sdk_http.trainer_base_url(account, job_id)) >= 1
        service = _service(sdk_http, account, job_id)
        try:
            training = service.create_lora_training_client(base_model=BASE_MODEL, rank=0).result(
                RESULT_TIMEOUT
            )
            out = training.forward(byte_datums(types, CORPUS[:1]), "cross_entropy")
            assert out.result(RESULT_TIMEOUT).metrics["loss:sum"] > 0
        finally:
            service.close("success").result(RESULT_TIMEOUT)
    sdk_http.delete_job(account, job_id)


def _rl_datum(prompt: list[int], seq: types.SampledSequence, advantage: float) -> types.Datum:
    """A policy-gradient datum over prompt + sample, with client-side logprobs all zero (so
    only the server's recorded ones can make the loss right)."""
    full = prompt + seq.tokens
    n_prompt = len(prompt) - 1  # target positions that predict prompt tokens
    return types.Datum(
        model_input=types.ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={
            "target_tokens": full[1:],
            "logprobs": [0.0] * (len(full) - 1),
            "advantages": [0.0] * n_prompt + [advantage] * len(seq.tokens),
        },
    )


def test_stable_reinforce_trains_against_the_recorded_samples(sdk_http: PlaneHttp) -> None:
    """StableReinforce with sequence provenance: samples taken with record_stability_info are
    remembered by sequence_id, and a training datum whose spans name them trains against the
    log-probabilities the sampler really had — not the ones the client sent (zeros here).
    A claim the record contradicts (another sequence's tokens) is refused."""
    account, job_id = _running_trainer(sdk_http, "stable")
    service = _service(sdk_http, account, job_id)
    try:
        training = service.create_lora_training_client(base_model=BASE_MODEL, rank=4).result(
            RESULT_TIMEOUT
        )
        sampler = training.save_weights_and_get_sampling_client(record_stability_info=True).result(
            RESULT_TIMEOUT
        )
        prompt = list(b"2+2=")
        params = types.SamplingParams(max_tokens=5, temperature=1.0)
        sampled = sampler.sample(types.ModelInput.from_ints(prompt), 2, params).result(
            RESULT_TIMEOUT
        )
        datums, plain = [], []
        for seq, advantage in zip(sampled.sequences, (1.0, -1.0), strict=True):
            datum = _rl_datum(prompt, seq, advantage)
            plain.append(datum)
            datums.append(
                datum.with_provenance(
                    model_input=[
                        types.PromptProvenanceSpan(sequence_id=seq.sequence_id, length=len(prompt)),
                        types.SampledProvenanceSpan(
                            sequence_id=seq.sequence_id, length=len(seq.tokens) - 1
                        ),
                    ],
                    loss_fn_inputs=[
                        types.PromptProvenanceSpan(
                            sequence_id=seq.sequence_id, offset=1, length=len(prompt) - 1
                        ),
                        types.SampledProvenanceSpan(
                            sequence_id=seq.sequence_id, length=len(seq.tokens)
                        ),
                    ],
                )
            )
        # On the weights that sampled, the recorded ratio is 1: plain REINFORCE, -sum(A * lp).
        result = training.forward(datums, "stable_reinforce").result(RESULT_TIMEOUT)
        expected = -sum(
            float(adv) * float(lp)
            for d, out in zip(datums, result.loss_fn_outputs, strict=True)
            for adv, lp in zip(
                d.loss_fn_inputs["advantages"].to_numpy(), out["logprobs"].to_numpy(), strict=True
            )
        )
        assert result.metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)
        # Without provenance the client's zeros are the behaviour logprobs: another loss.
        blind = training.forward(plain, "stable_reinforce").result(RESULT_TIMEOUT)
        assert blind.metrics["loss:sum"] != pytest.approx(expected, rel=1e-3)
        # Training with it works end to end.
        training.forward_backward(datums, "stable_reinforce").result(RESULT_TIMEOUT)
        training.optim_step(ADAM).result(RESULT_TIMEOUT)

        # A span naming the other sequence for these tokens contradicts the record: refused.
        first, second = sampled.sequences
        if first.tokens != second.tokens:
            lying = plain[0].with_provenance(
                model_input=[
                    types.PromptProvenanceSpan(sequence_id=first.sequence_id, length=len(prompt)),
                    types.SampledProvenanceSpan(
                        sequence_id=second.sequence_id, length=len(first.tokens) - 1
                    ),
                ],
                loss_fn_inputs=[
                    types.PromptProvenanceSpan(
                        sequence_id=first.sequence_id, offset=1, length=len(prompt) - 1
                    ),
                    types.SampledProvenanceSpan(
                        sequence_id=second.sequence_id, length=len(first.tokens)
                    ),
                ],
            )
            with pytest.raises(tinker.APIStatusError, match="differ|exceeds"):
                training.forward([lying], "stable_reinforce").result(RESULT_TIMEOUT)
    finally:
        service.close("success").result(RESULT_TIMEOUT)
    sdk_http.delete_job(account, job_id)


def test_a_weights_only_load_starts_a_new_run_whose_names_are_its_own(
    sdk_http: PlaneHttp,
) -> None:
    """Checkpoint names are scoped by training run, as the hosted service scopes them: a new
    model made from another run's weights only (`create_training_client_from_state`, the
    cookbook's SFT -> RL hand-over) saves a name that run took, at other weights, and both
    paths name their own weights. A resume with optimizer state continues its predecessor's
    lineage: re-saving the name at the same step and weights is idempotent, at other weights
    it is refused, as before."""
    account, job_id = _running_trainer(sdk_http, "runs")
    data = byte_datums(types, CORPUS)
    other_data = byte_datums(types, ["world world\n", "there there\n"])

    def step(client: tinker.TrainingClient, datums: list[types.Datum]) -> None:
        client.forward_backward(datums, "cross_entropy").result(RESULT_TIMEOUT)
        client.optim_step(ADAM).result(RESULT_TIMEOUT)

    def probe(client: tinker.TrainingClient) -> float:
        return _loss(client.forward(data, "cross_entropy").result(RESULT_TIMEOUT))

    service = _service(sdk_http, account, job_id)
    try:
        run_a = service.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=0).result(
            RESULT_TIMEOUT
        )
        step(run_a, data)
        step(run_a, data)
        path_a = run_a.save_state("000002").result(RESULT_TIMEOUT).path
        loss_a = probe(run_a)
        assert path_a == f"tinker://{run_a.model_id}/weights/000002"

        # A new run from A's weights only: its own lineage, so "000002" is free for it.
        run_b = service.create_training_client_from_state(path_a).result(RESULT_TIMEOUT)
        step(run_b, other_data)
        loss_b = probe(run_b)
        assert loss_b != loss_a
        path_b = run_b.save_state("000002").result(RESULT_TIMEOUT).path
        assert path_b == f"tinker://{run_b.model_id}/weights/000002"
        ids = sdk_http.checkpoint_ids(account, job_id)
        assert "000002" in ids and len([c for c in ids if c.startswith("000002.")]) == 1, ids

        # Each path names its own weights; a bare name is the job's first "000002" (A's).
        for ref, expected in ((path_a, loss_a), (path_b, loss_b), ("000002", loss_a)):
            loaded = service.create_training_client_from_state_with_optimizer(ref).result(
                RESULT_TIMEOUT
            )
            assert probe(loaded) == expected, ref

        # A resume with optimizer state continues A's lineage: the same name at the same step
        # and weights is the same checkpoint (idempotent); at other weights it is refused.
        resumed = service.create_training_client_from_state_with_optimizer(path_a).result(
            RESULT_TIMEOUT
        )
        again = resumed.save_state("000002").result(RESULT_TIMEOUT).path
        assert again == f"tinker://{resumed.model_id}/weights/000002"
        assert sorted(sdk_http.checkpoint_ids(account, job_id)) == sorted(ids)
        step(resumed, data)
        with pytest.raises(tinker.RequestFailedError, match="already exists"):
            resumed.save_state("000002").result(RESULT_TIMEOUT)
        # ...while B, its own lineage, may re-save its name idempotently too.
        assert run_b.save_state("000002").result(RESULT_TIMEOUT).path == path_b
    finally:
        service.close("success").result(RESULT_TIMEOUT)
    sdk_http.delete_job(account, job_id)


def _soft_datum(tokens: list[int], topk: list[list[tuple[int, float]] | None]) -> types.Datum:
    """A top-k distillation datum as the cookbook builds one (distillation/sdft.py): position
    ``i`` of ``tokens[:-1]`` gets the teacher's top-k at prompt position ``i + 1``,
    renormalized, as ``[T, K]`` targets and weights."""
    rows = topk[1:]
    assert all(row is not None for row in rows)
    targets = [[tok for tok, _ in row] for row in rows if row is not None]
    weights = []
    for row in rows:
        assert row is not None
        logps = np.array([lp for _, lp in row])
        probs = np.exp(logps - np.logaddexp.reduce(logps))
        weights.append(probs.tolist())
    shape = [len(rows), len(rows[0] or [])]
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(
                data=[t for row in targets for t in row], dtype="int64", shape=shape
            ),
            "weights": types.TensorData(
                data=[w for row in weights for w in row], dtype="float32", shape=shape
            ),
        },
    )


def test_topk_prompt_logprobs_and_soft_target_cross_entropy(sdk_http: PlaneHttp) -> None:
    """What self-distillation recipes send (tinker-cookbook's sdft, off-policy distillation):
    a teacher's top-k prompt logprobs from a sampler, then cross_entropy on [T, K] targets and
    weights — through the unmodified SDK (sample results and forward_backward in protobuf)."""
    account, job_id = _running_trainer(sdk_http, "topk")
    service = _service(sdk_http, account, job_id)
    try:
        training = service.create_lora_training_client(base_model=BASE_MODEL, rank=4).result(
            RESULT_TIMEOUT
        )
        # The teacher: the base model, as sdft's static teacher is.
        teacher = service.create_sampling_client(base_model=BASE_MODEL).result(RESULT_TIMEOUT)
        tokens = list(b"hello world\n")
        k = 5
        answer = teacher.sample(
            types.ModelInput.from_ints(tokens),
            num_samples=1,
            sampling_params=types.SamplingParams(max_tokens=1),
            include_prompt_logprobs=True,
            topk_prompt_logprobs=k,
        ).result(RESULT_TIMEOUT)
        topk, scored = answer.topk_prompt_logprobs, answer.prompt_logprobs
        assert topk is not None and scored is not None and len(topk) == len(tokens)
        assert topk[0] is None and scored[0] is None  # no context for the first token
        for i, row in enumerate(topk[1:], start=1):
            assert row is not None and len(row) == k
            ids, logps = [t for t, _ in row], [lp for _, lp in row]
            assert len(set(ids)) == k and all(0 <= t < 257 for t in ids)
            assert logps == sorted(logps, reverse=True) and logps[0] <= 0.0
            assert sum(np.exp(logps)) <= 1.0 + 1e-5
            if tokens[i] in ids:  # the prompt token's own logprob, where it ranks in the top k
                assert logps[ids.index(tokens[i])] == pytest.approx(scored[i], abs=1e-5)
            else:
                assert scored[i] <= logps[-1] + 1e-6
        last = teacher.sample(
            types.ModelInput.from_ints(tokens),
            num_samples=1,
            sampling_params=types.SamplingParams(max_tokens=1),
            include_prompt_logprobs=True,
            topk_prompt_logprobs=2,
            prompt_logprobs_last_n=3,
        ).result(RESULT_TIMEOUT)
        assert last.topk_prompt_logprobs is not None
        assert [row is None for row in last.topk_prompt_logprobs] == [True] * 9 + [False] * 3
        assert last.topk_prompt_logprobs[-1] == topk[-1][:2]
        with pytest.raises(
            tinker.APIStatusError, match=r"topk_prompt_logprobs: must be in \[0, 64\]"
        ):
            teacher.sample(
                types.ModelInput.from_ints(tokens),
                num_samples=1,
                sampling_params=types.SamplingParams(max_tokens=1),
                topk_prompt_logprobs=65,
            ).result(RESULT_TIMEOUT)

        # Distil: cross_entropy on [T, K] soft targets; the outputs have the targets' shape
        # and the loss is -sum(w * logp) over every (t, k).
        datum = _soft_datum(tokens, topk)
        before = training.forward([datum], "cross_entropy").result(RESULT_TIMEOUT)
        logprobs = before.loss_fn_outputs[0]["logprobs"]
        assert logprobs.shape == [len(tokens) - 1, k]
        weights = datum.loss_fn_inputs["weights"].to_numpy().reshape(len(tokens) - 1, k)
        expected = -float((weights * logprobs.to_numpy().reshape(weights.shape)).sum())
        assert _loss(before) == pytest.approx(expected, rel=1e-4)
        losses = []
        for _ in range(3):
            fb = training.forward_backward([datum], "cross_entropy")
            training.optim_step(ADAM).result(RESULT_TIMEOUT)
            losses.append(_loss(fb.result(RESULT_TIMEOUT)))
        assert losses[0] == pytest.approx(_loss(before)) and losses[-1] < losses[0], losses

        # A client-side loss over [T, K] logprobs (sdft's reverse-KL path): the forward
        # answers [T, K], the SDK sends back -dC/dlogp as [T, K] weights.
        shapes = []

        def reverse_kl(data: list[types.Datum], logprobs_list: list[Any]) -> tuple[Any, dict]:
            lp = logprobs_list[0]
            shapes.append(tuple(lp.shape))
            p = lp.softmax(dim=-1)
            return (p * (lp.log_softmax(dim=-1) - lp.detach())).sum(), {}

        training.forward_backward_custom([datum], reverse_kl).result(RESULT_TIMEOUT)
        training.optim_step(ADAM).result(RESULT_TIMEOUT)
        assert shapes == [(len(tokens) - 1, k)]
    finally:
        service.close("success").result(RESULT_TIMEOUT)
    served = sdk_http.data_plane(account, job_id)
    assert served.get("protobuf:forward_backward", 0) + served.get("protobuf:forward", 0) >= 5
    assert sdk_http.trainer_tables(account, job_id)["losses"]["forward_backward:cross_entropy"] >= 4
    sdk_http.delete_job(account, job_id)
