"""Training loops are Tinker loops, registered with the workers by name.

A loop is an object with ``async step(ctx, step) -> loss`` (one optimizer step: call
``ctx.training_client.forward_backward(...)``, ``.optim_step(...)``, sampling … exactly as
with the tinker SDK) and, optionally, ``async evaluate(ctx) -> {metric: value}`` with the
names it reports declared as ``metrics = ("reward", ...)`` (a job tracking another
``checkpoint.metric`` is then refused before any trainer exists); a bare
``async def (ctx, step)`` is a loop without its own evaluation (the built-in one's
``eval_loss`` is used). ``ctx.training_client`` has
the tinker SDK's ``TrainingClient`` methods and types (:mod:`shepherd.tinker_client`).

Loops run inside the training activity and get every guarantee of the lifecycle, on two
conditions: a step is a deterministic function of ``(ctx, step)`` (seed any sampling from
``step``), and it awaits what it submitted before returning. Then a retried or resumed
step re-sends the same operations with the same ``seq_id``s and the trainer applies each
exactly once.

Where loops come from (a spec names one; nothing is imported from a spec):

* built in: ``supervised``;
* the ``shepherd.loops`` entry-point group of installed packages;
* the worker's ``SHEPHERD_LOOPS`` environment variable:
  ``name=package.module:attr,other=/abs/path/file.py:attr``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from shepherd import datasets
from shepherd.spec import BUILTIN_LOOP_METRICS, LOOP_NAME

ENTRY_POINT_GROUP = "shepherd.loops"
ENV_VAR = "SHEPHERD_LOOPS"
#: Held-out records evaluated at most (a forward pass each; bounded cost per checkpoint).
MAX_EVAL_RECORDS = 64


@dataclass
class LoopContext:
    #: The Tinker training client of this job's model (see module docstring).
    training_client: Any
    dataset: str
    batch_size: int
    micro_batches: int
    seed: int
    learning_rate: float
    max_context_length: int
    validation_split: float
    total_steps: int
    #: Loop-private cache (a loaded dataset, a tokenizer), kept for the activity attempt.
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def tokenizer(self) -> Any:
        if "tokenizer" not in self.cache:
            self.cache["tokenizer"] = self.training_client.get_tokenizer()
        return self.cache["tokenizer"]


@runtime_checkable
class Loop(Protocol):
    async def step(self, ctx: LoopContext, step: int) -> float | None: ...


class LoopLoadError(ValueError):
    pass


class _FunctionLoop:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    async def step(self, ctx: LoopContext, step: int) -> float | None:
        return await self.fn(ctx, step)


# ------------------------------------------------------------------ the built-in loop


def to_datum(tokenizer: Any, example: datasets.Example, max_len: int) -> dict[str, Any] | None:
    """A next-token datum: weights 1 on the completion (and its end token), 0 on the prompt.
    JSON-dialect form, which the training client passes through as it is."""
    prompt = tokenizer.encode(example.prompt, add_special_tokens=False) if example.prompt else []
    completion = tokenizer.encode(example.completion, add_special_tokens=False)
    eos = tokenizer.eos_token_id
    tokens = prompt + completion + ([eos] if eos is not None else [])
    weights = [0.0] * len(prompt) + [1.0] * (len(tokens) - len(prompt))
    tokens, weights = tokens[: max_len + 1], weights[: max_len + 1]
    if len(tokens) < 2 or not any(weights[1:]):
        return None
    n = len(tokens) - 1
    return {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": tokens[:-1]}]},
        "loss_fn_inputs": {
            "target_tokens": {"data": tokens[1:], "dtype": "int64", "shape": [n]},
            "weights": {"data": weights[1:], "dtype": "float32", "shape": [n]},
        },
    }


def _weight(datum: dict[str, Any]) -> float:
    return float(sum(datum["loss_fn_inputs"]["weights"]["data"]))


_TOKENIZED: dict[tuple[str, float, int, str], Any] = {}


def _tokenized(
    dataset: str, validation_split: float, max_len: int, tokenizer_name: str, tokenizer: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) datums, cached per worker process: every chunk activity of every
    job on the same data would otherwise tokenize it again."""
    key = (dataset, validation_split, max_len, tokenizer_name)
    if key not in _TOKENIZED:
        try:
            train, val = datasets.split(datasets.load(dataset), validation_split)
        except datasets.DatasetError as exc:
            raise LoopLoadError(f"training.dataset: {exc}") from None
        if len(_TOKENIZED) >= 8:
            _TOKENIZED.pop(next(iter(_TOKENIZED)))
        _TOKENIZED[key] = (
            [d for d in (to_datum(tokenizer, e, max_len) for e in train) if d],
            [d for d in (to_datum(tokenizer, e, max_len) for e in val[:MAX_EVAL_RECORDS]) if d],
        )
    return _TOKENIZED[key]


class Supervised:
    """SFT: micro-batches of the dataset's records, cross-entropy on completion tokens,
    then one Adam step. Batches are a pure function of ``(seed, step, micro_batch)``."""

    metrics = BUILTIN_LOOP_METRICS["supervised"]

    def _data(self, ctx: LoopContext) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        if "datums" not in ctx.cache:
            ctx.cache["datums"] = _tokenized(
                ctx.dataset,
                ctx.validation_split,
                ctx.max_context_length,
                ctx.training_client.tokenizer_name,
                ctx.tokenizer,
            )
        return ctx.cache["datums"]

    async def step(self, ctx: LoopContext, step: int) -> float:
        train, _ = self._data(ctx)
        tc = ctx.training_client
        batches = []
        # ``batch_size`` records per step, split over the micro-batches (the first ones
        # take the remainder): each is one forward_backward, their gradients add up.
        per, extra = divmod(ctx.batch_size, ctx.micro_batches)
        for mb in range(ctx.micro_batches):
            rng = np.random.default_rng([ctx.seed, step, mb])
            size = per + (1 if mb < extra else 0)
            batches.append([train[int(i)] for i in rng.integers(0, len(train), size=size)])
        # Everything is submitted before anything is awaited: the calls pipeline.
        futures = [tc.forward_backward(batch, "cross_entropy") for batch in batches]
        optim = tc.optim_step({"learning_rate": ctx.learning_rate})
        results = [await f for f in futures]
        await optim
        loss = sum(float(r.metrics.get("loss:sum", 0.0)) for r in results)
        weight = sum(_weight(d) for batch in batches for d in batch)
        return loss / weight if weight else loss

    async def evaluate(self, ctx: LoopContext) -> dict[str, float]:
        """Mean per-token cross-entropy on the held-out records (a forward pass)."""
        _, val = self._data(ctx)
        result = await ctx.training_client.forward(val, "cross_entropy")
        weight = sum(_weight(d) for d in val)
        loss = float(result.metrics.get("loss:sum", 0.0))
        return {"eval_loss": loss / weight if weight else loss}


BUILTIN: dict[str, Loop] = {"supervised": Supervised()}


# --------------------------------------------------------------------------- registry


def _parse_env(value: str) -> dict[str, str]:
    refs: dict[str, str] = {}
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        name, sep, ref = item.partition("=")
        name, ref = name.strip(), ref.strip()
        if not sep or not LOOP_NAME.match(name) or ":" not in ref:
            raise LoopLoadError(
                f"{ENV_VAR}: {item!r} must be name=package.module:attr or name=/path/file.py:attr"
            )
        refs[name] = ref
    return refs


def registered(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every loop this worker knows: name -> where it comes from."""
    env = os.environ if env is None else env
    refs = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    refs.update(_parse_env(env.get(ENV_VAR, "")))
    # Built-in names cannot be taken over: a spec saying "supervised" means Shepherd's loop.
    refs.update({name: "built in" for name in BUILTIN})
    return refs


def _import(ref: str) -> Any:
    target, _, attr = ref.rpartition(":")
    if target.endswith(".py"):
        path = Path(target)
        spec = importlib.util.spec_from_file_location(f"shepherd_loop_{path.stem}", path)
        if spec is None or spec.loader is None or not path.is_file():
            raise LoopLoadError(f"loop file {target} cannot be read on this worker")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    obj = getattr(module, attr, None)
    if obj is None:
        raise LoopLoadError(f"{target} has no attribute {attr!r}")
    return obj


def _as_loop(obj: Any, name: str) -> Loop:
    if inspect.isclass(obj):
        obj = obj()
    if isinstance(obj, Loop):
        return obj
    if inspect.iscoroutinefunction(obj):
        return _FunctionLoop(obj)
    raise LoopLoadError(
        f"loop {name!r} is neither an object with 'async step(ctx, step)' nor an async function"
    )


def declared_metrics(loop: Loop) -> tuple[str, ...] | None:
    """The metrics ``loop``'s evaluation reports: as it declares them (``metrics``), the
    built-in evaluation's for a loop without one, None when it does not say."""
    declared = getattr(loop, "metrics", None)
    if isinstance(declared, list | tuple | set | frozenset) and all(
        isinstance(m, str) for m in declared
    ):
        return tuple(declared)
    if getattr(loop, "evaluate", None) is None:
        return BUILTIN_LOOP_METRICS["supervised"]
    return None


def resolve(name: str, env: Mapping[str, str] | None = None) -> Loop:
    """The loop registered as ``name`` on this worker."""
    if name in BUILTIN:
        return BUILTIN[name]
    refs = registered(env)
    if name not in refs:
        raise LoopLoadError(
            f"training.loop: no loop {name!r} is registered on this worker (known: "
            f"{', '.join(sorted(refs))}); register it with {ENV_VAR}=name=module:attr or the "
            f"{ENTRY_POINT_GROUP!r} entry-point group"
        )
    try:
        return _as_loop(_import(refs[name]), name)
    except LoopLoadError:
        raise
    except Exception as exc:  # an import error in user code, reported, never a crash
        raise LoopLoadError(
            f"training.loop: loop {name!r} ({refs[name]}) failed to load: {type(exc).__name__}: {exc}"
        ) from None
