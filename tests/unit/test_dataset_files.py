"""Dataset files the worker reads: only inside the operator's allowed directories (when
set), and a refusal never tells whether, or where, a file exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from shepherd import datasets

GOOD = '{"text": "one"}\n{"text": "two"}\n'


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    datasets.load.cache_clear()


def _refusal(name: str) -> str:
    datasets.load.cache_clear()
    with pytest.raises(datasets.DatasetError) as refused:
        datasets.load(name)
    return str(refused.value)


def test_only_allowed_directories_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    allowed, outside = tmp_path / "allowed", tmp_path / "secret"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "ok.jsonl").write_text(GOOD)
    (outside / "data.jsonl").write_text(GOOD)
    (allowed / "link.jsonl").symlink_to(outside / "data.jsonl")
    (allowed / "dir.jsonl").mkdir()
    monkeypatch.setenv(datasets.DIRS_ENV, str(allowed))

    assert len(datasets.load(str(allowed / "ok.jsonl"))) == 2
    answers = {
        _refusal(str(outside / "data.jsonl")).replace("data.jsonl", "X"),  # exists, outside
        _refusal(str(outside / "missing.jsonl")).replace("missing.jsonl", "X"),
        _refusal(str(allowed / "link.jsonl")).replace("link.jsonl", "X"),  # a way out
        _refusal(str(allowed / "dir.jsonl")).replace("dir.jsonl", "X"),
        _refusal("file://" + str(allowed / "nope.jsonl")).replace("nope.jsonl", "X"),
    }
    assert len(answers) == 1  # the same words whether the file exists or not
    (answer,) = answers
    assert str(tmp_path) not in answer and datasets.DIRS_ENV in answer


def test_unset_means_any_readable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(datasets.DIRS_ENV, raising=False)
    (tmp_path / "d.jsonl").write_text(GOOD)
    assert len(datasets.load(str(tmp_path / "d.jsonl"))) == 2
    assert "not readable" in _refusal(str(tmp_path / "absent.jsonl"))
