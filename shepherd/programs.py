"""Programs: unmodified Tinker programs, registered with the workers by name.

A program owns its loop and builds its own ``tinker.ServiceClient`` (a tinker-cookbook
recipe, a user's script). A job names one (``training.program``) and gives it ``key=value``
arguments (``training.args``); it never carries a command. The registration fixes the
command: a module run with ``python -m`` (or a script file), its fixed leading arguments,
which argument receives the job's durable log directory, and which argument (if any) gives
its total of optimizer steps. The program runs with ``TINKER_BASE_URL`` and ``TINKER_API_KEY``
pointing at the job's data-plane proxy (shepherd/proxy), never at the trainer.

Where programs come from:

* built in, when ``tinker-cookbook`` is installed: ``cookbook-chat-sl``
  (``tinker_cookbook.recipes.chat_sl.train``) and ``cookbook-math-rl``
  (``tinker_cookbook.recipes.math_rl.train``), each resuming from its own log directory
  (``behavior_if_log_dir_exists=resume``) when its worker restarts it;
* the ``shepherd.programs`` entry-point group of installed packages (each a :class:`Program`
  or the mapping below);
* the worker's ``SHEPHERD_PROGRAMS`` environment variable: a JSON object, name ->
  ``{"module": "pkg.mod" | "script": "/abs/file.py", "args": ["k=v", ...],
  "log_dir_arg": "log_path", "total_steps_arg": "max_steps", "substeps_arg": "num_substeps",
  "model_arg": "model_name", "env": {"K": "v"}, "metrics_file": "metrics.jsonl",
  "metrics": ["env/all/reward/total"]}``.

A tinker-cookbook recipe registered by hand (``"module": "tinker_cookbook.recipes..."``) whose
config has a ``behavior_if_log_dir_exists`` field gets ``behavior_if_log_dir_exists=resume``
unless its registration fixes another value (:func:`with_cookbook_defaults`): the field's
default, "ask", reads stdin when the log directory exists, and a job's always does (Shepherd
makes it first, and a restarted program must go on from its own checkpoints there). A recipe
that asks without such a field (``sl_basic``, ``rl_basic``) cannot run as a job: its jobs are
refused before any trainer exists (:meth:`Program.problem`).

Where a job's log directory lives: ``<SHEPHERD_PROGRAM_DIR>/<workflow id>`` (a shared volume
in production, so the program restarted on another worker finds its own checkpoints there),
else ``<state dir>/programs/<workflow id>`` of the worker. A retried job (``shepherd retry``)
starts its program in a copy of the failed job's directory (:func:`seed_log_dir`): a program
that resumes from its own checkpoints goes on from the failed job's last one.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shepherd.names import PROGRAM_ARG_KEY, PROGRAM_NAME
from shepherd.program_metrics import DEFAULT_METRICS_FILE

ENTRY_POINT_GROUP = "shepherd.programs"
ENV_VAR = "SHEPHERD_PROGRAMS"
DIR_ENV_VAR = "SHEPHERD_PROGRAM_DIR"
#: The program's output, one stamped line each, in its log directory (``shepherd logs``).
OUTPUT_FILE = "program.log"
#: Written when the program exited 0 (with Shepherd's final checkpoint once it is saved): a
#: later attempt of the same job never starts the program again. Not copied into a retry.
EXIT_FILE = "shepherd-exit.json"


#: The error type of a job refused at its preflight for its program: not registered on the
#: worker, arguments its registration fixes, a recipe that cannot run as a job.
INVALID_PROGRAM = "InvalidProgram"
#: ... or for the tokenizer its ``model_arg`` names, which an offline worker does not have.
TOKENIZER_MISSING = "TokenizerMissing"
#: The cookbook's switch for an existing log directory, and what a job needs of it.
LOG_DIR_BEHAVIOR = "behavior_if_log_dir_exists"
RESUME = f"{LOG_DIR_BEHAVIOR}=resume"


class ProgramError(ValueError):
    """A registration that cannot be used, or a job's arguments a program refuses."""


@dataclass(frozen=True)
class Program:
    name: str
    #: ``python -m <module>``, or ``python <script>``.
    module: str | None = None
    script: str | None = None
    #: Leading arguments the registration fixes (a spec cannot change them).
    args: tuple[str, ...] = ()
    #: The ``key`` that receives the job's log directory (``key=<dir>``), if any.
    log_dir_arg: str | None = None
    #: The ``key`` whose value is the program's total of optimizer steps, if any.
    total_steps_arg: str | None = None
    #: The ``key`` whose value is how many optimizer steps the program takes per unit of
    #: ``total_steps_arg``, when that counts something else (batches): the cookbook's RL
    #: ``num_substeps``. The job's total is then their product (1 when not given).
    substeps_arg: str | None = None
    #: The ``key`` whose value names the model the program asks for (the cookbook's
    #: ``model_name``, a Hugging Face name it picks its tokenizer and renderer by): the proxy
    #: takes that name for the trainer's base model (``trainer.base_model``).
    model_arg: str | None = None
    #: Extra environment of the program.
    env: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    #: The program's metrics file (shepherd/program_metrics.py), relative to the job's log
    #: directory (or absolute); the program is told it in ``SHEPHERD_METRICS_FILE``.
    metrics_file: str = DEFAULT_METRICS_FILE
    #: The metrics a job of this program keeps curves of unless its spec names others
    #: (its headline measures: an RL recipe's reward).
    metrics: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not PROGRAM_NAME.match(self.name):
            raise ProgramError(f"program name {self.name!r}: 1-63 characters of a-z, 0-9, _ and -")
        if (self.module is None) == (self.script is None):
            raise ProgramError(f"program {self.name!r}: give exactly one of module and script")
        if self.script is not None and not Path(self.script).is_absolute():
            raise ProgramError(f"program {self.name!r}: script must be an absolute path")

    @property
    def fixed_keys(self) -> set[str]:
        """The keys a job may not set: the registration's own and the log directory's."""
        return set(self.fixed_values())

    def fixed_values(self) -> dict[str, str]:
        """Each key a job may not set, with what the registration passes for it."""
        fixed = {}
        for arg in self.args:
            key, sep, value = arg.partition("=")
            if sep:
                fixed[key] = f"{key}={value}"
        if self.log_dir_arg:
            fixed[self.log_dir_arg] = "the job's log directory"
        return fixed

    def arg_problems(self, args: Mapping[str, Any]) -> list[tuple[str, str]]:
        """What the registration refuses of a job's arguments, each as (field, rule)."""
        fixed = self.fixed_values()
        problems = [
            (
                f"training.args.{key}",
                f"is fixed by the registration of program {self.name!r} (Shepherd passes "
                f"{fixed[key]}); leave it out",
            )
            for key in sorted(set(fixed) & set(args))
        ]
        problems += [
            ("training.args", f"{key!r} is not a key=value key")
            for key in args
            if not PROGRAM_ARG_KEY.match(key)
        ]
        return problems

    def problem(self) -> str | None:
        """Why no job can run this program at all (None: it can), for ``training.program``."""
        if self.module and _asks_on_stdin(self.module):
            return (
                f"program {self.name!r} runs {self.module}, which asks on its stdin what to do "
                "when its log directory exists (it takes no behavior_if_log_dir_exists), and "
                "that directory exists when a job starts it (Shepherd makes the job's first; "
                "the recipe's default one exists from its first run on): without a stdin, the "
                "question ends it (EOFError). Register a recipe that takes "
                "behavior_if_log_dir_exists instead (tinker_cookbook.recipes.chat_sl.train "
                "for SFT, tinker_cookbook.recipes.math_rl.train for RL) or your own script"
            )
        return None

    def check_args(self, args: Mapping[str, Any]) -> None:
        problems = self.arg_problems(args)
        if problems:
            raise ProgramError("; ".join(f"{field}: {rule}" for field, rule in problems))

    def model_names(self, args: Mapping[str, Any]) -> list[str]:
        """Names the program may give the trainer's base model (its ``model_arg``)."""
        value = args.get(self.model_arg) if self.model_arg else None
        return [str(value)] if isinstance(value, str) and value else []

    def model_name(self, args: Mapping[str, Any]) -> str | None:
        """The model the program picks its tokenizer by: the job's ``model_arg``, else the
        registration's fixed one (None: the program's own default, unknown here)."""
        if self.model_arg is None:
            return None
        value = args.get(self.model_arg)
        if value is None:
            value = self.fixed_values().get(self.model_arg, "").partition("=")[2] or None
        return str(value) if isinstance(value, str) and value else None

    def total_steps(self, args: Mapping[str, Any]) -> int | None:
        """The total of optimizer steps its arguments give (the registration's
        ``total_steps_arg``, times ``substeps_arg`` where it names one), if any."""
        total = self._int_arg(self.total_steps_arg, args)
        if total is None:
            return None
        substeps = self._int_arg(self.substeps_arg, args)
        return total * substeps if substeps and substeps > 0 else total

    def _int_arg(self, key: str | None, args: Mapping[str, Any]) -> int | None:
        """The whole number the job's ``key`` argument (else the registration's) gives."""
        if key is None:
            return None
        value = args.get(key)
        if value is None:
            for fixed in self.args:
                name, sep, text = fixed.partition("=")
                if sep and name == key:
                    value = text
        try:
            return int(value) if value is not None and not isinstance(value, bool) else None
        except (TypeError, ValueError):
            return None

    def metrics_path(self, log_dir: Path) -> Path:
        """Where the program of a job with this log directory writes its metrics."""
        return log_dir / self.metrics_file  # (an absolute metrics_file stays itself)

    def command(self, python: str, args: Mapping[str, Any], log_dir: Path) -> list[str]:
        """The program's argv: each argument one item (never a shell line)."""
        self.check_args(args)
        argv = [python, "-m", self.module] if self.module else [python, str(self.script)]
        argv += list(self.args)
        argv += [f"{key}={_text(value)}" for key, value in args.items()]
        if self.log_dir_arg:
            argv.append(f"{self.log_dir_arg}={log_dir}")
        return argv

    @classmethod
    def from_mapping(cls, name: str, data: Any) -> Program:
        if isinstance(data, Program):
            return data
        if not isinstance(data, Mapping):
            raise ProgramError(f"program {name!r}: the registration must be an object")
        known = {
            "module",
            "script",
            "args",
            "log_dir_arg",
            "total_steps_arg",
            "substeps_arg",
            "model_arg",
            "env",
            "description",
            "metrics_file",
            "metrics",
        }
        unknown = sorted(set(data) - known)
        if unknown:
            raise ProgramError(f"program {name!r}: unknown fields {', '.join(unknown)}")
        args = data.get("args", [])
        env = data.get("env", {})
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ProgramError(f"program {name!r}: args must be a list of strings")
        if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ProgramError(f"program {name!r}: env must map strings to strings")
        metrics_file = data.get("metrics_file", DEFAULT_METRICS_FILE)
        if not isinstance(metrics_file, str) or not metrics_file.strip():
            raise ProgramError(f"program {name!r}: metrics_file must be a file name or path")
        metrics = data.get("metrics", [])
        if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
            raise ProgramError(f"program {name!r}: metrics must be a list of metric names")
        return cls(
            name=name,
            module=data.get("module"),
            script=data.get("script"),
            args=tuple(args),
            log_dir_arg=data.get("log_dir_arg"),
            total_steps_arg=data.get("total_steps_arg"),
            substeps_arg=data.get("substeps_arg"),
            model_arg=data.get("model_arg"),
            env=dict(env),
            description=str(data.get("description", "")),
            metrics_file=metrics_file,
            metrics=tuple(metrics),
        )


def _text(value: Any) -> str:
    """A YAML scalar as its program reads it (chz parses True/False, numbers, strings)."""
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def _cookbook() -> dict[str, Program]:
    if importlib.util.find_spec("tinker_cookbook") is None:
        return {}
    resume = RESUME
    return {
        "cookbook-chat-sl": Program(
            name="cookbook-chat-sl",
            module="tinker_cookbook.recipes.chat_sl.train",
            args=(resume,),
            log_dir_arg="log_path",
            total_steps_arg="max_steps",
            model_arg="model_name",
            description="tinker-cookbook: supervised fine-tuning on chat data (chat_sl)",
            metrics=("train_mean_nll", "test/nll"),
        ),
        "cookbook-math-rl": Program(
            name="cookbook-math-rl",
            module="tinker_cookbook.recipes.math_rl.train",
            args=(resume,),
            log_dir_arg="log_path",
            # max_steps counts batches; each is num_substeps optimizer steps.
            total_steps_arg="max_steps",
            substeps_arg="num_substeps",
            model_arg="model_name",
            description="tinker-cookbook: RL on math problems (math_rl; env=arithmetic offline)",
            metrics=("env/all/reward/total",),
        ),
    }


def _module_source(module: str) -> str | None:
    """The source of ``module`` (``python -m`` runs it), found without importing it: a
    recipe's imports (torch, transformers) cost seconds."""
    top, _, rest = module.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        base = Path(location, *rest.split(".")) if rest else Path(location)
        for candidate in (base.with_suffix(".py"), base / "__init__.py", base / "__main__.py"):
            try:
                return candidate.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
    return None


#: A chz config field of the recipe (``behavior_if_log_dir_exists: LogdirBehavior = "ask"``).
_BEHAVIOR_FIELD = re.compile(rf"^\s+{LOG_DIR_BEHAVIOR}\s*:", re.MULTILINE)
#: A recipe that asks whatever its arguments say (``check_log_dir(..., behavior_if_exists="ask")``).
_ASKS = re.compile(r"check_log_dir\([^)]*behavior_if_exists\s*=\s*[\"']ask[\"']", re.DOTALL)


@functools.lru_cache(maxsize=256)
def _cookbook_log_dir(module: str) -> str | None:
    """How a tinker-cookbook recipe treats an existing log directory: "field" (its config
    takes behavior_if_log_dir_exists), "asks" (it asks on stdin, whatever its arguments say),
    None (not a cookbook recipe, or neither)."""
    if not module.startswith("tinker_cookbook."):
        return None
    source = _module_source(module) or ""
    if _BEHAVIOR_FIELD.search(source):
        return "field"
    return "asks" if _ASKS.search(source) else None


def _asks_on_stdin(module: str) -> bool:
    return _cookbook_log_dir(module) == "asks"


def with_cookbook_defaults(program: Program) -> Program:
    """``program`` with ``behavior_if_log_dir_exists=resume`` fixed when it runs a cookbook
    recipe that takes it and the registration fixes no value: the recipe's default ("ask")
    reads stdin, which a job's program does not have, when its log directory exists — and a
    job's always does."""
    if (
        program.module is None
        or LOG_DIR_BEHAVIOR in program.fixed_values()
        or _cookbook_log_dir(program.module) != "field"
    ):
        return program
    return dataclasses.replace(program, args=(RESUME, *program.args))


def registered(env: Mapping[str, str] | None = None) -> dict[str, Program]:
    """Every program this worker knows, by name."""
    env = os.environ if env is None else env
    found = _cookbook()
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            found[ep.name] = Program.from_mapping(ep.name, ep.load())
        except Exception as exc:  # noqa: BLE001 - a broken package is reported, not a crash
            raise ProgramError(f"entry point {ep.value!r} ({ep.name}): {exc}") from None
    raw = env.get(ENV_VAR, "").strip()
    if raw:
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ProgramError(f"{ENV_VAR}: not a JSON object ({exc})") from None
        if not isinstance(data, dict):
            raise ProgramError(f"{ENV_VAR}: must be a JSON object, name -> registration")
        for name, registration in data.items():
            found[name] = Program.from_mapping(name, registration)
    return {name: with_cookbook_defaults(program) for name, program in found.items()}


def resolve(name: str, env: Mapping[str, str] | None = None) -> Program:
    programs = registered(env)
    if name not in programs:
        raise ProgramError(
            f"training.program: no program {name!r} is registered on this worker (known: "
            f"{', '.join(sorted(programs)) or 'none'}); register it with {ENV_VAR}="
            '\'{"<name>": {"module": "<pkg.module>", "log_dir_arg": "log_path"}}\' or the '
            f"{ENTRY_POINT_GROUP!r} entry-point group"
        )
    return programs[name]


def log_dir(workflow_id: str, env: Mapping[str, str] | None = None) -> Path:
    """The job's durable log directory (the same for every attempt of its program)."""
    env = os.environ if env is None else env
    root = env.get(DIR_ENV_VAR)
    if root:
        return Path(root) / workflow_id
    state = Path(env.get("SHEPHERD_STATE_DIR", ".shepherd"))
    return (state / "programs" / workflow_id).resolve()


def seed_log_dir(directory: Path, source: Path) -> bool:
    """Start ``directory`` (a retried job's, not made yet) as a copy of ``source`` (the job it
    retries): the program's own checkpoints and the proxy's id map (:data:`~shepherd.proxy.
    settings.IDS_FILE`, so the ``tinker://`` paths the program wrote down still resolve; a
    checkpoint outlives its trainer), not the old program's output. Copied aside and renamed
    into place, so a worker that dies mid-copy leaves no half directory behind. False: there
    was nothing to copy, or the directory exists (a later attempt of the same job)."""
    if directory.exists() or not source.is_dir():
        return False
    staging = directory.with_name(f"{directory.name}.seeding")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, ignore=shutil.ignore_patterns(OUTPUT_FILE, EXIT_FILE))
    staging.rename(directory)
    return True
