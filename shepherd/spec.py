"""The job spec: one pydantic model, loaded from YAML/JSON or built in Python, validated
before anything is provisioned (design.md, "The job spec").

Every rule the platform would reject is checked here with the platform's own rules
(:mod:`shepherd.platform.rules`), plus Shepherd's own. A spec that breaks rules raises
:class:`SpecError`, which lists every problem as ``field: rule``.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from shepherd import datasets
from shepherd.names import LOOP_NAME, PROGRAM_ARG_KEY, PROGRAM_NAME
from shepherd.platform import rules

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

# ------------------------------------------------------------------ sane bounds
#
# A submission holds every duration to at most MAX_DURATION: a year is longer than any
# job, wait or timeout Shepherd has a use for, and far inside what Temporal's timers hold
# ("100000000d" was accepted and broke Temporal's timeout fields). Any duration is finite
# and fits a timedelta (".inf" or "99999999999999999999d" ended in an OverflowError).
MAX_DURATION = timedelta(days=365)
#: The shortest value of each policy that a healthy trainer can meet. Below them a job
#: would hold a trainer only to time out: the creation, the boot or the first step.
MIN_POLICY: dict[str, timedelta] = {
    # Waiting for a capacity slot: a busy platform places a job in seconds at best.
    "pending_timeout": timedelta(seconds=10),
    # From slot to RUNNING: a trainer's boot takes seconds even on localplane.
    "ready_timeout": timedelta(seconds=10),
    # Warm-up: consecutive probes spaced by policies.WARMUP_PROBE_SPACING, and the route
    # race on top.
    "warmup_timeout": timedelta(seconds=10),
    # One optimizer step's call also waits for the trainer's queue and the network: 1 s
    # is the least a step of the smallest model meets on an idle trainer.
    "step_timeout": timedelta(seconds=1),
    # Heartbeats are sent every quarter of it; below 1 s they would be most of the load.
    "heartbeat_timeout": timedelta(seconds=1),
    # Polling faster than once a second only loads the platform (and Temporal).
    "poll_interval": timedelta(seconds=1),
}
#: The shortest max_runtime: a job needs about a minute to get a trainer and train at all.
MIN_MAX_RUNTIME = timedelta(minutes=1)

_DURATION_RULE = "must be a duration such as '90s', '15m' or '48h'"


def _seconds_of(value: Any) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool):
        raise PydanticCustomError("duration", _DURATION_RULE)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        parts = _DURATION_PART.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sum(float(n) * _UNITS[u] for n, u in parts)
        if re.fullmatch(r"\d+(\.\d+)?", text):
            return float(text)
    raise PydanticCustomError("duration", _DURATION_RULE)


def parse_duration(value: Any) -> timedelta:
    """``90``, ``"90s"``, ``"15m"``, ``"1h30m"``, ``"48h"``, ``"2d"`` or a timedelta;
    finite (a submission also holds it to :data:`MAX_DURATION`, see "sane bounds")."""
    seconds = _seconds_of(value)
    if not math.isfinite(seconds) or abs(seconds) > timedelta.max.total_seconds():
        raise PydanticCustomError(
            "duration", f"must be finite and at most {MAX_DURATION.days}d (a year)"
        )
    return value if isinstance(value, timedelta) else timedelta(seconds=seconds)


def format_duration(td: timedelta) -> str:
    seconds = td.total_seconds()
    if seconds and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
]


def _not_bool(value: Any) -> Any:
    # pydantic reads true/false as 1/0 where a number is meant (``total_steps: true``).
    if isinstance(value, bool):
        raise PydanticCustomError("bool_number", "must be a number, not true/false")
    return value


#: Every number in a spec: an int or float field refuses true/false.
Int = Annotated[int, BeforeValidator(_not_bool)]
Float = Annotated[float, BeforeValidator(_not_bool)]


class SpecModel(BaseModel):
    """Strict about names (a typo is an error, not a silently ignored field), and about
    numbers: NaN and infinities are refused, and so are true/false (fields typed
    :data:`Int` / :data:`Float`)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False, allow_inf_nan=False)


TEMPLATE_MARK = "{scheduled_time"
#: The only placeholders a template may hold: ``{scheduled_time}`` or
#: ``{scheduled_time:<strftime>}``. Nothing else is expanded (no attributes, no indexing,
#: no conversions), so a spec cannot reach into Python objects through a template.
_PLACEHOLDER = re.compile(r"\{scheduled_time(?::([^{}]*))?\}")


def is_template(value: Any) -> bool:
    """A string filled per run by a schedule (``nightly-{scheduled_time:%Y%m%d}``)."""
    return isinstance(value, str) and TEMPLATE_MARK in value


def _control_characters(value: str) -> bool:
    return any(not ch.isprintable() for ch in value)


def _rule(check: Any) -> Any:
    """A field validator from a platform rule check (returns None or the broken rule).
    Templates are checked once resolved (see :func:`resolve_templates`). Every value these
    checks cover is a name or an id: one line, without control characters."""

    def validate(value: Any) -> Any:
        if isinstance(value, str) and _control_characters(value):
            raise PydanticCustomError(
                "platform_rule", "must be one line without control characters"
            )
        if value is not None and not is_template(value) and (problem := check(value)):
            raise PydanticCustomError("platform_rule", problem)
        return value

    return validate


# `\Z`, not `$`: `$` also matches before a trailing newline ("name\n" would pass).
LABEL_KEY = re.compile(r"^[a-z0-9]([a-z0-9_./-]{0,61}[a-z0-9])?\Z")
#: Arguments one program job may pass, and the longest value: arguments are flags and small
#: values (a file name, a number), never data.
MAX_PROGRAM_ARGS = 64
MAX_PROGRAM_ARG_LEN = 1000
#: What the workers report of a program's training from the wire, for ``checkpoint.metric``:
#: the mean loss of each optimizer step's forward_backward calls, as the trainer returned it.
#: Any other name is read from the program's own metrics file (shepherd/program_metrics.py).
PROGRAM_METRICS = ("train_loss",)
#: Program metrics a job keeps curves of (``training.metrics``, the tracked one and the
#: registration's): each curve travels in every status query and continue-as-new.
MAX_KEPT_METRICS = 8
JOB_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?\Z")
BACKEND_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}\Z")
METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:/-]{0,63}\Z")
#: Temporal task queue names Shepherd accepts: no spaces or control characters.
QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}\Z")
#: Capability tags a backend declares and a job requires.
CAPABILITY = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}\Z")
#: The metrics the built-in loops' evaluations report (shepherd.loops declares them on the
#: loops; a spec naming another one would fail at its first evaluation).
BUILTIN_LOOP_METRICS: dict[str, tuple[str, ...]] = {"supervised": ("eval_loss",)}


def label_problem(key: str, value: str, *, searchable: bool = True) -> str | None:
    """Why ``key=value`` cannot be a label (None: it can). The same rule for a submitted
    spec's labels and for ``list --label``, so every label can be searched for."""
    if not LABEL_KEY.match(key):
        return f"label key {key!r} must be 1-63 characters of a-z, 0-9, '_', '.', '/', '-'"
    # A '"' cannot be searched for: visibility's full-text index of a KeywordList (SQLite's
    # FTS5) breaks on it, escaped or not.
    if len(value) > 63 or _control_characters(value) or (searchable and '"' in value):
        return f"label {key!r}: values are at most 63 characters on one line, without '\"'"
    return None


class TrainerSpec(SpecModel):
    """What to provision (the platform's create request)."""

    base_model: Annotated[str, BeforeValidator(_rule(rules.check_base_model))]
    #: ``accounts/<a>/trainingShapes/<s>[/versions/<v>]``; None is the manual path.
    training_shape: Annotated[str | None, BeforeValidator(_rule(rules.check_shape_ref))] = None
    lora_rank: Annotated[
        Int,
        BeforeValidator(_rule(lambda v: rules.check_lora_rank(v) if isinstance(v, int) else None)),
    ] = 0
    learning_rate: Float = Field(default=1e-3, gt=0, le=1)
    max_context_length: Int | None = Field(default=None, ge=1, le=rules.MAX_CONTEXT_LENGTH)
    display_name: Annotated[str | None, BeforeValidator(_rule(rules.check_display_name))] = None
    hot_load_deployment: Annotated[str | None, BeforeValidator(_rule(rules.check_resource_id))] = (
        None
    )
    forward_only: bool = False
    # Infrastructure overrides: the manual path only (a shape decides them otherwise).
    region: str | None = None
    accelerator_type: Annotated[
        str | None, BeforeValidator(_rule(rules.check_accelerator_type))
    ] = None
    accelerator_count: Int | None = Field(default=None, ge=1, le=64)
    node_count: Int | None = Field(default=None, ge=1, le=64)
    extra_args: list[str] = Field(default_factory=list)
    inactivity_timeout: Duration = timedelta(hours=1)
    preemptible: bool = False

    @field_validator("inactivity_timeout")
    @classmethod
    def _inactivity(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise PydanticCustomError("platform_rule", "must be positive")
        if value.total_seconds() > rules.MAX_INACTIVITY_TIMEOUT_S:
            raise PydanticCustomError("platform_rule", "must be at most 3h (the platform's limit)")
        return value

    @model_validator(mode="after")
    def _shape_or_manual(self) -> TrainerSpec:
        if self.training_shape:
            overrides = {
                "accelerator_type": self.accelerator_type,
                "accelerator_count": self.accelerator_count,
                "node_count": self.node_count,
                "region": self.region,
            }
            for field_name, value in overrides.items():
                if value is not None:
                    raise _located(
                        field_name,
                        "must not be set together with trainer.training_shape: the shape decides it "
                        "(manual path only)",
                    )
        return self


def _program_arg(value: Any) -> Any:
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PydanticCustomError("arg", "must be a finite number")
        return value
    raise PydanticCustomError(
        "arg",
        "must be a scalar: a string, a number or true/false (not {kind})",
        {"kind": type(value).__name__},
    )


#: A program argument's value, as given (YAML's types): passed as ``key=value``.
ProgramArg = Annotated[Any, BeforeValidator(_program_arg)]


class TrainingSpec(SpecModel):
    """What to run."""

    #: The name of a loop registered with the workers: ``supervised`` (built in), or a
    #: Tinker loop registered by name (``SHEPHERD_LOOPS``, ``shepherd.loops`` entry points).
    loop: str = "supervised"
    #: Or the name of a *program* registered with the workers: an unmodified Tinker program
    #: (a tinker-cookbook recipe, a user's script) run behind Shepherd's data-plane proxy
    #: (``SHEPHERD_PROGRAMS``, ``shepherd.programs`` entry points; shepherd/programs.py).
    program: str | None = None
    #: The program's ``key=value`` arguments, each passed as one argv item (never through a
    #: shell); values are scalars.
    args: dict[str, ProgramArg] = Field(default_factory=dict)
    dataset: str = "synthetic:text"
    #: Optimizer steps to train (a loop: required). A program decides its own length; when
    #: given, it is the total its status shows (else the program's registration names the
    #: argument that gives it, e.g. the cookbook's ``max_steps``).
    total_steps: Int | None = Field(default=None, gt=0, le=10_000_000)
    #: Records per optimizer step, split over ``micro_batches`` forward_backward calls.
    batch_size: Int = Field(default=32, ge=1, le=4096)
    micro_batches: Int = Field(default=1, ge=1, le=64)
    seed: Int = Field(default=0, ge=0, le=2**31 - 1)
    validation_split: Float = Field(default=0.1, gt=0, lt=1)
    #: Start from this checkpoint (``accounts/<a>/rlorTrainerJobs/<j>/checkpoints/<c>``).
    resume_from: str | None = None
    #: Optimizer steps per training activity; defaults to the checkpoint cadence (max 50).
    steps_per_chunk: Int | None = Field(default=None, ge=1, le=10_000)
    #: A program's own metrics (from its metrics file: shepherd/program_metrics.py) the job
    #: keeps curves of, beside ``checkpoint.metric`` and those its registration names.
    metrics: list[str] = Field(default_factory=list, max_length=MAX_KEPT_METRICS)
    #: Which of a program's models the job follows — counts its steps by, checkpoints every
    #: ``checkpoint.every_steps`` and promotes: ``last``, the newest model the program has
    #: trained (a pipeline's final stage: SFT, then a reward model, then the RL policy it
    #: exists to make); ``first``; or a model's number, 1-based, in the order the program
    #: makes them.
    follow: Literal["last", "first"] | Annotated[int, Field(ge=1, le=100_000)] = "last"

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: str) -> str:
        if problem := datasets.check_name(value):
            raise PydanticCustomError("dataset", problem)
        return value

    @field_validator("loop")
    @classmethod
    def _loop(cls, value: str) -> str:
        if not LOOP_NAME.match(value):
            raise PydanticCustomError(
                "loop",
                "must be the name of a loop registered with the workers (e.g. 'supervised'; "
                "1-63 characters of a-z, 0-9, '_' and '-'); code is never imported from a spec: "
                "register a loop with SHEPHERD_LOOPS=name=module:attr on the workers",
            )
        return value

    @field_validator("program")
    @classmethod
    def _program(cls, value: str | None) -> str | None:
        if value is not None and not PROGRAM_NAME.match(value):
            raise PydanticCustomError(
                "program",
                "must be the name of a program registered with the workers (1-63 characters "
                "of a-z, 0-9, '_' and '-'); commands are never taken from a spec: register "
                "one with SHEPHERD_PROGRAMS on the workers",
            )
        return value

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, value: list[str]) -> list[str]:
        for name in value:
            if not METRIC_NAME.match(name):
                raise PydanticCustomError(
                    "metrics",
                    "'{name}': a metric name is 1-64 characters of letters, digits, '_', '.', "
                    "':', '/', '-' (e.g. env/all/reward/total)",
                    {"name": name[:80]},
                )
        return list(dict.fromkeys(value))

    @field_validator("args")
    @classmethod
    def _args(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(value) > MAX_PROGRAM_ARGS:
            raise PydanticCustomError("args", "at most {n} arguments", {"n": MAX_PROGRAM_ARGS})
        for key, arg in value.items():
            if not PROGRAM_ARG_KEY.match(key):
                raise PydanticCustomError(
                    "args",
                    "'{key}': a key is a name or a dotted path of names (letters, digits, "
                    "'_'; e.g. max_steps, dataset_builder.batch_size)",
                    {"key": key[:80]},
                )
            if isinstance(arg, str) and (
                len(arg) > MAX_PROGRAM_ARG_LEN or _control_characters(arg)
            ):
                raise PydanticCustomError(
                    "args",
                    "{key}: a value is at most {n} characters, without control characters",
                    {"key": key, "n": MAX_PROGRAM_ARG_LEN},
                )
        return value

    @model_validator(mode="after")
    def _loop_or_program(self) -> TrainingSpec:
        # What differs from its default (a spec dumped and read again sets every field).
        given = {
            name
            for name, info in type(self).model_fields.items()
            if getattr(self, name) != info.get_default(call_default_factory=True)
        }
        if self.program is None:
            if self.args:
                raise _located("training.args", "are a program's arguments: set training.program")
            if "follow" in given:
                raise _located(
                    "training.follow",
                    "says which of a program's models the job follows; a loop trains one",
                )
            if self.metrics:
                raise _located(
                    "training.metrics",
                    "are a program's metrics (from the file it writes); a loop's job tracks "
                    "checkpoint.metric from its evaluation",
                )
            if self.total_steps is None:
                raise _located("training.total_steps", "is required for a loop")
            return self
        # A program owns its loop and its data: the loop's settings would be ignored.
        for name in ("loop", "dataset", "batch_size", "micro_batches", "validation_split"):
            if name in given:
                raise _located(
                    f"training.{name}",
                    "is a loop's setting; a program takes its own in training.args "
                    "(training.loop and training.program are mutually exclusive)",
                )
        if "steps_per_chunk" in given:
            raise _located("training.steps_per_chunk", "is a loop's setting; a program has none")
        if self.resume_from is not None:
            # The proxy cannot make a program start at a step: the program decides where
            # it starts, from its own log directory (which a retry copies).
            raise _located(
                "training.resume_from",
                "is a loop's setting; a program resumes from its own checkpoints (shepherd "
                "retry starts the new job in a copy of the old job's log directory)",
            )
        return self

    @field_validator("resume_from")
    @classmethod
    def _resume(cls, value: str | None) -> str | None:
        if (
            value is not None
            and not is_template(value)
            and (_control_characters(value) or not rules.CHECKPOINT_NAME_RE.fullmatch(value))
        ):
            raise PydanticCustomError(
                "checkpoint",
                "must be a checkpoint name: accounts/<a>/rlorTrainerJobs/<j>/checkpoints/<c>",
            )
        return value


class CheckpointSpec(SpecModel):
    every_steps: Int = Field(default=50, ge=1)
    keep_last: Int = Field(default=3, ge=1, le=1000)
    #: Tracked metric for "best": ``eval_loss`` (or another key the trainer's evaluate returns).
    metric: str = "eval_loss"

    mode: Literal["min", "max"] = "min"
    #: Which checkpoint a recovery reloads.
    resume_from: Literal["last", "best"] = "last"
    #: Evaluate at every checkpoint (needed to track the best).
    evaluate: bool = True


class OutputSpec(SpecModel):
    model_id: Annotated[str | None, BeforeValidator(_rule(rules.check_resource_id))] = None
    promote: Literal["best", "last", "none"] = "last"
    hot_load_deployment: Annotated[str | None, BeforeValidator(_rule(rules.check_resource_id))] = (
        None
    )


class SchedulingSpec(SpecModel):
    #: The admission queue — a team's share of the backend's capacity (its quota, what it
    #: may borrow: shepherd/scheduling.py) — where the job waits for its slot, where the
    #: backend declares its capacity (None: the ``default`` queue).
    queue: str | None = Field(default=None, min_length=1, max_length=200)
    #: The Temporal task queue of the workers that run this job (None: the client's).
    task_queue: str | None = Field(default=None, min_length=1, max_length=200)
    #: 0 (lowest) .. 10 (most urgent): the order of admission within its queue (and
    #: Temporal's task priority).
    priority: Int = Field(default=5, ge=0, le=10)
    #: The job may be paused for a more urgent one (it resumes by itself when its turn
    #: comes, from its checkpoint), and its trainers may be spot (preemptible) ones.
    preemptible: bool = False
    #: Capability tags the backend must declare (its profile's ``capabilities``: an
    #: accelerator, a region ...); a job is refused at submission where no worker's backend
    #: has them.
    required_capabilities: list[str] = Field(default_factory=list, max_length=16)
    #: Hard bound on the job's whole life; past it the job fails (and the trainer is deleted).
    max_runtime: Duration | None = None

    @field_validator("max_runtime")
    @classmethod
    def _positive(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise PydanticCustomError("duration", "must be positive")
        return value


class PoliciesSpec(SpecModel):
    """Overrides of the declared timeouts and retry budgets (see ``workflows.policies``)."""

    pending_timeout: Duration = timedelta(hours=48)
    ready_timeout: Duration = timedelta(minutes=15)
    poll_interval: Duration = timedelta(seconds=5)
    warmup_probes: Int = Field(default=3, ge=1, le=50)
    warmup_timeout: Duration = timedelta(seconds=120)
    route_race_retries: Int = Field(default=4, ge=0, le=100)
    route_race_window: Duration = timedelta(seconds=30)
    max_preemptions: Int = Field(default=10, ge=0, le=1000)
    max_failures: Int = Field(default=3, ge=0, le=100)
    #: After this many preemptions a preemptible job continues on a non-preemptible trainer.
    fallback_to_on_demand_after: Int | None = Field(default=None, ge=1)
    #: Longest one optimizer step may take before the trainer is presumed stuck.
    step_timeout: Duration = timedelta(minutes=10)
    #: Silence after which a training activity's worker is presumed dead and the chunk is
    #: retried elsewhere (activities heartbeat during long steps too). 4 s keeps a worker
    #: crash's stall near 5 s (+1 s retry interval); the SDK then sends a heartbeat about
    #: every 3.2 s per activity holding a trainer: ~0.3 server writes/s per live trainer,
    #: bounded by the platform's slots, not by the number of jobs.
    heartbeat_timeout: Duration = timedelta(seconds=4)
    #: Continue-as-new once the history holds this many events (Temporal's own suggestion
    #: also triggers it), so a 100 000-step job keeps a small history.
    max_history_events: Int = Field(default=10_000, ge=100, le=50_000)

    @model_validator(mode="after")
    def _positive(self) -> PoliciesSpec:
        for name in (
            "pending_timeout",
            "ready_timeout",
            "warmup_timeout",
            "route_race_window",
            "step_timeout",
            "heartbeat_timeout",
        ):
            if getattr(self, name) <= timedelta(0):
                raise _located(name, "must be positive")
        if self.poll_interval < timedelta(seconds=1):
            raise _located("poll_interval", "must be at least 1s")
        if self.route_race_window > timedelta(seconds=rules.ROUTE_RACE_WINDOW_MAX_S):
            # A trainer holds later seq_ids only this long while the missing one is retried;
            # a longer window would break the model before the retry arrives.
            raise _located(
                "route_race_window",
                f"must be at most {rules.ROUTE_RACE_WINDOW_MAX_S:g}s: a trainer holds later "
                f"operations {rules.SEQ_GAP_HOLD_S:g}s while an earlier one is retried, and a "
                f"retry needs {rules.ROUTE_RACE_RETRY_MARGIN_S:g}s beyond the window",
            )
        return self


class JobSpec(SpecModel):
    """A training job, from provisioning to the promoted model."""

    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    trainer: TrainerSpec
    training: TrainingSpec
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    output: OutputSpec = Field(default_factory=OutputSpec)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    policies: PoliciesSpec = Field(default_factory=PoliciesSpec)
    #: The *name* of a backend profile of the worker (URLs and keys live there, never here).
    backend: str = "local"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not JOB_NAME.match(value):
            raise PydanticCustomError(
                "name",
                "must be 1-40 characters of a-z, 0-9 and '-', starting and ending with a letter or digit",
            )
        return value

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str) -> str:
        if not BACKEND_NAME.match(value):
            raise PydanticCustomError(
                "backend", "must be a backend profile name such as 'local' or 'fireworks'"
            )
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 32:
            raise PydanticCustomError("labels", "at most 32 labels")
        for key, val in value.items():
            if problem := label_problem(key, val, searchable=False):
                raise PydanticCustomError("labels", "{problem}", {"problem": problem})
        return value

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.training.program is not None and "metric" not in self.checkpoint.model_fields_set:
            # What a program's checkpoints are measured by, unless the spec says otherwise.
            self.checkpoint.metric = PROGRAM_METRICS[0]
        total = self.training.total_steps
        if total is not None and self.checkpoint.every_steps > total:
            raise _located(
                "checkpoint.every_steps",
                f"must be <= training.total_steps ({total})",
            )
        if self.output.promote != "none" and not self.output.model_id:
            raise _located("output.model_id", "is required when output.promote is 'best' or 'last'")
        if self.output.promote == "best" and not self.checkpoint.evaluate:
            raise _located(
                "output.promote", "'best' needs checkpoint.evaluate: true (the best is measured)"
            )
        if self.checkpoint.resume_from == "best" and not self.checkpoint.evaluate:
            raise _located("checkpoint.resume_from", "'best' needs checkpoint.evaluate: true")
        if self.trainer.forward_only:
            raise _located(
                "trainer.forward_only",
                "a forward-only trainer cannot apply optimizer steps; this job trains",
            )
        return self

    # ------------------------------------------------------------------ helpers

    @property
    def preemptible(self) -> bool:
        return self.trainer.preemptible or self.scheduling.preemptible

    @property
    def steps_per_chunk(self) -> int:
        return self.training.steps_per_chunk or min(self.checkpoint.every_steps, 50)

    @property
    def total_steps(self) -> int:
        """The loop's total; a program's when known (0: not known)."""
        return self.training.total_steps or 0

    def label_keywords(self) -> list[str]:
        """Labels as ``key=value`` keywords (the ``ShepherdLabels`` search attribute)."""
        return [f"{k}={v}" for k, v in sorted(self.labels.items())]


# ------------------------------------------------------------------------------ errors


def _located(field: str, rule: str) -> PydanticCustomError:
    # Raised from model validators, which pydantic would otherwise report on the model itself.
    return PydanticCustomError("located", "{field}: {rule}", {"field": field, "rule": rule})


class SpecProblem(BaseModel):
    field: str
    rule: str

    def __str__(self) -> str:
        return f"{self.field}: {self.rule}"


class SpecError(ValueError):
    """The spec (or an argument that goes with it: an override, a workflow id, an option)
    breaks rules; ``problems`` lists each as ``field: rule``. ``what`` names the input in
    the message, so an option error is not reported as a bad spec."""

    def __init__(
        self, problems: list[SpecProblem], source: str | None = None, *, what: str = "job spec"
    ) -> None:
        self.problems = problems
        self.source = source
        self.what = what
        where = f" in {source}" if source else ""
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(
            f"invalid {what}{where} ({len(problems)} problem{'s' * (len(problems) != 1)}):\n{lines}"
        )


def input_error(field: str, rule: str, what: str = "input") -> SpecError:
    """One problem with an argument rather than with the spec itself."""
    return SpecError([SpecProblem(field=field, rule=rule)], what=what)


def _prefix_for(model_loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in model_loc)


def problems_from(exc: ValidationError) -> list[SpecProblem]:
    out = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        field = _prefix_for(loc) or "spec"
        if err["type"] == "located":
            ctx = err.get("ctx", {})
            inner = str(ctx.get("field", ""))
            prefix = field if field != "spec" else ""
            field = f"{prefix}.{inner}" if prefix and not inner.startswith(prefix) else inner
            rule = str(ctx.get("rule", err["msg"]))
        elif err["type"] == "extra_forbidden":
            rule = "is not a known field"
        elif err["type"] == "missing":
            rule = "is required"
        elif err["type"] == "finite_number":
            rule = "must be a finite number (not NaN or infinity)"
        else:
            rule = err["msg"]
            rule = rule[0].lower() + rule[1:] if rule else rule
        out.append(SpecProblem(field=field, rule=rule))
    return out


def validate_spec(data: Any, source: str | None = None, *, strict: bool = True) -> JobSpec:
    """A valid :class:`JobSpec` from a dict (or a JobSpec), else :class:`SpecError`.

    ``strict`` (a submission, a dry run, a schedule or a retry being created) also applies
    :func:`submission_problems`. Workflow code validates leniently: a spec recorded in a
    running job's history (its input, a schedule's template, a sweep's trial) must stay
    readable, and mean what it meant, when these rules grow."""
    if isinstance(data, JobSpec):
        data = data.model_dump(mode="json")
    if not isinstance(data, dict):
        raise SpecError([SpecProblem(field="spec", rule="must be a mapping of sections")], source)
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(problems_from(exc), source) from None
    if strict and (problems := submission_problems(spec)):
        raise SpecError(problems, source)
    return spec


def _durations(model: BaseModel, prefix: str) -> list[tuple[str, timedelta]]:
    out = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, timedelta):
            out.append((f"{prefix}{name}", value))
        elif isinstance(value, BaseModel):
            out += _durations(value, f"{prefix}{name}.")
    return out


def submission_problems(spec: JobSpec) -> list[SpecProblem]:
    """What a submission refuses beyond the spec's own model: everything that can be
    checked before anything is provisioned without asking a worker or the platform
    (issue 17). Templated values are checked once filled (:func:`resolve_templates`)."""
    problems: list[SpecProblem] = []

    def refuse(field: str, rule: str) -> None:
        problems.append(SpecProblem(field=field, rule=rule))

    for field, duration in _durations(spec, ""):
        if duration > MAX_DURATION:
            refuse(field, f"must be at most {MAX_DURATION.days}d (a year)")
    for name, least in MIN_POLICY.items():
        if getattr(spec.policies, name) < least:
            refuse(f"policies.{name}", f"must be at least {format_duration(least)}")
    runtime = spec.scheduling.max_runtime
    if runtime is not None and runtime < MIN_MAX_RUNTIME:
        refuse("scheduling.max_runtime", f"must be at least {format_duration(MIN_MAX_RUNTIME)}")
    t, tr, c = spec.trainer, spec.training, spec.checkpoint
    if not is_template(t.base_model) and (problem := rules.check_trainer_base_model(t.base_model)):
        refuse("trainer.base_model", problem)
    for i, arg in enumerate(t.extra_args):
        if problem := rules.check_extra_arg(arg):
            refuse(f"trainer.extra_args[{i}]", problem)
    if tr.micro_batches > tr.batch_size:
        refuse(
            "training.micro_batches",
            f"must be <= training.batch_size ({tr.batch_size}): a micro-batch holds at least "
            "one example",
        )
    if not is_template(tr.dataset) and (problem := datasets.check_path(tr.dataset)):
        refuse("training.dataset", problem)
    if not METRIC_NAME.match(c.metric):
        refuse(
            "checkpoint.metric",
            "must be the name of a metric the loop's evaluation (or the program's metrics "
            "file) reports (e.g. eval_loss, env/all/reward/total; 1-64 characters of letters, "
            "digits, '_', '.', ':', '/', '-')",
        )
    elif (
        tr.program is None
        and (reports := BUILTIN_LOOP_METRICS.get(tr.loop))
        and c.evaluate
        and c.metric not in reports
    ):
        refuse(
            "checkpoint.metric", f"the built-in loop {tr.loop!r} reports only {', '.join(reports)}"
        )
    for field in ("queue", "task_queue"):
        queue = getattr(spec.scheduling, field)
        if queue is not None and not QUEUE_NAME.match(queue):
            refuse(
                f"scheduling.{field}",
                "must be a queue name: 1-200 characters of letters, digits, '.', '_', ':', "
                "'/' and '-'",
            )
    for i, tag in enumerate(spec.scheduling.required_capabilities):
        if not CAPABILITY.match(tag):
            refuse(
                f"scheduling.required_capabilities[{i}]",
                "a capability tag is 1-63 characters of a-z, 0-9, '.', '_' and '-' "
                "(e.g. h100, region-eu)",
            )
    for key, label in spec.labels.items():
        if problem := label_problem(key, label):
            refuse("labels", problem)
    if tr.program is not None:
        problems += _program_problems(tr.program, tr.args)
    return problems


def _program_problems(name: str, args: dict[str, Any]) -> list[SpecProblem]:
    """The program's registration's rules (the keys it fixes; a recipe no job can run), where
    this process knows the program from the registry the workers read (built in, entry
    points, SHEPHERD_PROGRAMS). A program it does not know is the workers' to judge: the
    submission asks them whether they have it, and the job's preflight checks the rest."""
    from shepherd import programs  # only when a spec names a program

    try:
        program = programs.registered().get(name)
    except programs.ProgramError:
        return []  # this process's registry is unreadable; the workers' is what counts
    if program is None:
        return []
    found = [SpecProblem(field=field, rule=rule) for field, rule in program.arg_problems(args)]
    if problem := program.problem():
        found.append(SpecProblem(field="training.program", rule=problem))
    return found


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that repeats a key (which YAML's loaders
    accept silently, the last one winning: a spec would run with half its section lost)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<: *base": overriding merged keys is what merging is for
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: the base loader reports it
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first on line {first + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """YAML as a spec reads it: safe, and a repeated key is an error."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def load_spec_data(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(
            [SpecProblem(field="spec", rule=f"cannot read {path}: {exc.strerror}")], str(path)
        ) from None
    try:
        data = (
            json.loads(text, object_pairs_hook=_unique_pairs)
            if path.suffix == ".json"
            else load_yaml(text)
        )
    except (ValueError, yaml.YAMLError) as exc:
        raise SpecError(
            [
                SpecProblem(
                    field="spec",
                    rule=f"not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}",
                )
            ],
            str(path),
        ) from None
    if not isinstance(data, dict):
        raise SpecError(
            [SpecProblem(field="spec", rule="must be a mapping of sections")], str(path)
        )
    return data


def load_spec(path: str | Path, *, overrides: list[str] | None = None) -> JobSpec:
    """Load and validate a YAML/JSON spec, applying ``path.to.field=value`` overrides."""
    data = load_spec_data(path)
    for item in overrides or []:
        apply_override(data, item)
    return validate_spec(data, str(path))


def load_job_spec(
    spec: JobSpec | Mapping[str, Any] | str | Path,
    overrides: list[str] | Mapping[str, Any] | None = None,
) -> JobSpec:
    """A validated spec from a model, a mapping or a YAML/JSON path, with ``path.to.field=value``
    overrides (a list of strings, or a mapping of dotted paths to values)."""
    source = None
    if isinstance(spec, str | Path):
        source = str(spec)
        data = load_spec_data(spec)
    elif isinstance(spec, JobSpec):
        data = spec.model_dump(mode="json")
    elif isinstance(spec, Mapping):
        data = copy.deepcopy(dict(spec))
    else:
        raise input_error(
            "spec",
            "must be a JobSpec, a mapping of sections or the path of a YAML/JSON file, "
            f"not {type(spec).__name__}",
            "argument",
        )
    apply_overrides(data, overrides)
    return validate_spec(data, source)


def apply_overrides(data: dict[str, Any], overrides: list[str] | Mapping[str, Any] | None) -> None:
    """``["path.to.field=value", ...]`` (values read as YAML) or ``{"path.to.field": value}``."""
    if overrides is None:
        return
    if isinstance(overrides, Mapping):
        for path, value in overrides.items():
            set_path(data, path, value)
    elif isinstance(overrides, list | tuple):
        for item in overrides:
            apply_override(data, item)
    else:
        raise input_error(
            "overrides",
            "must be a list of 'path.to.field=value' strings or a mapping of paths to values, "
            f"not {type(overrides).__name__}",
            "argument",
        )


def apply_override(data: dict[str, Any], item: str) -> None:
    """``training.total_steps=200`` -> data["training"]["total_steps"] = 200 (YAML-typed)."""
    if not isinstance(item, str):
        raise input_error(
            "overrides",
            f"each override must be a 'path.to.field=value' string, not {item!r}",
            "override",
        )
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise input_error(item, "an override must be path.to.field=value", "override")
    try:
        value = load_yaml(raw) if raw else ""
    except yaml.YAMLError as exc:
        raise input_error(key.strip(), f"not a YAML value: {exc}", "override") from None
    set_path(data, key.strip(), value)


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    """``data[a][b][c] = value`` for ``path`` "a.b.c", creating missing sections; a path
    through a value that is not a section is an error naming the path."""
    if not isinstance(path, str) or not path or "" in path.split("."):
        raise input_error(
            "overrides",
            f"{path!r} is not a dotted field path such as training.total_steps",
            "override",
        )
    node = data
    *parents, leaf = path.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise input_error(path, f"{part} is not a section", "override")
        node = child
    node[leaf] = value


def has_templates(spec: JobSpec) -> bool:
    return TEMPLATE_MARK in spec.model_dump_json()


def resolve_templates(spec: JobSpec, scheduled_time: datetime, *, strict: bool = True) -> JobSpec:
    """Fill ``{scheduled_time:%Y%m%d}``-style placeholders in string fields (schedules),
    then validate the result fully (``strict``: see :func:`validate_spec`; a workflow
    filling its own templates is not). A placeholder that cannot be filled is a SpecError
    naming its field."""
    data = spec.model_dump(mode="json")
    problems: list[SpecProblem] = []

    def expand(match: re.Match[str]) -> str:
        return format(scheduled_time, match.group(1) or "")

    def fill(value: Any, path: str) -> Any:
        if is_template(value):
            try:
                filled = _PLACEHOLDER.sub(expand, value)
            except ValueError as exc:
                filled, reason = value, f" ({exc})"
            else:
                reason = ""
            # Anything left in braces is a placeholder we do not expand ({scheduled_time.year},
            # {other}, {scheduled_time!r} ...): refused rather than passed on half-filled.
            if reason or "{" in filled or "}" in filled:
                problems.append(
                    SpecProblem(
                        field=path,
                        rule=f"bad template {value!r}: only {{scheduled_time}} and "
                        f"{{scheduled_time:<strftime>}} are expanded{reason}",
                    )
                )
                return value
            return filled
        if isinstance(value, dict):
            return {k: fill(v, f"{path}.{k}" if path else k) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v, f"{path}[{i}]") for i, v in enumerate(value)]
        return value

    filled = fill(data, "")
    if problems:
        raise SpecError(problems)
    return validate_spec(filled, strict=strict)
