"""The store's file and schema: how a ``store.db`` is created, checked and migrated.

Version 2 keeps no ``scalability`` table (what the policy learned is in the saved policy state, what
was measured when in the event log); a version-1 store is migrated when opened, its table kept
read-only as ``scalability_v1`` for :meth:`malletrain.daemon.store.Store.scaling`."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

from malletrain.daemon.statedir import FILE_MODE

log = logging.getLogger("malletrain.daemon.store")

SCHEMA_VERSION = 2
LEGACY_SCALING_TABLE = "scalability_v1"
"""A version-1 store's measured scalability rows, kept read-only by the migration to version 2."""
SQLITE_MAGIC = b"SQLite format 3\x00"
WAL_LIMIT_BYTES = 8 * 1024 * 1024

SCHEMA = """
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
    updated REAL NOT NULL,
    owner_uid INTEGER,
    owner_gid INTEGER,
    owner_umask INTEGER
);
CREATE TABLE IF NOT EXISTS job_states (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL, state TEXT NOT NULL, time REAL NOT NULL, reason TEXT NOT NULL
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
CREATE INDEX IF NOT EXISTS events_kind ON events (kind, id);
"""


class StoreError(RuntimeError):
    """A store that cannot be used (missing, empty, corrupt, wrong schema, disk full or
    read-only) or a bad request (unknown job id); the message names the file or the job."""


def sqlite_error_text(exc: sqlite3.Error | UnicodeDecodeError, path: str) -> str:
    """A sqlite error in words an operator acts on."""
    if isinstance(exc, UnicodeDecodeError):
        return f"{path}: corrupt store (text that is not UTF-8: {exc.reason}); restore it from a backup of the state dir"
    text = str(exc)
    low = text.lower()
    folder = os.path.dirname(path) or "."
    if "full" in low:
        return f"{path}: disk full ({text}); free space in {folder}: nothing stored was lost"
    if "readonly" in low or "read-only" in low or not os.access(folder, os.W_OK):
        return f"{path}: read-only ({text}); make {folder} writable: nothing stored was lost"
    if "malformed" in low or "not a database" in low or "corrupt" in low:
        return f"{path}: corrupt store ({text}); restore it from a backup of the state dir"
    return f"{path}: {text}"


def init_schema(conn: sqlite3.Connection) -> None:
    for stmt in SCHEMA.split(";"):
        if stmt.strip():
            conn.execute(stmt)


def create_file(path: Path) -> None:
    """Build a new store under a temporary name and link it into place (never an empty ``store.db``)."""
    tmp = path.with_name(f"{path.name}.new-{os.getpid()}")
    try:
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE))
        conn = sqlite3.connect(str(tmp), isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("BEGIN IMMEDIATE")
            init_schema(conn)
            conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            conn.execute("COMMIT")
        finally:
            conn.close()
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process created it first: use theirs
    except sqlite3.Error as exc:
        raise StoreError(sqlite_error_text(exc, str(path))) from None
    except OSError as exc:
        raise StoreError(f"{path}: cannot create the store: {exc.strerror or exc}") from None
    finally:
        for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
            try:
                leftover.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("cannot remove %s: %s", leftover, exc)


def check_file(path: Path) -> None:
    """An existing ``store.db`` must be a non-empty SQLite file; else a StoreError naming it."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the store: {exc.strerror or exc}") from None
    if not head:
        raise StoreError(f"{path}: the store is an empty file (0 bytes), not a malletrain store; "
                         "restore it from a backup, or move it away to start with no jobs")
    if head != SQLITE_MAGIC:
        raise StoreError(f"{path}: not a SQLite database, so not a malletrain store; "
                         "restore it from a backup, or move it away to start with no jobs")


def migrate(c: sqlite3.Connection, path: str, new: bool) -> None:
    """Bring the store open on ``c`` (inside a write transaction) to :data:`SCHEMA_VERSION`; a
    version this malletrain does not know is a :class:`StoreError` naming the file."""
    init_schema(c)  # IF NOT EXISTS: adds what a store of this version lacks (e.g. an index)
    columns = {r[1] for r in c.execute("PRAGMA table_info(jobs)")}
    for col in ("owner_uid", "owner_gid", "owner_umask"):  # added in place: NULL (unknown) for older jobs
        if col not in columns:
            c.execute(f"ALTER TABLE jobs ADD COLUMN {col} INTEGER")
    row = c.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    if row is None and not new:
        raise StoreError(f"{path}: no schema version: not a malletrain store")
    if row is None:
        c.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        return
    if row[0] == "1":  # 1 -> 2: the scalability table is kept read-only under its legacy name
        tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "scalability" in tables:
            c.execute(f"ALTER TABLE scalability RENAME TO {LEGACY_SCALING_TABLE}")
        c.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
        log.info("%s: store migrated from schema version 1 to %d", path, SCHEMA_VERSION)
    elif row[0] != str(SCHEMA_VERSION):
        raise StoreError(f"{path}: schema version {row[0]!r}, this malletrain reads {SCHEMA_VERSION}")
