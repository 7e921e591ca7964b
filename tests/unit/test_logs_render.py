"""How ``shepherd logs`` words a job's history and a trainer's lines (no server: a recorded
history of a preempted and recovered job, and trainer lines as localplane writes them), a
program's signals, and a program's own output as it wrote it for a terminal (colours, cursor
moves, progress bars, bytes that were not UTF-8, control characters)."""

from __future__ import annotations

import io
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter

from shepherd import programs
from shepherd.cli.logs import Lifecycle, LogLine, Printer, ProgramLogs, trainer_text
from shepherd.cli.program_signals import ProgramSignals
from shepherd.terminal_text import readable

PREEMPTED = (
    Path(__file__).parent.parent
    / "histories"
    / "test-preemption-mid-training-ends-with-identical-weights-1.json"
)


def test_a_recovery_reads_as_what_happened_in_order() -> None:
    history = WorkflowHistory.from_json("spot", PREEMPTED.read_text())
    lifecycle = Lifecycle(pydantic_data_converter.payload_converter)
    lines = [line.text for event in history.events for line in lifecycle.lines(event)]

    def at(prefix: str, after: int = -1) -> int:
        return next(i for i, text in enumerate(lines) if i > after and text.startswith(prefix))

    lost = at("train steps 21-30: failed after ")
    assert "TrainerLost: " in lines[lost] and "preempted" in lines[lost]
    recovering = at("phase RECOVERING", lost)
    resumed = at("resume the trainer: done", recovering)
    # The model's reload and the route's warm-up are one activity (the baseline lifecycle).
    loaded = at("load step-00000020, warm up the route (3 probes): done", resumed)
    assert at("train steps 21-30: done after ", loaded) > loaded
    assert lines[-1].startswith("job completed: model accounts/")
    (trainer,) = lifecycle.trainers
    assert trainer.endswith("-g0") and lifecycle.deleted == {trainer}
    assert (lifecycle.backend, lifecycle.outcome) == ("local", "COMPLETED")
    # Bookkeeping (patch markers, task events, step counters) says nothing.
    assert not any("core_patch" in text or "ShepherdStep" in text for text in lines)


def test_trainer_lines_read_as_event_and_fields() -> None:
    line = {
        "event": "checkpoint.saved",
        "name": "step-10",
        "step": 10,
        "trainer_job_id": "t-g0",
        "account": "a",
        "generation": 1,
        "level": "info",
        "logger": "localplane.trainer",
        "timestamp": "2026-11-23T10:22:13Z",
    }
    assert trainer_text(json.dumps(line))[0] == "checkpoint.saved name=step-10 step=10"
    failed = {"event": "trainer.error", "op": "optim_step", "level": "error", "exception": "Tb\n"}
    assert trainer_text(json.dumps(failed))[0] == "ERROR trainer.error op=optim_step\nTb"
    assert trainer_text("Traceback (most recent call last):") == (
        "Traceback (most recent call last):",
        {},
    )


def _lines(name: str) -> list[str]:
    path = PREEMPTED.parent / name
    history = WorkflowHistory.from_json("h", path.read_text())
    lifecycle = Lifecycle(pydantic_data_converter.payload_converter)
    return [line.text for event in history.events for line in lifecycle.lines(event)]


def test_a_wait_the_platforms_event_answered_is_not_called_cancelled() -> None:
    lines = _lines("test-happy-path-to-a-promoted-model-0.json")
    waits = [text for text in lines if text.startswith("wait for RUNNING: ")]
    assert waits and all("answered by the platform's event (RUNNING)" in w for w in waits)
    # A wait a cancel stopped is still a cancel.
    cancelled = _lines("test-cancel-while-scheduling-0.json")
    assert any(text.startswith("wait for RUNNING: cancelled after") for text in cancelled)


# ---------------------------------------------------------------------------- program output


def test_colours_and_hyperlinks_are_gone_the_text_stays() -> None:
    assert readable("\x1b[1;32mready\x1b[0m to \x1b[38;2;255;0;0mtrain\x1b[39m") == "ready to train"
    assert readable("\x1b[38;5;208mwarm\x1b[m") == "warm"  # 256 colours; SGR's short reset
    # What rich writes to a terminal: bold red, an OSC 8 hyperlink, an emoji.
    console = Console(file=io.StringIO(), force_terminal=True, color_system="truecolor")
    console.print("[bold red]loss[/] [link=https://x.y]spike[/link] :warning:", end="")
    written = console.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[" in written and "\x1b]8;" in written
    assert readable(written) == "loss spike \u26a0"
    # A window title (OSC ended by BEL), a charset switch, a saved and restored cursor.
    assert readable("\x1b]0;epoch 3\x07\x1b(Bsaved\x1b7 here\x1b8") == "saved here"


def test_cursor_moves_and_erases_are_gone() -> None:
    # A multi-bar redraw: up one line, erase it, hide the cursor; what is written stays.
    assert readable("\x1b[1A\x1b[2K\x1b[?25lvalidation 3/10\x1b[?25h") == "validation 3/10"
    # Back to column 1 and erase, as spinners redraw: the last state, not the states run on.
    spinner = "\x1b[2K\x1b[1Gdownloading 10%\x1b[2K\x1b[1Gdownloading 90%\x1b[K"
    assert readable(spinner) == "downloading 90%"
    assert readable("\x1b[Gfirst\x1b[Gsecond") == "second"


def test_a_progress_bar_redrawn_with_carriage_returns_shows_its_final_state() -> None:
    tqdm = pytest.importorskip("tqdm")
    out = io.StringIO()
    for _ in tqdm.tqdm(range(4), file=out, ncols=60, mininterval=0, desc="train"):
        pass
    # One line (str.splitlines would split at \r too): every state, each after a \r.
    (bar,) = out.getvalue().rstrip("\n").split("\n")
    assert bar.count("\r") >= 5
    shown = readable(bar)
    assert shown.startswith("train: 100%|") and "4/4" in shown and "\r" not in shown
    # leave=False clears the bar at the end: its last state says more than a blank line.
    out = io.StringIO()
    for _ in tqdm.tqdm(range(3), file=out, ncols=60, mininterval=0, leave=False):
        pass
    assert readable(out.getvalue().rstrip("\n")).startswith("100%|")
    # A Windows line end is no redraw; a line of only redraws to blank is blank.
    assert readable("done\r") == "done"
    assert readable("\r   \r") == ""


def test_undecodable_bytes_and_control_characters_are_shown_not_acted_on() -> None:
    # As the worker writes a line the program wrote: bytes that are not UTF-8 become U+FFFD.
    line = b"caf\xe9 \xff\xfe ok".decode("utf-8", "replace")
    assert readable(line) == "caf\ufffd \ufffd\ufffd ok"
    assert readable("bell\x07 back\x08 nul\x00 del\x7f nel\x85 ff\x0c") == (
        r"bell\x07 back\x08 nul\x00 del\x7f nel\x85 ff\x0c"
    )
    # A lone ESC does not eat the word after it; a bidi override cannot reverse the line.
    assert readable("esc\x1b word") == r"esc\x1b word"
    assert readable("total \u202e0001$") == r"total \u202e0001$"
    assert readable("a\u2028b") == r"a\u2028b"
    # Tabs stay, and a trainer's traceback keeps its lines, each cleaned.
    assert readable("step\t1") == "step\t1"
    assert readable("Traceback:\n  \x1b[31mValueError\x1b[0m") == "Traceback:\n  ValueError"
    # Plain text, and text in other scripts, is left exactly as it is.
    for plain in ("loss 0.1234", "Schritt 3 \u00fcber \u65e5\u672c", "\U0001f468\u200d\U0001f469"):
        assert readable(plain) == plain


def test_a_programs_log_reads_clean_in_text_and_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(programs.DIR_ENV_VAR, str(tmp_path))
    written = [
        ("stdout", b"\x1b[32mready\x1b[0m"),
        ("stderr", b"\r 50%|#####     | 2/4\r100%|##########| 4/4"),
        ("stdout", b"caf\xe9\x07"),
    ]
    log = programs.log_dir("job-1") / programs.OUTPUT_FILE
    log.parent.mkdir(parents=True)
    with log.open("w", encoding="utf-8") as sink:  # as the worker writes it (its _pump)
        for stream, raw in written:
            text = raw.decode("utf-8", "replace")
            stamp = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC).isoformat(timespec="milliseconds")
            sink.write(json.dumps({"t": stamp, "stream": stream, "line": text}) + "\n")
    lines = ProgramLogs("job-1").new_lines()
    assert [line.human().split(" ", 1)[1] for line in lines] == [
        "[program] ready",
        "[program] 100%|##########| 4/4",
        "[program] caf\ufffd\\x07",
    ]
    # JSON: the text as shown, and the line as the program wrote it.
    records = [json.loads(line.as_json()) for line in lines]
    assert [r["text"] for r in records] == ["ready", "100%|##########| 4/4", "caf\ufffd\\x07"]
    assert [r["raw"] for r in records] == [raw.decode("utf-8", "replace") for _, raw in written]
    assert records[0]["fields"] == {"stream": "stdout"}
    plain = LogLine(datetime.now(UTC), "program", "step 3")
    assert "raw" not in json.loads(plain.as_json())  # nothing to clean: no second copy


def test_a_terminal_that_cannot_encode_the_text_gets_it_escaped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", out)
    Printer(as_json=False).lines([LogLine(datetime.now(UTC), "program", "caf\ufffd \u00e9t\u00e9")])
    out.seek(0)
    assert out.read().endswith(r"[program] caf\ufffd \xe9t\xe9" + "\n")


# ---------------------------------------------------------------------------- program signals


def test_a_programs_signals_read_as_what_happened() -> None:
    lines = _lines("test-a-program-on-a-dead-worker-starts-again-and-resumes-1.json")
    said = [text for text in lines if text.startswith("program ")]
    assert said[:2] == [
        "program started, 16 steps, on crash-2d948a95-programs-1662de54b01a",
        "program progress: step 1, loss 271.1663",
    ]
    assert (
        "program progress: step 4, loss 267.7812 -> 243.6266 (steps 2-4); "
        "checkpoint step-00000004 saved"
    ) in said
    # The worker died; the program's second attempt runs on another worker.
    assert "program started (attempt 2), 16 steps, on crash-2d948a95-programs-bff7a08ceb06" in said
    assert not any("signal program_" in text or "{" in text for text in lines)

    # A trainer lost under the program: the report says so and where the job restores from.
    lines = _lines("test-cookbook-math-rl-unmodified-survives-two-preemptions-0.json")
    (lost, *_) = [text for text in lines if "trainer lost" in text]
    assert lost.startswith("program progress: step 2, loss 0.0000; trainer lost: asample: ")
    assert lost.endswith("; restore point step-00000002")


def test_a_progress_report_shows_its_restore_point_only_when_it_says_something() -> None:
    signals = ProgramSignals()
    ckpt = "accounts/a/rlorTrainerJobs/j-g0/checkpoints/step-00000040"
    saved = {"step": 40, "checkpoints": [{"name": ckpt, "step": 40}], "restore_point": ckpt}
    assert signals.progress(saved) == "program progress: step 40; checkpoint step-00000040 saved"
    # Each later report repeats it: no news.
    again = {"step": 45, "last_loss": 0.1, "restore_point": ckpt}
    assert signals.progress(again) == "program progress: step 45, loss 0.1000"
    # It moved without a checkpoint in the same report (an older one kept after pruning).
    older = ckpt.replace("40", "30")
    assert signals.progress({"step": 46, "restore_point": older}) == (
        "program progress: step 46; restore point step-00000030"
    )


def test_a_program_a_later_run_took_over_reads_as_not_restarted() -> None:
    signals = ProgramSignals()
    restarted = {"control_queue": "q2", "attempt": 1, "generation": 2, "total_steps": 300}
    assert signals.started(restarted) == "program started (start 2), 300 steps, on q2"
    adopted = {**restarted, "adopted": True, "attached": "job-x-g1", "generation": 1}
    assert signals.started(adopted) == (
        "program adopted by this run (still running), 300 steps, on q2, attached to job-x-g1"
    )
    assert signals.started({**adopted, "attached": None, "attempt": 3}).endswith(
        "(still running, attempt 3), 300 steps, on q2, no trainer attached"
    )


def test_program_signals_never_fail_on_fields_they_do_not_know() -> None:
    signals = ProgramSignals()
    # Fields to come (metrics, the model) are shown compactly; empty ones not at all.
    assert signals.progress(
        {"step": 3, "last_loss": 1e-05, "metrics": {"acc": 0.91234567, "n": 8}, "note": None}
    ) == ("program progress: step 3, loss 1e-05; metrics acc=0.912346 n=8")
    assert signals.started(
        {"control_queue": "q", "attempt": 1, "total_steps": None, "model": "Qwen/Qwen3-8B"}
    ) == ("program started, on q, model Qwen/Qwen3-8B")
    # A flag: set, its name; not set, nothing.
    flags = {"step": 2, "resumed": True, "partial": False}
    assert signals.progress(flags) == "program progress: step 2; resumed"
    # A long value is cut; every shape a field could take still makes a line.
    long = signals.progress({"step": 1, "history": list(range(100))})
    assert long.endswith("...") and len(long) < 150
    odd: list[dict[str, Any]] = [
        {},
        {"step": None, "last_loss": "nan?", "losses": [[1], "x", [2, None]], "checkpoints": {}},
        {"step": "7", "checkpoints": ["weird", {"step": 7}, {"name": ""}, 3], "losses": None},
        {"trainer_lost": {"reason": "gone"}, "restore_point": 5},
        {"losses": 5, "checkpoints": "step-1", "attempt": [], "total_steps": {"of": 3}},
        {"last_loss": float("nan"), "losses": [[1, float("inf")], [2, -0.5]]},
    ]
    for payload in odd:
        assert signals.progress(payload).startswith("program progress: step ")
        assert signals.started(payload).startswith("program started")
    assert signals.started({"attempt": "two"}) == "program started (attempt two)"
    assert signals.progress(odd[2]) == (
        "program progress: step 7; checkpoints weird, at step 7, name=, 3 saved"
    )
