"""localplane's settings (how the process starts) and its operating config (capacity, boot
delay, faults), which the admin API changes at run time and the data directory persists."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic.alias_generators import to_camel
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_PORT = 8300
DEFAULT_ACCOUNT = "dev"


class PlaneSettings(BaseSettings):
    """How ``shepherd plane`` starts. Every field is also an env var ``SHEPHERD_PLANE_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="SHEPHERD_PLANE_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    data_dir: Path = Path(".shepherd/plane")
    #: The dev account's API key. Generated (and kept in the data dir) when not given.
    api_key: SecretStr | None = None
    #: The admin API's key. Generated (and kept in the data dir) when not given.
    admin_key: SecretStr | None = None
    account_id: str = DEFAULT_ACCOUNT
    #: Written once the plane serves: ``{"url", "port", "pid", "accountId"}`` (for tests and supervisors).
    ready_file: Path | None = None
    #: Operating config applied at start over the persisted one (e.g. ``{"capacity": 2}``).
    initial_config: dict[str, Any] = Field(default_factory=dict)


class _Camel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Range(_Camel):
    min: float = Field(ge=0)
    max: float = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class Outage(_Camel):
    """A window in which the control plane answers 503 to everything."""

    start: datetime
    end: datetime

    def active(self, now: datetime) -> bool:
        return self.start <= now < self.end


#: The longest outage, and the furthest start, a request may ask for: a year is more than any
#: test wants, and bounded values keep the window within what ``datetime`` can represent.
MAX_OUTAGE_S = 366 * 24 * 3600.0


class OutageRequest(_Camel):
    start_in_seconds: float = Field(default=0.0, ge=0, le=MAX_OUTAGE_S)
    duration_seconds: float = Field(gt=0, le=MAX_OUTAGE_S)

    def window(self) -> Outage:
        start = datetime.now(UTC) + timedelta(seconds=self.start_in_seconds)
        return Outage(start=start, end=start + timedelta(seconds=self.duration_seconds))


class _OutagePatch(_Camel):
    outage: OutageRequest | None


class PlaneConfig(_Camel):
    """Operating config and injected faults (trainer-api.md §6). Persisted; see
    ``POST /admin/v1/faults``."""

    #: Trainer slots; jobs beyond it wait in PENDING, first come first served.
    capacity: int = Field(default=4, ge=0, le=256)
    #: Time a trainer spends in CREATING beyond its process start (pod scheduling, image pull).
    boot_delay_seconds: float = Field(default=0.0, ge=0, le=3600)
    #: Gateway replicas; each learns a new route after its own lag, drawn from ``route_lag_seconds``.
    gateway_replicas: int = Field(default=3, ge=1, le=32)
    route_lag_seconds: Range = Field(default_factory=lambda: Range(min=0.0, max=0.3))
    #: Probability that the gateway answers 404 to a request whose route it knows.
    gateway_404_rate: float = Field(default=0.0, ge=0, le=1, alias="gateway404Rate")
    #: Probability that a control-plane request fails with 500/503.
    control_plane_5xx_rate: float = Field(default=0.0, ge=0, le=1, alias="controlPlane5xxRate")
    #: Whether an injected 5xx replaces the request (``before``), is returned after the request
    #: took effect (``after``: a lost response), or either at random (``mixed``).
    control_plane_5xx_mode: Literal["before", "after", "mixed"] = Field(
        default="before", alias="controlPlane5xxMode"
    )
    #: Extra latency added to every control-plane request, drawn uniformly.
    latency_ms: Range = Field(default_factory=lambda: Range(min=0.0, max=0.0))
    outage: Outage | None = None
    #: Default emulated GPU time of one forward_backward micro-batch (jobs may override
    #: with ``--compute-delay-ms=N`` in ``extraArgs``).
    compute_delay_ms: float = Field(default=0.0, ge=0, le=600_000)
    #: Whether trainers started from now on also speak the protobuf dialect of the Tinker API
    #: (tinker 0.38's). False: JSON only, as hosted Fireworks trainers are — a protobuf request
    #: is a 415 — so a test can prove a client (or a proxy in front of a tinker-SDK program)
    #: really speaks JSON.
    trainer_protobuf: bool = True
    #: Whether trainers started from now on are forked from the plane's fork server (a process
    #: that has imported what a trainer needs: a start costs milliseconds of CPU) or started
    #: from scratch (Python and NumPy imported again: about half a second of CPU each, what
    #: the plane falls back to when the fork server cannot start).
    fork_trainers: bool = True
    #: How long an async promotion takes to finish.
    promotion_seconds: float = Field(default=0.2, ge=0, le=3600)
    #: After a trainer dies, the job shows JOB_STATE_CREATING this long before FAILED (the
    #: hosted platform catching up); 0 turns it FAILED at once.
    death_settle_seconds: float = Field(default=0.0, ge=0, le=3600)
    #: Seed of the fault dice, for reproducible chaos; None draws from the OS.
    random_seed: int | None = None

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def merged(self, patch: dict[str, Any]) -> PlaneConfig:
        """This config with ``patch`` applied (``outage`` given as ``{durationSeconds,
        startInSeconds}`` relative to now, or null to clear)."""
        patch = dict(patch)
        outage: Any = self.outage
        if "outage" in patch:
            # Validated inside a wrapper so an error is reported as outage.<field>.
            request = _OutagePatch.model_validate({"outage": patch.pop("outage")}).outage
            outage = None if request is None else request.window()
        current = self.wire()
        current.pop("outage", None)
        merged = PlaneConfig.model_validate({**current, **patch})
        merged.outage = outage
        return merged
