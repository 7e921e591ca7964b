"""The tiny stand-in model every local trainer runs, whatever base model was asked for.

A one-hidden-layer MLP classifier (tanh, softmax cross-entropy) in float64 NumPy, trained
with Adam. The base model's *name* seeds its frozen "pretrained" weights, so two base
models are two different starting points. ``lora_rank == 0`` trains every weight;
``lora_rank > 0`` freezes them and trains low-rank adapters ``W + A @ B`` on both layers
(``B`` starts at zero, so an untrained adapter is the base model), as LoRA does.

Every operation is deterministic: BLAS runs single-threaded in trainer processes (see
``localplane.trainer.__main__``), gradients of micro-batches are summed in micro-batch
order, and checkpoints store the exact float64 bits.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

ADAPTER_SCALE = 1.0


def stable_seed(*parts: Any) -> int:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little")


@dataclass(frozen=True)
class Architecture:
    n_in: int
    n_hidden: int
    n_out: int
    lora_rank: int
    base_model: str

    @property
    def stand_in(self) -> str:
        mode = f"lora-r{self.lora_rank}" if self.lora_rank else "full"
        return f"localplane/tiny-mlp-{self.n_in}x{self.n_hidden}x{self.n_out}-{mode}"

    def fingerprint(self) -> dict[str, Any]:
        return {
            "n_in": self.n_in,
            "n_hidden": self.n_hidden,
            "n_out": self.n_out,
            "lora_rank": self.lora_rank,
            "base_model": self.base_model,
        }


class TinyModel:
    def __init__(self, arch: Architecture, seed: int) -> None:
        self.arch = arch
        base_rng = np.random.default_rng(
            stable_seed("base", arch.base_model, arch.n_in, arch.n_hidden, arch.n_out)
        )
        self.base = {
            "w1": base_rng.normal(0.0, 1.0 / np.sqrt(arch.n_in), size=(arch.n_in, arch.n_hidden)),
            "b1": np.zeros(arch.n_hidden),
            "w2": base_rng.normal(
                0.0, 1.0 / np.sqrt(arch.n_hidden), size=(arch.n_hidden, arch.n_out)
            ),
            "b2": np.zeros(arch.n_out),
        }
        r = arch.lora_rank
        if r:
            rng = np.random.default_rng(stable_seed("adapter", seed))
            self.params = {
                "a1": rng.normal(0.0, 1.0 / np.sqrt(arch.n_in), size=(arch.n_in, r)),
                "b1_": np.zeros((r, arch.n_hidden)),
                "a2": rng.normal(0.0, 1.0 / np.sqrt(arch.n_hidden), size=(arch.n_hidden, r)),
                "b2_": np.zeros((r, arch.n_out)),
            }
        else:
            self.params = {k: v.copy() for k, v in self.base.items()}

    # ------------------------------------------------------------------ weights

    def effective(self) -> dict[str, np.ndarray]:
        if not self.arch.lora_rank:
            return self.params
        p, b = self.params, self.base
        return {
            "w1": b["w1"] + ADAPTER_SCALE * (p["a1"] @ p["b1_"]),
            "b1": b["b1"],
            "w2": b["w2"] + ADAPTER_SCALE * (p["a2"] @ p["b2_"]),
            "b2": b["b2"],
        }

    def digest(self) -> str:
        """sha256 over the trainable parameters, in name order (bit-exact identity)."""
        h = hashlib.sha256()
        for name in sorted(self.params):
            h.update(name.encode())
            h.update(np.ascontiguousarray(self.params[name]).tobytes())
        return h.hexdigest()

    @property
    def n_trainable(self) -> int:
        return int(sum(v.size for v in self.params.values()))

    # ----------------------------------------------------------------- compute

    def _forward(self, x: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        w = self.effective()
        h = np.tanh(x @ w["w1"] + w["b1"])
        logits = h @ w["w2"] + w["b2"]
        return w, h, logits

    @staticmethod
    def _log_softmax(logits: np.ndarray) -> np.ndarray:
        shifted = logits - logits.max(axis=1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))

    def loss(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Mean cross-entropy and accuracy, no gradients."""
        _, _, logits = self._forward(x)
        logp = self._log_softmax(logits)
        loss = float(-logp[np.arange(len(y)), y].mean())
        accuracy = float((logits.argmax(axis=1) == y).mean())
        return loss, accuracy

    def loss_and_grads(self, x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        w, h, logits = self._forward(x)
        n = len(y)
        logp = self._log_softmax(logits)
        loss = float(-logp[np.arange(n), y].mean())
        d_logits = np.exp(logp)
        d_logits[np.arange(n), y] -= 1.0
        d_logits /= n
        d_w2 = h.T @ d_logits
        d_b2 = d_logits.sum(axis=0)
        d_h = (d_logits @ w["w2"].T) * (1.0 - h * h)
        d_w1 = x.T @ d_h
        d_b1 = d_h.sum(axis=0)
        if not self.arch.lora_rank:
            return loss, {"w1": d_w1, "b1": d_b1, "w2": d_w2, "b2": d_b2}
        p, s = self.params, ADAPTER_SCALE
        return loss, {
            "a1": s * (d_w1 @ p["b1_"].T),
            "b1_": s * (p["a1"].T @ d_w1),
            "a2": s * (d_w2 @ p["b2_"].T),
            "b2_": s * (p["a2"].T @ d_w2),
        }


class Adam:
    """Adam with bias correction; its state is part of every resumable checkpoint."""

    def __init__(self, params: dict[str, np.ndarray]) -> None:
        self.t = 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def apply(
        self,
        params: dict[str, np.ndarray],
        grads: dict[str, np.ndarray],
        *,
        lr: float,
        beta1: float,
        beta2: float,
        eps: float,
    ) -> None:
        self.t += 1
        c1 = 1.0 - beta1**self.t
        c2 = 1.0 - beta2**self.t
        for k in sorted(params):
            g = grads[k]
            self.m[k] = beta1 * self.m[k] + (1.0 - beta1) * g
            self.v[k] = beta2 * self.v[k] + (1.0 - beta2) * (g * g)
            params[k] = params[k] - lr * (self.m[k] / c1) / (np.sqrt(self.v[k] / c2) + eps)


def global_norm(grads: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(float((g * g).sum()) for g in grads.values())))
