"""Validation rules of the trainer platform's wire contract (trainer-api.md).

One place for every rule the platform enforces, so that ``localplane`` (which enforces
them) and Shepherd's job spec (which checks them before anything is provisioned) cannot
drift apart. Each check returns ``None`` when the value is fine, else a short sentence
stating the rule; the caller names the field.
"""

from __future__ import annotations

import re
from typing import Final

# Every pattern ends in `\Z`, not `$`: `$` also matches before a trailing newline, so
# "job-1\n" would pass and reach ids, paths and logs.

#: Resource ids chosen by clients (trainer job ids, model ids): 1–63 of a-z, 0-9, '-'.
RESOURCE_ID_RE: Final = re.compile(r"^[a-z0-9-]{1,63}\Z")
RESOURCE_ID_RULE: Final = "must be 1-63 characters of a-z, 0-9 and '-'"

#: Checkpoint ids (``save_weights`` names): a little looser, Tinker-style names like ``step_0100``.
CHECKPOINT_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")
CHECKPOINT_ID_RULE: Final = (
    "must be 1-63 characters of letters, digits, '.', '_' and '-', starting with a letter or digit"
)

ACCOUNT_ID_RE: Final = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}\Z")

SHAPE_REF_RE: Final = re.compile(
    r"^accounts/(?P<account>[a-z0-9][a-z0-9-]{0,62})/trainingShapes/(?P<shape>[a-z0-9][a-z0-9.-]{0,62})"
    r"(?:/versions/(?P<version>[a-z0-9][a-z0-9.-]{0,62}))?\Z"
)
SHAPE_REF_RULE: Final = "must be accounts/<account>/trainingShapes/<shape> or accounts/<account>/trainingShapes/<shape>/versions/<version>"

#: One segment of a resource name: starts with a letter or digit, so never "", "." or "..";
#: no spaces or control characters. Each owner checks its segment's own rule afterwards.
_SEGMENT: Final = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
MODEL_NAME_RE: Final = re.compile(
    rf"^accounts/(?P<account>{_SEGMENT})/models/(?P<model>{_SEGMENT})\Z"
)
JOB_NAME_RE: Final = re.compile(
    rf"^accounts/(?P<account>{_SEGMENT})/rlorTrainerJobs/(?P<job>{_SEGMENT})\Z"
)
CHECKPOINT_NAME_RE: Final = re.compile(
    rf"^accounts/(?P<account>{_SEGMENT})/rlorTrainerJobs/(?P<job>{_SEGMENT})"
    rf"/checkpoints/(?P<checkpoint>{_SEGMENT})\Z"
)

MAX_DISPLAY_NAME_LEN: Final = 63  # "display name < 64 chars"
MAX_BASE_MODEL_LEN: Final = 256
MAX_LORA_RANK: Final = 1024
MAX_INACTIVITY_TIMEOUT_S: Final = 3 * 3600  # the hosted platform caps it at 3 h
DEFAULT_INACTIVITY_TIMEOUT_S: Final = 3600
MAX_CONTEXT_LENGTH: Final = 1 << 20

#: How long a trainer holds a later ``seq_id`` while an earlier one is missing before it
#: gives up and breaks the model (trainer-api.md §4, ordering). A client retries a lost
#: submission within its route-race window, so the two bounds are tied:
#: ``ROUTE_RACE_WINDOW_MAX_S`` is what a job spec may ask for.
SEQ_GAP_HOLD_S: Final = 120.0
#: What a retry costs beyond its route-race delays: the activity's schedule-to-start and
#: warm-up probes before it re-sends the missing operation (seconds each on a loaded worker).
ROUTE_RACE_RETRY_MARGIN_S: Final = 30.0
#: The longest ``policies.route_race_window`` a trainer's hold can cover.
ROUTE_RACE_WINDOW_MAX_S: Final = SEQ_GAP_HOLD_S - ROUTE_RACE_RETRY_MARGIN_S

#: protobuf-JSON Duration: decimal seconds with an ``s`` suffix ("3600s", "1.5s").
DURATION_RE: Final = re.compile(r"^(?P<seconds>\d+(?:\.\d{1,9})?)s\Z")

ACCELERATOR_TYPES: Final = frozenset(
    {
        "NVIDIA_A100_80GB",
        "NVIDIA_H100_80GB",
        "NVIDIA_H200_141GB",
        "NVIDIA_B200_180GB",
        "AMD_MI300X_192GB",
        "CPU",
    }
)


def check_resource_id(value: str) -> str | None:
    return None if RESOURCE_ID_RE.match(value) else RESOURCE_ID_RULE


def check_checkpoint_id(value: str) -> str | None:
    return None if CHECKPOINT_ID_RE.match(value) else CHECKPOINT_ID_RULE


def check_shape_ref(value: str) -> str | None:
    return None if SHAPE_REF_RE.match(value) else SHAPE_REF_RULE


def check_display_name(value: str) -> str | None:
    if len(value) > MAX_DISPLAY_NAME_LEN:
        return f"must be at most {MAX_DISPLAY_NAME_LEN} characters (got {len(value)})"
    return None


def check_base_model(value: str) -> str | None:
    if not value.strip():
        return "is required"
    if len(value) > MAX_BASE_MODEL_LEN:
        return f"must be at most {MAX_BASE_MODEL_LEN} characters"
    if not value.isprintable() or any(ch.isspace() for ch in value):
        return "must be one line without spaces or control characters"
    if value.startswith("accounts/") and not MODEL_NAME_RE.match(value):
        return "must be accounts/<account>/models/<model> when given as a resource name"
    if any(part in ("", ".", "..") for part in value.split("/")):
        return "must not have empty, '.' or '..' path segments"
    return None


def check_lora_rank(value: int) -> str | None:
    if value < 0:
        return "must be >= 0 (0 means full fine-tuning)"
    if value > MAX_LORA_RANK:
        return f"must be <= {MAX_LORA_RANK}"
    return None


def parse_duration(value: str) -> float | None:
    """Seconds of a protobuf-JSON duration ("90s"), or None when malformed."""
    m = DURATION_RE.match(value)
    return float(m.group("seconds")) if m else None


def format_duration(seconds: float) -> str:
    return f"{seconds:g}s"


def check_inactivity_timeout(value: str) -> str | None:
    seconds = parse_duration(value)
    if seconds is None:
        return "must be a duration in seconds such as '3600s'"
    if seconds <= 0:
        return "must be positive"
    if seconds > MAX_INACTIVITY_TIMEOUT_S:
        return f"must be at most {MAX_INACTIVITY_TIMEOUT_S}s (3 h)"
    return None


def check_accelerator_type(value: str) -> str | None:
    if value not in ACCELERATOR_TYPES:
        return "must be one of " + ", ".join(sorted(ACCELERATOR_TYPES))
    return None


# ------------------------------------------------------------------ extraArgs
#
# The extraArgs a trainer accepts, with the type and the range of each value. The hosted
# platform passes extraArgs to its trainer image, which refuses a flag it does not know;
# a job spec is checked against this set before anything is provisioned, so a typo or an
# out-of-range value fails at submission, not after the trainer was created (or, for a
# flag the image would ignore, never). localplane's trainers take these options from it.

#: name -> (type, smallest, largest)
EXTRA_ARGS: Final[dict[str, tuple[type[int] | type[float], float, float]]] = {
    "--seed": (int, 0, 2**63 - 1),
    # Emulated GPU time per step on localplane's stand-in trainer (PlaneConfig's bound).
    "--compute-delay-ms": (float, 0, 600_000.0),
    "--retrieve-hold-seconds": (float, 0, 3600.0),
    "--seq-gap-timeout-seconds": (float, 0, 3600.0),
}
EXTRA_ARGS_RULE: Final = "must be one of " + ", ".join(f"{k}=N" for k in EXTRA_ARGS)


def check_extra_arg(arg: str) -> str | None:
    """Why ``arg`` is not an extraArg the platform accepts (None: it is)."""
    key, sep, raw = arg.partition("=")
    if key not in EXTRA_ARGS:
        return f"{arg[:80]!r} is not an accepted argument: {EXTRA_ARGS_RULE}"
    kind, low, high = EXTRA_ARGS[key]
    noun = "an integer" if kind is int else "a number"
    try:
        value = kind(raw) if sep else None
    except ValueError:
        value = None
    if value is None:
        return f"{key} needs {noun} value, as {key}=N"
    if not low <= value <= high:  # also refuses nan and inf
        return f"{key} must be in [{low:g}, {high:g}]"
    return None


# ---------------------------------------------------------------- base models
#
# A trainer's base model is a model resource of the platform, named as the hosted
# platform names it: accounts/<account>/models/<model>, both ids lower-case (the model id
# is a resource id). Whether it exists, and whether this account may train on it, only the
# platform can say: a job asks it first of all (activities/preflight.py).

TRAINER_BASE_MODEL_RULE: Final = (
    "must be a model resource name, accounts/<account>/models/<model> "
    "(lower-case ids, e.g. accounts/fireworks/models/qwen3-8b)"
)


def check_trainer_base_model(value: str) -> str | None:
    if problem := check_base_model(value):
        return problem
    m = MODEL_NAME_RE.match(value)
    if not m or not ACCOUNT_ID_RE.match(m["account"]) or check_resource_id(m["model"]):
        return TRAINER_BASE_MODEL_RULE
    return None
