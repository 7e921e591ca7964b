"""Tiny stand-ins for the Hugging Face Hub datasets the cookbook's recipes load by name, written
where ``datasets.load_dataset("<hub id>")`` finds them offline.

``sl_loop`` calls ``load_dataset("HuggingFaceH4/no_robots")``, ``rl_loop``
``load_dataset("openai/gsm8k", "main")`` and on-policy distillation (``dataset=deepmath``)
``load_dataset("zwhe99/DeepMath-103K", split="train")``, none of them with a way to name a
local file. With ``HF_DATASETS_OFFLINE=1`` (or ``HF_HUB_OFFLINE=1``) ``datasets`` 5 answers a
hub id from its own cache, ``$HF_HOME/datasets/<namespace>___<name>/<config>/<version>/<hash>/``
(``datasets.load.CachedDatasetModuleFactory`` and the ``cache`` packaged builder): a
``dataset_info.json`` and one Arrow file per split. :func:`write_hub_datasets` prepares exactly
that, with a real ``datasets`` builder (so the layout is what ``datasets`` itself writes), for
each dataset the recipes ask for: the same columns, a few made-up rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
from datasets.naming import camelcase_to_snakecase

#: A fixed "hash" directory (datasets names it after its builder's code; any string works).
_HASH = "localfixture"

#: ``HuggingFaceH4/no_robots``: chat conversations in ``messages`` (sl_loop trains on them).
NO_ROBOTS_ROWS = 40


def no_robots_rows(n: int = NO_ROBOTS_ROWS) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        rows.append(
            {
                "prompt": f"Say {i} twice.",
                "prompt_id": f"{i:04d}",
                "messages": [
                    {"role": "user", "content": f"Say {i} twice."},
                    {"role": "assistant", "content": f"{i} {i}"},
                ],
                "category": "Generation",
            }
        )
    return rows


def gsm8k_rows(n: int = 40) -> list[dict[str, Any]]:
    """``openai/gsm8k`` (config ``main``): ``question`` and ``answer`` ending ``#### <n>``."""
    return [
        {
            "question": f"Tom has {i} apples and buys {i + 2} more. How many apples?",
            "answer": f"He has {i} + {i + 2} = {2 * i + 2} apples.\n#### {2 * i + 2}",
        }
        for i in range(n)
    ]


def deepmath_rows(n: int = 40) -> list[dict[str, Any]]:
    """``zwhe99/DeepMath-103K``: the distillation recipe reads ``question`` only."""
    return [
        {
            "question": f"What is {i} times 3?",
            "final_answer": str(3 * i),
            "difficulty": 1.0,
            "topic": "Mathematics -> Arithmetic",
        }
        for i in range(n)
    ]


class _Rows(datasets.GeneratorBasedBuilder):
    """A builder over rows given in memory, named after a hub dataset (its cache directory)."""

    VERSION = datasets.Version("0.0.0")

    def __init__(self, *, splits: Mapping[str, Sequence[Mapping[str, Any]]], **kwargs: Any):
        self._splits = splits
        super().__init__(**kwargs)

    def _info(self) -> datasets.DatasetInfo:
        return datasets.DatasetInfo()

    def _split_generators(self, dl_manager: Any) -> list[datasets.SplitGenerator]:
        return [
            datasets.SplitGenerator(name=name, gen_kwargs={"rows": rows})
            for name, rows in self._splits.items()
        ]

    def _generate_examples(self, rows: Sequence[Mapping[str, Any]]) -> Iterator[Any]:
        yield from enumerate(rows)


def write_hub_dataset(
    home: Path,
    repo_id: str,
    splits: Mapping[str, Sequence[Mapping[str, Any]]],
    config: str = "default",
) -> Path:
    """Put ``splits`` into ``home``'s datasets cache as hub dataset ``repo_id`` (``config``);
    returns the directory written."""
    builder = _Rows(
        splits=splits,
        cache_dir=str(home / "datasets"),
        dataset_name=repo_id.split("/")[-1],
        repo_id=repo_id,
        config_name=config,
        hash=_HASH,
    )
    builder.download_and_prepare()
    return Path(builder.cache_dir)


def write_hub_datasets(home: Path) -> Path:
    """The datasets sl_loop, rl_loop and distillation (``deepmath``) load, under ``home``
    (an ``HF_HOME``, e.g. :func:`tests.plane.cookbook_support.hf_home`'s); returns ``home``."""
    wanted = [
        ("HuggingFaceH4/no_robots", {"train": no_robots_rows()}, "default"),
        ("openai/gsm8k", {"train": gsm8k_rows()}, "main"),
        ("zwhe99/DeepMath-103K", {"train": deepmath_rows()}, "default"),
    ]
    for repo_id, splits, config in wanted:
        if not cache_dir(home, repo_id).exists():
            write_hub_dataset(home, repo_id, splits, config)
    return home


def cache_dir(home: Path, repo_id: str) -> Path:
    """Where ``datasets`` keeps hub dataset ``repo_id`` under ``home`` (an ``HF_HOME``)."""
    namespace, name = repo_id.split("/")
    return home / "datasets" / f"{namespace}___{camelcase_to_snakecase(name)}"
