"""Starting job workflows: the one function every front end (Python API, CLI, demo,
schedules) uses, so that a job is validated before anything is provisioned and always gets
a readable workflow id, its search attributes and a static summary."""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from shepherd import preflight
from shepherd import search_attributes as sa
from shepherd.models import JobInput, JobStatus
from shepherd.phases import Phase
from shepherd.scheduling import pool_of, task_priority
from shepherd.spec import (
    JobSpec,
    has_templates,
    input_error,
    is_template,
    resolve_templates,
    validate_spec,
)

WORKFLOW_TYPE = "TrainingJob"

#: Workflow ids a user may choose. No '/', spaces or control characters: ids end up in Web
#: UI links, trainer ids and log lines. ':' stays (schedule runs end in an RFC 3339 time).
WORKFLOW_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")
WORKFLOW_ID_RULE = (
    "must be 1-200 characters of letters, digits, '.', '_', ':' and '-', "
    "starting with a letter or digit"
)


def check_workflow_id(workflow_id: Any) -> str:
    """``workflow_id`` if it is one a user may choose, else :class:`SpecError`."""
    if not isinstance(workflow_id, str) or not WORKFLOW_ID.fullmatch(workflow_id):
        raise input_error("workflow_id", WORKFLOW_ID_RULE, "workflow id")
    return workflow_id


def job_workflow_id(name: str) -> str:
    """``job-<name>-<short unique suffix>``: readable in the Web UI, unique per submission."""
    return f"job-{name}-{secrets.token_hex(3)}"


def static_summary(spec: JobSpec) -> str:
    shape = spec.trainer.training_shape or "manual"
    promote = (
        f"promote {spec.output.promote} -> {spec.output.model_id}"
        if spec.output.promote != "none"
        else "no promotion"
    )
    labels = ", ".join(spec.label_keywords()) or "none"
    return (
        f"{spec.name}: {spec.total_steps or 'its own'} steps of {spec.trainer.base_model} "
        f"(LoRA r={spec.trainer.lora_rank}) on {spec.training.dataset}; shape {shape}; {promote}; labels {labels}"
    )[:400]


def claimed_model(spec: JobSpec) -> str | None:
    """The output model id the job claims while it is live, from submission (a schedule's
    templated id is only known per run: the run claims it itself, see activities/claims.py)."""
    model_id = spec.output.model_id
    if spec.output.promote == "none" or not model_id or is_template(model_id):
        return None
    return model_id


def job_search_attributes(
    spec: JobSpec, *extra: SearchAttributePair[Any], claim: bool = True
) -> TypedSearchAttributes:
    """What a job is found by from its first moment: phase PENDING, name, labels, the
    output model it claims unless ``claim`` is off (+ extra)."""
    model_id = claimed_model(spec) if claim else None
    claims = [SearchAttributePair(sa.OUTPUT_MODEL, model_id)] if model_id else []
    return TypedSearchAttributes(
        [
            SearchAttributePair(sa.PHASE, Phase.PENDING.value),
            SearchAttributePair(sa.JOB_NAME, spec.name),
            SearchAttributePair(sa.LABELS, spec.label_keywords()),
            *claims,
            *extra,
        ]
    )


class JobPlan(BaseModel):
    """What a submission would start (``submit --dry-run`` prints it)."""

    workflow_id: str
    task_queue: str
    spec: JobSpec
    #: The output model id the job would claim.
    claims_model: str | None = None


async def plan_job(
    client: Client,
    spec: JobSpec | dict[str, Any],
    *,
    task_queue: str,
    workflow_id: str | None = None,
    rerun: bool = False,
) -> JobPlan:
    """Validate ``spec`` and make every check that can be made before starting: the id is
    free, a worker serves the backend, the output model id is not claimed. Starts nothing.
    Schedule templates in a directly submitted spec are filled with the submission time."""
    spec = validate_spec(spec)
    if has_templates(spec):
        spec = resolve_templates(spec, datetime.now(UTC))
    plan = JobPlan(
        workflow_id=job_workflow_id(spec.name)
        if workflow_id is None
        else check_workflow_id(workflow_id),
        task_queue=task_queue,
        spec=spec,
        claims_model=claimed_model(spec),
    )
    if workflow_id is not None and (
        refusal := await preflight.id_refusal(client, plan.workflow_id, rerun=rerun)
    ):
        raise refusal
    await check_workers(client, spec, task_queue)
    if plan.claims_model:
        await preflight.check_unclaimed(client, plan.claims_model, "output.model_id")
    return plan


async def check_workers(client: Client, spec: JobSpec, task_queue: str, prefix: str = "") -> None:
    """Workers poll the job's task queues, and one of them serves its backend and has its
    loop registered (``prefix``: where the spec sits, e.g. ``base.`` in a sweep)."""
    activities = spec.scheduling.task_queue or task_queue
    queue_field = (
        "scheduling.task_queue" if spec.scheduling.task_queue == task_queue else "task_queue"
    )
    await preflight.check_polled(client, task_queue, prefix + queue_field, activities=False)
    if activities != task_queue:
        await preflight.check_polled(
            client, activities, f"{prefix}scheduling.task_queue", activities=True
        )
    await check_not_a_task_queue(client, spec, activities, prefix)
    await preflight.check_backend(client, activities, spec.backend, f"{prefix}backend")
    await preflight.check_capabilities(
        client,
        activities,
        spec.backend,
        spec.scheduling.required_capabilities,
        f"{prefix}scheduling.required_capabilities",
    )
    await preflight.check_pool(
        client,
        activities,
        spec.backend,
        pool_of(spec.trainer.training_shape, spec.trainer.accelerator_type),
        f"{prefix}trainer.training_shape"
        if spec.trainer.training_shape
        else f"{prefix}trainer.accelerator_type",
    )
    if spec.training.program is not None:
        await preflight.check_registered(
            client, activities, "programs", spec.training.program, f"{prefix}training.program"
        )
    else:
        await preflight.check_registered(
            client, activities, "loops", spec.training.loop, f"{prefix}training.loop"
        )


async def check_not_a_task_queue(client: Client, spec: JobSpec, runs_on: str, prefix: str) -> None:
    """``scheduling.queue`` was the job's Temporal task queue; it is its admission queue now.
    A spec that names the task queue of other workers there means to run on them: refused,
    naming the field that does that now (a spec naming the queue it runs on anyway, or a
    queue no worker polls, keeps working)."""
    queue = spec.scheduling.queue
    if queue is None or queue == runs_on or spec.scheduling.task_queue is not None:
        return
    if await preflight.pollers(client, queue, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY):
        raise preflight.SubmissionRefused(
            f"{prefix}scheduling.queue",
            f"is the admission queue (a team's share of the backend's capacity) since "
            f"Shepherd schedules jobs itself; {queue!r} is the task queue of running workers: "
            f"to run the job on them, set scheduling.task_queue: {queue} (and scheduling.queue "
            "to its team's queue, or leave it out for the default one)",
        )


async def start_job(
    client: Client,
    spec: JobSpec | dict[str, Any],
    *,
    task_queue: str,
    workflow_id: str | None = None,
    parent_workflow_id: str | None = None,
    rerun: bool = False,
) -> WorkflowHandle[Any, JobStatus]:
    """Validate ``spec`` (raising :class:`shepherd.spec.SpecError` before anything exists),
    check it against the live system (:class:`shepherd.preflight.SubmissionRefused`) and start
    its lifecycle workflow. A used ``workflow_id`` is refused unless ``rerun``."""
    plan = await plan_job(client, spec, task_queue=task_queue, workflow_id=workflow_id, rerun=rerun)
    spec = plan.spec
    parent = [SearchAttributePair(sa.PARENT, parent_workflow_id)] if parent_workflow_id else []
    return await preflight.start_guarded(
        client,
        WORKFLOW_TYPE,
        JobInput(spec=spec, parent_workflow_id=parent_workflow_id),
        workflow_id=plan.workflow_id,
        task_queue=task_queue,
        rerun=rerun,
        model_id=plan.claims_model,
        model_field="output.model_id",
        result_type=JobStatus,
        search_attributes=job_search_attributes(spec, *parent),
        static_summary=static_summary(spec),
        # Its workflow tasks too (the first one waits behind every job submitted before it).
        priority=task_priority(spec.scheduling.priority),
        static_details=f"spec:\n```\n{spec.model_dump_json(indent=2, exclude_defaults=True)}\n```",
    )
