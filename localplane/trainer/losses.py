"""Every built-in loss of the Tinker API, in one place: its inputs, its ``loss_fn_config``
options, its per-token value and derivative, and its metrics (trainer-api.md §7).

A loss here is a function of the per-token log-probabilities ``lp`` of the target tokens;
the model turns ``d loss / d lp`` into parameter gradients. Terms the hosted service writes
with a stop-gradient (``sg[...]``: CISPO's clipped ratio, GSPO's sequence ratio,
StableReinforce's truncated ratio) are evaluated at ``frozen`` — the log-probabilities of
the forward pass, i.e. ``lp`` itself in training. Passing other ``lp`` with the same
``frozen`` gives the *surrogate* whose gradient at ``lp == frozen`` is the loss's gradient,
which is what the unit tests check by finite differences.

Losses are sums over tokens (Tinker defines them so; callers normalise via advantages,
weights, or ``grad_accumulation_normalization``). Behaviour log-probabilities ``q`` are the
``logprobs`` input: the sampler's, as the client recorded them, or — for StableReinforce
with provenance — as the trainer recorded them when it sampled (the caller resolves the
spans before the loss sees the datum).

Formulas follow the hosted service's documentation where it publishes one
(cross_entropy, importance_sampling, ppo, cispo, dro, gspo). StableReinforce's is not
published; localplane's is stated at :func:`_stable_reinforce` and in docs/trainer-api.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: What the surrogate returns: per-token loss, d loss / d lp, metrics.
Evaluated = tuple[np.ndarray, np.ndarray, dict[str, float]]


class LossError(ValueError):
    """A loss request that cannot be evaluated as sent; the message names the field."""


@dataclass(frozen=True)
class Option:
    default: float
    low: float = 0.0
    #: Whether ``low`` itself is allowed (β, κ may be 0; a ratio cap may not).
    low_inclusive: bool = True


@dataclass(frozen=True)
class LossSpec:
    name: str
    #: Per-token loss_fn_inputs it requires (target_tokens always).
    required: tuple[str, ...]
    #: Optional per-token inputs and their default fill values (None: derived, see the loss).
    optional: Mapping[str, float | None] = field(default_factory=dict)
    #: loss_fn_config options.
    options: Mapping[str, Option] = field(default_factory=dict)
    evaluate: Callable[..., Evaluated] | None = None
    #: Whether it uses the recorded sampled sequences (provenance) when a datum names them.
    uses_provenance: bool = False
    #: Whether it takes ``target_tokens`` of shape ``[T, K]`` (K targets a position, each
    #: with its own per-target inputs of the same shape): distillation's soft targets.
    multi_target: bool = False


@dataclass
class Batch:
    """Every datum's per-token fields concatenated, with the datum boundaries."""

    fields: dict[str, np.ndarray]
    #: ``bounds[i]:bounds[i+1]`` are datum ``i``'s positions.
    bounds: np.ndarray
    config: dict[str, float]

    def segments(self) -> list[slice]:
        return [
            slice(int(a), int(b)) for a, b in zip(self.bounds[:-1], self.bounds[1:], strict=True)
        ]


# ------------------------------------------------------------------------ the losses


def _cross_entropy(lp: np.ndarray, b: Batch, frozen: np.ndarray) -> Evaluated:
    # Per target: with [T, K] targets, -sum_{t,k} w[t,k] * log p(target[t,k] | t).
    w = b.fields["weights"]
    loss = -w * lp
    return loss, -w, {"loss:sum": float(loss.sum())}


def _ratio(frozen: np.ndarray, b: Batch) -> np.ndarray:
    return np.exp(frozen - b.fields["logprobs"])


def _importance_sampling(lp: np.ndarray, b: Batch, frozen: np.ndarray) -> Evaluated:
    # loss = -exp(lp - q) * A; its derivative is the same expression.
    adv = b.fields["advantages"]
    ratio = np.exp(lp - b.fields["logprobs"])
    loss = -ratio * adv
    return loss, loss.copy(), {"loss:sum": float(loss.sum())}


def _ppo(lp: np.ndarray, b: Batch, frozen: np.ndarray) -> Evaluated:
    # -min(r A, clip(r) A) token by token. Where the clipped term is the smaller one it is
    # constant in lp (no gradient); on a tie inside the clip range the unclipped term carries it.
    adv = b.fields["advantages"]
    ratio = np.exp(lp - b.fields["logprobs"])
    low, high = b.fields["clip_low_threshold"], b.fields["clip_high_threshold"]
    clipped = np.clip(ratio, low, high)
    unclipped_obj, clipped_obj = ratio * adv, clipped * adv
    use_unclipped = unclipped_obj <= clipped_obj
    loss = -np.where(use_unclipped, unclipped_obj, clipped_obj)
    grad = np.where(use_unclipped, -unclipped_obj, 0.0)
    return loss, grad, {"loss:sum": float(loss.sum()), "clip_frac:mean": _frac(~use_unclipped, adv)}


def _cispo(lp: np.ndarray, b: Batch, frozen: np.ndarray) -> Evaluated:
    # -sg[clip(r, lo, hi)] * lp * A.
    adv = b.fields["advantages"]
    ratio = _ratio(frozen, b)
    lo, hi = b.config["clip_low_threshold"], b.config["clip_high_threshold"]
    coeff = np.clip(ratio, lo, hi)
    loss = -coeff * lp * adv
    clipped = (ratio < lo) | (ratio > hi)
    return (
        loss,
        -coeff * adv,
        {"loss:sum": float(loss.sum()), "clip_frac:mean": _frac(clipped, adv)},
    )


def _dro(lp: np.ndarray, b: Batch, frozen: np.ndarray) -> Evaluated:
    # -(lp * A - beta/2 * (lp - q)^2).
    adv, q, beta = b.fields["advantages"], b.fields["logprobs"], b.config["beta"]
    diff = lp - q
    loss = -(lp * adv - 0.5 * beta * diff * diff)
    return loss, -adv + beta * diff, {"loss:sum": float(loss.sum())}


def _gspo(lp: np.ndarray, b: Batch, frozen: np.ndarray) -> Evaluated:
    # GSPO-token: every token carries the sequence ratio s (the geometric mean of the token
    # ratios over sequence_ratio_mask, a stop-gradient) times exp(lp - sg[lp]), then PPO's
    # clipped objective. d s_t / d lp_t = s_t, so each token's gradient is local.
    adv, q = b.fields["advantages"], b.fields["logprobs"]
    mask = b.fields["sequence_ratio_mask"] != 0
    lo, hi = b.config["clip_low_threshold"], b.config["clip_high_threshold"]
    seq_ratio = np.empty_like(lp)
    for seg in b.segments():
        m = mask[seg]
        log_ratio = float(np.mean((frozen[seg] - q[seg])[m])) if m.any() else 0.0
        seq_ratio[seg] = math.exp(log_ratio)
    s_t = seq_ratio * np.exp(lp - frozen)
    clipped = np.clip(s_t, lo, hi)
    unclipped_obj, clipped_obj = s_t * adv, clipped * adv
    use_unclipped = unclipped_obj <= clipped_obj
    loss = -np.where(use_unclipped, unclipped_obj, clipped_obj)
    inside = (s_t > lo) & (s_t < hi)
    grad = np.where(use_unclipped | inside, -s_t * adv, 0.0)
    return (
        loss,
        grad,
        {
            "loss:sum": float(loss.sum()),
            "clip_frac:mean": _frac(~use_unclipped, adv),
            "sequence_ratio:mean": float(np.mean(seq_ratio)) if len(seq_ratio) else 1.0,
        },
    )


def _stable_reinforce(lp: np.ndarray, b: Batch, frozen: np.ndarray) -> Evaluated:
    # localplane's StableReinforce: REINFORCE weighted by the truncated importance ratio
    # against the behaviour policy as it really sampled (sg[min(exp(lp - q), max_ratio)]), plus
    # an optional quadratic pull towards the sampler (kl_coeff/2 * (lp - q)^2):
    #   loss_t = -sg[min(r_t, max_ratio)] * A_t * lp_t + kl_coeff/2 * (lp_t - q_t)^2
    # On-policy (r = 1) it is plain REINFORCE; off-policy, truncation bounds every token's
    # weight, which is what keeps it stable when sampler and learner numerics differ.
    adv, q = b.fields["advantages"], b.fields["logprobs"]
    cap, kl = b.config["max_ratio"], b.config["kl_coeff"]
    ratio = _ratio(frozen, b)
    coeff = np.minimum(ratio, cap)
    diff = lp - q
    loss = -coeff * adv * lp + 0.5 * kl * diff * diff
    grad = -coeff * adv + kl * diff
    return (
        loss,
        grad,
        {
            "loss:sum": float(loss.sum()),
            "clip_frac:mean": _frac(ratio > cap, adv),
            "kl:sum": float((0.5 * diff * diff)[adv != 0].sum()),
        },
    )


def _frac(flags: np.ndarray, adv: np.ndarray) -> float:
    """Share of trained tokens (non-zero advantage) where ``flags`` holds."""
    trained = adv != 0
    return float(flags[trained].mean()) if trained.any() else 0.0


_CLIP = {
    "clip_low_threshold": Option(0.8),
    "clip_high_threshold": Option(1.2),
}
_RL = ("target_tokens", "logprobs", "advantages")

LOSSES: dict[str, LossSpec] = {
    spec.name: spec
    for spec in (
        LossSpec(
            "cross_entropy",
            ("target_tokens",),
            {"weights": 1.0},
            {},
            _cross_entropy,
            multi_target=True,
        ),
        LossSpec("importance_sampling", _RL, {}, {}, _importance_sampling),
        LossSpec(
            "ppo",
            _RL,
            # Per-datum thresholds (scalar or per token) override the config's.
            {"clip_low_threshold": None, "clip_high_threshold": None},
            _CLIP,
            _ppo,
        ),
        LossSpec("cispo", _RL, {}, _CLIP, _cispo),
        # β has no published default; 0.05 is the value the hosted docs' example uses.
        LossSpec("dro", _RL, {}, {"beta": Option(0.05)}, _dro),
        LossSpec("gspo", _RL, {"sequence_ratio_mask": None}, _CLIP, _gspo),
        LossSpec(
            "stable_reinforce",
            _RL,
            {},
            {"kl_coeff": Option(0.0), "max_ratio": Option(2.0, low_inclusive=False)},
            _stable_reinforce,
            uses_provenance=True,
        ),
    )
}

#: Loss names the Tinker API defines that this trainer does not run, and why.
REFUSED = {
    "custom": "server-side custom losses (ServiceClient.create_custom_loss) are not supported; "
    "run the loss client-side with forward_backward_custom",
}


# ----------------------------------------------------------------------- validation


def spec(loss_fn: Any) -> LossSpec:
    if loss_fn in REFUSED:
        raise LossError(f"loss_fn: {loss_fn!r}: {REFUSED[loss_fn]}")
    found = LOSSES.get(loss_fn) if isinstance(loss_fn, str) else None
    if found is None:
        raise LossError(f"loss_fn: {loss_fn!r} is not supported; supported: {sorted(LOSSES)}")
    return found


def config(s: LossSpec, raw: Mapping[str, Any] | None) -> dict[str, float]:
    """The loss's options, defaults filled in; an unknown or bad option is refused."""
    raw = dict(raw or {})
    unknown = sorted(set(raw) - set(s.options))
    if unknown:
        supported = sorted(s.options) or "none"
        raise LossError(
            f"loss_fn_config.{unknown[0]}: not an option of {s.name} (its options: {supported})"
        )
    out: dict[str, float] = {}
    for name, opt in s.options.items():
        value = raw.get(name, opt.default)
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise LossError(f"loss_fn_config.{name}: must be a number, got {value!r}")
        try:
            number = float(value)
        except ValueError:
            raise LossError(f"loss_fn_config.{name}: must be a number, got {value!r}") from None
        ok = number >= opt.low if opt.low_inclusive else number > opt.low
        if not math.isfinite(number) or not ok:
            bound = f">= {opt.low:g}" if opt.low_inclusive else f"> {opt.low:g}"
            raise LossError(
                f"loss_fn_config.{name}: must be a finite number {bound}, got {value!r}"
            )
        out[name] = number
    if "clip_low_threshold" in out and out["clip_low_threshold"] > out["clip_high_threshold"]:
        raise LossError("loss_fn_config.clip_low_threshold: exceeds clip_high_threshold")
    return out


def _float_field(
    inputs: Mapping[str, np.ndarray], name: str, shape: tuple[int, ...], where: str
) -> np.ndarray:
    """A per-target input, checked to have the targets' ``shape``, flattened row-major."""
    arr = np.asarray(inputs[name])
    if arr.dtype.kind not in "fiu":
        raise LossError(f"{where}: loss_fn_inputs[{name!r}] must be numeric, got {arr.dtype}")
    arr = arr.astype(np.float64)
    if arr.shape != shape:
        per = "one value per input token" if len(shape) == 1 else "the shape of target_tokens"
        raise LossError(
            f"{where}: loss_fn_inputs[{name!r}] has shape {list(arr.shape)}, "
            f"expected {list(shape)} ({per})"
        )
    if not np.all(np.isfinite(arr)):
        raise LossError(f"{where}: loss_fn_inputs[{name!r}] has non-finite values")
    return arr.reshape(-1)


def _clip_field(
    inputs: Mapping[str, np.ndarray], name: str, length: int, where: str, fallback: float
) -> np.ndarray:
    if name not in inputs:
        return np.full(length, fallback)
    arr = np.asarray(inputs[name], dtype=np.float64)
    if arr.size == 1:
        arr = np.full(length, float(arr.reshape(-1)[0]))
    if arr.shape != (length,) or not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise LossError(
            f"{where}: loss_fn_inputs[{name!r}] must be one finite value >= 0 or one per token"
        )
    return arr


def batch(
    s: LossSpec,
    targets: Sequence[np.ndarray],
    inputs: Sequence[Mapping[str, np.ndarray]],
    cfg: dict[str, float],
) -> Batch:
    """The loss's per-target fields for every datum (targets already checked by the model;
    a ``[T, K]`` datum's fields are ``[T, K]`` too, flattened row-major like its targets)."""
    known = set(s.required) | set(s.optional)
    per_datum: dict[str, list[np.ndarray]] = {name: [] for name in known - {"target_tokens"}}
    lengths = []
    for index, (target, raw) in enumerate(zip(targets, inputs, strict=True)):
        where = f"datum {index}"
        if target.ndim != 1 and not s.multi_target:
            multi = sorted(n for n, spec in LOSSES.items() if spec.multi_target)
            raise LossError(
                f"{where}: loss_fn_inputs['target_tokens'] has shape {list(target.shape)}: "
                f"several targets per position ([T, K]) are supported by {', '.join(multi)} "
                f"only, not {s.name}; send one target per position"
            )
        t = len(target)
        lengths.append(target.size)
        for name in s.required:
            if name != "target_tokens" and name not in raw:
                raise LossError(f"{where}: {s.name} needs loss_fn_inputs[{name!r}]")
        for name in per_datum:
            if s.name == "ppo" and name in ("clip_low_threshold", "clip_high_threshold"):
                per_datum[name].append(_clip_field(raw, name, t, where, cfg[name]))
            elif name in raw:
                per_datum[name].append(_float_field(raw, name, target.shape, where))
            elif name == "sequence_ratio_mask":
                # Not sent (cookbook 0.5.8 does not): the sampled tokens are the ones trained on.
                adv = _float_field(raw, "advantages", target.shape, where)
                per_datum[name].append((adv != 0) * 1.0)
            else:
                fill = s.optional[name]
                assert fill is not None
                per_datum[name].append(np.full(target.size, fill))
        if s.name == "ppo" and np.any(
            per_datum["clip_low_threshold"][-1] > per_datum["clip_high_threshold"][-1]
        ):
            raise LossError(f"{where}: clip_low_threshold exceeds clip_high_threshold")
    fields = {name: np.concatenate(arrays) for name, arrays in per_datum.items()}
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return Batch(fields, bounds, cfg)


def evaluate(s: LossSpec, lp: np.ndarray, b: Batch, frozen: np.ndarray | None = None) -> Evaluated:
    """Per-token loss, ``d loss / d lp`` and metrics; ``frozen`` defaults to ``lp``."""
    assert s.evaluate is not None
    return s.evaluate(lp, b, lp if frozen is None else frozen)
