"""The README's commands and examples, as a new user copies them, match the repository
(issue 17: run in order they collided on one model id; its sweep named another base)."""

from __future__ import annotations

import asyncio
import re
import shlex
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from shepherd.client import load_job_spec
from shepherd.spec import is_template, resolve_templates

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _block(after: str, lang: str) -> str:
    start = README.index(after)
    m = re.compile(rf"```{lang}\n(.*?)```", re.S).search(README, start)
    assert m is not None
    return m.group(1)


def test_using_shepherd_submissions_never_share_a_model_id() -> None:
    """Run in order, every submission of the section claims a model id of its own."""
    claimed: list[str] = []
    when = datetime(2026, 11, 24, 9, tzinfo=UTC)
    for line in _block("## Using Shepherd", "sh").splitlines():
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
    assert len(claimed) >= 3 and len(set(claimed)) == len(claimed), claimed


def test_the_sweep_example_is_the_file() -> None:
    shown = yaml.safe_load(_block("### Sweeps", "yaml"))
    on_disk = yaml.safe_load((ROOT / "examples" / "sweep.yaml").read_text())
    assert {k: on_disk.get(k) for k in shown} == shown


def test_the_dev_stack_key_is_described_as_printed() -> None:
    # `shepherd dev` shows the key on a terminal only (tests/test_dev_stack.py checks it).
    text = " ".join(README.split())
    assert (
        "the dev API key (on a terminal; when its output goes to a file or a pipe, the path" in text
    )


def test_the_reapers_grace_is_one_default_and_the_readme_says_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``shepherd dev`` installs the reaper with the grace everyone else defaults to
    (``reaper run`` once used 10 min where the dev stack's reaper used 2), and the README
    names that grace where it describes the reaper."""
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
    text = " ".join(README.split())
    assert f"longer than the grace: {minutes:g} min unless `--grace` says otherwise" in text
    assert "`shepherd dev` uses it too" in text
