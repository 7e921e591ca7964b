"""The plane: storage, operating config, keys, and the services built on them, started and
stopped together. Routes (``app``) talk only to this object."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from localplane import auth, limits
from localplane import checkpoints as ckpt
from localplane.config import PlaneConfig, PlaneSettings
from localplane.deployments import DeploymentService
from localplane.errors import InvalidArgument, PermissionDenied, Unauthenticated
from localplane.events import EventBus
from localplane.gateway import Gateway
from localplane.holds import Holds
from localplane.jobs import JobService, now_rfc3339
from localplane.promotion import PromotionService
from localplane.storage import Storage
from shepherd.platform import rules
from shepherd.states import JobState

log = structlog.stdlib.get_logger("localplane")

#: Per-job counter names of data-plane requests by "<dialect>:<op>".
DATA_PLANE_PREFIX = "dataPlane|"

API_KEY_FILE = "dev-api-key"
ADMIN_KEY_FILE = "admin-api-key"


@dataclass(frozen=True)
class Principal:
    kind: str  # "user" | "admin"
    account_id: str | None


def _check_key_style(style: str) -> None:
    if style not in auth.KEY_PREFIXES:
        raise InvalidArgument(f"keyStyle: must be one of {', '.join(auth.KEY_PREFIXES)}")


def _read_or_create_secret(path: Path, prefix: str) -> str:
    if path.exists():
        path.chmod(0o600)  # a key file copied or made by hand is still the owner's only
        return path.read_text().strip()
    key = f"{prefix}_{secrets.token_urlsafe(24)}"
    path.touch(mode=0o600)
    path.write_text(key + "\n")
    return key


class Plane:
    def __init__(self, settings: PlaneSettings) -> None:
        self.settings = settings
        self.data_dir = settings.data_dir.resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.storage = Storage(self.data_dir / "plane.db")
        stored = self.storage.get_setting("config") or {}
        base = PlaneConfig.model_validate({k: v for k, v in stored.items() if k != "outage"})
        if stored.get("outage"):
            base.outage = PlaneConfig.model_validate({"outage": stored["outage"]}).outage
        self.config = base.merged(settings.initial_config) if settings.initial_config else base
        self.storage.put_setting("config", self.config.wire())
        self.rng = random.Random(self.config.random_seed)
        self.events = EventBus(self.storage)
        self.gateway = Gateway(
            lambda: self.config, self.rng, self._on_route_404, self._on_data_plane
        )
        self.jobs = JobService(
            self.storage,
            self.events,
            self.gateway,
            self.data_dir,
            lambda: self.config,
            self.keys_file,
        )
        self.promotion = PromotionService(self.storage, self.data_dir, lambda: self.config)
        self.holds = Holds()
        self.deployments = DeploymentService(self.storage, self.data_dir)
        self.api_key, self.admin_key = self._ensure_keys()

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.events.start()
        await self.jobs.start()
        await self.promotion.start()
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_checkpoints())

    async def stop(self) -> None:
        self._sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._sweeper
        await self.jobs.stop()
        await self.promotion.stop()
        self.deployments.close()
        await self.events.stop()
        await self.gateway.aclose()
        self.storage.close()

    def sweep_checkpoints(self) -> int:
        """Delete expired checkpoint segments from disk (readers already skip them)."""
        changed = ckpt.sweep(self.data_dir)
        if changed:
            log.info("checkpoints.swept", changed=changed)
        return changed

    async def _sweep_checkpoints(self) -> None:
        while True:
            await asyncio.sleep(limits.CHECKPOINT_SWEEP_S)
            try:
                # A file walk: off the event loop (it touches no SQLite).
                await asyncio.to_thread(self.sweep_checkpoints)
            except Exception:  # a sweep must never stop the plane
                log.exception("checkpoints.sweep_failed")

    # ----------------------------------------------------------------- keys

    def _ensure_keys(self) -> tuple[str, str]:
        now = now_rfc3339()
        account = self.settings.account_id
        if not rules.ACCOUNT_ID_RE.match(account):
            raise ValueError(f"account id {account!r} must be 1-63 characters of a-z, 0-9 and '-'")
        self.storage.ensure_account(account, now)
        if self.settings.api_key:
            api_key = self.settings.api_key.get_secret_value()
        else:
            api_key = _read_or_create_secret(self.data_dir / API_KEY_FILE, "lp")
        if self.settings.admin_key:
            admin_key = self.settings.admin_key.get_secret_value()
        else:
            admin_key = _read_or_create_secret(self.data_dir / ADMIN_KEY_FILE, "lpadmin")
        self.storage.add_key(api_key, account, "user", now)
        self.storage.add_key(admin_key, None, "admin", now)
        self._write_keys_file(account)
        return api_key, admin_key

    def keys_file(self, account: str) -> Path:
        return self.data_dir / "accounts" / account / "api-keys.sha256"

    def _write_keys_file(self, account: str) -> None:
        # Trainer processes authenticate direct calls against this list of key hashes.
        path = self.keys_file(account)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n".join(self.storage.key_hashes(account)) + "\n")
        os.replace(tmp, path)

    def create_account(self, account_id: str | None, key_style: str = "tinker") -> tuple[str, str]:
        account_id = account_id or f"acct-{secrets.token_hex(4)}"
        if not rules.ACCOUNT_ID_RE.match(account_id):
            raise InvalidArgument(
                f"accountId: {account_id!r} must be 1-63 characters of a-z, 0-9 and '-'"
            )
        _check_key_style(key_style)
        self.storage.ensure_account(account_id, now_rfc3339())
        return account_id, self.add_key(account_id, key_style)

    def add_key(self, account_id: str, key_style: str = "tinker") -> str:
        """A new key for the account; Tinker-style (``tml-``) unless asked otherwise."""
        _check_key_style(key_style)
        key = auth.mint(key_style)
        self.storage.add_key(key, account_id, "user", now_rfc3339())
        self._write_keys_file(account_id)
        return key

    def authenticate(self, headers: Mapping[str, str]) -> Principal:
        key = auth.api_key(headers)
        if key is None:
            raise Unauthenticated(
                "missing API key: send 'X-Api-Key: <key>' or 'Authorization: Bearer <key>'"
            )
        found = self.storage.lookup_key(key)
        if found is None:
            raise Unauthenticated("unknown API key")
        return Principal(*found)

    @staticmethod
    def check_account(principal: Principal, account: str) -> None:
        if principal.kind != "user":
            raise PermissionDenied("the admin key is for /admin/v1 only; use an account's API key")
        if principal.account_id != account:
            raise PermissionDenied(f"the API key does not grant access to account {account}")

    @staticmethod
    def check_admin(principal: Principal) -> None:
        if principal.kind != "admin":
            raise PermissionDenied("the admin API needs the admin key")

    # --------------------------------------------------------------- config

    def set_config(self, patch: dict[str, Any]) -> PlaneConfig:
        self.config = self.config.merged(patch)
        self._config_changed()
        return self.config

    def reset_config(self) -> PlaneConfig:
        self.holds.release_all()  # a reset leaves no request waiting
        self.config = PlaneConfig()
        self._config_changed()
        return self.config

    def _config_changed(self) -> None:
        self.storage.put_setting("config", self.config.wire())
        if self.config.random_seed is not None:
            self.rng.seed(self.config.random_seed)
        self.jobs.schedule()  # more capacity may admit waiting jobs

    # ---------------------------------------------------------------- stats

    def _on_data_plane(self, account: str, job: str, dialect: str, op: str) -> None:
        # Counted here, where the plane's storage is: trainers only say what a request was.
        # Bookkeeping, not the request: one served by the trainer is answered even when the
        # count cannot be written (a full disk under the plane's database).
        scope = f"{dialect}:{op}"
        job_name = f"accounts/{account}/rlorTrainerJobs/{job}"
        try:
            self.storage.incr("dataPlaneRequests")
            self.storage.incr("dataPlaneRequests", scope)
            self.storage.incr("dataPlaneRequests", job_name)
            self.storage.incr(f"{DATA_PLANE_PREFIX}{scope}", job_name)
        except sqlite3.Error as exc:
            log.warning("stats.not_counted", job=job_name, op=scope, error=str(exc))

    def _on_route_404(self, account: str, job: str) -> None:
        self.storage.incr("route404s")
        self.storage.incr("route404s", f"accounts/{account}/rlorTrainerJobs/{job}")

    def stats(self) -> dict[str, Any]:
        counters = self.storage.counters()
        totals = counters.pop("", {})
        jobs: dict[str, Any] = {}
        data_plane: dict[str, int] = {}
        for name, values in counters.items():
            m = rules.JOB_NAME_RE.match(name)
            if not m:  # a "<dialect>:<op>" scope of the data-plane counter
                data_plane[name] = values.get("dataPlaneRequests", 0)
                continue
            rec = self.storage.get_job(m["account"], m["job"])
            by_op = {
                k.removeprefix(DATA_PLANE_PREFIX): v
                for k, v in values.items()
                if k.startswith(DATA_PLANE_PREFIX)
            }
            jobs[name] = {
                **{k: v for k, v in values.items() if not k.startswith(DATA_PLANE_PREFIX)},
                "dataPlane": by_op,
                "state": rec.state.value if rec else None,
                "liveTrainer": (m["account"], m["job"]) in self.jobs.trainers,
            }
        return {
            # Data-plane requests that reached a trainer, by "<dialect>:<op>" (json/protobuf).
            "dataPlane": data_plane,
            **{k: totals.get(k, 0) for k in _TOTALS},
            **{k: v for k, v in totals.items() if k not in _TOTALS},
            "liveTrainers": self.jobs.live_trainers(),
            "pendingJobs": self.storage.count_in([JobState.PENDING]),
            "capacity": self.config.capacity,
            "jobs": jobs,
        }


_TOTALS = (
    "creates",
    "createConflicts",
    "resumes",
    "deletes",
    "deleteCalls",
    "preemptions",
    "trainersStarted",
    "trainersExited",
    "route404s",
    "dataPlaneRequests",
    "controlPlaneRequests",
    "injected5xx",
    "webhookDeliveries",
    "webhookFailures",
)
