"""Starting job workflows: the one function every front end (Python API, CLI, demo,
schedules) uses, so that a job is validated before anything is provisioned and always gets
a readable workflow id, its search attributes and a static summary."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from shepherd import search_attributes as sa
from shepherd.models import JobInput, JobStatus
from shepherd.phases import Phase
from shepherd.spec import JobSpec, has_templates, resolve_templates, validate_spec

WORKFLOW_TYPE = "TrainingJob"


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
        f"{spec.name}: {spec.training.total_steps} steps of {spec.trainer.base_model} "
        f"(LoRA r={spec.trainer.lora_rank}) on {spec.training.dataset}; shape {shape}; {promote}; labels {labels}"
    )[:400]


def job_search_attributes(spec: JobSpec, *extra: SearchAttributePair[Any]) -> TypedSearchAttributes:
    """What a job is found by from its first moment: phase PENDING, name, labels (+ extra)."""
    return TypedSearchAttributes(
        [
            SearchAttributePair(sa.PHASE, Phase.PENDING.value),
            SearchAttributePair(sa.JOB_NAME, spec.name),
            SearchAttributePair(sa.LABELS, spec.label_keywords()),
            *extra,
        ]
    )


async def start_job(
    client: Client,
    spec: JobSpec | dict[str, Any],
    *,
    task_queue: str,
    workflow_id: str | None = None,
    parent_workflow_id: str | None = None,
) -> WorkflowHandle[Any, JobStatus]:
    """Validate ``spec`` (raising :class:`shepherd.spec.SpecError` before anything exists)
    and start its lifecycle workflow. Schedule templates in a directly submitted spec are
    filled with the submission time."""
    spec = validate_spec(spec)
    if has_templates(spec):
        spec = resolve_templates(spec, datetime.now(UTC))
    parent = [SearchAttributePair(sa.PARENT, parent_workflow_id)] if parent_workflow_id else []
    return await client.start_workflow(
        WORKFLOW_TYPE,
        JobInput(spec=spec, parent_workflow_id=parent_workflow_id),
        id=workflow_id or job_workflow_id(spec.name),
        task_queue=task_queue,
        result_type=JobStatus,
        search_attributes=job_search_attributes(spec, *parent),
        static_summary=static_summary(spec),
        static_details=f"spec:\n```\n{spec.model_dump_json(indent=2, exclude_defaults=True)}\n```",
    )
