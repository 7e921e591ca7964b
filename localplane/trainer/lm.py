"""The stand-in model every local trainer runs: a small byte-level causal language model.

Whatever base model a client asks for, the trainer runs this model over the byte vocabulary
(ids 0..255 are bytes, 256 is EOS). For every position it embeds the previous ``context``
tokens (left-padded with EOS), concatenates them, applies one tanh hidden layer and reads
logits over the vocabulary: a fixed-window causal LM, small enough to train in milliseconds
on a CPU, real enough that every Tinker operation means what it means on a real model
(per-token log-probabilities, cross-entropy and policy-gradient losses, Adam, sampling).

The base model's *name* seeds the frozen "pretrained" weights (sha256 of the name), so two
base models are two different starting points. ``lora_rank == 0`` trains every weight;
``lora_rank > 0`` freezes them and trains low-rank adapters ``W + A @ B`` on the hidden and
output matrices (``B`` starts at zero, so an untrained adapter is the base model).

Everything is float64 NumPy with hand-written gradients and a fixed order of summation;
trainer processes run BLAS single-threaded (``localplane.trainer.__main__``), so the same
base model, seed and sequence of operations give bit-identical weights, also across a
save/restore.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from localplane.trainer import losses
from localplane.trainer.tokenizer import (
    EOS,
    EOS_TEXT,
    VOCAB_SIZE,
    decode,
    encode,
    write_tokenizer_dir,
)

__all__ = [
    "EOS",
    "EOS_TEXT",
    "VOCAB_SIZE",
    "Adam",
    "CausalLM",
    "LMConfig",
    "decode",
    "encode",
    "write_tokenizer_dir",
]

# Positions per block of the batched forward/backward: bounds memory (a block's logits are
# CHUNK x 257 float64, ~8 MB) whatever a client sends, and fixes the summation order.
CHUNK = 4096

Datum = tuple[np.ndarray, Mapping[str, np.ndarray]]


def stable_seed(*parts: Any) -> int:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little")


@dataclass(frozen=True)
class LMConfig:
    base_model: str
    lora_rank: int = 0
    context: int = 8
    embed: int = 32
    hidden: int = 128
    #: LoRA targets (Tinker's LoraConfig flags): the hidden layer is the model's MLP, the
    #: output matrix its unembedding. It has no attention, so train_attn has nothing to adapt.
    train_mlp: bool = True
    train_unembed: bool = True
    #: LoRA's alpha: adapters add (alpha / rank) * A @ B (None: scale 1, alpha = rank).
    lora_alpha: float | None = None

    @property
    def lora_scale(self) -> float:
        return self.lora_alpha / self.lora_rank if self.lora_alpha and self.lora_rank else 1.0

    def __post_init__(self) -> None:
        for name in ("context", "embed", "hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must be 0 or positive, got {self.lora_rank}")
        if self.lora_rank and not (self.train_mlp or self.train_unembed):
            raise ValueError("a LoRA model needs train_mlp or train_unembed: nothing to train")

    @property
    def adapted(self) -> tuple[str, ...]:
        """The weight matrices a LoRA model adapts."""
        if not self.lora_rank:
            return ()
        return tuple(m for m, on in (("w1", self.train_mlp), ("w2", self.train_unembed)) if on)

    @property
    def stand_in(self) -> str:
        mode = f"lora-r{self.lora_rank}" if self.lora_rank else "full"
        if self.lora_rank and self.adapted != ("w1", "w2"):
            mode += "-" + "+".join({"w1": "mlp", "w2": "unembed"}[m] for m in self.adapted)
        return f"localplane/byte-lm-c{self.context}-e{self.embed}-h{self.hidden}-{mode}"

    def fingerprint(self) -> dict[str, Any]:
        return {
            "base_model": self.base_model,
            "lora_rank": self.lora_rank,
            "context": self.context,
            "embed": self.embed,
            "hidden": self.hidden,
            "vocab_size": VOCAB_SIZE,
            "stand_in": self.stand_in,
        }

    def n_parameters(self) -> int:
        """Trainable parameters (without building the model)."""
        c, e, h, v, r = self.context, self.embed, self.hidden, VOCAB_SIZE, self.lora_rank
        if not r:
            return v * e + c * e * h + h + h * v + v
        sizes = {"w1": r * (c * e + h), "w2": r * (h + v)}
        return sum(sizes[m] for m in self.adapted)

    def n_frozen(self) -> int:
        c, e, h, v = self.context, self.embed, self.hidden, VOCAB_SIZE
        return (v * e + c * e * h + h + h * v + v) if self.lora_rank else 0


@functools.lru_cache(maxsize=4)
def _base_weights(base_model: str, c: int, e: int, h: int) -> dict[str, np.ndarray]:
    """The frozen "pretrained" weights of a base model: a function of its name, computed once
    per process and shared, read-only, by every model and sampler built on it."""
    v = VOCAB_SIZE
    rng = np.random.default_rng(stable_seed("localplane-lm/base", base_model, c, e, h))
    # Scales keep the hidden pre-activations near unit variance: tanh neither saturated
    # nor linear, and the base model's next-token distribution is broad but not uniform.
    base = {
        "embed": rng.normal(0.0, 1.0, size=(v, e)),
        "w1": rng.normal(0.0, 1.0 / math.sqrt(c * e), size=(c * e, h)),
        "b1": rng.normal(0.0, 0.1, size=h),
        "w2": rng.normal(0.0, 1.0 / math.sqrt(h), size=(h, v)),
        "b2": rng.normal(0.0, 0.1, size=v),
    }
    for arr in base.values():
        arr.flags.writeable = False
    return base


class CausalLM:
    """The model: frozen base weights plus the trainable ``params`` (all, or the adapters)."""

    def __init__(self, cfg: LMConfig, seed: int = 0) -> None:
        self.cfg = cfg
        c, e, h, v = cfg.context, cfg.embed, cfg.hidden, VOCAB_SIZE
        base = _base_weights(cfg.base_model, c, e, h)
        r = cfg.lora_rank
        if r:
            self.base = base
            arng = np.random.default_rng(stable_seed("localplane-lm/adapter", seed, r))
            # Drawn in a fixed order whatever is adapted, so a target's adapter is the same
            # with or without the other one.
            adapters = {
                "w1_lora_a": arng.normal(0.0, 1.0 / math.sqrt(c * e), size=(c * e, r)),
                "w1_lora_b": np.zeros((r, h)),
                "w2_lora_a": arng.normal(0.0, 1.0 / math.sqrt(h), size=(h, r)),
                "w2_lora_b": np.zeros((r, v)),
            }
            self.params: dict[str, np.ndarray] = {
                name: arr for name, arr in adapters.items() if name[:2] in cfg.adapted
            }
        else:
            self.base = {}
            self.params = {name: arr.copy() for name, arr in base.items()}

    # ------------------------------------------------------------------ weights

    def _weights(self) -> dict[str, np.ndarray]:
        if not self.cfg.lora_rank:
            return self.params
        p, w = self.params, dict(self.base)
        scale = self.cfg.lora_scale
        for m in self.cfg.adapted:
            w[m] = w[m] + scale * (p[f"{m}_lora_a"] @ p[f"{m}_lora_b"])
        return w

    def digest(self) -> str:
        """sha256 over the trainable parameters in name order: bit-exact identity."""
        h = hashlib.sha256()
        for name in sorted(self.params):
            arr = np.ascontiguousarray(self.params[name], dtype=np.float64)
            h.update(f"{name}:{arr.shape}".encode())
            h.update(arr.tobytes())
        return h.hexdigest()

    def n_trainable(self) -> int:
        return int(sum(a.size for a in self.params.values()))

    def state(self) -> dict[str, np.ndarray]:
        """The trainable arrays (copies); the frozen base is a function of the config."""
        return {name: arr.copy() for name, arr in self.params.items()}

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        expected = {name: arr.shape for name, arr in self.params.items()}
        got = {name: np.shape(arr) for name, arr in arrays.items()}
        if got != expected:
            raise ValueError(
                f"checkpoint does not fit this model ({self.cfg.stand_in}): "
                f"expected arrays {expected}, got {got}"
            )
        for name in self.params:
            self.params[name] = np.array(arrays[name], dtype=np.float64, copy=True)

    # ----------------------------------------------------------------- compute

    def _contexts(self, tokens: np.ndarray) -> np.ndarray:
        """[T, context]: row i holds tokens[i-context+1 .. i], left-padded with EOS."""
        c = self.cfg.context
        padded = np.concatenate([np.full(c - 1, EOS, dtype=np.int64), tokens])
        return np.lib.stride_tricks.sliding_window_view(padded, c)

    def _logits(
        self, w: dict[str, np.ndarray], ctx: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = w["embed"][ctx].reshape(len(ctx), -1)
        hid = np.tanh(x @ w["w1"] + w["b1"])
        return x, hid, hid @ w["w2"] + w["b2"]

    def forward_backward(
        self,
        datums: Sequence[Datum],
        loss_fn: str,
        loss_fn_config: Mapping[str, Any] | None = None,
        *,
        backward: bool = True,
        frozen: np.ndarray | None = None,
    ) -> tuple[list[dict[str, np.ndarray]], dict[str, float], dict[str, np.ndarray] | None]:
        """Per-datum outputs, metrics, and the gradients of the summed loss (or None).

        Position ``i`` of a datum predicts ``target_tokens[i]`` from input tokens ``[: i+1]``;
        with ``target_tokens`` of shape ``[T, K]`` (``cross_entropy`` only) it scores the K
        targets ``target_tokens[i, :]`` under the one distribution of position ``i``, and the
        datum's outputs have that shape too. The loss is the sum over datums and targets (no
        mean), as Tinker defines it; the caller accumulates gradients across calls until the
        optimizer step. ``frozen`` (every target's log-probability, concatenated) is where
        the loss evaluates its stop-gradient terms; by default this forward pass's own (see
        :mod:`losses`). Raises :class:`~localplane.trainer.losses.LossError` (a ValueError)
        naming the field.
        """
        spec = losses.spec(loss_fn)
        if not datums:
            raise losses.LossError("forward_backward needs at least one datum")
        cfg = losses.config(spec, loss_fn_config)
        tokens, targets = _check_datums(datums)
        b = losses.batch(spec, targets, [raw for _, raw in datums], cfg)
        ctx = np.concatenate([self._contexts(t) for t in tokens])
        # The loss sees one log-probability per *target*: a [T] datum's are its positions, a
        # [T, K] datum's are its cells, row-major. ``pos`` maps targets to positions (None:
        # every datum is [T], targets are positions, the original arithmetic runs unchanged).
        target = np.concatenate([t.reshape(-1) for t in targets])
        pos = _target_positions(targets)
        w = self._weights()
        # Pass 1: every target's log-probability (GSPO needs a datum's all before any loss).
        logp = self._target_logprobs(w, ctx, target, pos)
        if frozen is not None and frozen.shape != logp.shape:
            raise ValueError(f"frozen has shape {frozen.shape}, expected {logp.shape}")
        elementwise, dloss_dlp, metrics = losses.evaluate(spec, logp, b, frozen)
        grads_w = None
        if backward:
            # Pass 2: recompute each block's activations (cheaper than keeping them all) and
            # backpropagate d loss / d lp. Blocks are summed in a fixed order: reproducible.
            grads_w = _zero_grads(w, full=not self.cfg.lora_rank)
            for sl in _blocks(len(ctx)):
                x, hid, logits = self._logits(w, ctx[sl])
                rows = np.arange(sl.stop - sl.start)
                shifted = logits - logits.max(axis=1, keepdims=True)
                expd = np.exp(shifted)
                total = expd.sum(axis=1)
                if pos is None:
                    g = dloss_dlp[sl]
                    # d(sum loss)/d logits = g * (onehot(target) - softmax) per row.
                    d_logits = expd * (-g / total)[:, None]
                    d_logits[rows, target[sl]] += g
                else:
                    # Several targets a row: sum_k g_k * (onehot(t_k) - softmax). add.at, as
                    # a row may name a token twice (padding repeats one at weight 0).
                    cells = _cells(pos, sl)
                    local, g_cells = pos[cells] - sl.start, dloss_dlp[cells]
                    g = np.bincount(local, weights=g_cells, minlength=len(rows))
                    d_logits = expd * (-g / total)[:, None]
                    np.add.at(d_logits, (local, target[cells]), g_cells)
                grads_w["w2"] += hid.T @ d_logits
                d_hid = (d_logits @ w["w2"].T) * (1.0 - hid * hid)
                grads_w["w1"] += x.T @ d_hid
                if "embed" in grads_w:
                    grads_w["b2"] += d_logits.sum(axis=0)
                    grads_w["b1"] += d_hid.sum(axis=0)
                    d_x = (d_hid @ w["w1"].T).reshape(-1, self.cfg.embed)
                    _scatter_add_rows(grads_w["embed"], ctx[sl].reshape(-1), d_x)
        outputs = [
            {
                "logprobs": logp[seg].reshape(t.shape).astype(np.float32),
                "elementwise_loss": elementwise[seg].reshape(t.shape).astype(np.float32),
            }
            for seg, t in zip(b.segments(), targets, strict=True)
        ]
        if grads_w is None:
            return outputs, metrics, None
        return outputs, metrics, self._param_grads(grads_w)

    def _target_logprobs(
        self, w: dict[str, np.ndarray], ctx: np.ndarray, target: np.ndarray, pos: np.ndarray | None
    ) -> np.ndarray:
        logp = np.empty(len(target))
        for sl in _blocks(len(ctx)):
            _, _, logits = self._logits(w, ctx[sl])
            if pos is None:
                logp[sl] = _log_softmax(logits)[np.arange(sl.stop - sl.start), target[sl]]
            else:
                cells = _cells(pos, sl)
                logp[cells] = _log_softmax(logits)[pos[cells] - sl.start, target[cells]]
        return logp

    def target_logprobs(self, datums: Sequence[Datum]) -> np.ndarray:
        """Every datum target's float64 log-probability, concatenated (a [T, K] datum's
        row-major): the values a loss sees (``frozen`` for :meth:`forward_backward`)."""
        tokens, targets = _check_datums(datums)
        ctx = np.concatenate([self._contexts(t) for t in tokens])
        target = np.concatenate([t.reshape(-1) for t in targets])
        return self._target_logprobs(self._weights(), ctx, target, _target_positions(targets))

    def _param_grads(self, grads_w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self.cfg.lora_rank:
            return grads_w
        p = self.params
        out = {}
        # W = W0 + s A @ B  =>  dA = s dW @ B^T, dB = s A^T @ dW.
        s = self.cfg.lora_scale
        for m in self.cfg.adapted:
            out[f"{m}_lora_a"] = s * (grads_w[m] @ p[f"{m}_lora_b"].T)
            out[f"{m}_lora_b"] = s * (p[f"{m}_lora_a"].T @ grads_w[m])
        return out

    def prompt_logprobs(
        self, tokens: Sequence[int], last_n: int | None = None
    ) -> list[float | None]:
        """log p(tokens[i] | tokens[:i]) for every position; the first has no context: None.
        With ``last_n`` only the last ``last_n`` positions are scored, the others None."""
        toks = _as_tokens(tokens, "tokens")
        if len(toks) < 2:
            return [None] * len(toks)
        first = 1 if last_n is None else max(1, len(toks) - last_n)
        w = self._weights()
        out: list[float | None] = [None] * first
        ctx = self._contexts(toks[:-1])[first - 1 :]
        target = toks[first:]
        for sl in _blocks(len(target)):
            _, _, logits = self._logits(w, ctx[sl])
            lp = _log_softmax(logits)[np.arange(sl.stop - sl.start), target[sl]]
            out.extend(float(v) for v in lp)
        return out

    def prompt_topk(
        self, tokens: Sequence[int], k: int, last_n: int | None = None
    ) -> tuple[int, np.ndarray, np.ndarray]:
        """The ``k`` most likely next tokens at prompt positions: ``(first, ids, logprobs)``,
        where row ``i`` of the ``[n, k]`` arrays is position ``first + i`` (the distribution
        of ``tokens[first + i]`` given ``tokens[: first + i]``), most likely first, ties by
        token id. Position 0 has no context, and ``last_n`` scores only the last positions,
        as in :meth:`prompt_logprobs`."""
        toks = _as_tokens(tokens, "tokens")
        if not 1 <= k <= VOCAB_SIZE:
            raise ValueError(f"k must be in [1, {VOCAB_SIZE}], got {k}")
        first = max(1, len(toks) - last_n) if last_n is not None else 1
        first = min(first, len(toks))
        n = len(toks) - first
        ids = np.empty((n, k), dtype=np.int64)
        logprobs = np.empty((n, k))
        if n:
            w = self._weights()
            ctx = self._contexts(toks[:-1])[first - 1 :]
            for sl in _blocks(n):
                _, _, logits = self._logits(w, ctx[sl])
                lsm = _log_softmax(logits)
                order = np.argsort(-lsm, axis=1, kind="stable")[:, :k]
                ids[sl] = order
                logprobs[sl] = np.take_along_axis(lsm, order, axis=1)
        return first, ids, logprobs

    def sample(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int,
        temperature: float = 1.0,
        top_k: int = -1,
        top_p: float = 1.0,
        stop: Sequence[Sequence[int]] | None = None,
        seed: int,
    ) -> tuple[list[int], list[float], str]:
        """Generate up to ``max_tokens`` tokens after ``prompt``: (tokens, logprobs, reason).
        (:meth:`sample_detailed` also gives the sampling distribution's log-probabilities.)

        ``logprobs`` are the sampled tokens' log-probabilities under the model itself
        (temperature 1, no top-k/top-p), which is what Tinker's sampler reports. Stopping
        follows Tinker's ``SamplingParams.stop``: ``None`` stops at EOS; ``[]`` never stops
        early (not even at EOS); a non-empty list stops at any of its token sequences and at
        EOS. The stop token(s) are part of the returned tokens; ``reason`` is ``"stop"`` then,
        ``"length"`` when ``max_tokens`` ran out. The same arguments give the same result.
        """
        tokens, logprobs, reason, _ = self.sample_detailed(
            prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            stop=stop,
            seed=seed,
        )
        return tokens, logprobs, reason

    def sample_detailed(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int,
        temperature: float = 1.0,
        top_k: int = -1,
        top_p: float = 1.0,
        stop: Sequence[Sequence[int]] | None = None,
        seed: int,
    ) -> tuple[list[int], list[float], str, list[float]]:
        """:meth:`sample`, plus each token's log-probability under the distribution it was
        drawn from (after temperature, top-k and top-p: 0 for a greedy pick) — what a serving
        deployment reports as ``sampling_logprob``."""
        toks = _as_tokens(prompt, "prompt")
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be 0 or more, got {max_tokens}")
        if not temperature >= 0.0 or not math.isfinite(temperature):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        stops = [[EOS]] if stop is None else [_as_tokens(s, "stop").tolist() for s in stop]
        if stop:
            stops.append([EOS])
        if any(not s for s in stops):
            raise ValueError("stop: a stop sequence must not be empty")
        rng = np.random.default_rng(int(seed) % (1 << 64))
        w = self._weights()
        c = self.cfg.context
        window = [EOS] * c + [int(t) for t in toks[-c:]]
        out: list[int] = []
        logprobs: list[float] = []
        sampling: list[float] = []
        for _ in range(max_tokens):
            ctx = np.asarray(window[-c:], dtype=np.int64)[None, :]
            _, _, logits = self._logits(w, ctx)
            logits = logits[0]
            token, chosen = _choose(logits, temperature, top_k, top_p, rng)
            out.append(token)
            logprobs.append(float(_log_softmax(logits[None, :])[0, token]))
            sampling.append(math.log(chosen))
            window.append(token)
            if any(out[-len(s) :] == s for s in stops if len(s) <= len(out)):
                return out, logprobs, "stop", sampling
        return out, logprobs, "length", sampling


class Adam:
    """AdamW as Tinker's ``AdamParams`` describe it; its state goes into every checkpoint.

    Bias-corrected moments, decoupled weight decay (``p -= lr * wd * p`` before the Adam
    update, as ``torch.optim.AdamW``), and optional clipping of the global gradient norm.
    """

    def __init__(self, params: Mapping[str, np.ndarray]) -> None:
        self.t = 0
        self.m = {k: np.zeros_like(v, dtype=np.float64) for k, v in params.items()}
        self.v = {k: np.zeros_like(v, dtype=np.float64) for k, v in params.items()}

    def apply(
        self,
        params: dict[str, np.ndarray],
        grads: Mapping[str, np.ndarray] | None,
        *,
        learning_rate: float,
        beta1: float = 0.9,
        beta2: float = 0.95,
        eps: float = 1e-12,
        weight_decay: float = 0.0,
        grad_clip_norm: float = 0.0,
    ) -> dict[str, float]:
        """One step, updating ``params`` in place.

        A parameter without a gradient (``grads`` None: no forward_backward since the last
        step) is not touched — no moment decay, no weight decay, no step count — as
        ``torch.optim.AdamW`` skips parameters whose ``.grad`` is None."""
        if set(params) != set(self.m):
            raise ValueError(
                f"optimizer state is for {sorted(self.m)}, parameters are {sorted(params)}"
            )
        if grads is not None and set(grads) != set(params):
            # The model produces all of its gradients or none; a partial set is a bug.
            raise ValueError(f"gradients for {sorted(grads)}, parameters are {sorted(params)}")
        for name, value in (
            ("learning_rate", learning_rate),
            ("beta1", beta1),
            ("beta2", beta2),
            ("eps", eps),
            ("weight_decay", weight_decay),
            ("grad_clip_norm", grad_clip_norm),
        ):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"adam_params.{name} must be a finite number >= 0, got {value}")
        if beta1 >= 1 or beta2 >= 1:
            raise ValueError(f"adam_params.beta1/beta2 must be < 1, got {beta1}, {beta2}")
        if grads is None:
            return {
                "grad_norm:mean": 0.0,
                "grad_norm_clipped:mean": 0.0,
                "learning_rate:mean": float(learning_rate),
                "step:max": float(self.t),
                "skipped_no_gradient:sum": 1.0,
            }
        names = sorted(params)
        g = {}
        for name in names:
            g[name] = np.asarray(grads[name])
            if g[name].shape != params[name].shape:
                raise ValueError(
                    f"gradient {name} has shape {g[name].shape}, expected {params[name].shape}"
                )
        grad_norm = math.sqrt(sum(float(np.vdot(g[n], g[n])) for n in names))
        if not math.isfinite(grad_norm):
            raise ValueError("gradients are not finite")
        scale = 1.0
        if grad_clip_norm > 0.0 and grad_norm > grad_clip_norm:
            scale = grad_clip_norm / grad_norm
        self.t += 1
        c1 = 1.0 - beta1**self.t
        c2 = 1.0 - beta2**self.t
        for name in names:
            grad = g[name] * scale if scale != 1.0 else g[name]
            m, v, p = self.m[name], self.v[name], params[name]
            m *= beta1
            m += (1.0 - beta1) * grad
            v *= beta2
            v += (1.0 - beta2) * (grad * grad)
            if weight_decay:
                p *= 1.0 - learning_rate * weight_decay
            p -= learning_rate * (m / c1) / (np.sqrt(v / c2) + eps)
        return {
            "grad_norm:mean": grad_norm,
            "grad_norm_clipped:mean": grad_norm * scale,
            "learning_rate:mean": float(learning_rate),
            "step:max": float(self.t),
        }

    def state(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {"t": np.array(self.t, dtype=np.int64)}
        for name in self.m:
            out[f"m/{name}"] = self.m[name].copy()
            out[f"v/{name}"] = self.v[name].copy()
        return out

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        expected = {"t", *(f"m/{n}" for n in self.m), *(f"v/{n}" for n in self.v)}
        if set(arrays) != expected:
            raise ValueError(
                f"optimizer checkpoint has arrays {sorted(arrays)}, expected {sorted(expected)}"
            )
        for name in self.m:
            for kind, store in (("m", self.m), ("v", self.v)):
                arr = np.array(arrays[f"{kind}/{name}"], dtype=np.float64, copy=True)
                if arr.shape != store[name].shape:
                    raise ValueError(f"optimizer array {kind}/{name} has shape {arr.shape}")
                store[name] = arr
        self.t = int(arrays["t"])


# --------------------------------------------------------------------- helpers


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _scatter_add_rows(out: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    """out[rows[i]] += values[i], summing each row's contributions in their given order.

    A stable sort groups the contributions per row and ``reduceat`` sums each group; about
    three times faster than ``np.add.at`` here, with the same fixed order every run.
    """
    order = np.argsort(rows, kind="stable")
    sorted_rows = rows[order]
    starts = np.flatnonzero(np.r_[True, sorted_rows[1:] != sorted_rows[:-1]])
    out[sorted_rows[starts]] += np.add.reduceat(values[order], starts, axis=0)


def _zero_grads(w: Mapping[str, np.ndarray], *, full: bool) -> dict[str, np.ndarray]:
    # LoRA freezes the embedding and biases: only the two matrices' gradients are needed.
    names = ("embed", "w1", "b1", "w2", "b2") if full else ("w1", "w2")
    return {name: np.zeros_like(w[name]) for name in names}


def _as_tokens(tokens: Any, field: str) -> np.ndarray:
    arr = np.asarray(tokens)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"{field} must be a flat list of token ids, got shape {arr.shape}")
    if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{field} must hold integer token ids, got {arr.dtype}")
    arr = arr.astype(np.int64)
    bad = (arr < 0) | (arr >= VOCAB_SIZE)
    if bad.any():
        raise ValueError(
            f"{field} has token id {int(arr[bad][0])} outside the vocabulary [0, {VOCAB_SIZE})"
        )
    return arr


def _blocks(n: int) -> list[slice]:
    return [slice(start, min(start + CHUNK, n)) for start in range(0, n, CHUNK)]


def _target_positions(targets: Sequence[np.ndarray]) -> np.ndarray | None:
    """The position (in the concatenated datums) of every target, or None when every datum
    has one target a position (then targets are positions)."""
    if all(t.ndim == 1 for t in targets):
        return None
    out, start = [], 0
    for t in targets:
        k = t.shape[1] if t.ndim == 2 else 1
        out.append(np.repeat(np.arange(start, start + len(t)), k))
        start += len(t)
    return np.concatenate(out)


def _cells(pos: np.ndarray, sl: slice) -> slice:
    """The targets of the positions in ``sl`` (``pos`` is non-decreasing: a contiguous run)."""
    lo, hi = np.searchsorted(pos, [sl.start, sl.stop])
    return slice(int(lo), int(hi))


def _check_datums(datums: Sequence[Datum]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each datum's input tokens and target tokens, checked: ``[T]``, one target a position,
    or ``[T, K]``, K targets a position (the losses say which they take)."""
    tokens: list[np.ndarray] = []
    targets: list[np.ndarray] = []
    for index, (raw_tokens, raw_inputs) in enumerate(datums):
        where = f"datum {index}"
        toks = _as_tokens(raw_tokens, f"{where}: model_input")
        if len(toks) == 0:
            raise losses.LossError(f"{where}: model_input has no tokens")
        if "target_tokens" not in raw_inputs:
            raise losses.LossError(f"{where}: loss_fn_inputs is missing 'target_tokens'")
        field = f"{where}: loss_fn_inputs['target_tokens']"
        raw = np.asarray(raw_inputs["target_tokens"])
        shape = list(raw.shape)
        if raw.ndim == 2:
            if raw.shape[0] != len(toks) or raw.shape[1] < 1:
                raise losses.LossError(
                    f"{field} has shape {shape}, expected [{len(toks)}, K] with K >= 1 "
                    "(K targets per input token)"
                )
            target = _as_tokens(raw.reshape(-1), field).reshape(raw.shape)
        else:
            target = _as_tokens(raw, field)
            if target.shape != toks.shape:
                raise losses.LossError(
                    f"{field} has shape {shape}, expected [{len(toks)}] (one target per input "
                    f"token) or [{len(toks)}, K] (K targets per input token)"
                )
        tokens.append(toks)
        targets.append(target)
    return tokens, targets


def _choose(
    logits: np.ndarray, temperature: float, top_k: int, top_p: float, rng: np.random.Generator
) -> tuple[int, float]:
    """The drawn token and its probability under the distribution it was drawn from."""
    # The RNG is drawn exactly once per token whatever the settings, so a seed's stream of
    # draws does not depend on where a sequence stops.
    u = rng.random()
    if temperature == 0.0:
        return int(np.argmax(logits)), 1.0
    # Candidates by descending logit, ties by token id (stable sort): fully deterministic.
    order = np.argsort(-logits, kind="stable")
    if top_k > 0:
        order = order[:top_k]
    z = logits[order] / temperature
    p = np.exp(z - z[0])
    p /= p.sum()
    if top_p < 1.0:
        # Nucleus: the smallest prefix whose mass reaches top_p (always at least one token).
        keep = (np.cumsum(p) - p) < top_p
        order, p = order[keep], p[keep]
        p = p / p.sum()
    index = min(int(np.searchsorted(np.cumsum(p), u, side="right")), len(order) - 1)
    return int(order[index]), float(p[index])
