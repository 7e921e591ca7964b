"""Recovery: bring a dead trainer back with ``:resume`` (a fresh process, a new route)."""

from __future__ import annotations

from temporalio import activity

from activities.base import ClientProvider, log, lost, snapshot, translate
from shepherd.models import PlatformJob, TrainerRef
from shepherd.platform import FailedPrecondition, PlatformError
from shepherd.states import JobState


class RecoveryActivities:
    def __init__(self, clients: ClientProvider) -> None:
        self.clients = clients

    @activity.defn(name="resume_trainer")
    async def resume_trainer(self, ref: TrainerRef) -> PlatformJob:
        """Resume the job. If the platform refuses because the job is already on its way
        back (our earlier resume took effect but its answer was lost), that is success."""
        client = self.clients.client(ref.backend)
        logger = log(trainer_job_id=ref.trainer_job_id)
        try:
            job = snapshot(await client.resume_job(ref.trainer_job_id))
            logger.info("trainer.resumed", state=job.state)
            return job
        except FailedPrecondition as refused:
            try:
                job = snapshot(await client.get_job(ref.trainer_job_id))
            except PlatformError as exc:
                raise translate(exc, "reading the trainer after a refused resume") from None
            state = JobState(job.state)
            if state in (JobState.PENDING, JobState.CREATING, JobState.RUNNING):
                logger.info("trainer.resume_already_applied", state=job.state)
                return job
            if state.is_gone():
                raise lost(job) from None
            raise translate(refused, "resuming the trainer") from None
        except PlatformError as exc:
            raise translate(exc, "resuming the trainer") from None
