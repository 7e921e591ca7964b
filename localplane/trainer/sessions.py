"""Sessions: one per client (``ServiceClient``), the owner of its models and samplers.

Sessions live in the trainer process (they do not survive a restart, as on the hosted
service a new trainer means a new session). Bounded (:mod:`localplane.limits`): a session
idle ``SESSION_IDLE_S`` is gone with its models and samplers, and beyond ``MAX_SESSIONS``
the longest idle one without work in flight makes room.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from localplane import checkpoints as ckpt
from localplane import limits
from localplane.errors import FailedPrecondition, ResourceExhausted, shorten
from localplane.trainer import validate

log = structlog.stdlib.get_logger("localplane.trainer")


@dataclass
class Session:
    session_id: str
    created_at: str
    user_metadata: dict[str, str] = field(default_factory=dict)
    display_name: str | None = None
    last_seen: float = field(default_factory=time.monotonic)
    finished: bool = False
    models: set[str] = field(default_factory=set)
    samplers: set[str] = field(default_factory=set)

    def wire(self) -> dict[str, Any]:
        """``tinker.types.GetSessionResponse``."""
        return {
            "training_run_ids": sorted(self.models),
            "sampler_ids": sorted(self.samplers),
            "user_metadata": self.user_metadata or None,
            "display_name": self.display_name,
        }


class Sessions:
    def __init__(
        self, busy: Callable[[Session], bool], on_forget: Callable[[Session], None]
    ) -> None:
        self._sessions: dict[str, Session] = {}
        self._busy = busy
        self._on_forget = on_forget

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, body: dict[str, Any]) -> Session:
        metadata = validate.user_metadata(body.get("user_metadata"))
        display = validate.text(body, "display_name", required=False)
        if len(self._sessions) >= limits.MAX_SESSIONS:
            self._make_room()
        session = Session(
            f"sess-{secrets.token_hex(8)}",
            ckpt.now_rfc3339(),
            metadata,
            display[:200] if display else None,
        )
        self._sessions[session.session_id] = session
        log.info("session.created", session_id=session.session_id, sdk=body.get("sdk_version"))
        return session

    def _make_room(self) -> None:
        idle = sorted(
            (s for s in self._sessions.values() if not self._busy(s)), key=lambda s: s.last_seen
        )
        if not idle:
            raise ResourceExhausted(
                f"this trainer holds {limits.MAX_SESSIONS} sessions, all with work in flight; "
                "finish a session (close its client) and retry"
            )
        self.forget(idle[0], "evicted: the trainer's session limit was reached")

    def get(self, session_id: Any) -> Session:
        session = self._sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise FailedPrecondition(
                f"session {shorten(session_id)} is not on this trainer (sessions do not survive "
                "a trainer restart and expire when idle); call create_session first"
            )
        session.last_seen = time.monotonic()
        return session

    def find(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def touch(self, session_id: str) -> None:
        session = self._sessions.get(session_id)
        if session is not None:
            session.last_seen = time.monotonic()

    def finish(self, session_id: str) -> None:
        session = self._sessions.get(session_id)
        if session is not None:
            session.finished = True

    def all(self) -> list[Session]:
        return sorted(self._sessions.values(), key=lambda s: s.created_at)

    def forget(self, session: Session, why: str) -> None:
        if self._sessions.pop(session.session_id, None) is None:
            return
        log.info("session.forgotten", session_id=session.session_id, reason=why)
        self._on_forget(session)

    def sweep(self, now: float) -> None:
        for session in list(self._sessions.values()):
            if now - session.last_seen > limits.SESSION_IDLE_S and not self._busy(session):
                self.forget(session, f"idle for more than {limits.SESSION_IDLE_S}s")
