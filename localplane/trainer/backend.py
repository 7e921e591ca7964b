"""The seam between what the Tinker API promises and what a model computes.

The service (sessions, sequencing, futures, checkpoints, sampling bookkeeping) talks to the
model only through :class:`Backend`: it hands over validated inputs and gets arrays back.
localplane runs :class:`~localplane.trainer.numpy_backend.NumpyBackend`, a small byte-level
LM in NumPy; a backend for a real model (torch, JAX) implements the same methods and the
routes, futures and checkpoint handling stay as they are (SkyRL's tx/tinker keeps the same
seam: api → engine → backends).

Every method runs on the trainer's one compute thread, so a backend needs no locking.
Errors in the inputs are raised as ``ValueError`` whose message names the field; the service
fails the operation's future with category ``user``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shepherd.tinker_wire.values import Datum


@dataclass(frozen=True)
class LoraSettings:
    """``create_model``'s ``lora_config`` (rank 0: full-parameter training)."""

    rank: int = 0
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True
    #: LoRA's alpha: the adapter is scaled by alpha / rank (None: 1, i.e. alpha = rank).
    alpha: float | None = None


@dataclass(frozen=True)
class AdamSettings:
    learning_rate: float
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


@dataclass(frozen=True)
class SampleSettings:
    """A validated sampling request, as a backend samples it."""

    prompt: list[int]
    num_samples: int
    max_tokens: int
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    #: Token sequences that end a sample (None: EOS only; []: nothing, not even EOS).
    stop: list[list[int]] | None = None
    prompt_logprobs: bool = False
    prompt_logprobs_last_n: int | None = None
    #: The k most likely tokens at every scored prompt position (0: not asked for).
    topk_prompt_logprobs: int = 0


@dataclass
class Exported:
    """A model's checkpointable state: ``config`` rebuilds an identical model elsewhere."""

    config: dict[str, Any]
    params: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray] | None
    digest: str
    base_model: str
    lora_rank: int


@dataclass
class Sampled:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str


@dataclass
class PromptTopk:
    """The ``k`` most likely next tokens at prompt positions ``first ..``: row ``i`` of the
    ``[n, k]`` arrays is position ``first + i``, most likely first."""

    first: int
    token_ids: np.ndarray
    logprobs: np.ndarray


@dataclass
class ForwardResult:
    outputs: list[dict[str, np.ndarray]]
    metrics: dict[str, float]
    extra: dict[str, Any] = field(default_factory=dict)


class Trainable(ABC):
    """A model being trained: weights, optimizer state and accumulated gradients."""

    #: What it was built from (base model, rank, targets), in the backend's terms.
    config: dict[str, Any]
    base_model: str
    lora_rank: int


class SamplerWeights(ABC):
    """Frozen weights to sample from (a snapshot, a checkpoint, or the base model)."""

    base_model: str


class Backend(ABC):
    #: Token ids a model of this backend takes: [0, vocab_size).
    vocab_size: int

    @abstractmethod
    def describe(self, base_model: str, lora: LoraSettings) -> dict[str, Any]:
        """The model config ``create`` would build; raises ValueError naming the setting it
        cannot honour (e.g. a LoRA target the architecture lacks)."""

    @abstractmethod
    def estimate_bytes(self, config: Mapping[str, Any], *, trainable: bool) -> int:
        """Memory a model (with optimizer state and gradients) or a sampler takes."""

    @abstractmethod
    def sampler_bytes(self, weights: SamplerWeights) -> int:
        """Memory a sampler takes."""

    @abstractmethod
    def create(self, config: Mapping[str, Any], seed: int) -> Trainable: ...

    @abstractmethod
    def restore(self, exported: Exported, *, with_optimizer: bool, seed: int) -> Trainable:
        """A new model from a checkpoint (optimizer state too when asked)."""

    @abstractmethod
    def load_into(self, model: Trainable, exported: Exported, *, with_optimizer: bool) -> None:
        """Overwrite a model's weights (and optimizer state) from a checkpoint of the same
        architecture; pending gradients are dropped."""

    @abstractmethod
    def forward_backward(
        self,
        model: Trainable,
        datums: Sequence[Datum],
        loss_fn: str,
        loss_fn_config: Mapping[str, Any] | None,
        *,
        backward: bool,
    ) -> ForwardResult:
        """Per-datum outputs and metrics; with ``backward`` the gradients accumulate in the
        model until :meth:`optim_step`."""

    @abstractmethod
    def optim_step(
        self, model: Trainable, adam: AdamSettings, normalization: str | None
    ) -> dict[str, float]:
        """Apply the accumulated gradients (normalised as asked) and clear them."""

    @abstractmethod
    def digest(self, model: Trainable | SamplerWeights) -> str:
        """sha256 identity of the trainable weights: equal iff bit-identical."""

    @abstractmethod
    def info(self, model: Trainable) -> dict[str, Any]:
        """Facts for get_info: ``arch``, ``trainable_parameters``."""

    @abstractmethod
    def export(self, model: Trainable, *, with_optimizer: bool) -> Exported: ...

    @abstractmethod
    def snapshot(self, model: Trainable) -> SamplerWeights:
        """Frozen copy of the current weights (later training does not change it)."""

    @abstractmethod
    def sampler_from(self, exported: Exported) -> SamplerWeights: ...

    @abstractmethod
    def base_sampler(self, base_model: str) -> SamplerWeights: ...

    @abstractmethod
    def sample(self, weights: SamplerWeights, settings: SampleSettings, seed: int) -> list[Sampled]:
        """``settings.num_samples`` samples; the same arguments give the same samples."""

    @abstractmethod
    def prompt_logprobs(
        self, weights: SamplerWeights, tokens: Sequence[int], last_n: int | None
    ) -> list[float | None]: ...

    @abstractmethod
    def prompt_topk(
        self, weights: SamplerWeights, tokens: Sequence[int], k: int, last_n: int | None
    ) -> PromptTopk:
        """The top-``k`` log-probabilities at every prompt position but the first (the last
        ``last_n`` only, when given)."""

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Text to token ids (stop strings in sampling parameters)."""
