"""Worker configuration from the environment: Temporal connection, task queue, and the
backend profiles (where each trainer platform is, and the *name* of the env var that holds
its key). Keys are read here, at the edge, and never travel in workflow inputs or history.

    SHEPHERD_BACKENDS=local,fireworks              profiles to load (default: local)
    SHEPHERD_BACKEND_<NAME>_URL=...                control plane
    SHEPHERD_BACKEND_<NAME>_GATEWAY_URL=...        data-plane gateway (default: the URL)
    SHEPHERD_BACKEND_<NAME>_API_KEY_ENV=VAR        env var holding the key
    SHEPHERD_BACKEND_<NAME>_ACCOUNT=...            account id (default: resolved from the key)
    SHEPHERD_BACKEND_<NAME>_EVENTS=true|false      subscribe to the platform's event stream
    SHEPHERD_BACKEND_<NAME>_TIMEOUT=30             per-request timeout, seconds
    SHEPHERD_BACKEND_<NAME>_SLOTS=4                its capacity: trainers Shepherd lets its
                                                   jobs hold at once (unset: no admission in
                                                   Shepherd; the platform's queue decides)
    SHEPHERD_BACKEND_<NAME>_CAPABILITIES=h100,eu   capability tags it offers
    SHEPHERD_BACKEND_<NAME>_QUEUES='{"team-a": {"quota": 2, "borrow_limit": 1}}'
                                                   its admission queues, when its scheduler
                                                   first starts (then: ``shepherd queues``)
    SHEPHERD_BACKEND_<NAME>_HOLDER_CHECK=30        seconds: a job closed without a word (say,
                                                   terminated) has its slot taken back within
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from pydantic import BaseModel, Field, ValidationError

from shepherd.platform import PlatformClient
from shepherd.scheduling import (
    PLACES_FIRST,
    Capacity,
    QueueConfig,
    pools_problem,
    quota_problem,
)

#: Defaults per well-known profile name.
_DEFAULTS: dict[str, dict[str, object]] = {
    "local": {
        "url": "http://127.0.0.1:8300",
        "api_key_env": "SHEPHERD_PLANE_API_KEY",
        "events": True,
    },
    "fireworks": {
        "url": "https://api.fireworks.ai",
        "api_key_env": "FIREWORKS_API_KEY",
        "events": False,
    },
}


class BackendProfile(BaseModel):
    name: str
    url: str
    gateway_url: str | None = None
    api_key_env: str
    account_id: str | None = None
    events: bool = False
    timeout_s: float = Field(default=30.0, gt=0)
    #: Its capacity for Shepherd's admission (None: none; the platform queues the jobs).
    slots: int | None = Field(default=None, ge=0)
    capabilities: list[str] = Field(default_factory=list)
    #: Its slots per accelerator type or training shape (shepherd/scheduling.py ``Capacity``).
    pools: dict[str, int] = Field(default_factory=dict)
    #: Its queues' configs, a new scheduler's seed (shepherd/scheduling.py).
    queues: dict[str, QueueConfig] = Field(default_factory=dict)
    #: How often its scheduler takes back the slots of jobs closed without a word.
    holder_check_s: float = Field(default=30.0, gt=0)
    #: How often its scheduler tells the first waiting jobs their places, at most.
    places_every_s: float = Field(default=30.0, gt=0)
    #: How many of each line its scheduler tells their exact place (the rest: a range).
    places_first: int = Field(default=PLACES_FIRST, ge=0)

    def api_key(self, env: Mapping[str, str]) -> str | None:
        return env.get(self.api_key_env) or None


class BackendConfigError(ValueError):
    pass


def profiles_from_env(env: Mapping[str, str] | None = None) -> dict[str, BackendProfile]:
    env = os.environ if env is None else env
    names = [n.strip() for n in env.get("SHEPHERD_BACKENDS", "local").split(",") if n.strip()]
    profiles = {}
    for name in names:
        prefix = f"SHEPHERD_BACKEND_{name.upper().replace('-', '_')}_"
        base = dict(_DEFAULTS.get(name, {}))
        slots = _slots(env.get(prefix + "SLOTS"), prefix + "SLOTS")
        pools = _pools(env.get(prefix + "POOLS"), prefix + "POOLS")
        if pools and slots is None:
            slots = sum(pools.values())  # every pool's slots usable at once
        queues = _queues(env.get(prefix + "QUEUES"), prefix + "QUEUES")
        if queues and slots is None:
            raise BackendConfigError(f"{prefix}QUEUES: declare {prefix}SLOTS too")
        if slots is not None and (problem := quota_problem(queues, Capacity(slots=slots))):
            raise BackendConfigError(f"{prefix}QUEUES: {problem}")
        values = {
            "url": env.get(prefix + "URL", base.get("url")),
            "gateway_url": env.get(prefix + "GATEWAY_URL"),
            "api_key_env": env.get(
                prefix + "API_KEY_ENV", base.get("api_key_env", f"SHEPHERD_{name.upper()}_API_KEY")
            ),
            "account_id": env.get(prefix + "ACCOUNT"),
            "events": env.get(prefix + "EVENTS", str(base.get("events", False))).lower()
            in ("1", "true", "yes"),
            "timeout_s": _number(env, prefix + "TIMEOUT", 30.0),
            "slots": slots,
            "capabilities": [
                t.strip() for t in env.get(prefix + "CAPABILITIES", "").split(",") if t.strip()
            ],
            "queues": queues,
            "pools": pools,
            "holder_check_s": _number(env, prefix + "HOLDER_CHECK", 30.0),
            "places_every_s": _number(env, prefix + "PLACES_EVERY", 30.0),
            "places_first": int(_number(env, prefix + "PLACES_FIRST", PLACES_FIRST, whole=True)),
        }
        if not values["url"]:
            raise BackendConfigError(f"backend {name!r}: set {prefix}URL")
        profiles[name] = BackendProfile(name=name, **values)
    return profiles


def _number(env: Mapping[str, str], name: str, default: float, *, whole: bool = False) -> float:
    """A positive number from ``name`` (``default`` when unset), or an error naming it."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise BackendConfigError(f"{name}: {raw!r} is not {kind}") from None
    if value < 0 or (value == 0 and not whole):
        raise BackendConfigError(f"{name}: must be {'>= 0' if whole else '> 0'}")
    return value


def _slots(raw: str | None, name: str) -> int | None:
    if raw is None or not raw.strip():
        return None
    try:
        slots = int(raw)
    except ValueError:
        raise BackendConfigError(f"{name}: {raw!r} is not a whole number of slots") from None
    if slots < 0:
        raise BackendConfigError(f"{name}: must be >= 0")
    return slots


def _pools(raw: str | None, name: str) -> dict[str, int]:
    if raw is None or not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise BackendConfigError(f"{name}: {exc}") from None
    if not isinstance(data, dict):
        raise BackendConfigError(
            f"{name}: an object of accelerator type or training shape -> slots"
        )
    if problem := pools_problem(data):
        raise BackendConfigError(f"{name}: {problem}")
    return data


def _queues(raw: str | None, name: str) -> dict[str, QueueConfig]:
    if raw is None or not raw.strip():
        return {}
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("an object of queue name -> {quota, borrow_limit, weight}")
        return {q: QueueConfig.model_validate({**conf, "name": q}) for q, conf in data.items()}
    except (ValueError, TypeError, ValidationError) as exc:
        raise BackendConfigError(f"{name}: {str(exc).splitlines()[0]}") from None


class BackendRegistry:
    """Platform clients by backend name, built on first use and shared by the activities."""

    def __init__(
        self, profiles: Mapping[str, BackendProfile], env: Mapping[str, str] | None = None
    ) -> None:
        self.profiles = dict(profiles)
        self._env = os.environ if env is None else env
        self._clients: dict[str, PlatformClient] = {}

    def client(self, backend: str) -> PlatformClient:
        from temporalio.exceptions import ApplicationError

        from workflows import policies

        if backend not in self._clients:
            profile = self.profiles.get(backend)
            if profile is None:
                raise ApplicationError(
                    f"backend {backend!r} is not configured on this worker (known: {', '.join(sorted(self.profiles)) or 'none'})",
                    type=policies.BACKEND_MISCONFIGURED,
                    non_retryable=True,
                )
            key = profile.api_key(self._env)
            if not key:
                raise ApplicationError(
                    f"backend {backend!r}: the env var {profile.api_key_env} holding its API key is not set",
                    type=policies.BACKEND_MISCONFIGURED,
                    non_retryable=True,
                )
            self._clients[backend] = PlatformClient(
                profile.url,
                key,
                gateway_url=profile.gateway_url,
                account_id=profile.account_id,
                timeout=profile.timeout_s,
            )
        return self._clients[backend]

    def events(self, backend: str) -> bool:
        profile = self.profiles.get(backend)
        return bool(profile and profile.events)

    def admits(self, backend: str) -> bool:
        profile = self.profiles.get(backend)
        return bool(profile and profile.slots is not None)

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
