"""A program job shows the program's own measure of progress (issue 30, item 4): the metrics
the program writes (its metrics file: ``SHEPHERD_METRICS_FILE``, the cookbook's
``metrics.jsonl``) are curves of the job's, a spec's ``checkpoint.metric`` and ``mode`` pick
the best checkpoint by one of them, and the promoted model is that checkpoint's weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError

from shepherd.models import JobStatus
from shepherd.phases import Phase
from tests.helpers import run_cli
from tests.workflows.conftest import Stack
from tests.workflows.test_programs import printed, promoted_digest, sft_spec


def scored_spec(stack: Stack, name: str, metrics: list[str] | None = None, **sections: Any) -> Any:
    spec = sft_spec(
        stack,
        name,
        program="scored",
        args={"steps": 12, "peak": 8},
        **{"checkpoint": {"every_steps": 4, "keep_last": 1}, **sections},
    )
    return spec.model_copy(
        update={"training": spec.training.model_copy(update={"metrics": metrics or []})}
    )


async def test_the_programs_own_metric_picks_the_best_or_says_it_cannot(
    stack: Stack, programs_env: Path
) -> None:
    """Three jobs of one program at once: the best checkpoint by a metric it writes is
    promoted; a metric equal at every checkpoint decides nothing; one it never writes is
    said at once and fails ``promote: best`` clearly."""
    scored = await stack.start(
        scored_spec(
            stack,
            "scored",
            metrics=["loss"],
            checkpoint={"every_steps": 4, "keep_last": 1, "metric": "score", "mode": "max"},
            output={"model_id": "scored-model", "promote": "best"},
        )
    )
    flat = await stack.start(
        scored_spec(
            stack,
            "flat",
            checkpoint={"every_steps": 4, "keep_last": 3, "metric": "flat", "mode": "max"},
            output={"model_id": "flat-model", "promote": "best"},
        )
    )
    unscored = await stack.start(
        scored_spec(
            stack,
            "unscored",
            checkpoint={"every_steps": 4, "keep_last": 2, "metric": "reward", "mode": "max"},
            output={"model_id": "unscored-model", "promote": "best"},
        )
    )
    # The total is known from the job's start (its arguments), not when the program says.
    early = await stack.until(scored, lambda s: s.total_steps > 0, timeout=30)
    assert early.total_steps == 12

    # Best by score (10 around step 8), kept past keep_last: 1, and promoted.
    final: JobStatus = await scored.result()
    assert final.phase is Phase.COMPLETED and final.step == 12
    assert final.best is not None and final.best.step == 8 and final.best.metric == 10.0
    assert final.best_decided
    digests = {line["step"]: line["digest"] for line in printed(programs_env, scored)}
    assert await promoted_digest(stack, "scored") == digests[8]
    assert final.model is not None and "step-00000008" in (final.model.checkpoint or "")
    # The program's curves, by its own step (0 .. 11), and its newest values.
    assert [p.step for p in final.metric_curves["score"]] == list(range(12))
    assert [p.step for p in final.metric_curves["loss"]] == list(range(12))
    assert final.metrics_step == 11 and set(final.metrics) == {"score", "loss", "flat"}
    assert [p.step for p in final.eval_curve] == [4, 8, 12]
    shown = await run_cli("status", scored.id, "--plot", "--metric", "score", stack=stack)
    assert shown.returncode == 0, shown.stderr
    assert "score (the program's, by its step)" in shown.stdout and "program" in shown.stdout
    wrong = await run_cli("status", scored.id, "--plot", "--metric", "reward", stack=stack)
    assert wrong.returncode == 2 and "keeps: score, loss" in wrong.stderr, wrong.stderr
    assert "flat" in wrong.stderr  # the program's other metrics, by name

    # A metric that is the same at every checkpoint (as math_rl's default loss, 0.0 at every
    # step) decides nothing: no checkpoint is called best, and promote: best takes the
    # latest of equals — the weights the program ended with.
    even: JobStatus = await flat.result()
    assert even.phase is Phase.COMPLETED
    assert even.best is not None and even.best.step == 12 and not even.best_decided
    ended = printed(programs_env, flat)[-1]
    assert ended["step"] == 12 and await promoted_digest(stack, "flat") == ended["digest"]
    shown = await run_cli("status", flat.id, stack=stack)
    assert "flat is the same at every checkpoint: it decides nothing" in shown.stdout
    listed = await run_cli("checkpoints", flat.id, stack=stack)
    assert listed.returncode == 0 and "*" not in listed.stdout, listed.stdout
    said = json.loads((await run_cli("status", flat.id, "--json", stack=stack)).stdout)
    assert said["metrics"]["flat"] == 0.0

    # A metric the program never writes: said at its first record, and best fails clearly.
    with pytest.raises(WorkflowFailureError):
        await unscored.result()
    failed = await stack.status(unscored)
    assert failed.phase is Phase.FAILED and failed.error is not None
    assert failed.error.type == "MetricMissing"
    assert "checkpoint.metric 'reward'" in failed.error.message
    assert "flat, loss, score" in failed.error.message  # what the program does write
    assert any("no such metric (it writes flat, loss, score)" in n for n in failed.notices)
    assert failed.best is None and failed.cleanup == "done" and failed.checkpoints
