"""The job store: SQLite in WAL mode, so a daemon restart loses nothing.

Every change is one transaction; the CLI may write (submit, cancel) while the daemon runs or is down.
A new store is built under a temporary name and linked into place; a file that is empty, not SQLite,
corrupt or not ours is a :class:`StoreError` naming it (never started over silently). The state dir
is 0700 and the store 0600 (job env may hold tokens). A failed write is a :class:`StoreError` naming
the file and rolls back; events are observability, so :meth:`Store.log_event` drops one it cannot
write (``dropped_events``). The event log is bounded (``max_samples``, ``max_events``)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal

from malletrain.daemon.jobspec import MEMBER_KEYS, NAME_MAX_CHARS, JobSpec, JobSpecError, JobState, check_submit, parse_spec
from malletrain.daemon.statedir import current_umask, private_file, private_state_dir
from malletrain.daemon.store_schema import SQLITE_MAGIC, LEGACY_SCALING_TABLE, WAL_LIMIT_BYTES, StoreError  # noqa: F401  (re-exported)
from malletrain.daemon.store_schema import check_file, create_file, migrate, sqlite_error_text

log = logging.getLogger("malletrain.daemon.store")


MAX_EVENTS = 100_000
"""Newest event rows kept (all kinds but the periodic samples)."""
MAX_SAMPLES = 86_400
"""Newest periodic ``nodes`` rows kept: a day at one per second."""
SAMPLE_KINDS = ("nodes",)
SCALING_EVENTS = ("refined", "profile_done", "profile_aborted")
"""The policy's events that name measured points (``points`` or ``measured``: {count: samples/s})."""
LIFECYCLE_KINDS = ("daemon_start", "daemon_stop")
"""Events a restarted daemon reads (was the last one killed?): pruned apart from the others, so no job's
events, however many, rotate them out."""
MAX_LIFECYCLE = 1000  # newest LIFECYCLE_KINDS rows kept
WORLDS_META = "worlds/"
"""Meta key prefix: ``worlds/JOB`` counts the non-empty member lists published for a torchrun job (its
restart count goes on from there after a daemon restart; not read from rotating event rows)."""
PRUNE_EVERY = 500
"""Events written between two prunes."""


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
    owner_uid: int | None = None
    owner_gid: int | None = None
    owner_umask: int | None = None  # the submitter's, recorded at submit, for its workers (None: the agent's)

    def as_dict(self) -> dict[str, Any]:
        """The job as ``status --json`` shows it, with its array or sweep keys when it has them."""
        return {
            "id": self.id, "name": self.spec.name, "state": self.state.value, "samples": self.samples,
            "target": self.spec.samples, "nodes": list(self.nodes), "min_nodes": self.spec.min_nodes,
            "max_nodes": self.spec.max_nodes, "profile": self.spec.profile, "message": self.message,
            "submitted": self.submitted, "updated": self.updated, "cancel_requested": self.cancel_requested,
            "command": list(self.spec.command), "owner_uid": self.owner_uid,
        } | {k: getattr(self.spec, k) for k in MEMBER_KEYS if getattr(self.spec, k) is not None}


@dataclass(frozen=True)
class JobStatus:
    """A job's state and cancel flag, read without its spec (:meth:`Store.job_states`)."""

    id: str
    state: JobState
    cancel_requested: bool


def job_id(seq: int) -> str:
    return f"j{seq:06d}"


class Store:
    """One SQLite database; use :meth:`open`."""

    def __init__(self, conn: sqlite3.Connection, path: str, max_events: int = MAX_EVENTS,
                 max_samples: int = MAX_SAMPLES, clock: Callable[[], float] = time.time) -> None:
        self.conn = conn
        self.clock = clock  # the daemon injects its own: every stored time comes from one clock
        self.path = path
        self.max_events = max_events
        self.max_samples = max_samples
        self.dropped_events = 0
        self.commits = 0  # transactions committed (benchmarks/bench_daemon_scale.py reports them per second)
        self._batching = False  # inside batch(): writes are savepoints of its transaction
        self._since_prune = 0

    @classmethod
    def open(cls, path: str | Path, max_events: int = MAX_EVENTS, max_samples: int = MAX_SAMPLES,
             clock: Callable[[], float] = time.time) -> "Store":
        """Open the store at ``path`` (created if there is no file; WAL); a file that is empty, not SQLite,
        corrupt or not ours raises :class:`StoreError` naming it."""
        p = str(path)
        if p != ":memory:":
            fp = Path(p)
            try:
                private_state_dir(fp.parent)
            except OSError as exc:
                raise StoreError(f"{fp.parent}: cannot create the state dir: {exc.strerror or exc}") from None
            if not fp.exists():
                create_file(fp)
            check_file(fp)
            private_file(fp)
        try:
            conn = sqlite3.connect(p, timeout=10.0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(sqlite_error_text(exc, p)) from None
        store = cls(conn, p, max_events, max_samples, clock)
        try:
            store._setup(new=p == ":memory:")
            store.fail_invalid_jobs()
        except BaseException:
            conn.close()
            raise
        return store

    def _setup(self, new: bool) -> None:
        conn = self.conn
        try:
            conn.execute("PRAGMA busy_timeout=10000")
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise StoreError(f"{self.path}: corrupt store (quick_check: {check}); "
                                 "restore it from a backup of the state dir")
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except (sqlite3.Error, UnicodeDecodeError) as exc:
            raise StoreError(sqlite_error_text(exc, self.path)) from None
        if not new and "meta" not in tables:
            raise StoreError(f"{self.path}: a SQLite database without malletrain's tables, not a malletrain store")
        with self._tx() as c:
            migrate(c, self.path, new)

    def close(self) -> None:
        self.conn.close()

    class _Tx:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (rolled back on any error, sqlite errors as StoreError); inside
        :meth:`Store.batch` a savepoint of the batch's transaction."""

        def __init__(self, store: "Store") -> None:
            self.store = store
            self.conn = store.conn
            self.nested = store._batching

        def __enter__(self) -> sqlite3.Connection:
            try:
                self.conn.execute("SAVEPOINT write" if self.nested else "BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(sqlite_error_text(exc, self.store.path)) from None
            return self.conn

        def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> Literal[False]:
            if exc_type is None:
                try:
                    self.conn.execute("RELEASE write" if self.nested else "COMMIT")
                    self.store.commits += 0 if self.nested else 1
                    return False
                except sqlite3.Error as commit_exc:
                    self._rollback()
                    raise StoreError(sqlite_error_text(commit_exc, self.store.path)) from None
            self._rollback()
            if isinstance(exc, (sqlite3.Error, UnicodeDecodeError)):
                raise StoreError(sqlite_error_text(exc, self.store.path)) from None
            return False

        def _rollback(self) -> None:
            if not self.conn.in_transaction:
                return  # sqlite already rolled back (e.g. SQLITE_FULL)
            try:
                if self.nested:
                    self.conn.execute("ROLLBACK TO write")
                    self.conn.execute("RELEASE write")
                else:
                    self.conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                log.warning("%s: rollback failed: %s", self.store.path, exc)

    def _tx(self) -> "Store._Tx":
        return Store._Tx(self)

    def _write1(self, sql: str, args: tuple[Any, ...]) -> None:
        """One statement, whole or absent: inside :meth:`batch` as it is (SQLite undoes a failed statement
        and keeps the transaction; a savepoint would add two statements a write), outside in its own transaction."""
        if not self._batching:
            with self._tx() as c:
                c.execute(sql, args)
            return
        try:
            self.conn.execute(sql, args)
        except (sqlite3.Error, UnicodeDecodeError) as exc:
            raise StoreError(sqlite_error_text(exc, self.path)) from None

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Every write inside in one transaction, committed at the end (even when the block raises; nested
        batches join the outer one): a phase of a step costs one commit. Other writers (the CLI) wait for it."""
        if self._batching:
            yield
            return
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StoreError(sqlite_error_text(exc, self.path)) from None
        self._batching = True
        try:
            yield
        finally:
            self._batching = False
            if self.conn.in_transaction:
                try:
                    self.conn.execute("COMMIT")
                    self.commits += 1
                except sqlite3.Error as exc:
                    Store._Tx(self)._rollback()
                    raise StoreError(sqlite_error_text(exc, self.path)) from None

    # -- meta
    def get_meta(self, key: str) -> str | None:
        rows = self._select("SELECT value FROM meta WHERE key=?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str) -> None:
        self._write1("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def count_world(self, jid: str) -> None:
        """One more non-empty member list published for ``jid`` (a torchrun job's worlds)."""
        self._write1("INSERT INTO meta VALUES (?, '1') ON CONFLICT(key) DO UPDATE SET "
                     "value = CAST(value AS INTEGER) + 1", (WORLDS_META + jid,))

    def set_worlds(self, jid: str, n: int) -> None:
        """Start :meth:`count_world`'s count of ``jid`` at ``n``."""
        self.set_meta(WORLDS_META + jid, str(int(n)))

    def worlds(self, jid: str) -> int | None:
        """The non-empty member lists published for ``jid`` (:meth:`count_world`); None where no daemon
        counted them (a store an older daemon wrote: its event log says)."""
        raw = self.get_meta(WORLDS_META + jid)
        try:
            return max(0, int(raw)) if raw is not None else None
        except ValueError:
            return None

    def ports(self, names: Iterable[str]) -> dict[str, int]:
        """The ports the last daemon ran on (meta ``ports``, a JSON object), 0 for any not recorded;
        a value that is not one names the file, the entry and the fix."""
        raw = self.get_meta("ports")
        try:
            stored = json.loads(raw) if raw else {}
        except ValueError:
            stored = None
        if not isinstance(stored, dict):
            raise StoreError(f"{self.path}: meta 'ports' is not a JSON object ({raw[:60] if raw else raw!r}); "
                             "delete that row (the daemon picks ports again) or restore the state dir")
        out = {}
        for name in names:
            port = stored.get(name, 0)
            if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
                raise StoreError(f"{self.path}: meta 'ports' entry {name!r} = {str(port)[:40]!r} is not a port "
                                 "(0..65535); delete that row (the daemon picks ports again)")
            out[name] = port
        return out

    def set_machine_nodes(self, nodes: int) -> None:
        """Record the machine's node count (the daemon's backend knows it); submit checks jobs against it."""
        self.set_meta("machine_nodes", str(int(nodes)))

    def machine_nodes(self) -> int | None:
        """The machine's node count the daemon recorded, or None when no daemon has said yet."""
        raw = self.get_meta("machine_nodes")
        try:
            n = int(raw) if raw is not None else None
        except ValueError:
            return None
        return n if n is not None and n > 0 else None

    # -- jobs
    def submit(self, spec: JobSpec, owner_uid: int | None = None, owner_gid: int | None = None,
               owner_umask: int | None = None) -> str:
        """Queue a job (PENDING) owned by ``owner_uid``/``owner_gid``, run with ``owner_umask`` (defaults: this
        process's); returns its id ``jNNNNNN``; :class:`~malletrain.daemon.jobspec.JobSpecError` if it breaks a rule."""
        where = f"job {spec.name!r}"
        spec = parse_spec(json.loads(spec.to_json()), where)  # nothing invalid is ever stored
        check_submit(spec, where, self.machine_nodes(), self.get_meta("node_slots"))  # (jobspec.NODE_SLOTS_KEY)
        now = self.clock()
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO jobs (id, name, spec, state, submitted, updated, owner_uid, owner_gid, owner_umask) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                ("pending-id", spec.name, spec.to_json(), JobState.PENDING.value, now, now,
                 os.geteuid() if owner_uid is None else int(owner_uid),
                 os.getegid() if owner_gid is None else int(owner_gid),
                 current_umask() if owner_umask is None else int(owner_umask) & 0o777),
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
        jid, spec, state, samples, nodes, cancel, message, submitted, updated, uid, gid, umask = row
        try:
            return JobRecord(
                jid, _stored_spec(spec, jid), JobState(state), int(samples),
                tuple(str(n) for n in json.loads(nodes)), bool(cancel), str(message), float(submitted),
                float(updated), None if uid is None else int(uid), None if gid is None else int(gid),
                None if umask is None else int(umask) & 0o777,
            )
        except (ValueError, TypeError, RecursionError) as exc:
            raise StoreError(f"{self.path}: job {jid!r}: damaged row ({exc}); restore the store from a backup") from None

    def _select(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return self.conn.execute(sql, args).fetchall()
        except (sqlite3.Error, UnicodeDecodeError) as exc:  # UnicodeDecodeError: a damaged TEXT value
            raise StoreError(sqlite_error_text(exc, self.path)) from None

    _COLS = ("id, spec, state, samples, nodes, cancel_requested, message, submitted, updated, owner_uid, owner_gid, "
             "owner_umask")

    def get(self, jid: str) -> JobRecord | None:
        rows = self._select(f"SELECT {self._COLS} FROM jobs WHERE id=?", (jid,))
        return self._row(rows[0]) if rows else None

    def require(self, jid: str) -> JobRecord:
        rec = self.get(jid)
        if rec is None:
            raise StoreError(f"no job {jid!r}")
        return rec

    def jobs(self, states: Iterable[JobState] | None = None) -> list[JobRecord]:
        if states is None:
            rows = self._select(f"SELECT {self._COLS} FROM jobs ORDER BY seq")
        else:
            wanted = sorted({s.value for s in states})
            marks = ",".join("?" * len(wanted))
            rows = self._select(f"SELECT {self._COLS} FROM jobs WHERE state IN ({marks}) ORDER BY seq", wanted)
        return [self._row(r) for r in rows]

    def job_states(self, states: Iterable[JobState]) -> dict[str, JobStatus]:
        """Id -> state and cancel flag of each job in ``states`` (submission order), without parsing their specs
        (asked every iteration: parsing 100 specs cost more than the rest of it at 4,608 nodes)."""
        wanted = sorted({s.value for s in states})
        marks = ",".join("?" * len(wanted))
        rows = self._select(f"SELECT id, state, cancel_requested FROM jobs WHERE state IN ({marks}) ORDER BY seq", wanted)
        out: dict[str, JobStatus] = {}
        for jid, state, cancel in rows:
            try:
                out[str(jid)] = JobStatus(str(jid), JobState(state), bool(cancel))
            except ValueError as exc:
                raise StoreError(f"{self.path}: job {jid!r}: damaged row ({exc}); restore the store from a backup") from None
        return out

    def fail_invalid_jobs(self) -> list[str]:
        """Fail every live job whose stored spec today's rules refuse (e.g. stored by an older
        malletrain before limits existed); returns their ids. Called by :meth:`open`."""
        failed = []
        live = [s.value for s in JobState if not s.terminal]
        marks = ",".join("?" * len(live))
        for jid, spec in self._select(f"SELECT id, spec FROM jobs WHERE state IN ({marks})", live):
            try:
                JobSpec.from_json(spec, f"job {jid}")
            except JobSpecError as exc:
                self.set_state(jid, JobState.FAILED, f"refused: {exc}")
                failed.append(jid)
        return failed

    def set_state(self, jid: str, state: JobState, reason: str = "") -> bool:
        """Move a job to ``state`` (terminal states never change); returns whether it changed."""
        now = self.clock()
        with self._tx() as c:
            row = c.execute("SELECT state FROM jobs WHERE id=?", (jid,)).fetchone()
            if row is None:
                raise StoreError(f"no job {jid!r}")
            old = JobState(row[0])
            if old == state:
                return False
            if not old.can_become(state):
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
            c.execute("UPDATE jobs SET nodes=?, updated=? WHERE id=?", (json.dumps(list(nodes)), self.clock(), jid))

    def set_samples(self, jid: str, samples: int) -> None:
        self._write1("UPDATE jobs SET samples=? WHERE id=? AND samples<?", (int(samples), jid, int(samples)))

    def reset_samples(self, jid: str, samples: int) -> None:
        """The job's count, also downwards: its training restarted from ``samples`` (its progress was lost)."""
        self._write1("UPDATE jobs SET samples=? WHERE id=?", (int(samples), jid))

    def request_cancel(self, jid: str) -> JobState:
        """Cancel: a queued job is CANCELLED at once; a running one is flagged for the daemon."""
        rec = self.require(jid)
        if rec.state.terminal:
            return rec.state
        if rec.state in (JobState.PENDING, JobState.SUSPENDED):
            self.set_state(jid, JobState.CANCELLED, "cancelled by user")
            return JobState.CANCELLED
        with self._tx() as c:
            c.execute("UPDATE jobs SET cancel_requested=1, updated=? WHERE id=?", (self.clock(), jid))
        return rec.state

    def history(self, jid: str) -> list[tuple[str, float, str]]:
        rows = self._select("SELECT state, time, reason FROM job_states WHERE job=? ORDER BY id", (jid,))
        return [(s, t, r) for s, t, r in rows]

    # -- scalability and rescales
    def scaling(self, jid: str) -> dict[int, float]:
        """The samples/s measured for the job per node count, from the policy's events (a later point replaces
        an earlier one) over a version-1 store's rows; what the policy believes is its saved state."""
        out: dict[int, float] = {}
        if self._select("SELECT name FROM sqlite_master WHERE type='table' AND name=?", (LEGACY_SCALING_TABLE,)):
            rows = self._select(f"SELECT nodes, rate FROM {LEGACY_SCALING_TABLE} WHERE job=? ORDER BY nodes", (jid,))
            out.update((int(n), float(r)) for n, r in rows)
        for ev in self.job_events(jid, SCALING_EVENTS):
            points = ev.get("points", ev.get("measured", {}))
            for n, rate in (points.items() if isinstance(points, dict) else ()):
                try:
                    out[int(n)] = float(rate)
                except (TypeError, ValueError):
                    continue  # a damaged event is observability, not state: skipped
        return dict(sorted(out.items()))

    def record_rescale(self, jid: str, from_nodes: int, to_nodes: int, pause_s: float, kind: str) -> None:
        self._write1("INSERT INTO rescales (job, time, from_nodes, to_nodes, pause_s, kind) VALUES (?, ?, ?, ?, ?, ?)",
                     (jid, self.clock(), from_nodes, to_nodes, float(pause_s), kind))

    def rescales(self, jid: str | None = None) -> list[dict[str, Any]]:
        q = "SELECT job, time, from_nodes, to_nodes, pause_s, kind FROM rescales"
        rows = self._select(q + (" WHERE job=? ORDER BY id" if jid else " ORDER BY id"), (jid,) if jid else ())
        return [dict(zip(("job", "time", "from_nodes", "to_nodes", "pause_s", "kind"), r)) for r in rows]

    # -- membership generations
    def set_generation(self, jid: str, gen: int) -> None:
        """Remember ``gen`` as the job's last published generation; it never goes backwards."""
        self._write1("INSERT INTO generations VALUES (?, ?) ON CONFLICT(job) DO UPDATE SET gen=MAX(gen, excluded.gen)",
                     (jid, int(gen)))

    def generation(self, jid: str) -> int:
        """The job's last published generation (0: none)."""
        rows = self._select("SELECT gen FROM generations WHERE job=?", (jid,))
        return int(rows[0][0]) if rows else 0

    # -- events
    def log_event(self, kind: str, job: str = "", **detail: Any) -> None:
        """Append an event; on a full or read-only disk the event is dropped (and counted), never raised."""
        try:
            self._write1("INSERT INTO events (time, kind, job, detail) VALUES (?, ?, ?, ?)",
                         (self.clock(), kind, job, json.dumps(detail, default=str)))
        except StoreError as exc:
            self.dropped_events += 1
            if self.dropped_events == 1 or self.dropped_events % 1000 == 0:
                log.warning("event %r not stored (%d dropped so far): %s", kind, self.dropped_events, exc)
            return
        self._since_prune += 1
        if self._since_prune >= PRUNE_EVERY:
            self.prune_events()

    def prune_events(self) -> int:
        """Delete the oldest event rows beyond the bounds; returns how many went."""
        self._since_prune = 0
        apart = (*SAMPLE_KINDS, *LIFECYCLE_KINDS)
        deleted = 0
        try:
            with self._tx() as c:
                for kinds, cond, keep in ((SAMPLE_KINDS, "IN", self.max_samples),
                                          (LIFECYCLE_KINDS, "IN", MAX_LIFECYCLE),
                                          (apart, "NOT IN", self.max_events)):
                    where = f"kind {cond} ({','.join('?' * len(kinds))})"
                    row = c.execute(f"SELECT id FROM events WHERE {where} ORDER BY id DESC LIMIT 1 OFFSET ?",
                                    (*kinds, keep)).fetchone()
                    if row is not None:
                        deleted += c.execute(f"DELETE FROM events WHERE {where} AND id <= ?",
                                             (*kinds, row[0])).rowcount
        except StoreError as exc:
            log.warning("events not pruned: %s", exc)
        return deleted

    def job_events(self, jid: str, kinds: Iterable[str]) -> Iterator[dict[str, Any]]:
        """The job's events of these ``kinds``, oldest first."""
        wanted = sorted(set(kinds))
        marks = ",".join("?" * len(wanted))
        rows = self._select(f"SELECT id, time, kind, job, detail FROM events WHERE kind IN ({marks}) AND job=? "
                            "ORDER BY id", (*wanted, jid))
        return (_event(row) for row in rows)

    def last_daemon_was_killed(self) -> bool:
        """Whether the last daemon on this store logged its start but not its stop (its agents may still run),
        whether or not its ``daemon.json`` is still there."""
        rows = self._select("SELECT MAX(CASE WHEN kind='daemon_start' THEN id END), "
                            "MAX(CASE WHEN kind='daemon_stop' THEN id END) FROM events "
                            "WHERE kind IN ('daemon_start', 'daemon_stop')")
        start, stop = rows[0] if rows else (None, None)
        return start is not None and (stop is None or stop < start)

    def events(self, kind: str | None = None, since_id: int = 0) -> Iterator[dict[str, Any]]:
        q = "SELECT id, time, kind, job, detail FROM events WHERE id>?"
        args: tuple[Any, ...] = (since_id,)
        if kind:
            q += " AND kind=?"
            args += (kind,)
        for row in self._select(q + " ORDER BY id", args):
            yield _event(row)


def _event(row: tuple[Any, ...]) -> dict[str, Any]:
    """An event row as a dict: its detail's keys beside id, time, kind and job."""
    i, t, k, j, d = row
    try:
        detail = json.loads(d)
    except (ValueError, RecursionError):
        detail = {"damaged": True}
    return {"id": i, "time": t, "kind": k, "job": j, **(detail if isinstance(detail, dict) else {})}


def _stored_spec(text: str, jid: str) -> JobSpec:
    """A stored spec; one that today's rules refuse reads as a stub (the job is FAILED by
    :meth:`Store.fail_invalid_jobs`), so one bad row never makes the whole store unreadable."""
    try:
        return JobSpec.from_json(text, f"job {jid}")
    except JobSpecError:
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError):
            raw = {}
        name = raw.get("name") if isinstance(raw, dict) else None
        clean = "".join(ch for ch in name if ch.isprintable())[:NAME_MAX_CHARS] if isinstance(name, str) else ""
        return JobSpec(clean or "invalid", ("invalid-spec",))
