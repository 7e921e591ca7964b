"""The README's commands and examples, and the docs pages its content moved to (issue 27), as a
new user copies them, match the repository (issue 17: run in order they collided on one model
id; its sweep named another base). That every command in them parses, every path and link
exists and every spec validates is tests/unit/test_docs_commands.py."""

from __future__ import annotations

import asyncio
import re
import shlex
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from shepherd.spec import is_template, load_job_spec, resolve_templates

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _text(doc: str) -> str:
    return (ROOT / doc).read_text()


def _section(doc: str, heading: str) -> str:
    """The section of ``doc`` under ``heading``, up to the next heading of its level or above
    (a ``#`` comment in a code block is no heading)."""
    lines = _text(doc).splitlines()
    first = lines.index(heading)
    level, fenced = len(heading.split(" ")[0]), False
    for n, line in enumerate(lines[first + 1 :], first + 1):
        fenced ^= line.lstrip().startswith("```")
        if not fenced and re.match(rf"#{{1,{level}}} ", line):
            return "\n".join(lines[first:n])
    return "\n".join(lines[first:])


def _blocks(doc: str, heading: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", _section(doc, heading), re.S)


def test_the_readme_opens_with_the_two_commands() -> None:
    """A newcomer's two commands are the first block of the README's first section."""
    first_section = re.search(r"^## .*$", README, re.M)
    assert first_section is not None and first_section.group(0) == "## On a fresh machine"
    first_block = re.search(r"```(\w*)\n(.*?)```", README, re.S)
    assert first_block is not None and first_block.group(1) == "sh"
    assert first_block.start() > first_section.start()
    commands = [line.split("#")[0].strip() for line in first_block.group(2).splitlines()]
    assert commands == ["make demo", "make test"]


@pytest.mark.parametrize(
    ("doc", "heading", "at_least"),
    [("README.md", "## A five-minute tour", 2), ("docs/jobs.md", "## The CLI", 3)],
)
def test_submissions_run_in_order_never_share_a_model_id(
    doc: str, heading: str, at_least: int
) -> None:
    """Run in order, every submission of the section claims a model id of its own."""
    claimed: list[str] = []
    when = datetime(2026, 11, 24, 9, tzinfo=UTC)
    lines = [line for block in _blocks(doc, heading, "sh") for line in block.splitlines()]
    for line in lines:
        words = shlex.split(line, comments=True)
        if words[:2] != ["shepherd", "submit"]:
            continue
        overrides = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
        spec = load_job_spec(ROOT / words[2], overrides)
        if spec.output.promote == "none":
            continue
        assert spec.output.model_id and is_template(spec.output.model_id), line
        when += timedelta(seconds=30)  # one command after the other
        claimed.append(str(resolve_templates(spec, when).output.model_id))
    assert len(claimed) >= at_least and len(set(claimed)) == len(claimed), claimed


def test_the_sweep_example_is_the_file() -> None:
    shown = yaml.safe_load(_blocks("docs/schedules-and-sweeps.md", "## Sweeps", "yaml")[0])
    on_disk = yaml.safe_load((ROOT / "examples" / "sweep.yaml").read_text())
    assert {k: on_disk.get(k) for k in shown} == shown


def test_the_dev_stack_key_is_described_as_printed() -> None:
    # `shepherd dev` shows the key on a terminal only (tests/test_dev_stack.py checks it).
    text = " ".join(_text("docs/localplane.md").split())
    assert (
        "the dev API key (on a terminal; when its output goes to a file or a pipe, the path" in text
    )


def test_the_reapers_grace_is_one_default_and_the_readme_says_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``shepherd dev`` installs the reaper with the grace everyone else defaults to
    (``reaper run`` once used 10 min where the dev stack's reaper used 2), and the README
    names that grace where it describes the reaper (docs/production.md)."""
    from types import SimpleNamespace

    from shepherd import reaper
    from workers import devstack

    installed: dict[str, Any] = {}

    async def install(client: Any, task_queue: str, **settings: Any) -> str:
        installed.update(settings)
        return reaper.SCHEDULE_ID

    async def connect(settings: Any) -> object:
        return object()

    monkeypatch.setattr(reaper, "install", install)
    monkeypatch.setattr(devstack, "connect", connect)
    stack = devstack.DevStack(tmp_path)
    stack.temporal = SimpleNamespace(address="127.0.0.1:1")  # type: ignore[assignment]
    asyncio.run(stack._install_reaper())
    assert installed["grace"] == reaper.REAPER_GRACE
    assert reaper.ReaperInput().grace == reaper.REAPER_GRACE
    minutes = reaper.REAPER_GRACE.total_seconds() / 60
    text = " ".join(_text("docs/production.md").split())
    assert f"longer than the grace: {minutes:g} min unless `--grace` says otherwise" in text
    assert "`shepherd dev` uses it too" in text
