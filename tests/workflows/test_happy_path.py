"""The whole life of a job on the real stack, to a promoted model."""

from __future__ import annotations

from shepherd.phases import Phase
from shepherd.states import JobState
from tests.workflows.conftest import Stack


async def test_happy_path_to_a_promoted_model(stack: Stack) -> None:
    handle = await stack.start(stack.spec("happy"))
    result = await handle.result()
    assert result.phase is Phase.COMPLETED
    assert result.step == 20
    assert result.model is not None and result.model.state == "READY"
    assert result.model.name == f"accounts/{stack.account.id}/models/happy-model"
    assert [c.step for c in result.checkpoints] == [10, 20]
    assert result.best is not None and result.eval_value is not None
    assert result.cleanup == "done"
    assert result.platform_state == JobState.DELETED.value  # what the platform says after cleanup
    stats = await stack.admin.stats()
    name = stack.job_name(result.trainer_job_id or "")
    assert stats["jobs"][name]["creates"] == 1
    assert stats["jobs"][name]["liveTrainer"] is False
    job = await stack.account.client.get_job(result.trainer_job_id or "")
    assert job.state is JobState.DELETED
    # Shepherd's own client speaks the JSON dialect only (what hosted trainers speak), and
    # the lifecycle really drove the Tinker API (exactly-once is proven by digests elsewhere).
    served = await stack.admin.data_plane(name)
    assert served and all(key.startswith("json:") for key in served), served
    assert served.get("json:optim_step", 0) >= 20, served
    assert served.get("json:forward_backward", 0) >= 20
    assert served.get("json:save_weights", 0) >= 2
    assert served.get("json:save_weights_for_sampler", 0) >= 2
    assert served.get("json:forward", 0) >= 2  # the evaluations
