"""Every input a trainer takes is checked here, one function per kind of input, each error
naming the field and the rule (trainer-api.md §7 lists what is refused and why).

What a trainer does not support is refused, never ignored: an optimizer other than Adam, a
LoRA setting the model cannot honour, top-k sample logprobs, server-side custom losses … each is a
:class:`~localplane.trainer.errors.UserError` naming the field and what is supported. The
service answers those at submission as a 400 (:func:`as_http`), before anything is queued;
checks that need the model (datum contents) fail the operation's future instead.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

from localplane import limits
from localplane.errors import InvalidArgument, shorten
from localplane.trainer import losses
from localplane.trainer.backend import AdamSettings, LoraSettings, SampleSettings
from localplane.trainer.errors import UserError
from shepherd.platform import rules
from shepherd.tinker_wire import values
from shepherd.tinker_wire.errors import WireError

#: Most samples one request may ask for (what the hosted sampler takes per request).
MAX_NUM_SAMPLES = 1024
#: Most top-k prompt logprobs a request may ask for: distillation recipes ask for 20 (vLLM's
#: default cap); the answer holds prompt length x k pairs until it is retrieved.
MAX_TOPK_PROMPT_LOGPROBS = 64
#: max_tokens when a request leaves it out (Tinker's default is the model's context; a
#: byte-level model's full context is a long string of noise, so a line's worth instead).
DEFAULT_MAX_TOKENS = 64
#: ttl_seconds: positive, at most ten years (what the hosted REST API accepts).
MAX_TTL_S = 10 * 366 * 24 * 3600
ADAM_FIELDS = frozenset(
    {"learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm", "type"}
)
#: The Fireworks fork's grad-norm telemetry switch: metrics are reported whatever it says.
ADAM_TELEMETRY = frozenset({"emit_grad_norm_metrics"})
NORMALIZATIONS = (None, "none", "num_loss_tokens", "num_sequences")
SAMPLER_CHECKPOINT_TYPES = (None, "base", "delta")


@contextlib.contextmanager
def as_http() -> Iterator[None]:
    """Answer a refused input at submission: a 400 INVALID_ARGUMENT naming the field."""
    try:
        yield
    except (UserError, WireError, losses.LossError) as exc:
        raise InvalidArgument(str(exc)) from None


# -------------------------------------------------------------------------- scalars


def text(body: Mapping[str, Any], name: str, *, required: bool = True) -> str | None:
    value = body.get(name)
    if value is None or value == "":
        if required:
            raise UserError(f"{name}: is required")
        return None
    if not isinstance(value, str):
        raise UserError(f"{name}: must be a string, got {shorten(value)}")
    return value


def integer(
    body: Mapping[str, Any], name: str, *, required: bool = False, low: int | None = None
) -> int | None:
    value = body.get(name)
    if value is None:
        if required:
            raise UserError(f"{name}: is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{name}: must be an integer, got {shorten(value)}")
    if low is not None and value < low:
        raise UserError(f"{name}: must be >= {low}, got {value}")
    return value


def number(body: Mapping[str, Any], name: str, default: float, *, where: str = "") -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UserError(f"{where}{name}: must be a finite number, got {shorten(value)}")
    return float(value)


def flag(body: Mapping[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise UserError(f"{name}: must be true or false, got {shorten(value)}")
    return value


def user_metadata(value: Any, where: str = "user_metadata") -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{where}: must be an object of strings")
    if len(value) > limits.MAX_METADATA_ENTRIES:
        raise UserError(f"{where}: at most {limits.MAX_METADATA_ENTRIES} entries, got {len(value)}")
    out = {}
    for key, item in value.items():
        if not isinstance(item, str) and item is not None:
            item = str(item) if isinstance(item, int | float | bool) else None
            if item is None:
                raise UserError(f"{where}.{shorten(key, 40)}: must be a string")
        if item is None:
            continue
        if len(key) > limits.MAX_METADATA_CHARS or len(item) > limits.MAX_METADATA_CHARS:
            raise UserError(
                f"{where}.{shorten(key, 40)}: keys and values are at most "
                f"{limits.MAX_METADATA_CHARS} characters"
            )
        out[key] = item
    return out


def ttl_seconds(body: Mapping[str, Any], name: str = "ttl_seconds") -> int | None:
    value = integer(body, name)
    if value is not None and not 0 < value <= MAX_TTL_S:
        raise UserError(f"{name}: must be in [1, {MAX_TTL_S}] seconds (or null: never expires)")
    return value


def base_model(value: Any, served: str, where: str = "base_model") -> str:
    if value is None:
        return served
    if value != served:
        raise UserError(f"{where}: this trainer serves {shorten(served)!r}, not {shorten(value)!r}")
    return served


# --------------------------------------------------------------------- model setup


def lora(raw: Any) -> LoraSettings:
    """``lora_config`` (absent or rank 0: full-parameter training)."""
    if raw is None:
        return LoraSettings()
    if not isinstance(raw, dict):
        raise UserError("lora_config: must be an object {rank, ...}")
    rank = integer(raw, "rank", low=0) or 0
    if rank > rules.MAX_LORA_RANK:
        raise UserError(f"lora_config.rank: must be at most {rules.MAX_LORA_RANK}, got {rank}")
    init = raw.get("init_method")
    if init not in (None, "kaiming"):
        raise UserError(
            f"lora_config.init_method: {shorten(init)!r} is not supported; supported: kaiming"
        )
    alpha = raw.get("alpha")
    if alpha is not None and (
        isinstance(alpha, bool) or not isinstance(alpha, int | float) or alpha <= 0
    ):
        raise UserError("lora_config.alpha: must be a positive number (or null: alpha = rank)")
    return LoraSettings(
        rank=rank,
        train_mlp=flag(raw, "train_mlp", True),
        train_attn=flag(raw, "train_attn", True),
        train_unembed=flag(raw, "train_unembed", True),
        alpha=float(alpha) if alpha is not None and rank else None,
    )


def optimizer_config(raw: Any) -> None:
    """``create_model``'s ``optimizer_config``: the optimizer a model keeps for life."""
    if raw is None:
        return
    kind = raw.get("type") if isinstance(raw, dict) else raw
    if kind not in ("adamw", "adam"):
        raise UserError(
            f"optimizer_config.type: {shorten(kind)!r} is not supported by this trainer; "
            "supported: adamw"
        )


def seed(raw: Mapping[str, Any], default: int) -> int:
    value = integer(raw, "seed")
    return default if value is None else value


def refuse_set(body: Mapping[str, Any], names: Mapping[str, str]) -> None:
    """Refuse fields this trainer does not implement when they are set to anything but
    their neutral value (absent, null, 0, false)."""
    for name, why in names.items():
        value = body.get(name)
        if value not in (None, 0, False, "", [], {}):
            raise UserError(f"{name}: {why}")


# ------------------------------------------------------------------------ training


def loss(inp: Mapping[str, Any], where: str) -> tuple[losses.LossSpec, dict[str, float]]:
    """The loss and its options, checked at submission (unknown or unsupported: a 400)."""
    spec = losses.spec(inp.get("loss_fn", "cross_entropy"))
    raw = inp.get("loss_fn_config")
    if raw is not None and not isinstance(raw, dict):
        raise UserError(f"{where}.loss_fn_config: must be an object")
    try:
        return spec, losses.config(spec, raw)
    except losses.LossError as exc:
        raise UserError(f"{where}.{exc}") from None


def forward_input(body: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(field name, {data, loss_fn, loss_fn_config})`` of a forward/forward_backward body."""
    key = "forward_backward_input" if "forward_backward_input" in body else "forward_input"
    inp = body.get(key, body)
    if not isinstance(inp, dict):
        raise UserError(f"{key}: must be an object {{data, loss_fn, loss_fn_config}}")
    return key, inp


def datums(inp: Mapping[str, Any], key: str, *, vocab: int, max_len: int) -> list[values.Datum]:
    return values.datums(inp.get("data"), f"{key}.data", vocab=vocab, max_len=max_len)


def adam(body: Mapping[str, Any], default_lr: float) -> AdamSettings:
    """``optim_step``'s optimizer parameters: Adam(W) only."""
    field = next(
        (n for n in ("adam_params", "optim_params", "optimizer_params") if body.get(n) is not None),
        "adam_params",
    )
    params = body.get(field) or {}
    if not isinstance(params, dict):
        raise UserError(f"{field}: must be an object")
    kind = params.get("type")
    if kind not in (None, "adam", "adamw"):
        raise UserError(
            f"{field}.type: {shorten(kind)!r} is not supported by this trainer (it runs AdamW "
            "only); send AdamParams"
        )
    unknown = sorted(set(params) - ADAM_FIELDS - ADAM_TELEMETRY)
    if unknown:
        raise UserError(
            f"{field}.{shorten(unknown[0], 60)}: not an AdamW parameter; supported: "
            + ", ".join(sorted(ADAM_FIELDS - {"type"}))
        )
    where = f"{field}."
    out = AdamSettings(
        learning_rate=number(params, "learning_rate", default_lr, where=where),
        beta1=number(params, "beta1", 0.9, where=where),
        beta2=number(params, "beta2", 0.95, where=where),
        eps=number(params, "eps", 1e-12, where=where),
        weight_decay=number(params, "weight_decay", 0.0, where=where),
        grad_clip_norm=number(params, "grad_clip_norm", 0.0, where=where),
    )
    for name in ("learning_rate", "eps", "weight_decay"):
        if getattr(out, name) < 0:
            raise UserError(f"{where}{name}: must be >= 0")
    if not (0 <= out.beta1 < 1 and 0 <= out.beta2 < 1):
        raise UserError(f"{where}beta1/beta2: must be in [0, 1)")
    return out


def normalization(body: Mapping[str, Any]) -> str | None:
    mode = body.get("grad_accumulation_normalization")
    if mode not in NORMALIZATIONS:
        raise UserError(
            "grad_accumulation_normalization: must be num_loss_tokens, num_sequences or none"
        )
    return mode


def sampler_save(body: Mapping[str, Any]) -> None:
    """A sampler save's extras (tinker's ``kind``, the Fireworks fork's checkpoint type and
    export settings): what this trainer can honour."""
    if body.get("kind") not in (None, "snapshot"):
        raise UserError(
            f"kind: {shorten(body.get('kind'))!r} sampling clients are not supported; supported: "
            "snapshot (fixed weights)"
        )
    kind = body.get("checkpoint_type")
    if kind not in SAMPLER_CHECKPOINT_TYPES:
        raise UserError(
            f"checkpoint_type: {shorten(kind)!r} is not supported; supported: base, delta "
            "(every sampler checkpoint is saved whole)"
        )
    refuse_set(
        body,
        {
            "export_precision": "is not supported (checkpoints keep the model's own precision)",
            "metadata": "sampler checkpoint metadata is not supported",
        },
    )


# ------------------------------------------------------------------------ sampling


def sampling(
    body: Mapping[str, Any], *, vocab: int, max_context: int, encode: Any
) -> SampleSettings:
    """An ``asample`` request's prompt and parameters."""
    refuse_set(
        body,
        {
            "topk_sample_logprobs": "top-k sample logprobs are not supported",
            "target_prompt_logprobs": "target prompt logprobs are not supported",
            "prompt_alt_tokens_k": "prompt alternative-token draws are not supported",
        },
    )
    n = integer(body, "num_samples", low=1)
    n = 1 if n is None else n
    if n > MAX_NUM_SAMPLES:
        raise UserError(f"num_samples: must be in [1, {MAX_NUM_SAMPLES}], got {n}")
    prompt = values.model_input_tokens(body.get("prompt"), "prompt")
    if not prompt:
        raise UserError("prompt: has no tokens")
    if min(prompt) < 0 or max(prompt) >= vocab:
        raise UserError(f"prompt: token ids must be in [0, {vocab})")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise UserError("sampling_params: must be an object")
    room = max_context - len(prompt)
    max_tokens = integer(params, "max_tokens", low=0)
    max_tokens = min(DEFAULT_MAX_TOKENS, max(room, 0)) if max_tokens is None else max_tokens
    if max_tokens > room:
        raise UserError(
            f"sampling_params.max_tokens: {len(prompt)} prompt tokens + {max_tokens} exceed "
            f"max_context_length {max_context}"
        )
    temperature = number(params, "temperature", 1.0, where="sampling_params.")
    if temperature < 0:
        raise UserError("sampling_params.temperature: must be >= 0")
    top_p = number(params, "top_p", 1.0, where="sampling_params.")
    if not 0 < top_p <= 1:
        raise UserError("sampling_params.top_p: must be in (0, 1]")
    top_k = integer(params, "top_k")
    top_k = -1 if top_k is None or top_k == 0 else top_k  # 0: no limit, as the Fireworks API says
    if top_k < -1:
        raise UserError("sampling_params.top_k: must be -1 (no limit) or a positive integer")
    integer(params, "seed")
    stop = values.stop_sequences(params.get("stop"), encode, "sampling_params.stop")
    want_prompt = flag(body, "prompt_logprobs")
    last_n = integer(body, "prompt_logprobs_last_n", low=1)
    if last_n is not None:
        if not want_prompt:
            raise UserError("prompt_logprobs_last_n: needs prompt_logprobs")
        if last_n > len(prompt) - 1:
            raise UserError(
                f"prompt_logprobs_last_n: must be in [1, {len(prompt) - 1}] (prompt length - 1)"
            )
    topk = integer(body, "topk_prompt_logprobs", low=0) or 0
    most = min(MAX_TOPK_PROMPT_LOGPROBS, vocab)
    if topk > most:
        raise UserError(f"topk_prompt_logprobs: must be in [0, {most}] (0: none), got {topk}")
    flag(body, "record_stability_info")
    return SampleSettings(
        prompt=prompt,
        num_samples=n,
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        stop=stop,
        prompt_logprobs=want_prompt,
        prompt_logprobs_last_n=last_n,
        topk_prompt_logprobs=topk,
    )
