"""The program's ids and the trainers' (pure; no I/O).

A program holds ids the proxy gave it — sessions ``ps-…``, models ``{session}:train:{n}``
(the tinker SDK derives a model's id from its session and number itself), sampling sessions
``{session}:sample:{n}``, futures ``pr-…``, sampled sequences ``{future}:{i}`` — and keeps
them for its whole life. Each trainer generation has ids of its own. :class:`IdMap` turns
trainer ids in an answer into the program's (every generation's). Checkpoint paths are the
platform's own ``tinker://{trainer run}/weights/{name}``, handed to the program as the save
answered them: they outlive the proxy and resolve in any job; a path a program builds from
its model id (or one an older proxy handed out) is mapped back to the trainer path.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

TINKER = "tinker://"

#: Everything a trainer id or a program id may be mapped through is remembered, the oldest
#: forgotten past this many (a long RL program makes a sampler per step; each generation
#: adds its sessions and models). Forgetting a sampler two thousand steps old only means an
#: answer mentioning it shows the trainer's id.
MAX_MAPPED = 16_384


def model_id(session_id: str, model_seq_id: int) -> str:
    """A model's id as the tinker SDK derives it (and trainers make it)."""
    return f"{session_id}:train:{model_seq_id}"


def sampler_id(session_id: str, sampling_session_seq_id: int) -> str:
    return f"{session_id}:sample:{sampling_session_seq_id}"


def split_path(path: str) -> tuple[str, str, str] | None:
    """``(run, kind, name)`` of ``tinker://{run}/{kind}/{name}``, else None."""
    if not path.startswith(TINKER):
        return None
    parts = path[len(TINKER) :].split("/")
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0], parts[1], parts[2]


def shepherd_checkpoint(prefix: str) -> re.Pattern[str]:
    """Names of Shepherd's own checkpoints (``step-00000040``, ``…-m2``, ``…-sampler``):
    the program did not save them, so its listings do not show them."""
    return re.compile(rf"{re.escape(prefix)}\d{{8}}(-m\d+)?(-sampler)?\Z")


class IdMap:
    """Trainer ids (of every generation) to program ids, and program paths to trainer paths.

    With a ``store`` (a file in the job's durable log directory), what a program may still
    hold after its proxy is gone — its checkpoint paths and the training runs behind them —
    is kept there too, and read back by the next proxy: a program started again after its
    worker died resumes from the paths it wrote down (the cookbook's checkpoints.jsonl)."""

    def __init__(self, limit: int = MAX_MAPPED, store: Path | None = None) -> None:
        self._limit = limit
        self._program: OrderedDict[str, str] = OrderedDict()
        self._paths: OrderedDict[str, str] = OrderedDict()
        #: Program run (model) id -> its trainer runs, oldest first.
        self._runs: dict[str, list[str]] = {}
        self._store = store
        if store is not None:
            self._load(store)

    def _load(self, store: Path) -> None:
        try:
            lines = store.read_text().splitlines()
        except OSError:
            return
        for line in lines[-self._limit :]:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash
            if "p" in entry and "t" in entry:
                self._paths[str(entry["p"])] = str(entry["t"])
            elif "m" in entry and "r" in entry:
                self._program[str(entry["r"])] = str(entry["m"])
                runs = self._runs.setdefault(str(entry["m"]), [])
                if entry["r"] not in runs:
                    runs.append(str(entry["r"]))
        self._trim(self._paths)

    def _keep(self, entry: dict[str, str]) -> None:
        if self._store is None:
            return
        try:
            with self._store.open("a", encoding="utf-8") as sink:
                sink.write(json.dumps(entry) + "\n")
        except OSError:
            pass  # the map in memory still serves this proxy

    def learn(self, trainer_id: str, program_id: str) -> None:
        self._program[trainer_id] = program_id
        self._program.move_to_end(trainer_id)
        self._trim(self._program)

    def learn_run(self, trainer_model: str, program_model: str) -> None:
        """A trainer model (a training run) of ``program_model``, in this generation."""
        self.learn(trainer_model, program_model)
        runs = self._runs.setdefault(program_model, [])
        if trainer_model not in runs:
            runs.append(trainer_model)
            self._keep({"m": program_model, "r": trainer_model})

    def runs(self, program_model: str) -> list[str]:
        """Every trainer run of a program model, oldest first."""
        return list(self._runs.get(program_model, []))

    def forget_model(self, program_model: str) -> None:
        self._runs.pop(program_model, None)

    def learn_path(self, program_path: str, trainer_path: str) -> None:
        if self._paths.get(program_path) != trainer_path:
            self._keep({"p": program_path, "t": trainer_path})
        self._paths[program_path] = trainer_path
        self._paths.move_to_end(program_path)
        self._trim(self._paths)

    def _trim(self, table: OrderedDict[str, str]) -> None:
        while len(table) > self._limit:
            table.popitem(last=False)

    # ---------------------------------------------------------------- trainer -> program

    def program(self, trainer_id: str) -> str | None:
        return self._program.get(trainer_id)

    def program_str(self, value: str) -> str:
        """``value`` as the program knows it: a trainer id, a ``tinker://`` path whose run is
        a trainer model, or a sampled sequence ``{trainer future}:{i}``; else unchanged."""
        mapped = self._program.get(value)
        if mapped is not None:
            return mapped
        if split_path(value) is not None:
            # Checkpoint paths stay the platform's: they outlive the job and its proxy.
            return value
        head, sep, tail = value.rpartition(":")
        if sep and tail.isdigit() and head in self._program:
            return f"{self._program[head]}:{tail}"
        return value

    def program_value(self, value: Any) -> Any:
        """A JSON value with every trainer id in it (strings, keys excluded) mapped."""
        if isinstance(value, str):
            return self.program_str(value)
        if isinstance(value, dict):
            return {k: self.program_value(v) for k, v in value.items()}
        if isinstance(value, list):
            if value and isinstance(value[0], int | float):
                return value  # a tensor's numbers: no ids in them
            return [self.program_value(v) for v in value]
        return value

    # ---------------------------------------------------------------- program -> trainer

    def trainer_path(self, path: str, current_run: str | None = None) -> str:
        """The trainer path of a checkpoint path the program holds: the one the save that
        made it answered; for a path of a program model it never got from a save (it built
        it), the model's latest trainer run (``current_run``); anything else (another job's
        path, a checkpoint name) unchanged."""
        known = self._paths.get(path)
        if known is not None:
            return known
        parts = split_path(path)
        if parts is None:
            return path
        runs = self._runs.get(parts[0])
        run = current_run or (runs[-1] if runs else None)
        return f"{TINKER}{run}/{parts[1]}/{parts[2]}" if run else path
