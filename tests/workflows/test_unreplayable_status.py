"""A job whose history no worker can replay (a bug, an incompatible version): ``status``,
``watch`` and ``list`` still show what the search attributes say, with a line saying that
the live status is unavailable and why, instead of the SDK's error."""

from __future__ import annotations

import json
import uuid

from temporalio.worker import Worker

from tests.helpers import run_cli
from tests.workflows.conftest import Stack, worker_for
from tests.workflows.drifting import IncompatibleTrainingJob


async def test_status_watch_and_list_survive_a_history_that_does_not_replay(stack: Stack) -> None:
    queue = f"tq-{uuid.uuid4().hex}"
    handle = await stack.start(stack.spec("orphaned"), task_queue=queue)
    async with worker_for(stack.client, queue, stack.registry):
        final = await handle.result()
    # Only workers of an incompatible version poll the job's queue now.
    async with Worker(
        stack.client,
        task_queue=queue,
        workflows=[IncompatibleTrainingJob],
        max_cached_workflows=0,
    ):
        shown = await run_cli("status", handle.id, "--json", stack=stack)
        assert shown.returncode == 0, shown.stderr
        assert "Traceback" not in shown.stderr + shown.stdout
        status = json.loads(shown.stdout)
        assert status["phase"] == "COMPLETED" and status["step"] == final.step
        assert status["model"]["name"] == final.model.name  # type: ignore[union-attr]
        assert any(
            "live status unavailable" in n and "does not replay" in n for n in status["notices"]
        )
        text = await run_cli("status", handle.id, stack=stack)
        assert text.returncode == 0 and "live status unavailable" in text.stdout
        watched = await run_cli("watch", handle.id, stack=stack)
        assert "Traceback" not in watched.stderr + watched.stdout
        assert "COMPLETED" in watched.stdout and "live status unavailable" in watched.stdout
        listed = await run_cli("list", "--json", stack=stack)
        assert handle.id in listed.stdout
