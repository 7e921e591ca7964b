"""The training-shape catalog: a few local shapes, and the example shapes users copy from
the hosted platform's docs (``accounts/fireworks/trainingShapes/...``), so a spec written
for the hosted service runs unchanged on a laptop. Catalog accounts are public: any valid
key may read them.

Every shape runs as the same tiny local trainer; the snapshot fields are what the hosted
platform would report and are copied into the job's ``trainingConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PUBLIC_ACCOUNTS = frozenset({"fireworks", "localplane"})


@dataclass(frozen=True)
class ShapeVersion:
    account: str
    shape: str
    version: str
    validated: bool
    snapshot: dict[str, Any]

    @property
    def shape_name(self) -> str:
        return f"accounts/{self.account}/trainingShapes/{self.shape}"

    @property
    def name(self) -> str:
        return f"{self.shape_name}/versions/{self.version}"

    def wire(self) -> dict[str, Any]:
        return {"name": self.name, "snapshot": self.snapshot, "validated": self.validated}


def _snapshot(
    *,
    image: str,
    context: int,
    accelerator: str,
    count: int,
    nodes: int = 1,
    pp: int = 1,
    precision: str = "BF16",
    mode: str = "TRAINER_MODE_TRAIN",
    deployment: str = "",
) -> dict[str, Any]:
    return {
        "trainerImageTag": image,
        "maxSupportedContextLength": context,
        "nodeCount": nodes,
        "deploymentShapeVersion": deployment,
        "deploymentImageTag": image,
        "acceleratorType": accelerator,
        "acceleratorCount": count,
        "baseModelWeightPrecision": precision,
        "trainerShardingScheme": {"pipelineParallelism": pp},
        "trainerMode": mode,
    }


# Versions are listed oldest first; "latest validated" is the last validated one.
_VERSIONS: list[ShapeVersion] = [
    # Local shapes: CPU-sized, for laptops and CI.
    ShapeVersion(
        "localplane",
        "tiny-cpu",
        "v1",
        True,
        _snapshot(image="local-0.1", context=4096, accelerator="CPU", count=1),
    ),
    ShapeVersion(
        "localplane",
        "tiny-cpu",
        "v2",
        True,
        _snapshot(image="local-0.2", context=8192, accelerator="CPU", count=1),
    ),
    ShapeVersion(
        "localplane",
        "tiny-cpu",
        "v3-rc",
        False,
        _snapshot(image="local-0.3-rc", context=16384, accelerator="CPU", count=1),
    ),
    ShapeVersion(
        "localplane",
        "small-cpu",
        "v1",
        True,
        _snapshot(image="local-0.2", context=32768, accelerator="CPU", count=2),
    ),
    ShapeVersion(
        "localplane",
        "tiny-cpu-forward-only",
        "v1",
        True,
        _snapshot(
            image="local-0.2",
            context=8192,
            accelerator="CPU",
            count=1,
            mode="TRAINER_MODE_FORWARD_ONLY",
        ),
    ),
    # The hosted platform's documented examples.
    ShapeVersion(
        "fireworks",
        "qwen3-8b-128k-h200",
        "rc7d2k1a",
        True,
        _snapshot(
            image="0.33.1",
            context=131072,
            accelerator="NVIDIA_H200_141GB",
            count=8,
            deployment="accounts/fireworks/deploymentShapes/rft-qwen3-8b/versions/v1",
        ),
    ),
    ShapeVersion(
        "fireworks",
        "qwen3p5-9b-256k",
        "q9x4m2p0",
        True,
        _snapshot(
            image="0.34.0",
            context=262144,
            accelerator="NVIDIA_H200_141GB",
            count=8,
            pp=2,
            deployment="accounts/fireworks/deploymentShapes/rft-qwen3p5-9b/versions/v1",
        ),
    ),
    ShapeVersion(
        "fireworks",
        "qwen3-30b-a3b-h200",
        "a3b1v0k9",
        True,
        _snapshot(
            image="0.32.9",
            context=65536,
            accelerator="NVIDIA_H200_141GB",
            count=8,
            nodes=2,
            pp=2,
            deployment="accounts/fireworks/deploymentShapes/rft-qwen3-30b/versions/v1",
        ),
    ),
    ShapeVersion(
        "fireworks",
        "llama-v3p1-8b-instruct-h100",
        "l8h100v2",
        True,
        _snapshot(image="0.31.4", context=65536, accelerator="NVIDIA_H100_80GB", count=8),
    ),
]


def versions(account: str, shape: str) -> list[ShapeVersion]:
    return [v for v in _VERSIONS if v.account == account and v.shape == shape]


def latest_validated(account: str, shape: str) -> ShapeVersion | None:
    validated = [v for v in versions(account, shape) if v.validated]
    return validated[-1] if validated else None


def get(account: str, shape: str, version: str) -> ShapeVersion | None:
    return next((v for v in versions(account, shape) if v.version == version), None)


# ------------------------------------------------------------------------- base models

#: Public base models localplane serves (by their hosted names). Every one runs as the same
#: stand-in model (localplane/trainer/lm.py), seeded by its name. A Tinker-style name (no
#: ``accounts/`` prefix, e.g. ``Qwen/Qwen3-8B-Base``) names a stand-in too: the tinker-cookbook
#: picks renderers by such names.
BASE_MODELS = frozenset(
    f"accounts/fireworks/models/{m}"
    for m in (
        "qwen3-0p6b",
        "qwen3-1p7b",
        "qwen3-4b",
        "qwen3-8b",
        "qwen3-14b",
        "qwen3-32b",
        "qwen3-30b-a3b",
        "qwen3p5-9b",
        "llama-v3p1-8b-instruct",
        "llama-v3p2-1b-instruct",
        "llama-v3p2-3b-instruct",
    )
)


def check_servable(base_model: str, account: str) -> tuple[int, str] | None:
    """Why localplane cannot serve ``base_model`` for ``account`` — ``(http code, rule)`` —
    or None. Resource names must be one of :data:`BASE_MODELS`: another account's model is
    not the caller's to use (403), and a promoted model of the caller's own cannot be a base
    (the stand-in would train from its name, not its weights: load its checkpoint instead)."""
    if not base_model.startswith("accounts/"):
        return None
    if base_model in BASE_MODELS:
        return None
    owner = base_model.split("/")[1]
    if owner not in PUBLIC_ACCOUNTS and owner != account:
        return 403, f"{base_model} belongs to another account"
    if owner == account:
        return 400, (
            "a model of your account cannot be a base model on localplane (it would train from "
            "the stand-in of its name, not its weights); load its checkpoint with load_weights"
        )
    return 400, "is not a model localplane serves; it serves " + ", ".join(sorted(BASE_MODELS))


def base_model(account: str, model: str) -> dict[str, Any] | None:
    """A public base model as ``GET accounts/<a>/models/<m>`` shows it to any key (the hosted
    platform serves its public models so): a job asks whether its base model exists before
    it creates a trainer (Shepherd's activities/preflight.py)."""
    name = f"accounts/{account}/models/{model}"
    if name not in BASE_MODELS:
        return None
    return {"name": name, "state": "READY", "kind": "HF_BASE_MODEL"}
