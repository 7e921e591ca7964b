"""Pure logic of the local trainer: correct gradients, reproducible batches, and webhook
signatures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from localplane.trainer import data as datasets
from localplane.trainer.model import Adam, Architecture, TinyModel
from shepherd.platform import webhooks


@pytest.mark.parametrize("rank", [0, 3])
def test_gradients_match_finite_differences(rank: int) -> None:
    arch = Architecture(n_in=5, n_hidden=4, n_out=3, lora_rank=rank, base_model="m")
    model = TinyModel(arch, seed=1)
    if rank:  # B starts at zero; give it values so every gradient path is exercised
        rng = np.random.default_rng(0)
        for k in ("b1_", "b2_"):
            model.params[k] = rng.normal(0, 0.5, size=model.params[k].shape)
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(7, 5)), rng.integers(0, 3, size=7)
    _, grads = model.loss_and_grads(x, y)
    eps = 1e-6
    for name, param in model.params.items():
        for idx in list(np.ndindex(param.shape))[:6]:
            old = param[idx]
            param[idx] = old + eps
            up, _ = model.loss(x, y)
            param[idx] = old - eps
            down, _ = model.loss(x, y)
            param[idx] = old
            assert grads[name][idx] == pytest.approx((up - down) / (2 * eps), rel=1e-4, abs=1e-7)


def test_same_seed_same_bits_and_different_base_models_differ() -> None:
    arch = Architecture(n_in=5, n_hidden=4, n_out=3, lora_rank=0, base_model="m")
    a, b = TinyModel(arch, seed=1), TinyModel(arch, seed=1)
    assert a.digest() == b.digest()
    other = TinyModel(Architecture(5, 4, 3, 0, "another-base"), seed=1)
    assert other.digest() != a.digest()
    ds = datasets.load("synthetic:blobs", Path("/nonexistent"))
    arch = Architecture(ds.n_features, 8, ds.n_classes, 0, "m")
    digests = []
    for _ in range(2):
        model = TinyModel(arch, seed=3)
        adam = Adam(model.params)
        for step in range(1, 6):
            x, y = ds.train_batch(3, step, 0, 16)
            _, grads = model.loss_and_grads(x, y)
            adam.apply(model.params, grads, lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8)
        digests.append(model.digest())
    assert digests[0] == digests[1]


def test_batches_are_a_pure_function_of_seed_step_micro_batch() -> None:
    ds = datasets.load("synthetic:text", Path("/nonexistent"))
    x1, y1 = ds.train_batch(0, 7, 1, 8)
    x2, y2 = ds.train_batch(0, 7, 1, 8)
    x3, _ = ds.train_batch(0, 7, 2, 8)
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2) and not np.array_equal(x1, x3)
    assert ds.n_train + ds.n_eval == ds.n_examples and ds.n_eval > 0


def test_jsonl_errors_name_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"nothing": 1}) + "\n")
    with pytest.raises(datasets.DatasetError, match="line 2"):
        datasets.load(str(bad), tmp_path)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"x": [1.0], "y": 0}) + "\n")
    with pytest.raises(datasets.DatasetError, match="mixes"):
        datasets.load(str(mixed), tmp_path)
    assert datasets.check_name("synthetic:nope", tmp_path) is not None
    assert "does not exist" in (
        datasets.check_name(str(tmp_path / "missing.jsonl"), tmp_path) or ""
    )


def test_webhook_signatures() -> None:
    body = b'{"id": 1}'
    header = webhooks.sign("s" * 16, body, timestamp=1000)
    webhooks.verify("s" * 16, header, body, now=1010)
    with pytest.raises(webhooks.InvalidSignature, match="does not match"):
        webhooks.verify("s" * 16, header, body + b" ", now=1010)
    with pytest.raises(webhooks.InvalidSignature, match="tolerance"):
        webhooks.verify("s" * 16, header, body, now=5000)
    with pytest.raises(webhooks.InvalidSignature, match="missing"):
        webhooks.verify("s" * 16, None, body)
    with pytest.raises(webhooks.InvalidSignature, match="does not match"):
        webhooks.verify("t" * 16, header, body, now=1010)
