"""``shepherd logs JOB [--follow]``: a job's story in one stream, as SkyPilot's ``jobs logs``
and Determined's ``trial logs`` tell theirs. What the lifecycle did (phases, trainers, chunks,
checkpoints, recoveries, signals, the outcome) comes from the workflow's Temporal history, run
after run across continue-as-new; what each trainer wrote comes from the platform
(:meth:`~shepherd.platform.PlatformClient.read_log`, which localplane serves, trainer-api.md
§7). The two are merged by time, one line each: ``[shepherd]`` or ``[trainer g<generation>]``.

The platform is reached as the workers reach it: the job's backend profile in this shell's
environment (``SHEPHERD_BACKEND_<NAME>_*``, workers/config.py), else, for the embedded stack,
the plane and key file that ``shepherd dev`` wrote to its ``stack.json``. Without either the
lifecycle is shown alone, and one line on stderr says why and what to set. No key is printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shepherd.cli.common import EXIT_FAILED, EXIT_INVALID, dev_stack_info, fail, run, shepherd
from shepherd.cli.program_signals import ProgramSignals
from shepherd.states import JobState
from shepherd.terminal_text import readable

if TYPE_CHECKING:
    from temporalio.api.history.v1 import HistoryEvent
    from temporalio.client import Client
    from temporalio.converter import PayloadConverter

    from shepherd.platform import PlatformClient

#: The platform pushes no log stream, so a follower asks for new lines this often: one small
#: GET per second per live trainer is nothing for a control plane, and a line shows within
#: about a second of being written.
LOG_POLL_INTERVAL_S = 1.0
#: While following, a line waits this long before it is printed, so that a line of the other
#: source stamped a moment earlier (history events arrive by long poll, trainer lines by the
#: next poll; two clocks) can still be put before it.
FOLLOW_HOLD_S = 1.0
#: Lines asked for per log request (the platform caps it; localplane at 1,000).
LOG_PAGE_SIZE = 1000
#: The backend profile ``shepherd dev`` gives its worker, whose plane its stack.json names.
DEV_BACKEND = "local"

_GENERATION = re.compile(r"-g([0-9]+)\Z")
#: Fields of a trainer's JSON log line that the line's tag and time already say.
_TRAINER_NOISE = {"timestamp", "logger", "account", "trainer_job_id", "generation", "event"}
_EPOCH = datetime.fromtimestamp(0, UTC)


@dataclass
class LogLine:
    time: datetime
    source: str  # "shepherd" | "trainer"
    text: str
    trainer_job_id: str | None = None
    generation: int | None = None
    #: The trainer process (1: the first start, +1 per resume of the same trainer).
    run: int | None = None
    fields: dict[str, Any] = field(default_factory=dict)

    def human(self) -> str:
        if self.source == "shepherd":
            tag = "[shepherd]"
        elif self.source == "program":
            tag = "[program]"
        else:
            again = f", run {self.run}" if self.run and self.run > 1 else ""
            tag = f"[trainer g{self.generation if self.generation is not None else '?'}{again}]"
        stamp = self.time.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return f"{stamp} {tag} {readable(self.text)}"

    def as_json(self) -> str:
        """``text`` as :meth:`human` shows it; ``raw``, where that differs, as it was written
        (a program's colours and progress-bar redraws, escaped for JSON)."""
        shown = readable(self.text)
        data: dict[str, Any] = {
            "time": self.time.astimezone(UTC).isoformat(),
            "source": self.source,
            "text": shown,
        }
        if shown != self.text:
            data["raw"] = self.text
        if self.source == "trainer":
            data.update(
                trainer_job_id=self.trainer_job_id, generation=self.generation, run=self.run
            )
        if self.fields:
            data["fields"] = self.fields
        return json.dumps(data, default=str)


# ---------------------------------------------------------------------------- lifecycle


def _when(event: HistoryEvent) -> datetime:
    return event.event_time.ToDatetime(tzinfo=UTC)


def _seconds(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    return f"{seconds * 1000:.0f}ms" if seconds < 1 else f"{seconds:.1f}s"


def _failure_text(failure: Any) -> str:
    kind = (
        failure.application_failure_info.type
        if failure.HasField("application_failure_info")
        else ""
    )
    return f"{kind}: {failure.message}" if kind else failure.message


def _short_state(state: Any) -> str:
    return str(state).removeprefix("JOB_STATE_") if state else "?"


@dataclass
class _Scheduled:
    summary: str
    activity_type: str
    at: datetime
    attempt: int = 1
    trainer: str | None = None


#: The polls the workflow races against platform events, and the states that end each: a
#: poll cancelled once its trainer's event said one of them was answered by the event.
_WAIT_TARGETS: dict[str, set[str]] = {
    "wait_for_placement": {JobState.CREATING.value, JobState.RUNNING.value},
    "wait_for_running": {JobState.RUNNING.value},
    "wait_for_resumable": {s.value for s in JobState if s.is_resumable()}
    | {JobState.RUNNING.value},
}


class Lifecycle:
    """Turns a job's history events, run after run, into lines, remembering what later events
    refer to (activity summaries, update names) and what the log reader needs: the backend,
    the trainers (with when each was created) and which of them are deleted."""

    def __init__(self, converter: PayloadConverter) -> None:
        self._converter = converter
        self.workflow_type: str | None = None
        self.backend: str | None = None
        #: The program the job runs (None: a loop).
        self.program: str | None = None
        self.trainers: dict[str, datetime] = {}
        self.deleted: set[str] = set()
        self.runs = 0
        #: The last run ended without continuing as new; and how (phase or Temporal status).
        self.outcome: str | None = None
        self._scheduled: dict[int, _Scheduled] = {}
        self._updates: dict[int, str] = {}
        #: Each trainer's state by the last platform event; whether a cancel was asked.
        self._event_states: dict[str, str] = {}
        self._cancel_requested = False
        self._program_signals = ProgramSignals()

    def _values(self, payloads: Any) -> list[Any]:
        try:
            return list(self._converter.from_payloads(list(payloads)))
        except Exception:  # an undecodable payload costs its detail, never the line
            return []

    def _arg(self, payloads: Any) -> dict[str, Any]:
        """The first value of ``payloads`` when it is an object (a model), else empty."""
        values = self._values(payloads)
        return values[0] if values and isinstance(values[0], dict) else {}

    def _value(self, payload: Any) -> Any:
        values = self._values([payload])
        return values[0] if values else None

    def _trainer(self, trainer_job_id: Any, when: datetime) -> None:
        if isinstance(trainer_job_id, str) and trainer_job_id:
            self.trainers.setdefault(trainer_job_id, when)

    def lines(self, event: HistoryEvent) -> list[LogLine]:
        kind: str | None = event.WhichOneof("attributes")
        if kind is None:
            return []
        handler = getattr(self, f"_on_{kind.removesuffix('_event_attributes')}", None)
        if handler is None:
            return []
        when = _when(event)
        text = handler(event, getattr(event, kind), when)
        return [LogLine(when, "shepherd", text)] if text else []

    # -------------------------------------------------------------- the run

    def _on_workflow_execution_started(self, event: Any, a: Any, when: datetime) -> str:
        self.runs += 1
        self._scheduled.clear()  # event ids start again in each run
        self._updates.clear()
        self.workflow_type = a.workflow_type.name
        inp = self._arg(a.input.payloads)
        spec = _dict(inp.get("spec"))
        self.backend = spec.get("backend") or self.backend
        self.program = _dict(spec.get("training")).get("program") or self.program
        self._trainer(_dict(inp.get("carried")).get("trainer_job_id"), when)
        if a.continued_execution_run_id:
            return f"continued as new (run {self.runs} of this job's history)"
        return f"job {spec.get('name', '?')} started on backend {self.backend or '?'}"

    def _on_upsert_workflow_search_attributes(self, event: Any, a: Any, when: datetime) -> str:
        fields = a.search_attributes.indexed_fields
        lines = []
        if "ShepherdTrainerJobId" in fields:
            self._trainer(self._value(fields["ShepherdTrainerJobId"]), when)
        if "ShepherdPhase" in fields:
            lines.append(f"phase {self._value(fields['ShepherdPhase'])}")
        if "ShepherdModel" in fields:
            lines.append(f"model {self._value(fields['ShepherdModel'])}")
        return "; ".join(lines)

    def _on_workflow_execution_completed(self, event: Any, a: Any, when: datetime) -> str:
        result = self._arg(a.result.payloads)
        name = _dict(result.get("model")).get("name")
        self.outcome = str(result.get("phase", "COMPLETED"))
        return f"job completed{f': model {name}' if name else ''}"

    def _on_workflow_execution_failed(self, event: Any, a: Any, when: datetime) -> str:
        self.outcome = "FAILED"
        return f"job failed: {_failure_text(a.failure)}"

    def _on_workflow_execution_canceled(self, event: Any, a: Any, when: datetime) -> str:
        self.outcome = "CANCELLED"
        return "job cancelled"

    def _on_workflow_execution_terminated(self, event: Any, a: Any, when: datetime) -> str:
        self.outcome = "TERMINATED"
        return f"job terminated{f': {a.reason}' if a.reason else ''}"

    def _on_workflow_execution_timed_out(self, event: Any, a: Any, when: datetime) -> str:
        self.outcome = "TIMED_OUT"
        return "job timed out"

    def _on_workflow_execution_cancel_requested(self, event: Any, a: Any, when: datetime) -> str:
        self._cancel_requested = True
        return f"cancel requested{f': {a.cause}' if a.cause else ''}"

    # ------------------------------------------------------------ messages

    def _on_workflow_execution_signaled(self, event: Any, a: Any, when: datetime) -> str:
        arg = self._arg(a.input.payloads)
        if a.signal_name == "platform_event":
            trainer, state = arg.get("trainer_job_id", "?"), arg.get("state")
            if state == "JOB_STATE_DELETED" and isinstance(trainer, str):
                self.deleted.add(trainer)
            if isinstance(trainer, str) and isinstance(state, str):
                self._event_states[trainer] = state
            message = f": {arg['message']}" if arg.get("message") else ""
            return f"platform: trainer {trainer} {_short_state(state)}{message}"
        if a.signal_name == "program_started":
            return self._program_signals.started(arg)
        if a.signal_name == "program_progress":
            return self._program_signals.progress(arg)
        detail = ", ".join(f"{k} {v}" for k, v in arg.items() if v not in (None, "", {}, []))
        return f"signal {a.signal_name}{f' ({detail})' if detail else ''}"

    def _on_workflow_execution_update_accepted(self, event: Any, a: Any, when: datetime) -> str:
        name = a.accepted_request.input.name
        self._updates[event.event_id] = name
        return f"{name} accepted"

    def _on_workflow_execution_update_completed(self, event: Any, a: Any, when: datetime) -> str:
        name = self._updates.get(a.accepted_event_id, "update")
        if a.outcome.HasField("failure"):
            return f"{name} failed: {_failure_text(a.outcome.failure)}"
        return f"{name} done"

    # ---------------------------------------------------------- activities

    def _on_activity_task_scheduled(self, event: Any, a: Any, when: datetime) -> str:
        summary = ""
        if event.HasField("user_metadata") and event.user_metadata.HasField("summary"):
            summary = str(self._value(event.user_metadata.summary) or "")
        summary = summary or a.activity_type.name
        trainer = self._arg(a.input.payloads).get("trainer_job_id")
        self._scheduled[event.event_id] = _Scheduled(
            summary,
            a.activity_type.name,
            when,
            trainer=trainer if isinstance(trainer, str) else None,
        )
        if a.activity_type.name == "create_trainer":
            self._trainer(self._arg(a.input.payloads).get("trainer_job_id"), when)
        return summary

    def _on_activity_task_started(self, event: Any, a: Any, when: datetime) -> str:
        if scheduled := self._scheduled.get(a.scheduled_event_id):
            scheduled.attempt = a.attempt
        return ""

    def _done(self, a: Any, when: datetime, outcome: str) -> str:
        s = self._scheduled.get(a.scheduled_event_id)
        if s is None:
            return f"activity {outcome}"
        tries = f" (attempt {s.attempt})" if s.attempt > 1 else ""
        return f"{s.summary}: {outcome} after {_seconds(when - s.at)}{tries}"

    def _on_activity_task_completed(self, event: Any, a: Any, when: datetime) -> str:
        text = self._done(a, when, "done")
        s = self._scheduled.get(a.scheduled_event_id)
        result = self._arg(a.result.payloads)
        if s is not None:
            if s.activity_type == "train_chunk" and result.get("last_loss") is not None:
                text += f", loss {result['last_loss']:.4f}"
            if s.activity_type == "delete_trainer" and result.get("state") == "JOB_STATE_DELETED":
                self.deleted.add(str(result.get("trainer_job_id")))
        return text

    def _on_activity_task_failed(self, event: Any, a: Any, when: datetime) -> str:
        return f"{self._done(a, when, 'failed')}: {_failure_text(a.failure)}"

    def _on_activity_task_timed_out(self, event: Any, a: Any, when: datetime) -> str:
        return f"{self._done(a, when, 'timed out')}: {a.failure.message}"

    def _on_activity_task_canceled(self, event: Any, a: Any, when: datetime) -> str:
        s = self._scheduled.get(a.scheduled_event_id)
        targets = _WAIT_TARGETS.get(s.activity_type, set()) if s else set()
        state = self._event_states.get(s.trainer or "") if s else None
        if targets and not self._cancel_requested and state in targets:
            # The poll lost the race to the platform's event: the wait succeeded.
            return self._done(a, when, f"answered by the platform's event ({_short_state(state)})")
        return self._done(a, when, "cancelled")

    def _on_marker_recorded(self, event: Any, a: Any, when: datetime) -> str:
        if a.marker_name != "core_local_activity":
            return ""  # patches and other bookkeeping
        data = self._arg(a.details["data"].payloads) if "data" in a.details else {}
        summary = ""
        if event.HasField("user_metadata") and event.user_metadata.HasField("summary"):
            summary = str(self._value(event.user_metadata.summary) or "")
        summary = summary or str(data.get("activity_type", "local activity"))
        if data.get("activity_type") == "create_trainer" and "result" in a.details:
            # Local since the create-trainer-local patch; its result is the created job.
            self._trainer(self._arg(a.details["result"].payloads).get("trainer_job_id"), when)
        outcome = f"failed: {_failure_text(a.failure)}" if a.HasField("failure") else "done"
        start, end = (_proto_time(data.get(k)) for k in ("original_schedule_time", "complete_time"))
        took = f" after {_seconds(end - start)}" if start and end and end >= start else ""
        # Stamped when the workflow task that ran it completed, with the phase it ran in (a
        # local activity runs inside that task), so the phase line comes first.
        return f"{summary}: {outcome}{took}"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _proto_time(value: Any) -> datetime | None:
    if not isinstance(value, dict) or not isinstance(value.get("seconds"), int):
        return None
    return datetime.fromtimestamp(value["seconds"] + value.get("nanos", 0) / 1e9, UTC)


#: What :func:`history` yields once it has given every event there is so far.
CAUGHT_UP = None


async def history(
    client: Client, workflow_id: str, *, follow: bool
) -> AsyncIterator[HistoryEvent | None]:
    """The job's history events, from the first run of its continue-as-new chain to the
    last. Then, with ``follow``, :data:`CAUGHT_UP` and every new event until the last run
    closes (by long poll: the server answers as soon as there is one)."""
    from temporalio.service import RPCError, RPCStatusCode

    latest = client.get_workflow_handle(workflow_id)
    first = await anext(aiter(latest.fetch_history_events(page_size=1)))
    run_id: str | None = first.workflow_execution_started_event_attributes.first_execution_run_id
    try:
        await anext(
            aiter(
                client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history_events(
                    page_size=1
                )
            )
        )
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        run_id = None  # the chain's first runs passed the namespace's retention: the latest
    waiting = False
    while True:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        seen, run_id = 0, None
        while True:
            async for event in handle.fetch_history_events(wait_new_event=waiting):
                if event.event_id <= seen:
                    continue  # given before catching up (the long poll starts from the top)
                seen = event.event_id
                yield event
                if event.HasField("workflow_execution_continued_as_new_event_attributes"):
                    attrs = event.workflow_execution_continued_as_new_event_attributes
                    run_id = attrs.new_execution_run_id
            if run_id is not None or waiting or not follow:
                break
            waiting = True
            yield CAUGHT_UP
        if run_id is None:
            return


# ---------------------------------------------------------------------------- trainer logs


def trainer_text(raw: str) -> tuple[str, dict[str, Any]]:
    """A trainer's line for people: a structured (JSON) line as ``event key=value ...``."""
    try:
        data = json.loads(raw)
    except ValueError:
        return raw, {}
    if not isinstance(data, dict) or not isinstance(data.get("event"), str):
        return raw, {}
    level = str(data.get("level", "info"))
    rest = " ".join(
        f"{k}={v if isinstance(v, str) else json.dumps(v, default=str)}"
        for k, v in data.items()
        if k not in _TRAINER_NOISE and k not in ("level", "exception")
    )
    text = " ".join(
        p
        for p in (level.upper() if level not in ("info", "debug") else "", data["event"], rest)
        if p
    )
    if isinstance(data.get("exception"), str):
        text += "\n" + data["exception"].rstrip()
    return text, data


def _logged_at(fields: dict[str, Any]) -> datetime | None:
    stamp = fields.get("timestamp")
    try:
        when = datetime.fromisoformat(stamp) if isinstance(stamp, str) else None
    except ValueError:
        return None
    return when if when is None or when.tzinfo else when.replace(tzinfo=UTC)


class TrainerLogs:
    """New lines of each trainer, read from where the last read stopped."""

    def __init__(self, client: PlatformClient, lifecycle: Lifecycle, *, patient: bool) -> None:
        self.client = client
        self._lifecycle = lifecycle
        #: Following: a transient failure is read past on the next round, not given up on.
        self._patient = patient
        self._tokens: dict[str, str] = {}
        self._last: dict[str, datetime] = {}
        #: Deleted and read to the end: nothing more will come.
        self.finished: set[str] = set()
        #: Why the log cannot be read at all (then the lifecycle is shown alone).
        self.unavailable: str | None = None
        #: What to tell the user (once each), e.g. why no trainer line shows.
        self.notes: list[str] = []
        self._told: set[str] = set()

    def _tell(self, note: str) -> None:
        if note not in self._told:
            self._told.add(note)
            self.notes.append(note)

    async def new_lines(self, trainer_job_id: str) -> list[LogLine]:
        from shepherd.platform import NotFound, PlatformError

        if self.unavailable or trainer_job_id in self.finished:
            return []
        deleted = trainer_job_id in self._lifecycle.deleted  # before the read: then it is all
        m = _GENERATION.search(trainer_job_id)
        generation = int(m[1]) if m else None
        lines: list[LogLine] = []
        try:
            while True:
                page = await self.client.read_log(
                    trainer_job_id,
                    page_token=self._tokens.get(trainer_job_id),
                    page_size=LOG_PAGE_SIZE,
                )
                self._tokens[trainer_job_id] = page.next_page_token
                for entry in page.log_entries:
                    text, fields = trainer_text(entry.text)
                    # When the trainer logged it, if it says; else when the platform wrote it
                    # (a moment later); else (an older plane) with the line before it.
                    when = _logged_at(fields) or entry.time or self._last.get(trainer_job_id)
                    when = when or self._lifecycle.trainers.get(trainer_job_id, _EPOCH)
                    self._last[trainer_job_id] = when
                    lines.append(
                        LogLine(
                            when, "trainer", text, trainer_job_id, generation, entry.run, fields
                        )
                    )
                if page.caught_up:
                    break
        except NotFound:
            await self._not_found(trainer_job_id)
        except PlatformError as exc:
            if exc.retryable and self._patient:
                # The next round goes on from the same place.
                self._tell(f"the platform did not answer ({exc.message}); trying again")
                return lines
            self.unavailable = f"the platform did not give the trainer's log ({exc})"
            self._tell(self.unavailable)
            return lines
        if deleted:
            self.finished.add(trainer_job_id)
        return lines

    async def _not_found(self, trainer_job_id: str) -> None:
        """No log: either the trainer is not there (not created yet: read again later), or
        the platform has no log endpoint at all."""
        from shepherd.platform import PlatformError

        try:
            await self.client.get_job(trainer_job_id)
        except PlatformError:
            return  # not there yet (or not reachable just now): read again later
        self.unavailable = (
            f"the platform at {self.client.base_url} serves no trainer log "
            "(it has no rlorTrainerJobs/{job}:logs endpoint, a localplane extension)"
        )
        self._tell(self.unavailable)


class ProgramLogs:
    """A program job's own output (stdout and stderr, stamped by its worker), read from its
    log directory as it grows: ``SHEPHERD_PROGRAM_DIR`` (a shared volume in production) or
    the dev stack's (shepherd/programs.py)."""

    def __init__(self, workflow_id: str) -> None:
        from shepherd import programs

        root = os.environ.get(programs.DIR_ENV_VAR) or (dev_stack_info() or {}).get("program_dir")
        env = {programs.DIR_ENV_VAR: root} if root else None
        self.path = programs.log_dir(workflow_id, env) / programs.OUTPUT_FILE
        self._offset = 0

    def new_lines(self) -> list[LogLine]:
        try:
            with self.path.open("rb") as source:
                source.seek(self._offset)
                data = source.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written waits for its end
        self._offset += end
        lines = []
        for raw in data[:end].splitlines():
            try:
                entry = json.loads(raw)
                when = datetime.fromisoformat(entry["t"])
            except (ValueError, KeyError, TypeError):
                continue
            lines.append(
                LogLine(
                    time=when,
                    # Shepherd's own notes about the program (an idle trainer) are its.
                    source="shepherd" if entry.get("stream") == "shepherd" else "program",
                    text=str(entry.get("line", "")),
                    fields={"stream": entry.get("stream")},
                )
            )
        return lines


def platform_for(backend: str) -> tuple[PlatformClient | None, str]:
    """A client of the job's platform, as the workers configure it, or why there is none."""
    from shepherd.platform import PlatformClient
    from workers.config import BackendConfigError, profiles_from_env

    prefix = f"SHEPHERD_BACKEND_{backend.upper().replace('-', '_')}_"
    try:
        profile = profiles_from_env().get(backend)
    except (BackendConfigError, ValueError) as exc:
        return None, f"the backend profiles in this shell are invalid ({exc})"
    if profile is not None and (key := profile.api_key(os.environ)):
        client = PlatformClient(
            profile.url, key, account_id=profile.account_id, timeout=profile.timeout_s
        )
        return client, ""
    stack = dev_stack_info()
    if stack is not None and backend == DEV_BACKEND and isinstance(stack.get("plane"), str):
        key_file = stack.get("plane_api_key_file")
        if isinstance(key_file, str):
            try:
                key = Path(key_file).read_text().strip()
            except OSError as exc:
                return None, f"the dev stack's key file is not readable ({exc.strerror})"
            return PlatformClient(stack["plane"], key), ""
    how = (
        f"set {profile.api_key_env} to its API key ({prefix}URL is {profile.url})"
        if profile is not None
        else f"set SHEPHERD_BACKENDS={backend}, {prefix}URL and {prefix}API_KEY_ENV"
    )
    return None, f"this shell has no key for backend {backend!r}: {how}, as the workers have them"


# ----------------------------------------------------------------------------- output


class Printer:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        # A program's U+FFFD (bytes it wrote that were not UTF-8), a trainer's non-ASCII: an
        # output that cannot encode them (a file on Windows, PYTHONIOENCODING=ascii) gets
        # them as \ufffd, instead of the command dying on the line.
        if isinstance(sys.stdout, io.TextIOWrapper):
            sys.stdout.reconfigure(errors="backslashreplace")

    def lines(self, lines: list[LogLine]) -> None:
        out = [line.as_json() if self.as_json else line.human() for line in lines]
        if out:
            sys.stdout.write("\n".join(out) + "\n")
            sys.stdout.flush()

    @staticmethod
    def note(text: str) -> None:
        sys.stderr.write(f"trainer log not shown: {text}\n")
        sys.stderr.flush()


def _in_order(lines: list[LogLine]) -> list[LogLine]:
    return sorted(lines, key=lambda line: line.time)  # stable: each source keeps its order


async def show(workflow_id: str, *, follow: bool, tail: int | None, as_json: bool) -> str | None:
    """Print the job's lines; returns how it ended (None: it is still running)."""
    if follow:
        # Ctrl-C ends a follower at once: what it printed is flushed, and there is nothing
        # else to save. Set before anything is printed: a Ctrl-C after the first lines and
        # before it was set unwound through asyncio's shutdown, which sometimes took well
        # over 20 s on a busy machine (tests/workflows/test_logs_cli.py saw it).
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, _interrupted)
    sh = await shepherd()
    client: Client = sh.client
    lifecycle = Lifecycle(client.data_converter.payload_converter)
    printer = Printer(as_json)
    events = history(client, workflow_id, follow=follow)
    pending: list[LogLine] = []

    # The first event says what this is and where its trainers live.
    first = await anext(events)
    assert first is not CAUGHT_UP  # a run starts with its start event
    pending += lifecycle.lines(first)
    if lifecycle.workflow_type != "TrainingJob":
        fail(
            f"{workflow_id} is a {lifecycle.workflow_type} workflow, not a job "
            "(a sweep's trials are jobs: `shepherd sweep status` lists them)",
            EXIT_INVALID,
        )
    platform, why = platform_for(lifecycle.backend or DEV_BACKEND)
    if platform is None:
        printer.note(why)
    async with contextlib.AsyncExitStack() as exits:
        logs: TrainerLogs | None = None
        if platform is not None:
            await exits.enter_async_context(platform)
            logs = TrainerLogs(platform, lifecycle, patient=follow)

        program = ProgramLogs(workflow_id) if lifecycle.program else None

        async def read_logs() -> list[LogLine]:
            read: list[LogLine] = program.new_lines() if program is not None else []
            if logs is None:
                return read
            for trainer in list(lifecycle.trainers):
                read += await logs.new_lines(trainer)
            for note in logs.notes:
                printer.note(note)
            logs.notes.clear()
            return read

        def flush(before: datetime | None, last: int | None = None) -> None:
            """Print what is pending in time order: all of it, or what is older than
            ``before`` (a line of the other source may still come in ahead of the rest);
            of that, the ``last`` lines only."""
            ordered = _in_order(pending)
            ready = [line for line in ordered if before is None or line.time <= before]
            pending[:] = ordered[len(ready) :]
            printer.lines(ready[-last:] if last else ready)

        async for event in events:  # what happened so far
            if event is CAUGHT_UP:
                break
            pending += lifecycle.lines(event)
        pending += await read_logs()
        if not follow:
            flush(None, tail)
            return lifecycle.outcome
        flush(datetime.now(UTC) - timedelta(seconds=FOLLOW_HOLD_S), tail)

        async def read_history() -> None:
            async for event in events:
                if event is not CAUGHT_UP:
                    pending.extend(lifecycle.lines(event))

        reader = asyncio.ensure_future(read_history())
        try:
            while True:
                await asyncio.wait({reader}, timeout=LOG_POLL_INTERVAL_S)
                round_start = datetime.now(UTC)
                ended = reader.done()  # checked before the read: the last lines are in it
                pending += await read_logs()
                if ended:
                    reader.result()  # a failed history read ends the command with its error
                    flush(None)
                    return lifecycle.outcome
                flush(round_start - timedelta(seconds=FOLLOW_HOLD_S))
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader


def _interrupted() -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(130)


def register(app: typer.Typer) -> None:
    @app.command()
    def logs(
        workflow_id: Annotated[str, typer.Argument(help="The job's workflow id.")],
        follow: Annotated[
            bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")
        ] = False,
        tail: Annotated[
            int | None,
            typer.Option("--tail", "-n", min=1, help="Only the last N lines (then follow on)."),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    ) -> None:
        """The trainer's log interleaved with the job's lifecycle (phases, trainers, chunks,
        checkpoints, recoveries, signals), by time. With --follow: until the job ends, then
        exit 0 only if it completed."""
        try:
            outcome = run(show(workflow_id, follow=follow, tail=tail, as_json=as_json))
        except KeyboardInterrupt:
            raise typer.Exit(130) from None  # Ctrl-C: stop following, quietly
        except BrokenPipeError:
            # The reader went away (`| head`): nothing more to say, to anyone.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(0) from None
        if follow and outcome != "COMPLETED":
            raise typer.Exit(EXIT_FAILED)
