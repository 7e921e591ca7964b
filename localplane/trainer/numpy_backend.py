"""The backend every localplane trainer runs: the byte-level stand-in LM of
:mod:`localplane.trainer.lm`, trained with the losses of :mod:`localplane.trainer.losses`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from localplane.trainer import lm
from localplane.trainer.backend import (
    AdamSettings,
    Backend,
    Exported,
    ForwardResult,
    LoraSettings,
    PromptTopk,
    Sampled,
    SamplerWeights,
    SampleSettings,
    Trainable,
)
from shepherd.tinker_wire.values import Datum

#: float64 everywhere (bit-reproducible): 8 bytes a number.
_BYTES = 8


class NumpyModel(Trainable):
    def __init__(self, net: lm.CausalLM) -> None:
        self.net = net
        self.adam = lm.Adam(net.params)
        #: Gradients summed since the last optim_step, and what they were summed over.
        self.grads: dict[str, np.ndarray] | None = None
        self.grad_tokens = 0
        self.grad_sequences = 0

    @property
    def config(self) -> dict[str, Any]:  # type: ignore[override]
        return dataclasses.asdict(self.net.cfg)

    @property
    def base_model(self) -> str:  # type: ignore[override]
        return self.net.cfg.base_model

    @property
    def lora_rank(self) -> int:  # type: ignore[override]
        return self.net.cfg.lora_rank

    def clear_grads(self) -> None:
        self.grads, self.grad_tokens, self.grad_sequences = None, 0, 0


class NumpySampler(SamplerWeights):
    def __init__(self, net: lm.CausalLM) -> None:
        self.net = net

    @property
    def base_model(self) -> str:  # type: ignore[override]
        return self.net.cfg.base_model


def _lm_config(config: Mapping[str, Any]) -> lm.LMConfig:
    try:
        return lm.LMConfig(**config)
    except TypeError as exc:
        raise ValueError(f"not a localplane model config: {exc}") from None


def _loss_tokens(inputs: Mapping[str, np.ndarray]) -> int:
    """Positions that carry loss: non-zero weights (supervised), non-zero advantages (RL),
    or every position when there are neither. A position with K targets ([T, K] weights)
    is one token, however many of its targets carry weight."""
    for name in ("weights", "advantages"):
        if name in inputs:
            arr = np.asarray(inputs[name])
            if arr.ndim == 2:
                return int(np.count_nonzero(arr.any(axis=1)))
            return int(np.count_nonzero(arr))
    target = inputs.get("target_tokens")
    return int(np.shape(target)[0]) if target is not None and np.ndim(target) else 0


class NumpyBackend(Backend):
    vocab_size = lm.VOCAB_SIZE

    def describe(self, base_model: str, lora: LoraSettings) -> dict[str, Any]:
        if lora.rank and not (lora.train_mlp or lora.train_unembed):
            raise ValueError(
                "lora_config: train_mlp and train_unembed are both false: the model has nothing "
                "to adapt (it has no attention layers, so train_attn alone trains nothing)"
            )
        cfg = lm.LMConfig(
            base_model,
            lora_rank=lora.rank,
            train_mlp=lora.train_mlp if lora.rank else True,
            train_unembed=lora.train_unembed if lora.rank else True,
            lora_alpha=lora.alpha if lora.rank else None,
        )
        return dataclasses.asdict(cfg)

    def estimate_bytes(self, config: Mapping[str, Any], *, trainable: bool) -> int:
        cfg = _lm_config(config)
        # Weights, plus Adam's two moments and the gradient sum for a model being trained.
        copies = 4 if trainable else 1
        return _BYTES * (copies * cfg.n_parameters() + cfg.n_frozen())

    def sampler_bytes(self, weights: SamplerWeights) -> int:
        assert isinstance(weights, NumpySampler)
        return self.estimate_bytes(dataclasses.asdict(weights.net.cfg), trainable=False)

    def create(self, config: Mapping[str, Any], seed: int) -> NumpyModel:
        return NumpyModel(lm.CausalLM(_lm_config(config), seed=seed))

    def restore(self, exported: Exported, *, with_optimizer: bool, seed: int) -> NumpyModel:
        model = self.create(exported.config, seed)
        self.load_into(model, exported, with_optimizer=with_optimizer)
        return model

    def load_into(self, model: Trainable, exported: Exported, *, with_optimizer: bool) -> None:
        assert isinstance(model, NumpyModel)
        if _lm_config(exported.config) != model.net.cfg:
            raise ValueError(
                f"the checkpoint was saved by a different model "
                f"({_lm_config(exported.config).stand_in} from {exported.base_model!r}); this "
                f"model is {model.net.cfg.stand_in} from {model.base_model!r}"
            )
        adam = lm.Adam(model.net.params)
        if with_optimizer:
            if exported.optimizer is None:
                raise ValueError(
                    "the checkpoint holds sampler weights only (no optimizer state); load it "
                    "with optimizer=false, or load a save_weights checkpoint"
                )
            adam.load_state(exported.optimizer)
        model.net.load_state(exported.params)
        model.adam = adam
        model.clear_grads()

    def forward_backward(
        self,
        model: Trainable,
        datums: Sequence[Datum],
        loss_fn: str,
        loss_fn_config: Mapping[str, Any] | None,
        *,
        backward: bool,
    ) -> ForwardResult:
        assert isinstance(model, NumpyModel)
        pairs = [(d.tokens, d.inputs) for d in datums]
        outputs, metrics, grads = model.net.forward_backward(
            pairs, loss_fn, loss_fn_config, backward=backward
        )
        if grads is not None:
            if model.grads is None:
                model.grads = grads
            else:
                model.grads = {k: model.grads[k] + g for k, g in grads.items()}
            model.grad_sequences += len(datums)
            model.grad_tokens += sum(_loss_tokens(d.inputs) for d in datums)
        return ForwardResult(outputs, metrics)

    def optim_step(
        self, model: Trainable, adam: AdamSettings, normalization: str | None
    ) -> dict[str, float]:
        assert isinstance(model, NumpyModel)
        grads = model.grads
        if grads is not None and normalization in ("num_loss_tokens", "num_sequences"):
            # The Fireworks SDK's grad_accumulation_normalization: its hosted trainers divide
            # the summed gradients before clipping.
            n = model.grad_tokens if normalization == "num_loss_tokens" else model.grad_sequences
            if n > 0:
                grads = {k: g / n for k, g in grads.items()}
        metrics = model.adam.apply(
            model.net.params,
            grads,
            learning_rate=adam.learning_rate,
            beta1=adam.beta1,
            beta2=adam.beta2,
            eps=adam.eps,
            weight_decay=adam.weight_decay,
            grad_clip_norm=adam.grad_clip_norm,
        )
        model.clear_grads()
        return metrics

    def digest(self, model: Trainable | SamplerWeights) -> str:
        assert isinstance(model, NumpyModel | NumpySampler)
        return model.net.digest()

    def info(self, model: Trainable) -> dict[str, Any]:
        assert isinstance(model, NumpyModel)
        return {"arch": model.net.cfg.stand_in, "trainable_parameters": model.net.n_trainable()}

    def export(self, model: Trainable, *, with_optimizer: bool) -> Exported:
        assert isinstance(model, NumpyModel)
        cfg = model.net.cfg
        return Exported(
            config=dataclasses.asdict(cfg),
            params=model.net.state(),
            optimizer=model.adam.state() if with_optimizer else None,
            digest=model.net.digest(),
            base_model=cfg.base_model,
            lora_rank=cfg.lora_rank,
        )

    def snapshot(self, model: Trainable) -> NumpySampler:
        assert isinstance(model, NumpyModel)
        copy = lm.CausalLM(model.net.cfg)
        copy.load_state(model.net.state())
        return NumpySampler(copy)

    def sampler_from(self, exported: Exported) -> NumpySampler:
        net = lm.CausalLM(_lm_config(exported.config))
        net.load_state(exported.params)
        return NumpySampler(net)

    def base_sampler(self, base_model: str) -> NumpySampler:
        return NumpySampler(lm.CausalLM(lm.LMConfig(base_model)))

    def sample(self, weights: SamplerWeights, settings: SampleSettings, seed: int) -> list[Sampled]:
        assert isinstance(weights, NumpySampler)
        out = []
        for i in range(settings.num_samples):
            tokens, logprobs, reason = weights.net.sample(
                settings.prompt,
                max_tokens=settings.max_tokens,
                temperature=settings.temperature,
                top_k=settings.top_k,
                top_p=settings.top_p,
                stop=settings.stop,
                seed=(seed + i) % (1 << 64),
            )
            out.append(Sampled(tokens, logprobs, reason))
        return out

    def prompt_logprobs(
        self, weights: SamplerWeights, tokens: Sequence[int], last_n: int | None
    ) -> list[float | None]:
        assert isinstance(weights, NumpySampler)
        return weights.net.prompt_logprobs(tokens, last_n)

    def prompt_topk(
        self, weights: SamplerWeights, tokens: Sequence[int], k: int, last_n: int | None
    ) -> PromptTopk:
        assert isinstance(weights, NumpySampler)
        first, ids, logprobs = weights.net.prompt_topk(tokens, k, last_n)
        return PromptTopk(first, ids, logprobs)

    def encode(self, text: str) -> list[int]:
        return lm.encode(text)
