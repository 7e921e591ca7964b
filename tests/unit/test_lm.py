"""The stand-in byte-level causal LM: exact gradients, real learning, reproducibility, tokenizer."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from localplane.trainer import lm as lm_module
from localplane.trainer.lm import (
    EOS,
    VOCAB_SIZE,
    Adam,
    CausalLM,
    LMConfig,
    decode,
    encode,
    write_tokenizer_dir,
)
from localplane.trainer.numpy_backend import _loss_tokens

TEXT = "the quick brown fox jumps over the lazy dog. "
ADAM = {"beta1": 0.9, "beta2": 0.95, "eps": 1e-12}


def ce_datum(tokens: list[int], weights: list[float] | None = None):
    inputs = {"target_tokens": np.asarray(tokens[1:], dtype=np.int64)}
    if weights is not None:
        inputs["weights"] = np.asarray(weights, dtype=np.float32)
    return np.asarray(tokens[:-1], dtype=np.int64), inputs


def text_datums(n: int, length: int, offset: int = 0):
    stream = encode(TEXT * (1 + (n * length + offset) // len(TEXT) + 1))
    return [
        ce_datum(stream[offset + i * 7 : offset + i * 7 + length + 1], [1.0] * length)
        for i in range(n)
    ]


def mean_ce(model: CausalLM, datums) -> float:
    _, metrics, _ = model.forward_backward(datums, "cross_entropy", backward=False)
    return metrics["loss:sum"] / sum(len(t) for t, _ in datums)


# ------------------------------------------------------------------ tokens


def test_encode_decode_bytes_and_eos():
    text = "héllo\n\x00 wörld ✓"
    assert encode(text) == list(text.encode("utf-8"))
    assert decode(encode(text) + [EOS]) == text
    assert decode([0xFF, 0x41]) == "\ufffdA"
    assert VOCAB_SIZE == 257 and EOS == 256


# --------------------------------------------------------------- gradients


def _rl_inputs(model: CausalLM, tokens: np.ndarray, target: np.ndarray, rng):
    """Sampler logprobs away from the clip edges: ratios of 2, 1 and 1/2."""
    (out,), _, _ = model.forward_backward(
        [(tokens, {"target_tokens": target})], "cross_entropy", backward=False
    )
    shift = rng.choice([-np.log(2.0), 0.0, np.log(2.0)], size=len(tokens))
    advantages = rng.normal(size=len(tokens))
    advantages[0] = 0.0  # a prompt position: no advantage, outside GSPO's default mask
    return {
        "target_tokens": target,
        "logprobs": out["logprobs"].astype(np.float64) + shift,
        "advantages": advantages,
    }


#: Each loss with options that keep its clip/cap edges away from the sampled ratios (2, 1,
#: 1/2 per token; a finite difference across a kink would not match the gradient).
LOSS_CONFIGS = {
    "cross_entropy": None,
    "importance_sampling": None,
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "dro": {"beta": 0.3},
    "gspo": {"clip_low_threshold": 0.3, "clip_high_threshold": 3.0},
    "stable_reinforce": {"max_ratio": 1.5, "kl_coeff": 0.2},
}


@pytest.mark.parametrize("lora_rank", [0, 3])
@pytest.mark.parametrize("loss_fn", sorted(LOSS_CONFIGS))
def test_gradients_match_finite_differences(loss_fn: str, lora_rank: int):
    """The analytic gradient of every loss, through the whole model, against central
    differences. Losses with stop-gradient terms (CISPO's clipped ratio, GSPO's sequence
    ratio, StableReinforce's truncated ratio) are differenced as the surrogate that holds
    those terms at the forward pass's log-probabilities (``frozen``): its gradient there is
    the loss's gradient, by the stop-gradient's definition."""
    cfg = LMConfig(
        "fd-base",
        lora_rank=lora_rank,
        context=3,
        embed=4,
        hidden=6,
        lora_alpha=6.0 if lora_rank else None,
    )
    model = CausalLM(cfg, seed=5)
    rng = np.random.default_rng(11)
    if lora_rank:
        # B starts at zero, where dA is zero too: move off it so both are exercised.
        for name in ("w1_lora_b", "w2_lora_b"):
            model.params[name] = rng.normal(0.0, 0.3, size=model.params[name].shape)
    datums = []
    for length in (5, 9):
        seq = rng.integers(0, VOCAB_SIZE, size=length + 1)
        tokens, target = seq[:-1], seq[1:]
        if loss_fn == "cross_entropy":
            inputs = {"target_tokens": target, "weights": rng.choice([0.0, 0.5, 2.0], size=length)}
        else:
            inputs = _rl_inputs(model, tokens, target, rng)
        datums.append((tokens, inputs))
    config = LOSS_CONFIGS[loss_fn]
    _, _, grads = model.forward_backward(datums, loss_fn, config)
    frozen = model.target_logprobs(datums)

    def loss() -> float:
        _, metrics, _ = model.forward_backward(
            datums, loss_fn, config, backward=False, frozen=frozen
        )
        return metrics["loss:sum"]

    _matches_central_differences(model, grads, loss, rng)


def _matches_central_differences(model, grads, loss, rng) -> None:
    """Every parameter's gradient, at 25 random entries and its largest, equals the central
    difference of ``loss()`` there."""
    assert grads is not None and set(grads) == set(model.params)
    checked = 0
    for name, param in model.params.items():
        flat = param.reshape(-1)
        g = grads[name].reshape(-1)
        picks = set(rng.choice(flat.size, size=min(25, flat.size), replace=False).tolist())
        picks.add(int(np.argmax(np.abs(g))))
        for i in sorted(picks):
            old = flat[i]
            flat[i] = old + 1e-6
            up = loss()
            flat[i] = old - 1e-6
            down = loss()
            flat[i] = old
            numeric = (up - down) / 2e-6
            assert numeric == pytest.approx(g[i], rel=1e-5, abs=1e-7), (name, i)
            checked += 1
    # Not a vacuous check: some gradients are far from zero.
    assert max(float(np.abs(g).max()) for g in grads.values()) > 1e-2
    assert checked > 50


def _soft_targets(rng, length: int, k: int):
    """A [length, k] distillation datum's targets and weights: distinct tokens per row, the
    last column repeating the first at weight 0 (the cookbook pads short rows so), a row of
    zero weights (a prompt position), and a row naming one token twice with weight (both
    count)."""
    targets = np.stack([rng.choice(VOCAB_SIZE, size=k, replace=False) for _ in range(length)])
    weights = rng.dirichlet(np.ones(k), size=length)
    targets[:, -1], weights[:, -1] = targets[:, 0], 0.0
    weights[0] = 0.0
    targets[1, 1] = targets[1, 0]
    return targets, weights


@pytest.mark.parametrize("lora_rank", [0, 3])
def test_soft_target_cross_entropy_gradient_matches_finite_differences(lora_rank, monkeypatch):
    """cross_entropy with K weighted targets a position (target_tokens and weights [T, K]):
    loss = -sum_{t,k} w[t,k] log p(target[t,k] | t), through the whole model, against central
    differences; blocks of 4 positions, so rows of one datum span several blocks, beside a
    plain [T] datum in the same batch."""
    monkeypatch.setattr(lm_module, "CHUNK", 4)
    cfg = LMConfig("fd-soft", lora_rank=lora_rank, context=3, embed=4, hidden=6)
    model = CausalLM(cfg, seed=2)
    rng = np.random.default_rng(4)
    if lora_rank:
        for name in ("w1_lora_b", "w2_lora_b"):
            model.params[name] = rng.normal(0.0, 0.3, size=model.params[name].shape)
    datums = []
    for length, k in ((6, 3), (9, 4)):
        tokens = rng.integers(0, VOCAB_SIZE, size=length)
        targets, weights = _soft_targets(rng, length, k)
        datums.append((tokens, {"target_tokens": targets, "weights": weights}))
    plain = rng.integers(0, VOCAB_SIZE, size=6)
    datums.append(ce_datum(plain.tolist(), rng.choice([0.5, 2.0], size=5).tolist()))

    outputs, metrics, grads = model.forward_backward(datums, "cross_entropy")
    assert [o["logprobs"].shape for o in outputs] == [(6, 3), (9, 4), (5,)]
    expected = -sum(
        float((np.asarray(raw["weights"], dtype=np.float64) * o["logprobs"]).sum())
        for (_, raw), o in zip(datums, outputs, strict=True)
    )
    assert metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)

    def loss() -> float:
        return model.forward_backward(datums, "cross_entropy", backward=False)[1]["loss:sum"]

    _matches_central_differences(model, grads, loss, rng)


def test_soft_targets_score_each_column_as_a_plain_target_would():
    """A [T, K] datum's logprobs are, column by column, those of the [T] datum with that
    column as its targets; K = 1 gives the [T] datum's loss and gradients; the other losses,
    and inputs of another shape, are refused naming the field."""
    model = CausalLM(LMConfig("soft-base", context=4, embed=8, hidden=16))
    rng = np.random.default_rng(0)
    tokens = np.asarray(encode("soft targets"), dtype=np.int64)
    targets, weights = _soft_targets(rng, len(tokens), 5)
    (soft,), metrics, _ = model.forward_backward(
        [(tokens, {"target_tokens": targets, "weights": weights})], "cross_entropy", backward=False
    )
    assert soft["logprobs"].shape == soft["elementwise_loss"].shape == (len(tokens), 5)
    for k in range(5):
        (column,), _, _ = model.forward_backward(
            [(tokens, {"target_tokens": targets[:, k]})], "cross_entropy", backward=False
        )
        assert soft["logprobs"][:, k].tolist() == column["logprobs"].tolist()
    assert soft["elementwise_loss"] == pytest.approx(-weights * soft["logprobs"], rel=1e-6)

    one = {"target_tokens": targets[:, :1], "weights": weights[:, :1] + 0.5}
    flat = {"target_tokens": targets[:, 0], "weights": weights[:, 0] + 0.5}
    (o1,), m1, g1 = model.forward_backward([(tokens, one)], "cross_entropy")
    (o2,), m2, g2 = model.forward_backward([(tokens, flat)], "cross_entropy")
    assert o1["logprobs"].shape == (len(tokens), 1) and o2["logprobs"].shape == (len(tokens),)
    assert m1["loss:sum"] == pytest.approx(m2["loss:sum"], rel=1e-12)
    for name in g2:
        assert g1[name] == pytest.approx(g2[name], rel=1e-9, abs=1e-12)

    # grad_accumulation_normalization's num_loss_tokens counts positions, not targets.
    assert _loss_tokens({"target_tokens": targets, "weights": weights}) == len(tokens) - 1

    rl = {"target_tokens": targets, "logprobs": weights, "advantages": weights}
    with pytest.raises(ValueError, match=r"target_tokens.*cross_entropy only"):
        model.forward_backward([(tokens, rl)], "importance_sampling")
    for bad, field in (
        ({"target_tokens": targets, "weights": weights[:, 0]}, "weights"),
        ({"target_tokens": targets[:-1]}, "target_tokens"),
        ({"target_tokens": targets[:, :0]}, "target_tokens"),
    ):
        with pytest.raises(ValueError, match=field):
            model.forward_backward([(tokens, bad)], "cross_entropy")


def test_prompt_topk_is_the_head_of_the_sorted_distribution():
    model = CausalLM(LMConfig("topk-base"))
    tokens = encode("top k logprobs")
    first, ids, logprobs = model.prompt_topk(tokens, 6)
    assert first == 1 and ids.shape == logprobs.shape == (len(tokens) - 1, 6)
    every = [
        model.forward_backward(
            [(np.asarray(tokens[:-1]), {"target_tokens": np.full(len(tokens) - 1, v)})],
            "cross_entropy",
            backward=False,
        )[0][0]["logprobs"]
        for v in range(VOCAB_SIZE)
    ]
    table = np.stack(every, axis=1)  # [positions, vocab]
    for row in range(len(tokens) - 1):
        order = np.argsort(-table[row], kind="stable")[:6]
        assert ids[row].tolist() == order.tolist()
        assert logprobs[row] == pytest.approx(table[row][order], rel=1e-6)
        assert np.all(np.diff(logprobs[row]) <= 0)
    # The target's own logprob is prompt_logprobs', wherever it ranks in the top k.
    scored = model.prompt_logprobs(tokens)
    for row in range(len(tokens) - 1):
        if tokens[row + 1] in ids[row]:
            at = ids[row].tolist().index(tokens[row + 1])
            assert logprobs[row][at] == pytest.approx(scored[row + 1], rel=1e-12)
    last_first, last_ids, _ = model.prompt_topk(tokens, 3, last_n=2)
    assert last_first == len(tokens) - 2 and last_ids.tolist() == ids[-2:, :3].tolist()
    assert model.prompt_topk(tokens[:1], 3)[1].shape == (0, 3)
    with pytest.raises(ValueError, match="k must be"):
        model.prompt_topk(tokens, 0)


def test_outputs_are_tinker_shaped_and_losses_follow_their_formulas():
    model = CausalLM(LMConfig("shape-base"))
    tokens = encode("hello world")
    d1 = ce_datum(tokens, [0.0, 0.0] + [1.0] * (len(tokens) - 3))
    d2 = ce_datum(encode("abc"))  # no weights: all ones, as in tinker's own examples
    outputs, metrics, grads = model.forward_backward([d1, d2], "cross_entropy", backward=False)
    assert grads is None and set(metrics) == {"loss:sum"}
    assert [len(o["logprobs"]) for o in outputs] == [len(tokens) - 1, 2]
    for o in outputs:
        assert set(o) == {"logprobs", "elementwise_loss"}
        assert o["logprobs"].dtype == np.float32 and o["elementwise_loss"].dtype == np.float32
    lp = np.concatenate([o["logprobs"] for o in outputs]).astype(np.float64)
    w = np.concatenate([d1[1]["weights"], np.ones(2)])
    assert metrics["loss:sum"] == pytest.approx(-(w * lp).sum(), rel=1e-6)
    # The same numbers as prompt_logprobs, and a normalized distribution.
    assert outputs[0]["logprobs"] == pytest.approx(model.prompt_logprobs(tokens)[1:], rel=1e-6)
    every = model.forward_backward(
        [(np.array([65]), {"target_tokens": np.array([v])}) for v in range(VOCAB_SIZE)],
        "cross_entropy",
        backward=False,
    )[0]
    assert sum(np.exp(float(o["logprobs"][0])) for o in every) == pytest.approx(1.0, abs=1e-6)

    sampler_lp = lp[: len(tokens) - 1] - 0.5  # ratio e^0.5 ~ 1.65: clipped by PPO at 1.2
    adv = np.ones(len(tokens) - 1)
    rl = [
        (
            d1[0],
            {"target_tokens": d1[1]["target_tokens"], "logprobs": sampler_lp, "advantages": adv},
        )
    ]
    _, is_metrics, _ = model.forward_backward(rl, "importance_sampling", backward=False)
    assert is_metrics["loss:sum"] == pytest.approx(-np.exp(0.5) * len(adv), rel=1e-5)
    _, ppo_metrics, ppo_grads = model.forward_backward(rl, "ppo")
    assert ppo_metrics["loss:sum"] == pytest.approx(-1.2 * len(adv), rel=1e-5)
    assert all(not g.any() for g in ppo_grads.values())  # all clipped: nothing to learn
    _, wide, _ = model.forward_backward(
        rl, "ppo", {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0}, backward=False
    )
    assert wide["loss:sum"] == pytest.approx(is_metrics["loss:sum"], rel=1e-6)


@pytest.mark.parametrize(
    ("loss_fn", "inputs", "field"),
    [
        ("dpo", {"target_tokens": [1, 2]}, "loss_fn"),
        ("cross_entropy", {}, "target_tokens"),
        ("cross_entropy", {"target_tokens": [1, 2, 3]}, "target_tokens"),
        ("cross_entropy", {"target_tokens": [1, 2], "weights": [1.0]}, "weights"),
        ("cross_entropy", {"target_tokens": [1, 999]}, "target_tokens"),
        ("importance_sampling", {"target_tokens": [1, 2], "logprobs": [0.0, 0.0]}, "advantages"),
        ("ppo", {"target_tokens": [1, 2], "advantages": [1.0, 1.0]}, "logprobs"),
    ],
)
def test_bad_requests_name_the_field(loss_fn, inputs, field):
    model = CausalLM(LMConfig("err-base"))
    arrays = {k: np.asarray(v) for k, v in inputs.items()}
    with pytest.raises(ValueError, match=field):
        model.forward_backward([(np.array([5, 6]), arrays)], loss_fn)


# ---------------------------------------------------------------- learning


@pytest.mark.parametrize(("lora_rank", "lr"), [(0, 1e-2), (8, 2e-2)])
def test_cross_entropy_training_learns_the_text(lora_rank: int, lr: float):
    model = CausalLM(LMConfig("learn-base", lora_rank=lora_rank), seed=3)
    opt = Adam(model.params)
    train = text_datums(8, 48)
    before = mean_ce(model, train)
    for _ in range(60):
        _, _, grads = model.forward_backward(train, "cross_entropy")
        opt.apply(model.params, grads, learning_rate=lr, **ADAM)
    after = mean_ce(model, train)
    held_out = mean_ce(model, text_datums(4, 48, offset=3))
    assert before > 4.0  # about uniform over 257 tokens at the start
    assert after < 0.02 * before, (before, after)
    assert held_out < 0.1 * before, (before, held_out)
    # The model now continues the text it learned.
    tokens, _, _ = model.sample(encode("the quick "), max_tokens=5, temperature=0.0, seed=0)
    assert decode(tokens) == "brown"


def test_importance_sampling_rl_raises_the_rewarded_bytes_frequency():
    """A tiny RL loop: reward = how often the sample contains 'a'; it gets more frequent."""
    model = CausalLM(LMConfig("rl-base", lora_rank=4), seed=1)
    opt = Adam(model.params)
    prompt = encode("> ")
    favourite = ord("a")

    def rollouts(round_: int, n: int = 32):
        return [
            model.sample(prompt, max_tokens=8, stop=[], seed=round_ * 1000 + i) for i in range(n)
        ]

    def frequency(samples) -> float:
        return float(np.mean([t == favourite for tokens, _, _ in samples for t in tokens]))

    start = frequency(rollouts(10_000, 64))
    for round_ in range(25):
        samples = rollouts(round_)
        rewards = np.array([sum(t == favourite for t in tokens) for tokens, _, _ in samples])
        advantages = rewards - rewards.mean()
        datums = []
        for (tokens, logprobs, _), adv in zip(samples, advantages, strict=True):
            full = prompt + tokens
            n_prompt = len(prompt) - 1
            datums.append(
                (
                    np.asarray(full[:-1]),
                    {
                        "target_tokens": np.asarray(full[1:]),
                        "logprobs": np.asarray([0.0] * n_prompt + logprobs),
                        "advantages": np.asarray([0.0] * n_prompt + [adv] * len(tokens)),
                    },
                )
            )
        _, _, grads = model.forward_backward(datums, "importance_sampling")
        opt.apply(model.params, grads, learning_rate=3e-2, **ADAM)
    end = frequency(rollouts(20_000, 64))
    assert start < 0.05
    assert end > 0.5 and end > 10 * start, (start, end)


def test_save_restore_continues_bit_identically():
    cfg = LMConfig("resume-base", lora_rank=0)
    datums = text_datums(4, 32)
    hyper = {"learning_rate": 1e-2, "weight_decay": 0.01, "grad_clip_norm": 5.0, **ADAM}

    def step(model: CausalLM, opt: Adam) -> None:
        _, _, grads = model.forward_backward(datums, "cross_entropy")
        opt.apply(model.params, grads, **hyper)

    straight = CausalLM(cfg, seed=2)
    straight_opt = Adam(straight.params)
    for _ in range(6):
        step(straight, straight_opt)

    first = CausalLM(cfg, seed=2)
    first_opt = Adam(first.params)
    for _ in range(3):
        step(first, first_opt)
    saved_weights = {k: v.copy() for k, v in first.state().items()}
    saved_opt = {k: np.array(v) for k, v in first_opt.state().items()}
    step(first, first_opt)  # mutating after the save must not leak into the saved arrays

    resumed = CausalLM(cfg, seed=2)
    resumed.load_state(saved_weights)
    resumed_opt = Adam(resumed.params)
    resumed_opt.load_state(saved_opt)
    assert resumed_opt.t == 3
    for _ in range(3):
        step(resumed, resumed_opt)
    assert resumed.digest() == straight.digest()
    for name in straight.params:
        assert np.array_equal(resumed.params[name], straight.params[name])
    assert first.digest() != straight.digest()  # one step more: the digest sees it

    with pytest.raises(ValueError, match="does not fit"):
        CausalLM(LMConfig("resume-base", lora_rank=4)).load_state(saved_weights)


def test_lora_full_and_base_models():
    full = CausalLM(LMConfig("qwen-ish", lora_rank=0))
    lora = CausalLM(LMConfig("qwen-ish", lora_rank=4), seed=9)
    other = CausalLM(LMConfig("llama-ish", lora_rank=0))
    again = CausalLM(LMConfig("qwen-ish", lora_rank=0), seed=123)  # full ignores the seed
    assert lora.n_trainable() < full.n_trainable() / 10
    assert set(lora.params) == {"w1_lora_a", "w1_lora_b", "w2_lora_a", "w2_lora_b"}
    assert full.digest() == again.digest() != other.digest()
    tokens = encode("some text to score")
    # An untrained adapter (B = 0) is exactly the base model.
    assert lora.prompt_logprobs(tokens) == full.prompt_logprobs(tokens)
    assert other.prompt_logprobs(tokens) != full.prompt_logprobs(tokens)
    assert CausalLM(LMConfig("qwen-ish", 4), seed=10).digest() != lora.digest()
    assert full.cfg.fingerprint()["base_model"] == "qwen-ish"


# ---------------------------------------------------------------- sampling


def test_sampling_is_deterministic_and_reports_model_logprobs():
    model = CausalLM(LMConfig("sample-base"))
    prompt = encode("Once upon")
    a = model.sample(prompt, max_tokens=20, stop=[], seed=7)
    assert a == model.sample(prompt, max_tokens=20, stop=[], seed=7)
    assert a[0] != model.sample(prompt, max_tokens=20, stop=[], seed=8)[0]
    tokens, logprobs, reason = a
    assert reason == "length" and len(tokens) == len(logprobs) == 20
    # Temperature-1 logprobs of the sampled tokens, whatever the sampling temperature.
    scored = model.prompt_logprobs(prompt + tokens)[len(prompt) :]
    assert logprobs == pytest.approx(scored, rel=1e-9)
    hot = model.sample(prompt, max_tokens=20, temperature=0.7, stop=[], seed=7)
    assert hot[1] == pytest.approx(model.prompt_logprobs(prompt + hot[0])[len(prompt) :], rel=1e-9)

    greedy = model.sample(prompt, max_tokens=10, temperature=0.0, stop=[], seed=1)
    assert model.sample(prompt, max_tokens=10, top_k=1, stop=[], seed=2)[0] == greedy[0]
    assert model.sample(prompt, max_tokens=10, top_p=1e-9, stop=[], seed=3)[0] == greedy[0]
    # top_k keeps sampling inside the k most likely tokens, and does use all k of them.
    last = [model.prompt_logprobs(prompt + [t])[-1] for t in range(VOCAB_SIZE)]
    top3 = set(np.argsort(-np.asarray(last), kind="stable")[:3].tolist())
    drawn = {model.sample(prompt, max_tokens=1, top_k=3, stop=[], seed=s)[0][0] for s in range(40)}
    assert drawn <= top3 and len(drawn) > 1


def test_stop_sequences_and_eos():
    model = CausalLM(LMConfig("stop-base"))
    prompt = encode("abc")
    greedy, _, _ = model.sample(prompt, max_tokens=12, temperature=0.0, stop=[], seed=0)
    # Stop at the first occurrence of a two-token sequence from the greedy output.
    pair = greedy[4:6]
    first = next(i for i in range(len(greedy) - 1) if greedy[i : i + 2] == pair)
    tokens, logprobs, reason = model.sample(
        prompt, max_tokens=12, temperature=0.0, stop=[[0, 0], pair], seed=0
    )
    assert reason == "stop" and tokens == greedy[: first + 2] and len(logprobs) == len(tokens)
    assert model.sample(prompt, max_tokens=3, temperature=0.0, stop=[], seed=0)[2] == "length"
    assert model.sample(prompt, max_tokens=0, seed=0) == ([], [], "length")

    # Make EOS (almost) certain: None stops at it, [] does not, a stop list keeps it.
    model.params["b2"][EOS] += 60.0
    assert model.sample(prompt, max_tokens=5, seed=0) == (
        [EOS],
        pytest.approx([0.0], abs=1e-9),
        "stop",
    )
    assert model.sample(prompt, max_tokens=5, stop=[], seed=0)[0] == [EOS] * 5
    assert model.sample(prompt, max_tokens=5, stop=[[65]], seed=0)[2] == "stop"
    with pytest.raises(ValueError, match="prompt"):
        model.sample([300], max_tokens=1, seed=0)


# -------------------------------------------------------------------- Adam


def test_adam_bias_correction_decay_and_clipping():
    p = {"w": np.array([1.0, -2.0, 3.0])}
    g = {"w": np.array([0.5, -4.0, 0.0])}
    opt = Adam(p)
    metrics = opt.apply(p, g, learning_rate=0.1, **ADAM)
    # Step 1 with bias correction: the update is lr * sign(g) (and nothing where g == 0).
    assert p["w"] == pytest.approx([0.9, -1.9, 3.0], abs=1e-9)
    assert metrics["grad_norm:mean"] == pytest.approx(np.sqrt(0.25 + 16.0))

    # Decoupled weight decay: p *= 1 - lr * wd before the Adam update.
    p = {"w": np.array([2.0])}
    opt = Adam(p)
    opt.apply(p, {"w": np.array([0.0])}, learning_rate=0.1, weight_decay=0.5, **ADAM)
    assert p["w"][0] == pytest.approx(2.0 * (1 - 0.05), abs=1e-12)

    p = {"w": np.zeros(2)}
    opt = Adam(p)
    metrics = opt.apply(
        p, {"w": np.array([3.0, 4.0])}, learning_rate=0.1, grad_clip_norm=1.0, **ADAM
    )
    assert metrics["grad_norm:mean"] == pytest.approx(5.0)
    assert metrics["grad_norm_clipped:mean"] == pytest.approx(1.0)
    assert opt.m["w"] == pytest.approx([0.1 * 0.6, 0.1 * 0.8])
    with pytest.raises(ValueError, match="learning_rate"):
        opt.apply(p, None, learning_rate=float("nan"))


def test_adam_does_not_move_parameters_without_a_gradient():
    """torch's AdamW skips a parameter whose .grad is None: no momentum step, no decay, no
    step count. An optim_step with no forward_backward since the last one changes nothing."""
    p = {"w": np.array([1.0, -2.0])}
    opt = Adam(p)
    opt.apply(p, {"w": np.array([0.5, -1.0])}, learning_rate=0.1, weight_decay=0.1, **ADAM)
    after_step = p["w"].copy()
    m, v, t = opt.m["w"].copy(), opt.v["w"].copy(), opt.t
    metrics = opt.apply(p, None, learning_rate=0.1, weight_decay=0.1, **ADAM)
    assert p["w"].tolist() == after_step.tolist()  # the momentum would have moved it
    assert opt.m["w"].tolist() == m.tolist() and opt.v["w"].tolist() == v.tolist()
    assert opt.t == t and metrics["grad_norm:mean"] == 0.0


# Speed is measured in bench/, not asserted here.

# --------------------------------------------------------------- tokenizer


SAMPLES = ["hello world", "héllo\n\twörld ✓ 🙂", " leading and trailing ", "\x00\x01\xff", ""]


def test_tokenizer_dir_loads_offline_and_matches_encode(tmp_path, monkeypatch):
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    path = write_tokenizer_dir(tmp_path / "tok")
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    for text in SAMPLES:
        assert tok.encode(text).ids == encode(text)
        assert tok.decode(encode(text)) == text
    assert tok.token_to_id("<|endoftext|>") == EOS

    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed: AutoTokenizer part skipped"
    )
    auto = transformers.AutoTokenizer.from_pretrained(str(path))
    for text in SAMPLES:
        assert auto.encode(text) == encode(text)
        assert auto.decode(encode(text)) == text
    assert auto.eos_token_id == auto.bos_token_id == auto.pad_token_id == EOS

    # The tinker SDK's get_tokenizer() path, given get_info's tokenizer_id = this directory.
    sampling_client = pytest.importorskip("tinker.lib.public_interfaces.sampling_client")
    via_tinker = sampling_client._load_tokenizer_from_model_info("localplane/any-base", str(path))
    assert via_tinker.encode(SAMPLES[1]) == encode(SAMPLES[1])


def test_tokenizer_dir_is_idempotent_and_race_safe(tmp_path):
    path = tmp_path / "shared" / "tok"
    errors: list[BaseException] = []

    def write() -> None:
        try:
            write_tokenizer_dir(path)
        except BaseException as exc:  # collected and re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    files = sorted(p.name for p in path.iterdir())
    assert files == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    assert [p for p in path.parent.iterdir() if p.name != "tok"] == []  # no staging left over
    before = {p.name: p.stat().st_mtime_ns for p in path.iterdir()}
    assert write_tokenizer_dir(path) == path
    assert {p.name: p.stat().st_mtime_ns for p in path.iterdir()} == before

    (path / "tokenizer.json").write_text("{}")  # stale or damaged: rewritten
    write_tokenizer_dir(path)
    assert '"ByteLevel"' in (path / "tokenizer.json").read_text()
