"""Running the unmodified tinker-cookbook (0.5.8) offline, against any Tinker endpoint.

Reusable: the tests here run recipes against localplane directly; tests that run recipes
*under Shepherd* (issue 18) use the same pieces. What a recipe needs on a machine without the
Hugging Face hub (see /work/shared/cookbook-notes.md):

* a tokenizer for its model name: :func:`hf_home` builds an HF cache whose
  ``Qwen/Qwen3-8B-Base`` is localplane's byte-level tokenizer (ids = UTF-8 bytes, 256 =
  ``<|endoftext|>``), which the cookbook's recommended renderer for that model
  (``role_colon``) can use (shepherd.offline, as users and ``shepherd dev`` make it);
* the environment of :func:`offline_env` (no hub, no dataset downloads, no telemetry) plus
  the endpoint and key (:func:`recipe_env`);
* a recipe run as a user runs it: :func:`run_recipe`, a subprocess with a deadline whose
  output is kept for the failure message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from shepherd import offline

#: A model name in the cookbook's model table whose recommended renderer needs only
#: encode, decode and an EOS id — which the byte-level tokenizer has.
MODEL = "Qwen/Qwen3-8B-Base"
RENDERER = "role_colon"


def hf_home(root: Path, model: str = MODEL) -> Path:
    """An HF_HOME whose hub cache holds ``model``'s tokenizer (the byte-level one), written as
    users write it (shepherd.offline)."""
    return offline.write_hf_cache(root / "hf-home", model)


def offline_env(home: Path) -> dict[str, str]:
    """What keeps a recipe off the network: no hub, no dataset downloads, no telemetry."""
    return {
        **offline.offline_env(home),
        # The cookbook fetches a pricing file with a 5 s timeout; nothing answers offline.
        "NO_PROXY": "*",
    }


def recipe_env(base_url: str, api_key: str, home: Path) -> dict[str, str]:
    """The environment of a recipe run against ``base_url`` with ``api_key`` (``tml-…``)."""
    return {
        **os.environ,
        **offline_env(home),
        "TINKER_BASE_URL": base_url,
        "TINKER_API_KEY": api_key,
    }


def run_recipe(
    module: str,
    args: list[str],
    env: dict[str, str],
    *,
    cwd: Path,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` (a chz recipe takes ``key=value`` arguments); raises with the
    recipe's output when it fails or outlives ``timeout``."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", module, *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = (
            (exc.stdout or b"")[-4000:]
            if isinstance(exc.stdout, bytes)
            else (exc.stdout or "")[-4000:]
        )
        raise AssertionError(f"{module} did not finish within {timeout}s:\n{out}") from None
    if done.returncode != 0:
        raise AssertionError(
            f"{module} {' '.join(args)} exited {done.returncode}:\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        )
    return done


def metrics(log_path: Path) -> list[dict[str, object]]:
    """The recipe's metrics.jsonl, one dict per logged step."""
    path = log_path / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
