"""localplane's durable state: one SQLite file in the data directory.

Used only from the plane's event-loop thread, so there is no locking here: every call is a
short synchronous transaction. Checkpoint files live beside it (see ``checkpoints``).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shepherd.states import JobState

SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (
    id TEXT PRIMARY KEY,
    create_time TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS api_keys (
    key_hash TEXT PRIMARY KEY,
    account_id TEXT,             -- NULL for admin keys
    kind TEXT NOT NULL,          -- 'user' | 'admin'
    create_time TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS jobs (
    account_id TEXT NOT NULL,
    job_id TEXT NOT NULL,
    state TEXT NOT NULL,
    status_code TEXT NOT NULL DEFAULT 'OK',
    status_message TEXT NOT NULL DEFAULT '',
    create_time TEXT NOT NULL,
    update_time TEXT NOT NULL,
    spec TEXT NOT NULL,          -- the normalized create body (JSON)
    training_shape_ref TEXT,
    generation INTEGER NOT NULL DEFAULT 0,
    queue_seq INTEGER,
    pid INTEGER,
    PRIMARY KEY (account_id, job_id)
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, queue_seq);
CREATE TABLE IF NOT EXISTS models (
    account_id TEXT NOT NULL,
    model_id TEXT NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (account_id, model_id)
);
CREATE TABLE IF NOT EXISTS operations (
    account_id TEXT NOT NULL,
    op_id TEXT NOT NULL,
    done INTEGER NOT NULL DEFAULT 0,
    model_id TEXT NOT NULL,
    request TEXT NOT NULL,
    error TEXT,
    create_time TEXT NOT NULL,
    PRIMARY KEY (account_id, op_id)
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    account_id TEXT NOT NULL,
    job_id TEXT NOT NULL,
    payload TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    scope TEXT NOT NULL,         -- '' for the whole plane, else a job resource name
    name TEXT NOT NULL,
    value INTEGER NOT NULL,
    PRIMARY KEY (scope, name)
);
CREATE TABLE IF NOT EXISTS settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS deployments (
    account_id TEXT NOT NULL,
    deployment_id TEXT NOT NULL,
    payload TEXT NOT NULL,       -- the deployment as the control plane shows it (JSON)
    create_time TEXT NOT NULL,
    PRIMARY KEY (account_id, deployment_id)
);
CREATE TABLE IF NOT EXISTS webhooks (
    id TEXT PRIMARY KEY,
    account_id TEXT,             -- NULL: every account
    url TEXT NOT NULL,
    secret TEXT NOT NULL,
    create_time TEXT NOT NULL
);
"""


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class JobRecord:
    account_id: str
    job_id: str
    state: JobState
    create_time: str
    update_time: str
    spec: dict[str, Any]
    status_code: str = "OK"
    status_message: str = ""
    training_shape_ref: str | None = None
    generation: int = 0
    queue_seq: int | None = None
    pid: int | None = None

    @property
    def name(self) -> str:
        return f"accounts/{self.account_id}/rlorTrainerJobs/{self.job_id}"

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> JobRecord:
        return cls(
            account_id=row["account_id"],
            job_id=row["job_id"],
            state=JobState(row["state"]),
            create_time=row["create_time"],
            update_time=row["update_time"],
            spec=json.loads(row["spec"]),
            status_code=row["status_code"],
            status_message=row["status_message"],
            training_shape_ref=row["training_shape_ref"],
            generation=row["generation"],
            queue_seq=row["queue_seq"],
            pid=row["pid"],
        )


class Storage:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Single-threaded by design: a use from another thread is a bug and should fail loudly.
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        # NORMAL under WAL: durable across a process crash, which is what restart safety needs.
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------ accounts

    def ensure_account(self, account_id: str, now: str) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO accounts(id, create_time) VALUES (?, ?)", (account_id, now)
        )

    def account_exists(self, account_id: str) -> bool:
        return (
            self.db.execute("SELECT 1 FROM accounts WHERE id = ?", (account_id,)).fetchone()
            is not None
        )

    def add_key(self, key: str, account_id: str | None, kind: str, now: str) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO api_keys(key_hash, account_id, kind, create_time) VALUES (?, ?, ?, ?)",
            (key_hash(key), account_id, kind, now),
        )

    def lookup_key(self, key: str) -> tuple[str, str | None] | None:
        """``(kind, account_id)`` of a key, or None when unknown."""
        row = self.db.execute(
            "SELECT kind, account_id FROM api_keys WHERE key_hash = ?", (key_hash(key),)
        ).fetchone()
        return (row["kind"], row["account_id"]) if row else None

    def key_hashes(self, account_id: str) -> list[str]:
        rows = self.db.execute(
            "SELECT key_hash FROM api_keys WHERE account_id = ? AND kind = 'user'", (account_id,)
        )
        return [r["key_hash"] for r in rows]

    # ---------------------------------------------------------------- jobs

    def insert_job(self, rec: JobRecord) -> None:
        self.db.execute(
            "INSERT INTO jobs(account_id, job_id, state, status_code, status_message, create_time,"
            " update_time, spec, training_shape_ref, generation, queue_seq, pid)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                rec.account_id,
                rec.job_id,
                rec.state.value,
                rec.status_code,
                rec.status_message,
                rec.create_time,
                rec.update_time,
                json.dumps(rec.spec),
                rec.training_shape_ref,
                rec.generation,
                rec.queue_seq,
                rec.pid,
            ),
        )

    def save_job(self, rec: JobRecord) -> None:
        self.db.execute(
            "UPDATE jobs SET state = ?, status_code = ?, status_message = ?, update_time = ?,"
            " generation = ?, queue_seq = ?, pid = ? WHERE account_id = ? AND job_id = ?",
            (
                rec.state.value,
                rec.status_code,
                rec.status_message,
                rec.update_time,
                rec.generation,
                rec.queue_seq,
                rec.pid,
                rec.account_id,
                rec.job_id,
            ),
        )

    def set_pid(self, account_id: str, job_id: str, pid: int | None) -> None:
        """Only the pid: the rest of the row may have moved on since the caller read it."""
        self.db.execute(
            "UPDATE jobs SET pid = ? WHERE account_id = ? AND job_id = ?", (pid, account_id, job_id)
        )

    def get_job(self, account_id: str, job_id: str) -> JobRecord | None:
        row = self.db.execute(
            "SELECT * FROM jobs WHERE account_id = ? AND job_id = ?", (account_id, job_id)
        ).fetchone()
        return JobRecord.from_row(row) if row else None

    def find_jobs(self, job_id: str) -> list[JobRecord]:
        rows = self.db.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,))
        return [JobRecord.from_row(r) for r in rows]

    def jobs_linked_to(self, account_id: str, deployment_id: str) -> list[JobRecord]:
        """The account's trainer jobs created with ``hotLoadDeploymentId``, newest first."""
        rows = self.db.execute(
            "SELECT * FROM jobs WHERE account_id = ? AND json_extract(spec, '$.hotLoadDeploymentId') = ?"
            " ORDER BY create_time DESC, job_id DESC",
            (account_id, deployment_id),
        )
        return [JobRecord.from_row(r) for r in rows]

    def list_jobs(self, account_id: str, offset: int, limit: int) -> list[JobRecord]:
        rows = self.db.execute(
            "SELECT * FROM jobs WHERE account_id = ? ORDER BY create_time, job_id LIMIT ? OFFSET ?",
            (account_id, limit, offset),
        )
        return [JobRecord.from_row(r) for r in rows]

    def jobs_in(self, states: Iterable[JobState], limit: int = -1) -> list[JobRecord]:
        """Jobs in ``states``, queue order first; at most ``limit`` (-1: all)."""
        where, values = _in_states(states)
        rows = self.db.execute(
            f"SELECT * FROM jobs WHERE {where} ORDER BY queue_seq, create_time LIMIT ?",
            [*values, limit],
        )
        return [JobRecord.from_row(r) for r in rows]

    def count_in(self, states: Iterable[JobState]) -> int:
        where, values = _in_states(states)
        row = self.db.execute(f"SELECT COUNT(*) AS n FROM jobs WHERE {where}", values).fetchone()
        return int(row["n"])

    def next_queue_seq(self) -> int:
        row = self.db.execute("SELECT COALESCE(MAX(queue_seq), 0) + 1 AS n FROM jobs").fetchone()
        return int(row["n"])

    # -------------------------------------------------------------- models

    def get_model(self, account_id: str, model_id: str) -> dict[str, Any] | None:
        row = self.db.execute(
            "SELECT payload FROM models WHERE account_id = ? AND model_id = ?",
            (account_id, model_id),
        ).fetchone()
        return json.loads(row["payload"]) if row else None

    def put_model(
        self, account_id: str, model_id: str, payload: dict[str, Any], *, create: bool
    ) -> bool:
        """Insert (``create``: False if the id is taken) or replace a model."""
        verb = "INSERT OR IGNORE" if create else "INSERT OR REPLACE"
        cur = self.db.execute(
            f"{verb} INTO models(account_id, model_id, payload) VALUES (?, ?, ?)",
            (account_id, model_id, json.dumps(payload)),
        )
        return cur.rowcount == 1

    def delete_model(self, account_id: str, model_id: str) -> bool:
        cur = self.db.execute(
            "DELETE FROM models WHERE account_id = ? AND model_id = ?", (account_id, model_id)
        )
        return cur.rowcount == 1

    # ---------------------------------------------------------- deployments

    def get_deployment(self, account_id: str, deployment_id: str) -> dict[str, Any] | None:
        row = self.db.execute(
            "SELECT payload FROM deployments WHERE account_id = ? AND deployment_id = ?",
            (account_id, deployment_id),
        ).fetchone()
        return json.loads(row["payload"]) if row else None

    def put_deployment(
        self, account_id: str, deployment_id: str, payload: dict[str, Any], *, create: bool
    ) -> bool:
        """Insert (``create``: False if the id is taken) or replace a deployment."""
        verb = "INSERT OR IGNORE" if create else "INSERT OR REPLACE"
        cur = self.db.execute(
            f"{verb} INTO deployments(account_id, deployment_id, payload, create_time)"
            " VALUES (?, ?, ?, ?)",
            (account_id, deployment_id, json.dumps(payload), payload.get("createTime", "")),
        )
        return cur.rowcount == 1

    def delete_deployment(self, account_id: str, deployment_id: str) -> bool:
        cur = self.db.execute(
            "DELETE FROM deployments WHERE account_id = ? AND deployment_id = ?",
            (account_id, deployment_id),
        )
        return cur.rowcount == 1

    def list_deployments(self, account_id: str, offset: int, limit: int) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT payload FROM deployments WHERE account_id = ?"
            " ORDER BY create_time, deployment_id LIMIT ? OFFSET ?",
            (account_id, limit, offset),
        )
        return [json.loads(r["payload"]) for r in rows]

    # ---------------------------------------------------------- operations

    def insert_operation(
        self, account_id: str, op_id: str, model_id: str, request: dict[str, Any], now: str
    ) -> None:
        self.db.execute(
            "INSERT INTO operations(account_id, op_id, model_id, request, create_time) VALUES (?, ?, ?, ?, ?)",
            (account_id, op_id, model_id, json.dumps(request), now),
        )

    def get_operation(self, account_id: str, op_id: str) -> sqlite3.Row | None:
        return self.db.execute(
            "SELECT * FROM operations WHERE account_id = ? AND op_id = ?", (account_id, op_id)
        ).fetchone()

    def finish_operation(self, account_id: str, op_id: str, error: dict[str, Any] | None) -> None:
        self.db.execute(
            "UPDATE operations SET done = 1, error = ? WHERE account_id = ? AND op_id = ?",
            (json.dumps(error) if error else None, account_id, op_id),
        )

    def unfinished_operations_of(self, account_id: str, model_id: str) -> list[sqlite3.Row]:
        return list(
            self.db.execute(
                "SELECT * FROM operations WHERE done = 0 AND account_id = ? AND model_id = ?",
                (account_id, model_id),
            )
        )

    def unfinished_operations(self) -> list[sqlite3.Row]:
        return list(self.db.execute("SELECT * FROM operations WHERE done = 0 ORDER BY create_time"))

    # -------------------------------------------------------------- events

    def append_event(self, account_id: str, job_id: str, payload: dict[str, Any]) -> int:
        cur = self.db.execute(
            "INSERT INTO events(account_id, job_id, payload) VALUES (?, ?, '')",
            (account_id, job_id),
        )
        seq = int(cur.lastrowid or 0)
        payload["id"] = seq
        self.db.execute("UPDATE events SET payload = ? WHERE seq = ?", (json.dumps(payload), seq))
        return seq

    def events_after(
        self, account_id: str, seq: int, job_id: str | None = None
    ) -> list[dict[str, Any]]:
        if job_id:
            rows = self.db.execute(
                "SELECT payload FROM events WHERE account_id = ? AND seq > ? AND job_id = ? ORDER BY seq",
                (account_id, seq, job_id),
            )
        else:
            rows = self.db.execute(
                "SELECT payload FROM events WHERE account_id = ? AND seq > ? ORDER BY seq",
                (account_id, seq),
            )
        return [json.loads(r["payload"]) for r in rows]

    def last_event_seq(self) -> int:
        row = self.db.execute("SELECT COALESCE(MAX(seq), 0) AS n FROM events").fetchone()
        return int(row["n"])

    # ------------------------------------------------------------ counters

    def incr(self, name: str, scope: str = "", by: int = 1) -> None:
        self.db.execute(
            "INSERT INTO counters(scope, name, value) VALUES (?, ?, ?)"
            " ON CONFLICT(scope, name) DO UPDATE SET value = value + excluded.value",
            (scope, name, by),
        )

    def counters(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for row in self.db.execute("SELECT scope, name, value FROM counters"):
            out.setdefault(row["scope"], {})[row["name"]] = row["value"]
        return out

    def reset_counters(self) -> None:
        self.db.execute("DELETE FROM counters")

    # ------------------------------------------------------------ settings

    def get_setting(self, key: str) -> Any:
        row = self.db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return json.loads(row["value"]) if row else None

    def put_setting(self, key: str, value: Any) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO settings(key, value) VALUES (?, ?)", (key, json.dumps(value))
        )

    # ------------------------------------------------------------ webhooks

    def add_webhook(
        self, hook_id: str, account_id: str | None, url: str, secret: str, now: str
    ) -> None:
        self.db.execute(
            "INSERT INTO webhooks(id, account_id, url, secret, create_time) VALUES (?, ?, ?, ?, ?)",
            (hook_id, account_id, url, secret, now),
        )

    def webhooks(self) -> list[sqlite3.Row]:
        return list(self.db.execute("SELECT * FROM webhooks ORDER BY create_time"))

    def delete_webhook(self, hook_id: str) -> bool:
        return self.db.execute("DELETE FROM webhooks WHERE id = ?", (hook_id,)).rowcount == 1


def _in_states(states: Iterable[JobState]) -> tuple[str, list[str]]:
    """The ``state IN (...)`` condition for ``states`` and its parameters."""
    values = [s.value for s in states]
    return f"state IN ({','.join('?' * len(values))})", values
