"""The catalog's sqlite database: schema, opening it whatever state the file is in, and write transactions.

A catalog must start even when its database is damaged (a disk error, a file overwritten, a half-copied backup):
a file sqlite cannot read, or whose integrity check fails, is moved aside (never deleted) with its WAL, whatever
rows can still be read from it are salvaged into a fresh database, and every step is reported. The caller
(``CatalogServer``) then re-learns the rest from the stores (``reconcile``) and the durable tier (``adopt``).

The database lives on the catalog node's local disk: sqlite's WAL mode needs a local filesystem (shared memory
between connections), so it never lives on a network mount.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CatalogDatabaseError, DiskFullError, PolicyStoreError
from .ids import checked_id, is_policy_id

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
# Snapshot states. A deleted or aborted version keeps its row (a tombstone): versions are never reused, and a
# store that comes back with a copy of one is told to discard it rather than having it re-adopted.
RESERVED, COMMITTED, ABORTED, DELETED = "reserved", "committed", "aborted", "deleted"

SCHEMA = """
CREATE TABLE IF NOT EXISTS info (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- next: the next version to hand out; ceiling: the highest version handed out or about to be, always written
-- with a full sync, so that versions stay unique even if the latest non-synced publishes are lost to a power cut.
CREATE TABLE IF NOT EXISTS policies (
    pid TEXT PRIMARY KEY, next INTEGER NOT NULL, ceiling INTEGER NOT NULL, latest INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS snapshots (
    pid TEXT NOT NULL, version INTEGER NOT NULL, state TEXT NOT NULL, node TEXT NOT NULL,
    nbytes INTEGER NOT NULL DEFAULT 0, checksum TEXT NOT NULL DEFAULT '', meta TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL DEFAULT 0, durable INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (pid, version)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS holders (
    id INTEGER PRIMARY KEY, pid TEXT NOT NULL, version INTEGER NOT NULL, node TEXT NOT NULL,
    UNIQUE (pid, version, node)
);
CREATE INDEX IF NOT EXISTS holders_by_node ON holders (node);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, pid TEXT NOT NULL, version INTEGER NOT NULL
);
-- the token of each recent one-call publish: a store that lost the reply (the catalog was killed after its
-- commit) asks again with the same token and gets the version it was given, never a second one
CREATE TABLE IF NOT EXISTS publishes (token TEXT PRIMARY KEY, pid TEXT NOT NULL, version INTEGER NOT NULL);
"""


@dataclass
class Salvage:
    """Rows read back from a damaged database, to be written into the fresh one."""

    policies: dict[str, tuple[int, int]] = field(default_factory=dict)  # pid -> (next, ceiling)
    snapshots: list[tuple] = field(default_factory=list)  # rows of the snapshots table (committed and tombstones)
    holders: list[tuple[str, int, str]] = field(default_factory=list)


@dataclass
class Opened:
    conn: sqlite3.Connection
    new: bool  # no usable database was there: a new epoch begins
    problems: list[str]
    salvage: Salvage | None


def boot_id() -> str:
    """Changes when the machine restarts: a catalog that sees a new one may have lost unsynced transactions."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""  # unknown: treated as a restart every time (safe: versions jump, never repeat)


def connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=OFF")
    return conn


def open_db(path: Path) -> Opened:
    """Open (or create) the database at ``path``; a damaged one is moved aside and what can be read salvaged."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    problems: list[str] = []
    salvage = None
    existed = path.exists() and path.stat().st_size > 0
    if existed:
        fault = _check(path)
        if fault is not None:
            aside = _move_aside(path)
            problems.append(f"catalog database {path} is damaged ({fault}); moved to {aside}")
            salvage = _salvage(aside, problems)
            existed = False
    try:
        conn = connect(path)
        conn.executescript(SCHEMA)
    except sqlite3.DatabaseError as exc:
        raise CatalogDatabaseError(f"cannot create the catalog database {path}: {exc}") from exc
    new = conn.execute("SELECT value FROM info WHERE key = 'epoch'").fetchone() is None
    if new:
        with transaction(conn, durable=True):
            conn.executemany(
                "INSERT INTO info (key, value) VALUES (?, ?)",
                [("epoch", uuid.uuid4().hex), ("schema", str(SCHEMA_VERSION)), ("created", str(time.time())),
                 ("pruned_through", "0"), ("boot_id", boot_id())],
            )
    elif (schema := int(info(conn, "schema", "0"))) > SCHEMA_VERSION:
        conn.close()
        raise CatalogDatabaseError(
            f"catalog database {path} was written by a newer policystore (schema {schema}); "
            "upgrade policystore or point the catalog elsewhere"
        )
    return Opened(conn, new, problems, salvage)


def info(conn: sqlite3.Connection, key: str, default: str = "") -> str:
    row = conn.execute("SELECT value FROM info WHERE key = ?", (key,)).fetchone()
    return row[0] if row else default


def _check(path: Path) -> str | None:
    """Why sqlite cannot use the file as our catalog, or None if it can."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")  # replays a WAL left by a killed catalog
            result = [row[0] for row in conn.execute("PRAGMA quick_check")]
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        return str(exc)
    if result != ["ok"]:
        return "integrity check: " + "; ".join(result[:5])
    if tables and "info" not in tables:
        return f"not a policystore catalog (tables {sorted(tables)[:10]})"
    return None


def _move_aside(path: Path) -> Path:
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}")
    for suffix in ("", "-wal", "-shm"):  # a stale WAL must never be replayed into the new database
        src = Path(f"{path}{suffix}")
        if src.exists():
            os.replace(src, f"{aside}{suffix}")
    log.error("catalog database %s is damaged: moved to %s", path, aside)
    return aside


def _salvage(aside: Path, problems: list[str]) -> Salvage:
    """Read whatever rows a damaged database still yields; every row is re-validated before it is kept.

    It reads a copy padded to the page count the header records (sqlite refuses a torn file outright), scans each
    table as far as it goes, and where a snapshot scan breaks off it looks every version up one by one (a broken
    interior page hides only the rows below it). Version counters come from every table that names a version, so
    that versions keep increasing past anything the old database handed out.
    """
    out = Salvage()
    copy = Path(f"{aside}.salvage")
    bad = [0]
    broken: set[str] = set()
    try:
        _padded_copy(aside, copy)
        conn = sqlite3.connect(f"file:{copy}?mode=ro", uri=True, isolation_level=None)
    except (OSError, sqlite3.DatabaseError) as exc:
        problems.append(f"nothing salvaged: {exc}")
        copy.unlink(missing_ok=True)
        return out

    def rows(what: str, query: str, params: tuple = ()) -> Iterator[tuple]:
        try:
            yield from conn.execute(query, params)
        except sqlite3.DatabaseError as exc:
            broken.add(what)
            problems.append(f"salvage: reading {what} broke off: {exc}")

    def valid(row: tuple) -> bool:
        try:
            _check_snapshot_row(row)
            return True
        except (TypeError, ValueError, json.JSONDecodeError, PolicyStoreError):
            bad[0] += 1
            return False

    try:
        seen: dict[str, int] = {}
        for pid, nxt, ceiling in rows("policies", "SELECT pid, next, ceiling FROM policies"):
            if is_policy_id(pid) and isinstance(nxt, int) and isinstance(ceiling, int):
                out.policies[pid] = (nxt, ceiling)
        for what, query in (("holders", "SELECT pid, version, node FROM holders"),
                            ("events", "SELECT pid, version, '' FROM events")):
            for pid, version, node in rows(what, query):
                if is_policy_id(pid) and isinstance(version, int) and version > 0:
                    seen[pid] = max(seen.get(pid, 0), version)
                    if what == "holders" and isinstance(node, str):
                        out.holders.append((pid, version, node))
        columns = "pid, version, state, node, nbytes, checksum, meta, created, durable"
        states = f"state IN ('{COMMITTED}', '{DELETED}', '{ABORTED}')"
        found = {row[:2]: row for row in rows("snapshots", f"SELECT {columns} FROM snapshots WHERE {states}")}
        if "snapshots" in broken:  # look up every version the counters know of, one at a time
            for pid in set(out.policies) | set(seen):
                top = max(out.policies.get(pid, (1, 0))[0] - 1, seen.get(pid, 0))
                for version in range(1, top + 1):
                    if (pid, version) not in found:
                        for row in rows(f"{pid}@v{version}", f"SELECT {columns} FROM snapshots WHERE pid = ? AND "
                                        f"version = ? AND {states}", (pid, version)):
                            found[row[:2]] = row
        out.snapshots = [row for row in found.values() if valid(row)]
        for pid, version, *_ in out.snapshots:
            seen[pid] = max(seen.get(pid, 0), version)
        for pid, top in seen.items():
            nxt, ceiling = out.policies.get(pid, (1, 0))
            out.policies[pid] = (max(nxt, top + 1), ceiling)
    finally:
        conn.close()
        copy.unlink(missing_ok=True)
    committed = sum(row[2] == COMMITTED for row in out.snapshots)
    problems.append(
        f"salvaged {committed} committed snapshots, {len(out.snapshots) - committed} tombstones and "
        f"{len(out.policies)} version counters; {bad[0]} invalid rows skipped"
    )
    return out


def _padded_copy(src: Path, dst: Path) -> None:
    """Copy ``src``, padded with zeros to the size its sqlite header records (a torn file is otherwise refused)."""
    data = src.read_bytes()
    if len(data) >= 100 and data.startswith(b"SQLite format 3\x00"):
        page_size = int.from_bytes(data[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        pages = int.from_bytes(data[28:32], "big")
        data += b"\x00" * max(0, page_size * pages - len(data))
    dst.write_bytes(data)


def _check_snapshot_row(row: tuple) -> None:
    pid, version, state, node, nbytes, checksum, meta, created, durable = row
    checked_id(pid, version)
    if not (isinstance(node, str) and isinstance(nbytes, int) and isinstance(checksum, str)):
        raise ValueError(row)
    if not isinstance(json.loads(meta), dict) or not isinstance(created, (int, float)):
        raise ValueError(row)


@contextmanager
def transaction(conn: sqlite3.Connection, *, durable: bool) -> Iterator[sqlite3.Connection]:
    """One write transaction; ``durable`` makes its commit survive a power cut (fsync of the WAL).

    sqlite errors become policystore errors: a full disk is ``DiskFullError`` and the transaction is rolled back,
    so nothing of it shows (no phantom entry).
    """
    try:
        conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with suppress(sqlite3.DatabaseError):  # sqlite may already have rolled back (a full disk)
                    conn.execute("ROLLBACK")
            raise
    except sqlite3.DatabaseError as exc:
        if (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF == sqlite3.SQLITE_FULL:
            raise DiskFullError(f"the catalog's disk is full: {exc} (the change was rolled back)") from exc
        raise CatalogDatabaseError(f"the catalog database failed: {exc} (the change was rolled back)") from exc
