"""Tokenizers for workers without the Hugging Face Hub.

A program picks its tokenizer by a model's Hugging Face name (the cookbook's ``model_name``)
and loads it from the Hub, or, offline (``HF_HUB_OFFLINE=1``), from the Hugging Face cache
under ``HF_HOME``. This module:

* writes such a cache entry for a model name (:func:`write_hf_cache`), by default with
  localplane's byte-level tokenizer (ids = UTF-8 bytes, 256 = ``<|endoftext|>``): the one
  tokenizer whose ids localplane's stand-in model takes, and enough for the cookbook's
  ``role_colon`` renderer. ``shepherd dev`` prepares it for its worker; on the command line:

      python -m shepherd.offline --hf-home DIR Qwen/Qwen3-8B-Base

  (a real model's tokenizer for a hosted trainer comes from the Hub instead, downloaded once
  where there is network: docs/programs.md, "Tokenizers offline");
* says whether a tokenizer loads offline on this worker (:func:`tokenizer_problem`), which a
  program job's preflight asks before any trainer exists.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

#: A snapshot id for the cache layout (any 40-hex string loads offline).
SNAPSHOT = "0" * 40
#: The model names ``shepherd dev`` prepares: the examples' (the cookbook's model table has it,
#: and its recommended renderer, role_colon, needs only what a byte-level tokenizer has).
DEV_MODELS = ("Qwen/Qwen3-8B-Base",)
#: Where the docs say how to get a tokenizer onto an offline worker.
HOW = 'docs/programs.md, "Tokenizers offline"'
#: Hugging Face repo ids: ``name`` or ``org/name`` (no path tricks: they become directories).
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")
_TRUE = {"1", "true", "yes", "on"}


class OfflineError(ValueError):
    """A cache entry that cannot be written as asked."""


def byte_tokenizer_files() -> dict[str, str]:
    """localplane's byte-level tokenizer, as the files of a tokenizer directory."""
    from localplane.trainer.tokenizer import tokenizer_files

    return tokenizer_files()


def write_hf_cache(home: Path, model: str, files: Mapping[str, str] | None = None) -> Path:
    """Put a tokenizer for ``model`` into the Hugging Face cache of ``HF_HOME=home``, laid out
    as the Hub's download lays it out (``hub/models--<org>--<name>/snapshots/<id>/`` and
    ``refs/main``); ``files`` (name -> text) default to the byte-level tokenizer. Returns
    ``home``. Writing it again is a no-op; a cache that holds another snapshot of ``model``
    (a real download) is left alone and refused."""
    if not _REPO_ID.fullmatch(model) or ".." in model:
        raise OfflineError(f"{model!r} is not a Hugging Face model name (org/name)")
    files = dict(byte_tokenizer_files() if files is None else files)
    # transformers 5 reads a config.json beside the tokenizer; an empty one is enough.
    files.setdefault("config.json", json.dumps({}) + "\n")
    repo = Path(home) / "hub" / f"models--{model.replace('/', '--')}"
    ref = repo / "refs" / "main"
    current = ref.read_text().strip() if ref.is_file() else None
    if current not in (None, SNAPSHOT):
        raise OfflineError(
            f"{repo} already holds {model} (snapshot {current}); leave it, or use another "
            "HF_HOME for the byte-level tokenizer"
        )
    snapshot = repo / "snapshots" / SNAPSHOT
    if not _holds(snapshot, files):
        # Built aside and renamed into place: a worker reading the cache meanwhile sees the
        # whole snapshot or none.
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".snapshot.", dir=snapshot.parent))
        try:
            staging.chmod(0o755)
            for name, text in files.items():
                (staging / name).write_text(text, encoding="utf-8")
            shutil.rmtree(snapshot, ignore_errors=True)
            os.rename(staging, snapshot)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    if current != SNAPSHOT:
        ref.parent.mkdir(parents=True, exist_ok=True)
        staged = ref.with_name(".main.tmp")
        staged.write_text(SNAPSHOT)
        os.replace(staged, ref)
    return Path(home)


def _holds(snapshot: Path, files: Mapping[str, str]) -> bool:
    try:
        return all(
            (snapshot / name).read_text(encoding="utf-8") == text for name, text in files.items()
        )
    except OSError:
        return False


def offline_env(home: Path) -> dict[str, str]:
    """The environment of a worker (and so of its programs) that reads tokenizers from the
    cache at ``home`` and never asks the Hub, nor sends the tinker SDK's telemetry."""
    return {
        "HF_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TINKER_TELEMETRY": "0",
    }


def is_offline(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return any(
        env.get(name, "").strip().lower() in _TRUE
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def hub_cache(env: Mapping[str, str] | None = None) -> Path:
    """The Hugging Face cache a program started with ``env`` reads (as huggingface_hub finds
    it: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``). Worked out
    from ``env`` now, not from huggingface_hub's constants, which it fixes at its import."""
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


#: (model, cache) pairs whose tokenizer loaded: a worker checks each once.
_LOADED: set[tuple[str, str]] = set()


def tokenizer_problem(model: str, env: Mapping[str, str] | None = None) -> str | None:
    """Why a program started with ``env`` (the worker's) could not load ``model``'s tokenizer
    (None: it can, or the worker is online and the program downloads it). Loads it from the
    cache only (``local_files_only``), as an offline program would."""
    env = os.environ if env is None else env
    if not is_offline(env):
        return None
    cache = hub_cache(env)
    if (model, str(cache)) in _LOADED:
        return None
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(model, cache_dir=str(cache), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever stops it loading stops the program
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        return (
            f"the worker is offline (HF_HUB_OFFLINE=1) and no tokenizer for {model!r} loads "
            f"from its Hugging Face cache ({cache}: {reason}); put one there ({HOW}): "
            f"python -m shepherd.offline --hf-home {cache.parent} {model} writes localplane's "
            f"byte-level one; for a hosted trainer, HF_HOME={cache.parent} hf download {model} "
            "tokenizer.json tokenizer_config.json config.json where there is network"
        )
    _LOADED.add((model, str(cache)))
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shepherd.offline",
        description="Write localplane's byte-level tokenizer into a Hugging Face cache under "
        "the given model names, so programs find it offline (HF_HUB_OFFLINE=1).",
    )
    parser.add_argument("models", nargs="*", default=list(DEV_MODELS), metavar="MODEL")
    # Required: a stand-in tokenizer under a real model's name belongs in a cache of its own,
    # not in the one a user's real downloads live in.
    parser.add_argument(
        "--hf-home", type=Path, required=True, help="the cache's directory (the HF_HOME to use)"
    )
    args = parser.parse_args(argv)
    home = args.hf_home
    try:
        for model in args.models:
            write_hf_cache(home, model)
    except OfflineError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    lines = [f"byte-level tokenizer written for {', '.join(args.models)}; run the worker with:"]
    lines += [f"export {key}={value}" for key, value in offline_env(home.resolve()).items()]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
