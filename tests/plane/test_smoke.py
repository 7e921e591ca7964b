from localplane.admin import PlaneAdmin
from shepherd.states import JobState
from tests.helpers import Account, running_trainer, train_steps, wait_state


async def test_create_train_delete(account: Account, admin: PlaneAdmin) -> None:
    trainer = await running_trainer(account, "smoke")
    losses = await train_steps(trainer, 1, 5)
    assert len(losses) == 5 and losses[-1] < losses[0]
    await trainer.api.aclose()
    await account.client.delete_job("smoke")
    await wait_state(account.client, "smoke", JobState.DELETED)
    stats = await admin.job_stats(f"accounts/{account.id}/rlorTrainerJobs/smoke")
    assert stats["creates"] == 1 and stats["liveTrainer"] is False
