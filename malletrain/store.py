"""The job store: SQLite in WAL mode, so a daemon restart loses nothing.

Tables: ``meta`` (schema version, backend epoch), ``jobs`` (spec, state,
progress, nodes), ``job_states`` (every transition), ``scalability`` (measured
samples/s per node count), ``rescales`` (measured pauses), ``generations`` (the
last membership generation published per job, so a restarted daemon numbers
on from it) and ``events``.
Every change is one transaction. The CLI may write (submit, cancel) while the
daemon runs or is down: the daemon picks the rows up on its next loop.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from malletrain.jobspec import JobSpec, JobState

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    name TEXT NOT NULL,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    samples INTEGER NOT NULL DEFAULT 0,
    nodes TEXT NOT NULL DEFAULT '[]',
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    message TEXT NOT NULL DEFAULT '',
    submitted REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS job_states (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL, state TEXT NOT NULL, time REAL NOT NULL, reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS scalability (
    job TEXT NOT NULL, nodes INTEGER NOT NULL, rate REAL NOT NULL, time REAL NOT NULL,
    PRIMARY KEY (job, nodes)
);
CREATE TABLE IF NOT EXISTS rescales (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL, time REAL NOT NULL, from_nodes INTEGER NOT NULL,
    to_nodes INTEGER NOT NULL, pause_s REAL NOT NULL, kind TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS generations (job TEXT PRIMARY KEY, gen INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL, kind TEXT NOT NULL, job TEXT NOT NULL, detail TEXT NOT NULL
);
"""


class StoreError(RuntimeError):
    """A store that cannot be used (wrong schema) or a bad request (unknown job id)."""


@dataclass(frozen=True)
class JobRecord:
    id: str
    spec: JobSpec
    state: JobState
    samples: int
    nodes: tuple[str, ...]
    cancel_requested: bool
    message: str
    submitted: float
    updated: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.spec.name, "state": self.state.value,
            "samples": self.samples, "target": self.spec.samples, "nodes": list(self.nodes),
            "min_nodes": self.spec.min_nodes, "max_nodes": self.spec.max_nodes,
            "profile": self.spec.profile, "message": self.message,
            "submitted": self.submitted, "updated": self.updated,
            "cancel_requested": self.cancel_requested,
        }


def job_id(seq: int) -> str:
    return f"j{seq:06d}"


class Store:
    """One SQLite database; use :meth:`open`."""

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self.conn = conn
        self.path = path

    @classmethod
    def open(cls, path: str | Path) -> "Store":
        """Open (or create) the store at ``path``; WAL mode; checks the schema version."""
        p = str(path)
        if p != ":memory:":
            Path(p).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(p, timeout=10.0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=10000")
        store = cls(conn, p)
        with store._tx():
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise StoreError(f"{p}: schema version {row[0]}, this malletrain reads {SCHEMA_VERSION}")
        return store

    def close(self) -> None:
        self.conn.close()

    class _Tx:
        def __init__(self, conn: sqlite3.Connection) -> None:
            self.conn = conn

        def __enter__(self) -> sqlite3.Connection:
            self.conn.execute("BEGIN IMMEDIATE")
            return self.conn

        def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
            self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")

    def _tx(self) -> "Store._Tx":
        return Store._Tx(self.conn)

    # -- meta
    def get_meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self._tx() as c:
            c.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    # -- jobs
    def submit(self, spec: JobSpec) -> str:
        """Queue a job (PENDING); returns its id ``jNNNNNN``."""
        now = time.time()
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO jobs (id, name, spec, state, submitted, updated) VALUES (?, ?, ?, ?, ?, ?)",
                ("pending-id", spec.name, spec.to_json(), JobState.PENDING.value, now, now),
            )
            seq = int(cur.lastrowid or 0)
            jid = job_id(seq)
            c.execute("UPDATE jobs SET id=? WHERE seq=?", (jid, seq))
            c.execute("INSERT INTO job_states (job, state, time, reason) VALUES (?, ?, ?, ?)",
                      (jid, JobState.PENDING.value, now, "submitted"))
            c.execute("INSERT INTO events (time, kind, job, detail) VALUES (?, 'submit', ?, ?)",
                      (now, jid, json.dumps({"name": spec.name})))
        return jid

    def _row(self, row: tuple[Any, ...]) -> JobRecord:
        jid, spec, state, samples, nodes, cancel, message, submitted, updated = row
        return JobRecord(
            jid, JobSpec.from_json(spec, f"job {jid}"), JobState(state), int(samples),
            tuple(json.loads(nodes)), bool(cancel), message, submitted, updated,
        )

    _COLS = "id, spec, state, samples, nodes, cancel_requested, message, submitted, updated"

    def get(self, jid: str) -> JobRecord | None:
        row = self.conn.execute(f"SELECT {self._COLS} FROM jobs WHERE id=?", (jid,)).fetchone()
        return None if row is None else self._row(row)

    def require(self, jid: str) -> JobRecord:
        rec = self.get(jid)
        if rec is None:
            raise StoreError(f"no job {jid!r}")
        return rec

    def jobs(self, states: Iterable[JobState] | None = None) -> list[JobRecord]:
        if states is None:
            rows = self.conn.execute(f"SELECT {self._COLS} FROM jobs ORDER BY seq").fetchall()
        else:
            wanted = sorted({s.value for s in states})
            marks = ",".join("?" * len(wanted))
            rows = self.conn.execute(
                f"SELECT {self._COLS} FROM jobs WHERE state IN ({marks}) ORDER BY seq", wanted
            ).fetchall()
        return [self._row(r) for r in rows]

    def set_state(self, jid: str, state: JobState, reason: str = "") -> bool:
        """Move a job to ``state`` (no-op if already there); terminal states never change.

        Returns True if the state changed.
        """
        now = time.time()
        with self._tx() as c:
            row = c.execute("SELECT state FROM jobs WHERE id=?", (jid,)).fetchone()
            if row is None:
                raise StoreError(f"no job {jid!r}")
            old = JobState(row[0])
            if old == state:
                return False
            if old.terminal:
                raise StoreError(f"job {jid} is {old.value}; cannot become {state.value}")
            nodes_sql = ", nodes='[]'" if not state.active else ""
            c.execute(f"UPDATE jobs SET state=?, updated=?, message=?{nodes_sql} WHERE id=?",
                      (state.value, now, reason, jid))
            c.execute("INSERT INTO job_states (job, state, time, reason) VALUES (?, ?, ?, ?)",
                      (jid, state.value, now, reason))
            c.execute("INSERT INTO events (time, kind, job, detail) VALUES (?, 'state', ?, ?)",
                      (now, jid, json.dumps({"from": old.value, "to": state.value, "reason": reason})))
        return True

    def set_nodes(self, jid: str, nodes: Iterable[str]) -> None:
        with self._tx() as c:
            c.execute("UPDATE jobs SET nodes=?, updated=? WHERE id=?", (json.dumps(list(nodes)), time.time(), jid))

    def set_samples(self, jid: str, samples: int) -> None:
        with self._tx() as c:
            c.execute("UPDATE jobs SET samples=? WHERE id=? AND samples<?", (int(samples), jid, int(samples)))

    def request_cancel(self, jid: str) -> JobState:
        """Cancel: a queued job is CANCELLED at once; a running one is flagged for the daemon."""
        rec = self.require(jid)
        if rec.state.terminal:
            return rec.state
        if rec.state in (JobState.PENDING, JobState.SUSPENDED):
            self.set_state(jid, JobState.CANCELLED, "cancelled by user")
            return JobState.CANCELLED
        with self._tx() as c:
            c.execute("UPDATE jobs SET cancel_requested=1, updated=? WHERE id=?", (time.time(), jid))
        return rec.state

    def history(self, jid: str) -> list[tuple[str, float, str]]:
        rows = self.conn.execute("SELECT state, time, reason FROM job_states WHERE job=? ORDER BY id", (jid,))
        return [(s, t, r) for s, t, r in rows]

    # -- scalability and rescales
    def record_scaling(self, jid: str, nodes: int, rate: float) -> None:
        with self._tx() as c:
            c.execute("INSERT OR REPLACE INTO scalability VALUES (?, ?, ?, ?)", (jid, int(nodes), float(rate), time.time()))

    def scaling(self, jid: str) -> dict[int, float]:
        rows = self.conn.execute("SELECT nodes, rate FROM scalability WHERE job=? ORDER BY nodes", (jid,))
        return {int(n): float(r) for n, r in rows}

    def record_rescale(self, jid: str, from_nodes: int, to_nodes: int, pause_s: float, kind: str) -> None:
        with self._tx() as c:
            c.execute("INSERT INTO rescales (job, time, from_nodes, to_nodes, pause_s, kind) VALUES (?, ?, ?, ?, ?, ?)",
                      (jid, time.time(), from_nodes, to_nodes, float(pause_s), kind))

    def rescales(self, jid: str | None = None) -> list[dict[str, Any]]:
        q = "SELECT job, time, from_nodes, to_nodes, pause_s, kind FROM rescales"
        rows = self.conn.execute(q + (" WHERE job=? ORDER BY id" if jid else " ORDER BY id"), (jid,) if jid else ())
        return [dict(zip(("job", "time", "from_nodes", "to_nodes", "pause_s", "kind"), r)) for r in rows]

    # -- membership generations
    def set_generation(self, jid: str, gen: int) -> None:
        """Remember ``gen`` as the job's last published generation; it never goes backwards."""
        with self._tx() as c:
            c.execute("INSERT INTO generations VALUES (?, ?) ON CONFLICT(job) DO UPDATE SET gen=MAX(gen, excluded.gen)",
                      (jid, int(gen)))

    def generation(self, jid: str) -> int:
        """The job's last published generation (0: none)."""
        row = self.conn.execute("SELECT gen FROM generations WHERE job=?", (jid,)).fetchone()
        return 0 if row is None else int(row[0])

    # -- events
    def log_event(self, kind: str, job: str = "", **detail: Any) -> None:
        with self._tx() as c:
            c.execute("INSERT INTO events (time, kind, job, detail) VALUES (?, ?, ?, ?)",
                      (time.time(), kind, job, json.dumps(detail, default=str)))

    def events(self, kind: str | None = None, since_id: int = 0) -> Iterator[dict[str, Any]]:
        q = "SELECT id, time, kind, job, detail FROM events WHERE id>?"
        args: tuple[Any, ...] = (since_id,)
        if kind:
            q += " AND kind=?"
            args += (kind,)
        for i, t, k, j, d in self.conn.execute(q + " ORDER BY id", args).fetchall():
            yield {"id": i, "time": t, "kind": k, "job": j, **json.loads(d)}
