"""Hyperparameter sweeps: a base job spec, a parameter space and a search method; trials
are ordinary job workflows (children of the sweep workflow) with every lifecycle guarantee.

    name: lr-sweep
    base: quickstart.yaml            # or `spec:` inline
    parameters:
      trainer.learning_rate: {type: double, min: 0.001, max: 0.03, scale: log}
      trainer.lora_rank:     {type: int, min: 4, max: 16, step: 4}
      training.batch_size:   {type: categorical, values: [16, 32]}
    method: random                   # grid | random | bayes (Optuna TPE, asked from an activity)
    max_trials: 6
    parallelism: 2
    metric: eval_loss
    goal: minimize
    early_stopping: {type: median, min_trials: 2, min_step: 20}
    promote_best: {model_id: lr-sweep-best}

Everything here is pure and deterministic: the sweep workflow imports it.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from shepherd.platform import rules
from shepherd.spec import (
    JOB_NAME,
    Float,
    Int,
    JobSpec,
    SpecError,
    SpecModel,
    SpecProblem,
    load_spec_data,
    problems_from,
    validate_spec,
)


class DoubleParam(SpecModel):
    type: Literal["double"]
    min: Float
    max: Float
    scale: Literal["linear", "log"] = "linear"
    #: Points per axis for grid search.
    grid_points: Int = Field(default=3, ge=2, le=100)

    @model_validator(mode="after")
    def _range(self) -> DoubleParam:
        if self.min >= self.max:
            raise ValueError(f"min ({self.min}) must be < max ({self.max})")
        if self.scale == "log" and self.min <= 0:
            raise ValueError("a log scale needs min > 0")
        return self

    def sample(self, rng: random.Random) -> float:
        if self.scale == "log":
            return math.exp(rng.uniform(math.log(self.min), math.log(self.max)))
        return rng.uniform(self.min, self.max)

    def grid(self) -> list[float]:
        n = self.grid_points
        if self.scale == "log":
            lo, hi = math.log(self.min), math.log(self.max)
            return [math.exp(lo + (hi - lo) * i / (n - 1)) for i in range(n)]
        return [self.min + (self.max - self.min) * i / (n - 1) for i in range(n)]


class IntParam(SpecModel):
    type: Literal["int"]
    min: Int
    max: Int
    step: Int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _range(self) -> IntParam:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self

    def values(self) -> list[int]:
        return list(range(self.min, self.max + 1, self.step))

    def sample(self, rng: random.Random) -> int:
        return rng.choice(self.values())

    def grid(self) -> list[int]:
        return self.values()


class CategoricalParam(SpecModel):
    type: Literal["categorical"]
    values: list[Any] = Field(min_length=1)

    def sample(self, rng: random.Random) -> Any:
        return rng.choice(self.values)

    def grid(self) -> list[Any]:
        return list(self.values)


Param = Annotated[DoubleParam | IntParam | CategoricalParam, Field(discriminator="type")]


class EarlyStopping(SpecModel):
    """The median stopping rule: a trial whose metric at a checkpoint is worse than the
    median of the other trials' metrics at the same step is stopped."""

    type: Literal["median"] = "median"
    #: Other trials that must have reported at that step before any is stopped.
    min_trials: Int = Field(default=3, ge=1)
    #: No trial is stopped before this step (its early checkpoints are noisy).
    min_step: Int = Field(default=0, ge=0)


class PromoteBest(SpecModel):
    model_id: str


class SweepSpec(SpecModel):
    name: str
    base: JobSpec
    parameters: dict[str, Param] = Field(min_length=1)
    method: Literal["grid", "random", "bayes"] = "random"
    max_trials: Int = Field(default=10, ge=1, le=1000)
    parallelism: Int = Field(default=2, ge=1, le=100)
    metric: str = "eval_loss"
    goal: Literal["minimize", "maximize"] = "minimize"
    early_stopping: EarlyStopping | None = None
    promote_best: PromoteBest | None = None
    seed: Int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> SweepSpec:
        if not JOB_NAME.match(self.name) or len(self.name) > 30:
            raise ValueError("name: must be 1-30 characters of a-z, 0-9 and '-'")
        if self.metric != self.base.checkpoint.metric:
            raise ValueError(
                f"metric: {self.metric!r} must be the base spec's checkpoint.metric ({self.base.checkpoint.metric!r})"
            )
        if not self.base.checkpoint.evaluate:
            raise ValueError(
                "base.checkpoint.evaluate: trials must evaluate their checkpoints to be compared"
            )
        for path in self.parameters:
            try:
                trial_spec(self, 0, {path: self._probe(path)})
            except SpecError as exc:
                raise ValueError(f"parameters.{path}: {exc.problems[0]}") from None
        if self.promote_best is not None and (
            problem := rules.check_resource_id(self.promote_best.model_id)
        ):
            raise ValueError(f"promote_best.model_id: {problem}")
        return self

    def _probe(self, path: str) -> Any:
        param = self.parameters[path]
        return param.grid()[0]

    @property
    def minimize(self) -> bool:
        return self.goal == "minimize"


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    node = data
    *parents, leaf = path.split(".")
    for part in parents:
        if not isinstance(node.get(part), dict):
            raise SpecError(
                [SpecProblem(field=path, rule=f"{part} is not a section of a job spec")]
            )
        node = node[part]
    node[leaf] = value


def trial_spec(sweep: SweepSpec, index: int, params: dict[str, Any]) -> JobSpec:
    """The job spec of trial ``index``: the base spec with ``params`` applied; the sweep
    promotes the best trial itself, so trials promote nothing."""
    data = sweep.base.model_dump(mode="json")
    for path, value in params.items():
        _set(data, path, value)
    data["name"] = f"{sweep.name}-t{index}"
    data["labels"] = {**data.get("labels", {}), "sweep": sweep.name, "trial": str(index)}
    data["output"] = {**data.get("output", {}), "promote": "none", "model_id": None}
    # Lenient: the sweep workflow builds its trials (see validate_spec); the base spec was
    # held to a submission's rules when the sweep was submitted.
    return validate_spec(data, strict=False)


def grid_points(sweep: SweepSpec) -> list[dict[str, Any]]:
    names = sorted(sweep.parameters)
    axes = [sweep.parameters[n].grid() for n in names]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*axes)]


def random_point(sweep: SweepSpec, index: int) -> dict[str, Any]:
    rng = random.Random(f"{sweep.seed}/{index}")  # reproducible per (seed, trial)
    return {name: sweep.parameters[name].sample(rng) for name in sorted(sweep.parameters)}


def better(a: float, b: float, *, minimize: bool) -> bool:
    return a < b if minimize else a > b


def should_stop(
    rule: EarlyStopping, metric: float, step: int, others_at_step: list[float], *, minimize: bool
) -> bool:
    """The median stopping rule for one report."""
    if step < rule.min_step or len(others_at_step) < rule.min_trials:
        return False
    median = statistics.median(others_at_step)
    return better(median, metric, minimize=minimize)


def load_sweep(path: str | Path, *, overrides: list[str] | None = None) -> SweepSpec:
    """A sweep file: ``base:`` (a spec path, relative to the file) or ``spec:`` (inline)."""
    path = Path(path)
    data = load_spec_data(path)
    return validate_sweep(data, base_dir=path.parent, source=str(path), overrides=overrides)


def validate_sweep(
    data: dict[str, Any],
    *,
    base_dir: Path | None = None,
    source: str | None = None,
    overrides: list[str] | None = None,
) -> SweepSpec:
    from shepherd.spec import apply_override

    data = dict(data)
    base = data.pop("base", None)
    inline = data.pop("spec", None)
    if (base is None) == (inline is None):
        raise SpecError(
            [
                SpecProblem(
                    field="base", rule="give either base: <spec file> or spec: <inline spec>"
                )
            ],
            source,
        )
    if base is not None:
        if isinstance(base, dict):
            base_data = base
        else:
            base_path = Path(base)
            if not base_path.is_absolute() and base_dir is not None:
                base_path = base_dir / base_path
            base_data = load_spec_data(base_path)
    else:
        base_data = inline
    for item in overrides or []:
        apply_override(base_data, item)
    try:
        base_spec = validate_spec(base_data)
    except SpecError as exc:
        raise SpecError(
            [SpecProblem(field=f"base.{p.field}", rule=p.rule) for p in exc.problems], source
        ) from None
    try:
        # Unless the sweep says, its metric and goal are what its trials keep as "best"
        # (a program's job measures train_loss, not the loops' eval_loss).
        given = {
            "metric": base_spec.checkpoint.metric,
            "goal": "minimize" if base_spec.checkpoint.mode == "min" else "maximize",
            **data,
        }
        return SweepSpec.model_validate({**given, "base": base_spec})
    except ValidationError as exc:
        raise SpecError(problems_from(exc), source) from None


# ------------------------------------------------------------------------------ status


class TrialState(BaseModel):
    index: int
    params: dict[str, Any]
    workflow_id: str
    #: pending | running | completed | failed | stopped | cancelled
    state: str = "pending"
    metric: float | None = None
    step: int = 0
    #: The metric reported at each evaluated checkpoint (step -> value).
    reports: dict[int, float] = Field(default_factory=dict)
    best_checkpoint: str | None = None
    best_trainer_job_id: str | None = None
    error: str | None = None


class SweepStatus(BaseModel):
    workflow_id: str = ""
    name: str = ""
    #: RUNNING | COMPLETED | FAILED | CANCELLED
    phase: str = "RUNNING"
    method: str = ""
    metric: str = ""
    goal: str = ""
    max_trials: int = 0
    parallelism: int = 0
    trials: list[TrialState] = Field(default_factory=list)
    best: int | None = None
    model: str | None = None
    error: str | None = None

    @property
    def best_trial(self) -> TrialState | None:
        return None if self.best is None else self.trials[self.best]


class SweepInput(BaseModel):
    sweep: SweepSpec


class SuggestInput(BaseModel):
    """What the Bayesian sampler needs to propose trial ``index``."""

    parameters: dict[str, Param]
    minimize: bool
    seed: int
    index: int
    #: Finished trials: their parameters and metric.
    history: list[tuple[dict[str, Any], float]] = Field(default_factory=list)
