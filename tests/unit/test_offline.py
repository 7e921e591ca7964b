"""Tokenizers offline (shepherd/offline.py): the Hugging Face cache users and ``shepherd dev``
write, and the worker's check that a program's tokenizer loads from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shepherd import offline

MODEL = "Qwen/Qwen3-8B-Base"


def test_a_written_cache_loads_offline_as_a_program_loads_it(tmp_path: Path) -> None:
    home = offline.write_hf_cache(tmp_path / "hf", MODEL)
    env = offline.offline_env(home)
    assert offline.tokenizer_problem(MODEL, env) is None
    # In a fresh process, as a program would (HF_HOME is read at huggingface_hub's import).
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "from transformers import AutoTokenizer as A; "
            f"print(A.from_pretrained({MODEL!r}).encode('hi', add_special_tokens=False))",
        ],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert loaded.stdout.strip() == "[104, 105]", loaded.stderr[-2000:]
    # Writing it again changes nothing.
    before = {p: p.stat().st_mtime_ns for p in home.rglob("*") if p.is_file()}
    offline.write_hf_cache(home, MODEL)
    assert {p: p.stat().st_mtime_ns for p in home.rglob("*") if p.is_file()} == before


def test_a_missing_tokenizer_is_named_with_how_to_get_it(tmp_path: Path) -> None:
    env = offline.offline_env(tmp_path / "empty")
    problem = offline.tokenizer_problem(MODEL, env)
    assert problem is not None and MODEL in problem
    assert 'docs/programs.md, "Tokenizers offline"' in problem
    assert f"python -m shepherd.offline --hf-home {tmp_path / 'empty'} {MODEL}" in problem
    # Online, the program downloads it: nothing to check.
    assert offline.tokenizer_problem(MODEL, {"HF_HOME": str(tmp_path / "empty")}) is None


def test_a_real_download_is_never_overwritten_and_names_are_names(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--Qwen--Qwen3-8B-Base"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("a" * 40)
    with pytest.raises(offline.OfflineError, match="already holds"):
        offline.write_hf_cache(tmp_path, MODEL)
    assert (repo / "refs" / "main").read_text() == "a" * 40
    for bad in ("../etc", "a/b/c", "", "a/..", "/abs"):
        with pytest.raises(offline.OfflineError, match="not a Hugging Face model name"):
            offline.write_hf_cache(tmp_path, bad)


def test_the_command_writes_the_cache_and_says_what_to_export(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "shepherd.offline", "--hf-home", str(tmp_path / "hf"), MODEL],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"export HF_HOME={tmp_path / 'hf'}" in done.stdout
    assert "export HF_HUB_OFFLINE=1" in done.stdout
    assert offline.tokenizer_problem(MODEL, offline.offline_env(tmp_path / "hf")) is None
