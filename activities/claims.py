"""Output-model claims made by a running job: a schedule's run knows its model id only once
its ``{scheduled_time:...}`` templates are filled, inside the workflow, so it claims the id
there, through the same check and lock as a submission (``shepherd.preflight``).

Two steps around the workflow's own upsert of ``ShepherdOutputModel``: :meth:`take_model_claim`
takes the model's claim lock and checks that no other live job or sweep claims the id, and
keeps the lock; the workflow then sets its claim; :meth:`settle_model_claim` waits until the
claim is visible and gives the lock back. Whoever takes the lock next (a submission, another
run) therefore sees the claim. Claiming only after the check, rather than before it, is what
lets one of two runs starting together win: had both set the claim first, each would see the
other's and both would fail.
"""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import activity

from activities.base import refusal
from shepherd import preflight

#: The output model id is claimed by another live job or sweep (the run fails at once).
MODEL_CLAIMED = "ModelClaimed"


class ClaimInput(BaseModel):
    model_id: str


class ClaimLock(BaseModel):
    """A held claim lock: the run of ``shepherd-claim-<model_id>`` to end once settled."""

    model_id: str
    lock_run_id: str | None = None


class ClaimActivities:
    """Uses the worker's own Temporal client (``activity.client()``): claims live in
    visibility, not on a platform."""

    @activity.defn(name="take_model_claim")
    async def take_model_claim(self, inp: ClaimInput) -> ClaimLock:
        client = activity.client()
        lock = await preflight.take_lock(client, inp.model_id)
        try:
            # Not itself: schedules made before runs claimed for themselves set a fixed id's
            # claim when the run starts.
            await preflight.check_unclaimed(
                client, inp.model_id, "output.model_id", exclude=activity.info().workflow_id
            )
        except preflight.SubmissionRefused as refused:
            await preflight.release_lock(client, inp.model_id, lock.result_run_id)
            raise refusal(str(refused), MODEL_CLAIMED) from None
        except BaseException:
            await preflight.release_lock(client, inp.model_id, lock.result_run_id)
            raise
        return ClaimLock(model_id=inp.model_id, lock_run_id=lock.result_run_id)

    @activity.defn(name="settle_model_claim")
    async def settle_model_claim(self, lock: ClaimLock) -> None:
        client = activity.client()
        workflow_id = activity.info().workflow_id
        if workflow_id is not None:
            await preflight.until_visible(client, lock.model_id, workflow_id)
        await preflight.release_lock(client, lock.model_id, lock.lock_run_id)
