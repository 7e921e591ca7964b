"""The tinker-cookbook's DPO trainer (``tinker_cookbook.preference.train_dpo.main``, unmodified)
on a few hand-made comparisons, for ``python -m tests.plane.cookbook_dpo LOG_PATH BASE_URL``.

The cookbook's DPO CLI knows only hub datasets; this driver hands ``train_dpo.main`` the same
``DPODatasetBuilderFromComparisons`` with a comparison builder over an in-memory dataset, so
nothing is downloaded. What the run exercises on the server: ``forward_backward_custom`` (a
forward, then a weighted cross_entropy), the reference sampler's ``compute_logprobs``,
periodic checkpoints with a TTL, and rolling checkpoints deleted through the REST API.
The knobs come from the environment (see the names below) so a test can make TTLs short.
"""

from __future__ import annotations

import os
import sys

import chz
import datasets
from tinker_cookbook.preference import train_dpo
from tinker_cookbook.preference.dpo_datasets import DPODatasetBuilderFromComparisons
from tinker_cookbook.preference.preference_datasets import ComparisonDatasetBuilder
from tinker_cookbook.preference.types import Comparison, LabeledComparison
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

MODEL = "Qwen/Qwen3-8B-Base"
RENDERER = "role_colon"
PAIRS = [
    ("What is 2+2?", "4", "5"),
    ("Capital of France?", "Paris", "Rome"),
    ("Say hi.", "hi", "bye"),
    ("Is ice cold?", "yes", "no"),
]


@chz.chz
class InlineComparisons(ComparisonDatasetBuilder):
    """The PAIRS above as a Hugging Face dataset built in memory (offline)."""

    def get_train_and_test_datasets(self) -> tuple[datasets.Dataset, datasets.Dataset | None]:
        rows = [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in PAIRS]
        return datasets.Dataset.from_list(rows), None

    def example_to_labeled_comparison(self, example: dict) -> LabeledComparison | None:
        comparison = Comparison(
            prompt_conversation=[{"role": "user", "content": example["prompt"]}],
            completion_A=[{"role": "assistant", "content": example["chosen"]}],
            completion_B=[{"role": "assistant", "content": example["rejected"]}],
        )
        return LabeledComparison(comparison=comparison, label="A")


def main(log_path: str, base_url: str) -> None:
    builder = DPODatasetBuilderFromComparisons(
        common_config=ChatDatasetBuilderCommonConfig(
            model_name_for_tokenizer=MODEL,
            renderer_name=RENDERER,
            max_length=256,
            batch_size=2,
        ),
        comparison_builder=InlineComparisons(),
    )
    config = train_dpo.Config(
        log_path=log_path,
        model_name=MODEL,
        recipe_name="recipe_preference_dpo",
        renderer_name=RENDERER,
        dataset_builder=builder,
        learning_rate=1e-2,
        dpo_beta=0.5,
        lora_rank=4,
        base_url=base_url,
        save_every=int(os.environ.get("DPO_SAVE_EVERY", "2")),
        eval_every=0,
        infrequent_eval_every=0,
        ttl_seconds=int(os.environ.get("DPO_TTL_SECONDS", "604800")),
        rolling_save_every=int(os.environ.get("DPO_ROLLING_SAVE_EVERY", "1")),
        rolling_ttl_seconds=int(os.environ.get("DPO_ROLLING_TTL_SECONDS", "7200")),
        max_steps=int(os.environ.get("DPO_MAX_STEPS", "4")),
    )
    train_dpo.main(config)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
