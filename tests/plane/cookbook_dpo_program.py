"""The tinker-cookbook's DPO trainer (``tinker_cookbook.preference.train_dpo.main``, unmodified)
as a *program*: ``python -m tests.plane.cookbook_dpo_program log_path=DIR [max_steps=5 ...]``.

The same run as tests/plane/cookbook_dpo.py (its in-memory comparisons, no download), but with
``key=value`` arguments, as Shepherd passes a program's (the job's log directory comes as
``log_path=``), and the endpoint from ``TINKER_BASE_URL`` (``base_url`` left None, as a user's
program leaves it). The reference sampler is ``train_dpo``'s own: a sampler saved from the
initial weights before the first step and used for every step after (a frozen snapshot)."""

from __future__ import annotations

import chz
from tinker_cookbook.preference import train_dpo
from tinker_cookbook.preference.dpo_datasets import DPODatasetBuilderFromComparisons
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

from tests.plane.cookbook_dpo import MODEL, RENDERER, InlineComparisons


@chz.chz
class Args:
    log_path: str
    #: The model the program asks for (Shepherd's registration names it, as the cookbook's).
    model_name: str = MODEL
    #: Steps: the comparisons make 2 batches of 2 an epoch; ``num_epochs`` epochs, capped here.
    max_steps: int = 5
    num_epochs: int = 3
    batch_size: int = 2
    save_every: int = 2
    rolling_save_every: int = 1
    learning_rate: float = 1e-2
    lora_rank: int = 4
    base_url: str | None = None


def main(args: Args) -> None:
    builder = DPODatasetBuilderFromComparisons(
        common_config=ChatDatasetBuilderCommonConfig(
            model_name_for_tokenizer=args.model_name,
            renderer_name=RENDERER,
            max_length=256,
            batch_size=args.batch_size,
        ),
        comparison_builder=InlineComparisons(),
    )
    train_dpo.main(
        train_dpo.Config(
            log_path=args.log_path,
            model_name=args.model_name,
            recipe_name="recipe_preference_dpo",
            renderer_name=RENDERER,
            dataset_builder=builder,
            learning_rate=args.learning_rate,
            dpo_beta=0.5,
            lora_rank=args.lora_rank,
            base_url=args.base_url,
            num_epochs=args.num_epochs,
            save_every=args.save_every,
            eval_every=0,
            infrequent_eval_every=0,
            rolling_save_every=args.rolling_save_every,
            max_steps=args.max_steps,
        )
    )


if __name__ == "__main__":
    main(chz.entrypoint(Args))
