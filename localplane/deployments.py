"""Serving deployments and hot-load (trainer-api.md §4 "Deployments and hot-load", §7).

What the Fireworks fork's ``DeploymentManager``, ``WeightSyncer`` and sampling client use:

* **Deployments** (control plane, ``/v1/accounts/{a}/deployments``): create (synchronous:
  the answer is already ``READY``), get, list, patch, delete. A deployment serves its base
  model until a snapshot is hot-loaded.
* **Hot-load** (``/hot_load/v1/models/hot_load``, the deployment named in the
  ``fireworks-deployment`` header): ``POST {identity, ...}`` loads a sampler checkpoint of
  the trainer the deployment is attached to (``hotLoadTrainerJob``, or the newest trainer job
  created with ``hotLoadDeploymentId`` naming it); ``GET`` reports each replica's current
  snapshot. The identity is the snapshot name as saved (``WeightSyncer``), the path a
  ``save_weights_for_sampler`` answered (the managed sampler backend), or the checkpoint's
  resource name. Loading finishes within the request. A delta load
  (``incremental_snapshot_metadata``) must name the snapshot the deployment serves; every
  localplane snapshot is whole, so a delta loads whole too.
* **Inference** (``/inference/v1/completions``, token-in token-out, streamed or not): samples
  with the newest hot-loaded weights, and says which — ``snapshot`` in the answer and the
  ``x-localplane-snapshot-identity`` header. A request runs on the weights it began with (a
  hot-load switches between requests). Without ``seed`` the seed is a function of the
  weights, the request and how often the same request met them, as on trainers.

Sampling runs on one serving thread of the plane's process (the plane's "inference GPU").
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from localplane import catalog, limits
from localplane import checkpoints as ckpt
from localplane.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
    shorten,
)
from localplane.storage import Storage
from localplane.trainer import checkpoints as ckpts
from localplane.trainer.backend import SamplerWeights
from localplane.trainer.errors import UserError
from localplane.trainer.lm import EOS, decode, encode, stable_seed
from localplane.trainer.numpy_backend import NumpyBackend, NumpySampler
from shepherd.platform import rules
from shepherd.tinker_wire.dialects import canonical_digest

log = structlog.stdlib.get_logger("localplane.deployments")

DEPLOYMENT_HEADER = "fireworks-deployment"
MODEL_HEADER = "fireworks-model"
SNAPSHOT_HEADER = "x-localplane-snapshot-identity"
DEPLOYMENT_NAME_RE = re.compile(r"^accounts/(?P<account>[^/]+)/deployments/(?P<deployment>[^/]+)\Z")
SHAPE_RE = re.compile(
    r"^accounts/[a-z0-9-]+/deploymentShapes/[a-z0-9.-]+(/versions/[a-z0-9.-]+)?\Z"
)
#: Most replicas a deployment may ask for (each is the same in-process sampler here).
MAX_REPLICAS = 64
#: max_tokens when a completion request names none (the OpenAI completions default).
DEFAULT_MAX_TOKENS = 16
#: Completion fields this server honours; anything else is refused, naming it.
COMPLETION_FIELDS = frozenset(
    {
        "model",
        "prompt",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "n",
        "seed",
        "stop",
        "logprobs",
        "top_logprobs",
        "echo",
        "echo_last",
        "raw_output",
        "stream",
        "perf_metrics_in_response",
        "return_token_ids",
        "prompt_cache_key",
        "user",
    }
)
#: Known completion fields this server refuses, and why.
COMPLETION_REFUSED = {
    "include_routing_matrix": "routing matrices (MoE router replay) are not produced by this model",
    "routing_matrix_format": "routing matrices (MoE router replay) are not produced by this model",
    "top_sampling_logprobs": "top-K sampling references are not supported",
    "top_sampling_format": "top-K sampling references are not supported",
    "sampling_mask": "sampling masks are not supported",
    "images": "image inputs need a multimodal model",
}


def _now() -> str:
    return ckpt.now_rfc3339()


@dataclass
class Serving:
    """What a deployment serves right now."""

    identity: str | None
    checkpoint: str | None
    digest: str
    weights: SamplerWeights
    load_time: str
    #: Identical-request counts for the default seed (bounded, like a trainer's sampler).
    occurrences: OrderedDict[str, int] = field(default_factory=OrderedDict)

    def occurrence(self, key: str) -> int:
        seen = self.occurrences.pop(key, 0)
        self.occurrences[key] = seen + 1
        while len(self.occurrences) > limits.MAX_SAMPLE_OCCURRENCES:
            self.occurrences.popitem(last=False)
        return seen


class DeploymentService:
    def __init__(self, storage: Storage, data_dir: Path) -> None:
        self.storage = storage
        self.data_dir = data_dir
        self._backend = NumpyBackend()
        self._serving: dict[tuple[str, str], Serving] = {}
        self._errors: dict[tuple[str, str], dict[str, Any]] = {}
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="serving")

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)

    async def _compute(self, fn: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn)

    # ------------------------------------------------------------------- resources

    def _require(self, account: str, deployment_id: str) -> dict[str, Any]:
        payload = self.storage.get_deployment(account, deployment_id)
        if payload is None:
            raise NotFound(
                f"deployment accounts/{account}/deployments/{shorten(deployment_id)} not found"
            )
        return payload

    def get(self, account: str, deployment_id: str) -> dict[str, Any]:
        return self._require(account, deployment_id)

    def page(self, account: str, offset: int, size: int) -> tuple[list[dict[str, Any]], bool]:
        rows = self.storage.list_deployments(account, offset, size + 1)
        return rows[:size], len(rows) > size

    def create(self, account: str, query: Mapping[str, str], body: Any) -> dict[str, Any]:
        deployment_id = query.get("deploymentId") or ""
        if p := rules.check_resource_id(deployment_id):
            raise InvalidArgument(f"deploymentId: {shorten(deployment_id)!r} {p}")
        if not isinstance(body, dict):
            raise InvalidArgument("request body must be a JSON object")
        payload = self._validated(account, body, query)
        now = _now()
        payload.update(
            name=f"accounts/{account}/deployments/{deployment_id}",
            state="READY",
            createTime=now,
            updateTime=now,
        )
        if not self.storage.put_deployment(account, deployment_id, payload, create=True):
            raise AlreadyExists(
                f"deployment accounts/{account}/deployments/{deployment_id} already exists"
            )
        log.info("deployment.created", deployment=payload["name"], base_model=payload["baseModel"])
        return payload

    def _validated(
        self, account: str, body: dict[str, Any], query: Mapping[str, str]
    ) -> dict[str, Any]:
        problems: list[str] = []
        base = body.get("baseModel")
        if not isinstance(base, str) or (p := rules.check_base_model(base)):
            problems.append(f"baseModel: {p if isinstance(base, str) else 'is required'}")
        elif refused := catalog.check_servable(base, account):
            code, rule = refused
            if code == 403:
                raise PermissionDenied(f"baseModel: {rule}")
            problems.append(f"baseModel: {shorten(base)} {rule}")
        replicas = {}
        for name, default in (("minReplicaCount", 0), ("maxReplicaCount", 1)):
            value = body.get(name, default)
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not 0 <= value <= MAX_REPLICAS
            ):
                problems.append(f"{name}: must be an integer in [0, {MAX_REPLICAS}]")
                value = default
            replicas[name] = value
        if replicas["minReplicaCount"] > replicas["maxReplicaCount"]:
            problems.append("minReplicaCount: exceeds maxReplicaCount")
        trainer = body.get("hotLoadTrainerJob")
        if trainer is not None:
            m = rules.JOB_NAME_RE.match(trainer) if isinstance(trainer, str) else None
            if m is None:
                problems.append(
                    "hotLoadTrainerJob: must be accounts/<account>/rlorTrainerJobs/<job>"
                )
            elif m["account"] != account:
                raise PermissionDenied(
                    f"hotLoadTrainerJob: {shorten(trainer)} belongs to another account"
                )
            elif self.storage.get_job(account, m["job"]) is None:
                problems.append(f"hotLoadTrainerJob: {shorten(trainer)} does not exist")
        bucket = body.get("hotLoadBucketType")
        if bucket not in (None, "", "FW_HOSTED"):
            problems.append(
                "hotLoadBucketType: only FW_HOSTED is supported (the plane's own storage)"
            )
        transition = body.get("hotLoadTransitionType")
        if transition not in (None, "", "ASYNC", "SYNC", "HOT_LOAD_TRANSITION_TYPE_UNSPECIFIED"):
            problems.append("hotLoadTransitionType: must be ASYNC or SYNC")
        shape = body.get("deploymentShape")
        if shape is not None and not (isinstance(shape, str) and SHAPE_RE.match(shape)):
            problems.append(
                "deploymentShape: must be accounts/<account>/deploymentShapes/<shape>[/versions/<v>]"
            )
        accelerator = body.get("acceleratorType")
        if (
            shape is None
            and accelerator is not None
            and (p := rules.check_accelerator_type(str(accelerator)))
        ):
            problems.append(f"acceleratorType: {p}")
        for name in ("extraArgs", "extraValues"):
            if body.get(name):
                problems.append(
                    f"{name}: superuser serving overrides are not supported by localplane"
                )
        for name in ("enableHotLoad", "forTraining", "preemptible"):
            if not isinstance(body.get(name, False), bool):
                problems.append(f"{name}: must be true or false")
        if query.get("acceptShapelessRisk") in ("true", "1") and shape:
            problems.append("acceptShapelessRisk: cannot be combined with deploymentShape")
        if problems:
            raise InvalidArgument("; ".join(problems))
        payload: dict[str, Any] = {
            "baseModel": base,
            "description": str(body.get("description") or "")[:1000],
            "displayName": str(body.get("displayName") or "")[: rules.MAX_DISPLAY_NAME_LEN],
            **replicas,
            "replicaCount": replicas["maxReplicaCount"],
            "enableHotLoad": bool(body.get("enableHotLoad", False)),
            "forTraining": bool(body.get("forTraining", False)),
            "preemptible": bool(body.get("preemptible", False)),
        }
        for name in (
            "hotLoadTrainerJob",
            "hotLoadBucketType",
            "hotLoadTransitionType",
            "deploymentShape",
            "placement",
            "annotations",
        ):
            if body.get(name):
                payload[name] = body[name]
        if shape is None:
            payload["acceleratorType"] = accelerator or "CPU"
        return payload

    def update(self, account: str, deployment_id: str, body: Any, mask: str) -> dict[str, Any]:
        payload = self._require(account, deployment_id)
        if not isinstance(body, dict):
            raise InvalidArgument("request body must be a JSON object")
        fields = [f.strip() for f in mask.split(",") if f.strip()]
        if not fields:
            raise InvalidArgument("updateMask: is required (the fields to change, snake_case)")
        camel = {
            "hot_load_trainer_job": "hotLoadTrainerJob",
            "hot_load_transition_type": "hotLoadTransitionType",
            "min_replica_count": "minReplicaCount",
            "max_replica_count": "maxReplicaCount",
            "description": "description",
            "display_name": "displayName",
            "annotations": "annotations",
        }
        unknown = [f for f in fields if f not in camel]
        if unknown:
            raise InvalidArgument(
                f"updateMask: {shorten(unknown[0])!r} cannot be changed; changeable: {', '.join(sorted(camel))}"
            )
        merged = {**payload, **{camel[f]: body.get(camel[f]) for f in fields}}
        checked = self._validated(account, {k: v for k, v in merged.items() if v is not None}, {})
        payload.update({camel[f]: checked.get(camel[f]) for f in fields})
        payload["replicaCount"] = payload["maxReplicaCount"]
        payload["updateTime"] = _now()
        self.storage.put_deployment(account, deployment_id, payload, create=False)
        if "hot_load_trainer_job" in fields:
            self._errors.pop((account, deployment_id), None)
        return payload

    def delete(self, account: str, deployment_id: str) -> dict[str, Any]:
        payload = self._require(account, deployment_id)
        self.storage.delete_deployment(account, deployment_id)
        self._serving.pop((account, deployment_id), None)
        self._errors.pop((account, deployment_id), None)
        log.info("deployment.deleted", deployment=payload["name"])
        return {**payload, "state": "DELETED"}

    # ------------------------------------------------------------------------ hot-load

    def _addressed(self, account: str, headers: Mapping[str, str]) -> tuple[str, dict[str, Any]]:
        name = headers.get(DEPLOYMENT_HEADER) or ""
        m = DEPLOYMENT_NAME_RE.match(name)
        if m is None:
            raise InvalidArgument(
                f"{DEPLOYMENT_HEADER}: header must be accounts/<account>/deployments/<id>"
            )
        if m["account"] != account:
            raise PermissionDenied(
                f"{DEPLOYMENT_HEADER}: {shorten(name)} belongs to another account"
            )
        payload = self._require(account, m["deployment"])
        model = headers.get(MODEL_HEADER)
        if model and model != payload["baseModel"]:
            raise InvalidArgument(
                f"{MODEL_HEADER}: {shorten(model)} is not the deployment's base model {payload['baseModel']}"
            )
        return m["deployment"], payload

    def _source_job(self, account: str, deployment_id: str, payload: dict[str, Any]) -> str:
        attached = payload.get("hotLoadTrainerJob")
        if attached:
            m = rules.JOB_NAME_RE.match(attached)
            assert m is not None
            return m["job"]
        linked = self.storage.jobs_linked_to(account, deployment_id)
        if not linked:
            raise FailedPrecondition(
                f"deployment {payload['name']} has no trainer attached: create the trainer with "
                "hotLoadDeploymentId naming it, or set the deployment's hotLoadTrainerJob"
            )
        return linked[0].job_id

    async def hotload(self, account: str, headers: Mapping[str, str], body: Any) -> dict[str, Any]:
        deployment_id, payload = self._addressed(account, headers)
        key = (account, deployment_id)
        if not payload.get("enableHotLoad"):
            raise FailedPrecondition(
                f"deployment {payload['name']} was created without enableHotLoad"
            )
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("identity"), str)
            or not body["identity"]
        ):
            raise InvalidArgument("identity: is required (the snapshot to load)")
        identity = body["identity"]
        unknown = sorted(
            set(body) - {"identity", "reset_prompt_cache", "incremental_snapshot_metadata"}
        )
        if unknown:
            raise InvalidArgument(f"{shorten(unknown[0])}: extra inputs are not permitted")
        current = self._serving.get(key)
        delta = body.get("incremental_snapshot_metadata")
        try:
            if delta is not None:
                previous = (
                    delta.get("previous_snapshot_identity") if isinstance(delta, dict) else None
                )
                if previous != (current.identity if current else None):
                    raise UserError(
                        f"incremental_snapshot_metadata.previous_snapshot_identity: {shorten(previous)!r} "
                        f"is not the snapshot this deployment serves "
                        f"({current.identity if current else 'none'!r}); load a base snapshot"
                    )
            job = self._source_job(account, deployment_id, payload)
            caller = ckpts.Caller(self.data_dir, account, job)
            meta = ckpts.resolve(identity, caller, segment="sampler")
            if meta.base_model != payload["baseModel"]:
                raise UserError(
                    f"identity: snapshot {shorten(identity)} was trained from {meta.base_model}; "
                    f"this deployment serves {payload['baseModel']}"
                )
            exported = await self._compute(lambda: ckpts.read(self.data_dir, meta))
            weights = await self._compute(lambda: self._backend.sampler_from(exported))
        except (UserError, FailedPrecondition) as exc:
            self._errors[key] = {"target_snapshot_identity": identity, "message": str(exc)}
            raise InvalidArgument(f"hot-load of {shorten(identity)}: {exc}") from None
        serving = Serving(identity, meta.resource_name, exported.digest, weights, _now())
        self._serving[key] = serving
        self._errors.pop(key, None)
        payload["currentSnapshot"] = {
            "identity": identity,
            "checkpoint": meta.resource_name,
            "weightsDigest": exported.digest,
            "loadTime": serving.load_time,
        }
        payload["updateTime"] = serving.load_time
        self.storage.put_deployment(account, deployment_id, payload, create=False)
        log.info("deployment.hot_loaded", deployment=payload["name"], identity=identity)
        return {"identity": identity, "status": "loaded", "weights_digest": exported.digest}

    def hotload_status(self, account: str, headers: Mapping[str, str]) -> dict[str, Any]:
        deployment_id, payload = self._addressed(account, headers)
        key = (account, deployment_id)
        current = (payload.get("currentSnapshot") or {}).get("identity")
        error = self._errors.get(key)
        if error is not None:
            stage = {"stage": "error", **error}
        else:
            stage = {"stage": "done" if current else "idle", "target_snapshot_identity": current}
        replica = {
            "replica_id": "0",
            "current_snapshot_identity": current,
            "readiness": payload.get("maxReplicaCount", 1) > 0,
            "loading_state": stage,
            "supports_rdma_weight_sync": False,
            "rdma_weight_sync_enabled": False,
        }
        return {"replicas": [replica]}

    # ----------------------------------------------------------------------- inference

    async def _serving_of(
        self, account: str, deployment_id: str, payload: dict[str, Any]
    ) -> Serving:
        key = (account, deployment_id)
        serving = self._serving.get(key)
        if serving is not None:
            return serving
        snapshot = payload.get("currentSnapshot")
        if snapshot:
            # Loaded before a plane restart: load it again from its checkpoint.
            m = rules.CHECKPOINT_NAME_RE.match(snapshot["checkpoint"])
            assert m is not None
            meta = ckpt.read_meta(self.data_dir, m["account"], m["job"], m["checkpoint"])
            if meta is None:
                raise Unavailable(
                    f"the snapshot {snapshot['identity']} this deployment served is gone"
                )
            exported = await self._compute(lambda: ckpts.read(self.data_dir, meta))
            weights = await self._compute(lambda: self._backend.sampler_from(exported))
            serving = Serving(
                snapshot["identity"],
                snapshot["checkpoint"],
                exported.digest,
                weights,
                snapshot["loadTime"],
            )
        else:
            weights = await self._compute(lambda: self._backend.base_sampler(payload["baseModel"]))
            serving = Serving(
                None, None, self._backend.digest(weights), weights, payload["createTime"]
            )
        self._serving[key] = serving
        return serving

    def _request(self, body: dict[str, Any]) -> dict[str, Any]:
        refused = sorted(set(body) & set(COMPLETION_REFUSED))
        if refused:
            raise InvalidArgument(f"{refused[0]}: {COMPLETION_REFUSED[refused[0]]}")
        unknown = sorted(set(body) - COMPLETION_FIELDS)
        if unknown:
            raise InvalidArgument(
                f"{shorten(unknown[0])}: not a completion field this server supports; supported: "
                + ", ".join(sorted(COMPLETION_FIELDS))
            )
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            tokens = encode(prompt)
        elif isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            tokens = list(prompt)
        else:
            raise InvalidArgument("prompt: must be a string or a list of token ids")
        if not tokens or min(tokens) < 0 or max(tokens) > EOS:
            raise InvalidArgument(f"prompt: needs token ids in [0, {EOS}]")

        def number(name: str, default: float, low: float, high: float) -> float:
            value = body.get(name, default)
            if value is None:
                return default
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not low <= value <= high
            ):
                raise InvalidArgument(f"{name}: must be a number in [{low:g}, {high:g}]")
            return float(value)

        n = body.get("n", 1)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 128:
            raise InvalidArgument("n: must be an integer in [1, 128]")
        if body.get("stream") and n != 1:
            raise InvalidArgument("n: a streamed completion takes n = 1")
        max_tokens = body.get("max_tokens", DEFAULT_MAX_TOKENS)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise InvalidArgument("max_tokens: must be an integer >= 0")
        top_k = body.get("top_k", 0)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1:
            raise InvalidArgument("top_k: must be 0 (no limit) or a positive integer")
        top_logprobs = body.get("top_logprobs")
        if top_logprobs not in (None, 0):
            raise InvalidArgument("top_logprobs: top-k logprobs are not supported")
        stop = body.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        if stop is not None and not (
            isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)
        ):
            raise InvalidArgument("stop: must be a string or a list of non-empty strings")
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise InvalidArgument("seed: must be an integer")
        echo_last = body.get("echo_last")
        if echo_last is not None and (
            isinstance(echo_last, bool) or not isinstance(echo_last, int) or echo_last < 0
        ):
            raise InvalidArgument("echo_last: must be an integer >= 0")
        return {
            "prompt": tokens,
            "n": n,
            "max_tokens": max_tokens,
            "temperature": number("temperature", 1.0, 0.0, 100.0),
            "top_p": number("top_p", 1.0, 1e-9, 1.0),
            "top_k": -1 if top_k == 0 else top_k,
            "stop": [encode(s) for s in stop] if stop else None,
            "seed": seed,
            "logprobs": bool(body.get("logprobs")),
            "echo": bool(body.get("echo")) or echo_last is not None,
            "echo_count": echo_last,
            "raw_output": bool(body.get("raw_output")),
        }

    async def complete(
        self, account: str, body: Any
    ) -> tuple[dict[str, Any], str | None] | AsyncIterator[bytes]:
        """A completion: its JSON answer (and the snapshot identity), or the SSE stream."""
        if not isinstance(body, dict):
            raise InvalidArgument("request body must be a JSON object")
        name = body.get("model")
        m = DEPLOYMENT_NAME_RE.match(name) if isinstance(name, str) else None
        if m is None:
            raise InvalidArgument("model: must be accounts/<account>/deployments/<id>")
        if m["account"] != account:
            raise PermissionDenied(f"model: {shorten(name)} belongs to another account")
        payload = self._require(account, m["deployment"])
        if payload.get("maxReplicaCount", 1) == 0:
            raise Unavailable(f"deployment {payload['name']} is scaled to zero replicas")
        req = self._request(body)
        serving = await self._serving_of(account, m["deployment"], payload)
        content = canonical_digest(body, ignore=("stream", "perf_metrics_in_response", "user"))
        occurrence = serving.occurrence(content)
        started = time.monotonic()
        choices = await self._compute(lambda: self._sample(serving, req, content, occurrence))
        answer = {
            "id": f"cmpl-{secrets.token_hex(12)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": payload["name"],
            "choices": choices,
            "usage": {
                "prompt_tokens": len(req["prompt"]),
                "completion_tokens": sum(c["_completion_tokens"] for c in choices),
                "total_tokens": len(req["prompt"]) * len(choices)
                + sum(c["_completion_tokens"] for c in choices),
            },
            # localplane: which weights served this completion.
            "snapshot": {
                "identity": serving.identity,
                "checkpoint": serving.checkpoint,
                "weights_digest": serving.digest,
            },
        }
        for choice in choices:
            choice.pop("_completion_tokens")
        if not body.get("stream"):
            return answer, serving.identity
        elapsed = time.monotonic() - started
        return self._stream(answer, elapsed)

    def _sample(
        self, serving: Serving, req: dict[str, Any], content: str, occurrence: int
    ) -> list[dict[str, Any]]:
        net = serving.weights.net if isinstance(serving.weights, NumpySampler) else None
        assert net is not None
        seed = req["seed"]
        if seed is None:
            seed = stable_seed("localplane-serve", serving.digest, content, occurrence)
        prompt = req["prompt"]
        prompt_lp = net.prompt_logprobs(prompt) if req["echo"] else []
        choices = []
        for index in range(req["n"]):
            tokens, logprobs, reason, sampling = net.sample_detailed(
                prompt,
                max_tokens=req["max_tokens"],
                temperature=req["temperature"],
                top_k=req["top_k"],
                top_p=req["top_p"],
                stop=req["stop"],
                seed=(seed + index) % (1 << 64),
            )
            echoed: list[int] = []
            entries = []
            if req["echo"]:
                count = (
                    len(prompt)
                    if req["echo_count"] is None
                    else min(req["echo_count"], len(prompt))
                )
                echoed = prompt[len(prompt) - count :]
                for i in range(len(prompt) - count, len(prompt)):
                    # The first prompt token has no context: 0.0 (the SDK drops that row).
                    known = prompt_lp[i]
                    lp = 0.0 if known is None else known
                    entries.append(_entry(prompt[i], lp, lp))
            if req["logprobs"] or req["echo"]:
                entries.extend(
                    _entry(t, lp, s) for t, lp, s in zip(tokens, logprobs, sampling, strict=True)
                )
            choice: dict[str, Any] = {
                "index": index,
                "text": decode(echoed + tokens),
                "finish_reason": "stop" if reason == "stop" else "length",
                "_completion_tokens": len(tokens),
            }
            if req["logprobs"] or req["echo"]:
                choice["logprobs"] = {"content": entries}
            if req["raw_output"]:
                choice["raw_output"] = {
                    "prompt_token_ids": list(prompt),
                    "completion_token_ids": echoed + tokens,
                }
            choices.append(choice)
        return choices

    @staticmethod
    async def _stream(answer: dict[str, Any], elapsed: float) -> AsyncIterator[bytes]:
        """The completion as server-sent events: one chunk per token (text and logprobs),
        a last chunk with the finish reason, raw output, usage and timings, then [DONE]."""
        choice = answer["choices"][0]
        head = {k: answer[k] for k in ("id", "object", "created", "model")}
        entries = (choice.get("logprobs") or {}).get("content") or []
        for entry in entries:
            chunk = {
                **head,
                "choices": [{"index": 0, "text": entry["token"], "logprobs": {"content": [entry]}}],
            }
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        if not entries and choice["text"]:
            chunk = {**head, "choices": [{"index": 0, "text": choice["text"]}]}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        last: dict[str, Any] = {"index": 0, "text": "", "finish_reason": choice["finish_reason"]}
        if "raw_output" in choice:
            last["raw_output"] = choice["raw_output"]
        final = {
            **head,
            "choices": [last],
            "usage": answer["usage"],
            "snapshot": answer["snapshot"],
            "perf_metrics": {"server-processing-time": f"{elapsed:.6f}"},
        }
        yield f"data: {json.dumps(final)}\n\n".encode()
        yield b"data: [DONE]\n\n"


def _entry(token: int, logprob: float, sampling: float) -> dict[str, Any]:
    return {
        "token": decode([token]) if token != EOS else "<|endoftext|>",
        "token_id": token,
        "logprob": logprob,
        "sampling_logprob": sampling,
        "top_logprobs": [],
    }
