"""Validation of a create request: every rule of the contract, checked before anything is
created, each violation reported with the field it concerns. All violations are reported
at once, so a user fixes a request in one round trip."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from localplane import catalog
from localplane.errors import (
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    describe_validation_error,
    shorten,
)
from shepherd.platform import rules

DEFAULT_LEARNING_RATE = 1e-3
DEFAULT_MAX_CONTEXT = 8192

#: A dataset as the hosted platform names one. localplane's trainers read no dataset (clients
#: send tokens), so the plane keeps the name and never resolves it: a path or URL is refused
#: rather than accepted as if something would read it, and no answer depends on the host.
DATASET_NAME_RE = re.compile(r"accounts/(?P<account>[^/]+)/datasets/(?P<dataset>[^/]+)")
DATASET_RULE = (
    "must be empty or a dataset of this account, accounts/<account>/datasets/<dataset>; "
    "localplane reads no dataset files or URLs (clients send tokens)"
)


class _In(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class TrainingConfigIn(_In):
    base_model: str = ""
    lora_rank: int = 0
    learning_rate: float = 0.0
    max_context_length: int | None = None
    region: str | None = None
    custom_image_tag: str | None = None
    accelerator_type: str | None = None
    accelerator_count: int | None = None
    extra_args: list[str] = Field(default_factory=list)


class CreateIn(_In):
    display_name: str | None = None
    service_mode: bool = True
    keep_alive: bool = False
    dataset: str = ""
    training_config: TrainingConfigIn
    node_count: int | None = None
    hot_load_deployment_id: str | None = None
    forward_only: bool = False
    preemptible: bool = False
    inactivity_timeout: str | None = None
    trainer_replica_count: int | None = None


@dataclass
class ValidCreate:
    job_id: str | None
    spec: dict[str, Any]
    shape: catalog.ShapeVersion | None
    trainer_options: dict[str, Any]


def _parse_extra_args(args: list[str], problems: list[str]) -> dict[str, Any]:
    """The extraArgs localplane understands (the platform's set, shepherd/platform/rules.py),
    as trainer options; others are ignored, as an image ignores flags it does not know."""
    options: dict[str, Any] = {}
    for i, arg in enumerate(args):
        key, _, value = arg.partition("=")
        if key not in rules.EXTRA_ARGS:
            continue
        if problem := rules.check_extra_arg(arg):
            problems.append(f"trainingConfig.extraArgs[{i}]: {problem}")
            continue
        kind = rules.EXTRA_ARGS[key][0]
        options[key.removeprefix("--").replace("-", "_")] = kind(value)
    return options


def _check_dataset(dataset: str, account: str) -> str | None:
    if not dataset:
        return None
    m = DATASET_NAME_RE.fullmatch(dataset)
    if m is None or rules.check_resource_id(m["dataset"]):
        return DATASET_RULE
    if m["account"] != account:
        # Whether that account or dataset exists is not the caller's business.
        raise PermissionDenied(
            f"dataset: {dataset} belongs to another account; use a dataset of account {account}"
        )
    return None


def validate_create(query: dict[str, str], body: Any, account: str) -> ValidCreate:
    """The normalized spec of a valid create request in ``account``, or an InvalidArgument
    naming every problem (FailedPrecondition for a shape version that is not validated,
    PermissionDenied for another account's dataset)."""
    if not isinstance(body, dict):
        raise InvalidArgument("request body must be a JSON object")
    problems: list[str] = []

    job_id = query.get("rlorTrainerJobId") or None
    if job_id is not None and (p := rules.check_resource_id(job_id)):
        problems.append(f"rlorTrainerJobId: {shorten(job_id)!r} {p}")

    skip_raw = query.get("skipValidations", "false").lower()
    if skip_raw not in ("true", "false", "1", "0"):
        problems.append("skipValidations: must be true or false")
    skip = skip_raw in ("true", "1")

    deployment_id = query.get("deploymentId") or None
    if deployment_id is not None and (p := rules.check_resource_id(deployment_id)):
        problems.append(f"deploymentId: {shorten(deployment_id)!r} {p}")

    shape: catalog.ShapeVersion | None = None
    shape_ref = query.get("trainingShape") or None
    if shape_ref is not None:
        m = rules.SHAPE_REF_RE.match(shape_ref)
        if not m:
            problems.append(f"trainingShape: {shorten(shape_ref)!r} {rules.SHAPE_REF_RULE}")
        elif m["version"]:
            shape = catalog.get(m["account"], m["shape"], m["version"])
            if shape is None:
                problems.append(f"trainingShape: {shape_ref} does not exist")
            elif not shape.validated and not skip:
                raise FailedPrecondition(
                    f"trainingShape: {shape_ref} is not a validated version (pass skipValidations=true to use it anyway)"
                )
        else:
            shape = catalog.latest_validated(m["account"], m["shape"])
            if shape is None:
                problems.append(
                    f"trainingShape: {shape_ref} does not exist or has no validated version"
                )

    try:
        req = CreateIn.model_validate(body)
    except ValidationError as exc:
        problems.append(describe_validation_error(exc))
        raise InvalidArgument("; ".join(problems)) from None

    tc = req.training_config
    if p := rules.check_base_model(tc.base_model):
        problems.append(f"trainingConfig.baseModel: {p}")
    elif refused := catalog.check_servable(tc.base_model, account):
        code, rule = refused
        if code == 403:
            raise PermissionDenied(f"trainingConfig.baseModel: {rule}")
        problems.append(f"trainingConfig.baseModel: {shorten(tc.base_model)} {rule}")
    if p := rules.check_lora_rank(tc.lora_rank):
        problems.append(f"trainingConfig.loraRank: {p}")
    if not math.isfinite(tc.learning_rate) or tc.learning_rate < 0:
        problems.append(
            "trainingConfig.learningRate: must be a finite number >= 0 (0 uses the default)"
        )
    if (
        tc.max_context_length is not None
        and not 0 < tc.max_context_length <= rules.MAX_CONTEXT_LENGTH
    ):
        problems.append(
            f"trainingConfig.maxContextLength: must be in [1, {rules.MAX_CONTEXT_LENGTH}]"
        )
    if req.display_name is not None and (p := rules.check_display_name(req.display_name)):
        problems.append(f"displayName: {p}")
    if not req.service_mode:
        problems.append("serviceMode: localplane runs service-mode trainers only; set it to true")
    if req.inactivity_timeout is not None and (
        p := rules.check_inactivity_timeout(req.inactivity_timeout)
    ):
        problems.append(f"inactivityTimeout: {p}")
    if req.trainer_replica_count is not None and not 1 <= req.trainer_replica_count <= 8:
        problems.append("trainerReplicaCount: must be in [1, 8]")
    if req.hot_load_deployment_id and (p := rules.check_resource_id(req.hot_load_deployment_id)):
        problems.append(f"hotLoadDeploymentId: {p}")
    if p := _check_dataset(req.dataset, account):
        problems.append(f"dataset: {p}")

    if shape_ref is not None:
        # On the shape path the shape decides the hardware; sending it is a conflict.
        for field_name, value in (
            ("trainingConfig.acceleratorType", tc.accelerator_type),
            ("trainingConfig.acceleratorCount", tc.accelerator_count),
            ("nodeCount", req.node_count),
        ):
            if value is not None:
                problems.append(
                    f"{field_name}: must not be set when trainingShape is given (the shape decides it)"
                )
        if shape is not None and tc.max_context_length is not None and not skip:
            limit = shape.snapshot["maxSupportedContextLength"]
            if tc.max_context_length > limit:
                problems.append(
                    f"trainingConfig.maxContextLength: {tc.max_context_length} exceeds the shape's maxSupportedContextLength {limit}"
                )
    else:
        if tc.accelerator_type is not None and (
            p := rules.check_accelerator_type(tc.accelerator_type)
        ):
            problems.append(f"trainingConfig.acceleratorType: {p}")
        if tc.accelerator_count is not None and not 1 <= tc.accelerator_count <= 64:
            problems.append("trainingConfig.acceleratorCount: must be in [1, 64]")
        if req.node_count is not None and not 1 <= req.node_count <= 64:
            problems.append("nodeCount: must be in [1, 64]")

    options = _parse_extra_args(tc.extra_args, problems)
    if problems:
        raise InvalidArgument("; ".join(problems))

    training_config: dict[str, Any] = {
        "baseModel": tc.base_model,
        "loraRank": tc.lora_rank,
        "learningRate": tc.learning_rate or DEFAULT_LEARNING_RATE,
        "maxContextLength": tc.max_context_length
        or (shape.snapshot["maxSupportedContextLength"] if shape else DEFAULT_MAX_CONTEXT),
        "extraArgs": tc.extra_args,
    }
    if tc.region:
        training_config["region"] = tc.region
    forward_only = req.forward_only
    node_count = req.node_count or 1
    if shape is not None:
        snap = shape.snapshot
        training_config.update(
            acceleratorType=snap["acceleratorType"],
            acceleratorCount=snap["acceleratorCount"],
            customImageTag=snap["trainerImageTag"],
        )
        node_count = snap["nodeCount"]
        forward_only = forward_only or snap["trainerMode"] == "TRAINER_MODE_FORWARD_ONLY"
    else:
        training_config.update(
            acceleratorType=tc.accelerator_type or "CPU",
            acceleratorCount=tc.accelerator_count or 1,
        )
        if tc.custom_image_tag:
            training_config["customImageTag"] = tc.custom_image_tag

    spec = {
        "displayName": req.display_name or "",
        "serviceMode": True,
        "keepAlive": req.keep_alive,
        # Kept as a name only; trainers load no datasets (clients send tokens).
        "dataset": req.dataset,
        "trainingConfig": training_config,
        "nodeCount": node_count,
        "hotLoadDeploymentId": req.hot_load_deployment_id or deployment_id or "",
        "forwardOnly": forward_only,
        "preemptible": req.preemptible,
        "inactivityTimeout": req.inactivity_timeout
        or rules.format_duration(rules.DEFAULT_INACTIVITY_TIMEOUT_S),
        "trainerReplicaCount": req.trainer_replica_count or 1,
    }
    return ValidCreate(job_id=job_id, spec=spec, shape=shape, trainer_options=options)
