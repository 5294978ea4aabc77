"""The cluster catalog: which snapshots exist, their versions, and which nodes hold a copy.

One small actor per cluster (``policystore-catalog``) is the single source of truth for names and versions, so
``list()`` and ``get(pid)`` agree on every node as soon as ``publish`` returns. It never sees snapshot bytes:
the per-node stores are the data plane and fetch from each other (or from the durable tier) directly.

State lives in an sqlite database (``catalogdb.py``, WAL mode), one transaction per change, so a catalog killed
at any point restarts with every acknowledged change and nothing half-done, and a full disk rolls the change back
instead of leaving a phantom entry. Publishing a durable snapshot is two-phase (``reserve``, the store writes its
files, ``commit``), so a store killed mid-publish leaves the snapshot complete or absent; a non-durable publish is
one call (``publish``). Latest is always the highest committed version, whatever order commits arrive in.

The catalog's commit is the one commit point of a snapshot: a version is visible once its row is committed here,
and nowhere before (a durable commit marker is written only after it). A publish that fails after the commit
takes the version back (``withdraw``), and a store that lost the catalog's reply asks again with what makes the
call safe to repeat (``commit`` is idempotent, ``publish`` carries a token), so no version is left listed without
the copy it was committed with.

A catalog that starts with a new database (the file lost, or damaged and moved aside) rebuilds the league before
it answers anything: from the durable tier's commit markers and from every live store's holdings
(``ask_stores``), and each policy's versions continue after the highest version any of them has seen, so a
version number is never handed out again for other bytes. One bad marker or report is skipped and reported
(``health().skipped``, ``problems``), never fatal.

What must survive a power cut is synced (``synchronous=FULL``): reserve, durable commits, deletes, adoption.
A non-durable publish is not (its bytes live in memory and would not survive either); version numbers still never
repeat, because each policy's versions are handed out from a block whose end is synced first, and a catalog that
finds the machine rebooted continues after that block (and starts a new epoch for its watchers).

Watchers (the per-node stores) wait for news on the catalog's doorbell (``bell_after_beats``: hosted in the
catalog's own process as coroutines, ``hosting.py``, and rung after every change: a waiting store holds no thread
here), then ask ``watch`` for it;
``watch`` is served by its own concurrency group so it never holds up other calls (and can still wait itself,
as a long poll); create the actor with ``ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(CatalogServer)``.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import ray

from . import catalogdb, remote
from .catalogdb import ABORTED, COMMITTED, DELETED, RESERVED
from .config import StoreConfig
from .errors import (
    InvalidMetaError,
    InvalidOptionError,
    InvalidPolicyIdError,
    InvalidWeightsError,
    PolicyStoreError,
    UnknownPolicyError,
    UnknownVersionError,
    brief,
)
from .format import check_meta
from .ids import SnapshotId, check_policy_id, checked_id, checked_target
from .remote import WATCH_GROUP, store_name
from .tombstones import Tombstones
from .watch import Doorbell
from .wire import DURABLE, Adopted, CatalogEntry, CatalogEvents, CatalogHealth, Holdings, Reconciled, Ring, Summary

log = logging.getLogger(__name__)

# Threads that answer watchers (stores wait on the doorbell, not here, so a few serve any number of nodes).
CONCURRENCY_GROUPS = {WATCH_GROUP: 8}
VERSION_BLOCK = 64  # versions handed out per synced step of a policy's version counter
MAX_WATCH_S = 60.0
# The stores wake this long after a commit rings (``Doorbell``'s ``settle_s``): the committing store's call is
# answered before every store's follower calls back, and a burst of commits costs each store one call.
RING_SETTLE_S = 0.01
MAX_EVENTS = 1000  # per watch answer; the watcher asks again from the answer's seq
EVENT_LOG_KEEP = 10_000  # events kept for watchers that fall behind; older ones get a reset
# The highest version the catalog hands out or takes from a store or a marker: far beyond any real league, and
# leaves room for the version counters (version + a block) inside sqlite's 64-bit integers.
MAX_REPORTED_VERSION = 2**62
REBUILD_WAIT_S = 30.0  # how long a catalog with a new database waits for the live stores' holdings

_ENTRY = "SELECT pid, version, nbytes, checksum, meta, created, durable FROM snapshots"


_inside = threading.local()  # set while a counted call runs on this thread: calls it makes itself are not counted


def _counted(method: Callable) -> Callable:
    """Count each call the catalog receives, by method (``health().calls``): its load per published snapshot is
    what bounds a cluster's size. A call made by another method of the catalog is part of that one."""
    @functools.wraps(method)
    def counted(self: CatalogServer, *args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "yes", False):
            return method(self, *args, **kwargs)
        with self._calls_lock:
            self._calls[method.__name__] += 1
        _inside.yes = True
        try:
            return method(self, *args, **kwargs)
        finally:
            _inside.yes = False
    return counted


def _check_summary(summary: Any) -> str:
    """Validate a store's summary before anything is written; returns its meta as JSON."""
    if not isinstance(summary, Summary):
        raise InvalidWeightsError(f"the catalog takes a wire.Summary, got {type(summary).__name__}")
    if isinstance(summary.nbytes, bool) or not isinstance(summary.nbytes, int) or summary.nbytes < 0:
        raise InvalidWeightsError(f"summary.nbytes must be an int >= 0, got {summary.nbytes!r}")
    if not isinstance(summary.checksum, str) or not summary.checksum:
        raise InvalidWeightsError(f"summary.checksum must be a non-empty str, got {summary.checksum!r}")
    if not isinstance(summary.created, (int, float)) or not isinstance(summary.durable, bool):
        raise InvalidWeightsError(f"summary.created must be a number and durable a bool: {summary!r}")
    if not isinstance(summary.meta, dict):
        raise InvalidMetaError(f"summary.meta must be a dict, got {type(summary.meta).__name__}")
    return check_meta(summary.meta)


def _check_reports(entries: Sequence[tuple[Any, Any]],
                   ) -> tuple[list[tuple[SnapshotId, Summary, str]], list[tuple[SnapshotId, str]]]:
    """Reported (id, summary) pairs checked before anything is written: (id, summary, meta JSON) for the valid
    ones, (id, why) for the others; one bad report never stops the others from being taken."""
    valid, invalid = [], []
    for raw, summary in entries:
        try:
            sid = _check_id(raw)
        except (PolicyStoreError, TypeError, ValueError) as exc:
            invalid.append((SnapshotId(*raw) if isinstance(raw, tuple) and len(raw) == 2 else raw, str(exc)))
            continue
        try:
            valid.append((sid, summary, _check_summary(summary)))
        except (TypeError, InvalidWeightsError) as exc:
            invalid.append((sid, str(exc)))
    return valid, invalid


def _check_id(raw: Any) -> SnapshotId:
    """A reported snapshot id, checked (policy id, version from 1 to ``MAX_REPORTED_VERSION``)."""
    policy_id, version = raw
    sid = checked_id(policy_id, version)
    if sid.version > MAX_REPORTED_VERSION:
        raise InvalidPolicyIdError(f"{sid}: version is beyond the catalog's limit of {MAX_REPORTED_VERSION}")
    return sid


def _check_change(change: Any) -> tuple[SnapshotId, str]:
    """One holder change ``(snapshot id, node)`` from a store's batch, checked."""
    try:
        raw, node = change
        return _check_id(raw), _check_node(node)
    except (TypeError, ValueError) as exc:
        raise InvalidWeightsError(f"a holder change is (snapshot id, node id), got {change!r}: {exc}") from None


def _check_page(limit: Any, after: Any) -> tuple[int | None, SnapshotId | None]:
    """``list``'s paging arguments, checked: ``limit`` an int >= 1 or None, ``after`` a snapshot id or None."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidOptionError(f"list: limit must be an int >= 1 or None, got {limit!r}")
    if after is None:
        return limit, None
    try:
        policy_id, version = after
        return limit, checked_id(policy_id, version)
    except (TypeError, ValueError) as exc:
        raise InvalidOptionError(f"list: after must be a snapshot id (policy id, version) or None, got {after!r}: "
                                 f"{exc}") from None


def _check_node(node_id: Any) -> str:
    if not isinstance(node_id, str) or not node_id:
        raise InvalidWeightsError(f"node id must be a non-empty str, got {node_id!r}")
    return node_id


class CatalogServer:
    """Run as a Ray actor (see ``client.connect``); a plain class, so tests drive it directly.

    ``db_path``: the sqlite database, on the catalog node's local disk. When the database is new (first start, or
    the old one lost or damaged), the catalog rebuilds the league before it serves anything:
    ``seed`` returns the durable tier's committed snapshots, one line per marker it skipped and the deleted ids
    whose numbers stay used (e.g. a partial of ``durable.survey``), taken with ``adopt``; ``holdings`` returns
    what the live stores hold and one line per store that did not answer (``ask_stores``), taken with
    ``reconcile``.
    """

    def __init__(
        self,
        db_path: str,
        config: StoreConfig,
        *,
        seed: Callable[[], tuple[Sequence[tuple[SnapshotId, Summary]], Sequence[str],
                                  Sequence[SnapshotId]]] | None = None,
        holdings: Callable[[], tuple[Sequence[Holdings], Sequence[str]]] | None = None,
    ):
        self.config = config  # the cluster's store settings: stores started later, anywhere, use them
        # a delete asked of the catalog directly writes the durable tier's tombstones before it is done; within half
        # the caller's deadline, so the caller hears which tier was slow
        self._tombstones = None if config.durable_uri is None else Tombstones(
            config.durable_uri, min(config.durable_timeout_s, config.call_timeout_s / 2))
        self._path = Path(db_path)
        self._lock = threading.RLock()  # one connection, used by every thread of the actor in turn
        self._changed = threading.Condition(self._lock)  # wakes long polls when events are logged
        self.bell = Doorbell(RING_SETTLE_S)  # where the stores wait (coroutines: ``hosting.py``), rung from here
        self._closed = threading.Event()  # ends the beats
        self._beats = 0  # rung to the doorbell by ``_beat``: the ``as_of`` of this catalog's rings
        self._calls: Counter[str] = Counter()
        self._calls_lock = threading.Lock()
        opened = catalogdb.open_db(self._path)
        self._db = opened.conn
        self._new = opened.new
        self._problems = opened.problems
        if opened.salvage is not None:
            self._write_salvage(opened.salvage)
        self._after_reboot()
        self._epoch = catalogdb.info(self._db, "epoch")
        self._pruned = int(catalogdb.info(self._db, "pruned_through", "0"))
        self._seq = self._current_seq()
        self._adopted = self._skipped = 0
        if self._new:
            self._rebuild(seed, holdings)
            self._calls.clear()  # the rebuild's own reconcile and adopt are not calls received
        for problem in self._problems:
            log.error("catalog: %s", problem)
        self._ring()
        threading.Thread(target=self._beat, name="policystore-catalog-beat", daemon=True).start()
        health = self.health()
        log.info("catalog: %d snapshots of %d policies in %s (%s database, epoch %s)", health.snapshots,
                 health.policies, self._path, "new" if self._new else "existing", self._epoch)

    @_counted
    def store_config(self) -> StoreConfig:
        return self.config

    def health(self) -> CatalogHealth:
        """What startup found (damage, salvage, adoption) and how big the catalog is."""
        with self._lock:
            counts = dict(self._db.execute("SELECT state, count(*) FROM snapshots GROUP BY state").fetchall())
            policies = self._db.execute("SELECT count(*) FROM policies WHERE latest > 0").fetchone()[0]
            with self._calls_lock:
                calls = dict(self._calls)
            return CatalogHealth(
                path=str(self._path), epoch=self._epoch, new=self._new, problems=tuple(self._problems),
                adopted=self._adopted, skipped=self._skipped, seq=self._seq, policies=policies,
                snapshots=counts.get(COMMITTED, 0), reserved=counts.get(RESERVED, 0), calls=calls,
            )

    def close(self) -> None:
        """Close the database (an orderly stop; a killed catalog loses nothing it acknowledged either)."""
        self._closed.set()
        with self._lock:
            self._db.close()

    # ---- publish -------------------------------------------------------------------------------------------
    @_counted
    def reserve(self, policy_id: str, node_id: str) -> int:
        """A new version of ``policy_id``, invisible until ``commit``: the first phase of a durable publish."""
        check_policy_id(policy_id)
        _check_node(node_id)
        with self._write(durable=True) as db:
            version = self._next_version(db, policy_id)
            db.execute("INSERT INTO snapshots (pid, version, state, node) VALUES (?, ?, ?, ?)",
                       (policy_id, version, RESERVED, node_id))
        return version

    @_counted
    def commit(self, policy_id: str, version: int, node_id: str, summary: Summary) -> CatalogEntry:
        """Make a reserved version visible (synced: a committed snapshot survives a power cut)."""
        sid = checked_id(policy_id, version)
        meta = _check_summary(summary)
        _check_node(node_id)
        with self._write(durable=True) as db:
            row = db.execute("SELECT state, checksum FROM snapshots WHERE pid = ? AND version = ?", sid).fetchone()
            if row == (COMMITTED, summary.checksum):  # a retried commit that had landed
                return self._entry(sid)
            if row is None or row[0] != RESERVED:
                state = "not reserved" if row is None else f"{row[0]} (checksum {row[1]})" if row[1] else row[0]
                raise UnknownVersionError(f"{sid} cannot be committed: it is {state}")
            self._record_commit(db, sid, node_id, summary, meta)
        return self._entry(sid)

    @_counted
    def publish(self, policy_id: str, node_id: str, summary: Summary, token: str | None = None) -> CatalogEntry:
        """Reserve and commit a new version in one call and one transaction (a non-durable publish's one trip).

        ``token`` (unique per publish) makes the call safe to repeat: asked again with the same token, the catalog
        answers with the version that token was given instead of handing out another one.
        """
        check_policy_id(policy_id)
        meta = _check_summary(summary)
        _check_node(node_id)
        if token is not None and (not isinstance(token, str) or not 0 < len(token) <= 64):
            raise InvalidWeightsError(f"publish token must be a str of 1 to 64 characters, got {token!r}")
        with self._lock:
            row = self._db.execute("SELECT pid, version FROM publishes WHERE token = ?", (token,)).fetchone()
            if row is not None:
                try:
                    return self._entry(SnapshotId(*row))
                except KeyError:
                    raise UnknownVersionError(f"{SnapshotId(*row)} was published by this call, then deleted") from None
            durable = summary.durable or self._block_spent(policy_id)
            with self._write(durable=durable) as db:
                sid = SnapshotId(policy_id, self._next_version(db, policy_id))
                db.execute("INSERT INTO snapshots (pid, version, state, node) VALUES (?, ?, ?, ?)",
                           (*sid, RESERVED, node_id))
                self._record_commit(db, sid, node_id, summary, meta)
                if token is not None:
                    db.execute("INSERT INTO publishes (token, pid, version) VALUES (?, ?, ?)", (token, *sid))
            return self._entry(sid)

    @_counted
    def withdraw(self, policy_id: str, version: int, node_id: str) -> None:
        """Take back a version whose publish on ``node_id`` failed: reserved, it is aborted; committed (the publish
        failed after the catalog's commit, e.g. writing the durable marker), it is deleted, so no version stays
        listed without the copy it was committed with. Its number is never handed out again; repeating is harmless.
        """
        sid = checked_id(policy_id, version)
        _check_node(node_id)
        with self._write(durable=True) as db:
            row = db.execute("SELECT state, node FROM snapshots WHERE pid = ? AND version = ?", sid).fetchone()
            if row == (RESERVED, node_id):
                db.execute("UPDATE snapshots SET state = ? WHERE pid = ? AND version = ?", (ABORTED, *sid))
            elif row == (COMMITTED, node_id):
                self._tombstone(db, sid)
                self._refresh_latest(db, policy_id)

    # ---- holders -------------------------------------------------------------------------------------------
    @_counted
    def update_holders(self, gained: Sequence[tuple[SnapshotId, str]] = (),
                       dropped: Sequence[tuple[SnapshotId, str]] = ()) -> None:
        """A store's holder changes since its last call, in one call and one transaction (gained and dropped
        copies batched: a store sends them once per interval, so the catalog's load per snapshot is one message per
        node). Each change is ``(snapshot id, node id or wire.DURABLE)``; all are checked before any is written."""
        checked = [[_check_change(change) for change in changes] for changes in (gained, dropped)]
        with self._write(durable=False) as db:
            for sid, node in checked[0]:
                self._add_holder(db, sid, node)
            db.executemany("DELETE FROM holders WHERE pid = ? AND version = ? AND node = ?",
                           [(*sid, node) for sid, node in checked[1]])
            self._holders_changed(db, {sid.policy_id for sid, _ in (*checked[0], *checked[1])})

    @_counted
    def reconcile(self, node_id: str, held: Sequence[tuple[SnapshotId, Summary]], *,
                  restarted: bool = True) -> Reconciled:
        """A (re)started store reports the copies on its disk, each with its summary.

        Answers which to discard (reserved by this node and never committed: a publish killed midway; aborted;
        deleted while the store was away) and which to quarantine (another checksum than the catalog's, or a
        version another node is publishing now): a conflicting file is never grounds to delete a copy. Copies the
        catalog has no record of (a spill folder from an earlier catalog database) are adopted as committed.
        Committed versions the node no longer reports lose it as a holder.

        ``restarted``: the store has just started (before its first reservation), so every version still reserved
        by its node was left by a publish that died with the previous store: aborted, and in ``discard`` (the
        store removes whatever that publish left). False when a running store re-registers with a new catalog.
        """
        _check_node(node_id)
        reports, quarantine = _check_reports(held)
        discard, kept = [], set()
        with self._write(durable=True) as db:
            for sid, summary, meta in reports:
                row = db.execute("SELECT state, node, checksum FROM snapshots WHERE pid = ? AND version = ?",
                                 sid).fetchone()
                if row is None:
                    self._adopt_one(db, sid, node_id, summary, meta)
                    kept.add(sid)
                elif row[0] == RESERVED and row[1] == node_id:
                    db.execute("UPDATE snapshots SET state = ? WHERE pid = ? AND version = ?", (ABORTED, *sid))
                    discard.append(sid)
                elif row[0] == RESERVED:
                    quarantine.append((sid, f"{sid} is being published by node {row[1]}; this copy is not it"))
                elif row[0] in (ABORTED, DELETED):
                    discard.append(sid)
                elif row[2] != summary.checksum:
                    log.error("catalog: %s on node %s has checksum %s, the catalog %s: quarantine", sid, node_id,
                              summary.checksum, row[2])
                    quarantine.append((sid, f"checksum {summary.checksum} differs from the catalog's {row[2]}"))
                else:
                    self._add_holder(db, sid, node_id)
                    kept.add(sid)
            gone = [(pid, v) for pid, v in db.execute("SELECT pid, version FROM holders WHERE node = ?", (node_id,))
                    if (pid, v) not in kept]
            db.executemany("DELETE FROM holders WHERE pid = ? AND version = ? AND node = ?",
                           [(pid, v, node_id) for pid, v in gone])
            self._holders_changed(db, {pid for pid, _ in gone} | {sid.policy_id for sid in kept})
            if restarted:
                dead = [SnapshotId(*row) for row in db.execute(
                    "SELECT pid, version FROM snapshots WHERE node = ? AND state = ?", (node_id, RESERVED))]
                db.executemany("UPDATE snapshots SET state = ? WHERE pid = ? AND version = ?",
                               [(ABORTED, *sid) for sid in dead])
                discard.extend(dead)
        return Reconciled(tuple(discard), tuple(quarantine))

    @_counted
    def adopt(self, entries: Sequence[tuple[SnapshotId, Summary]]) -> Adopted:
        """Take the durable tier's committed snapshots (``DurableTier.list_committed()``) into the catalog.

        For a catalog whose database is new (``health().new``): a fresh cluster pointed at an existing durable
        URI sees the league. Entries the catalog already has gain the durable tier as holder; entries it deleted
        or aborted, or that conflict with it, are skipped and said why (the durable tier is never trusted over
        the catalog's own record).
        """
        checked, invalid = _check_reports(entries)
        added, held = [], []
        skipped = [f"{sid}: not a valid summary: {why}" for sid, why in invalid]
        with self._write(durable=True) as db:
            for sid, summary, meta in checked:
                row = db.execute("SELECT state, checksum FROM snapshots WHERE pid = ? AND version = ?",
                                 sid).fetchone()
                if row is None:
                    self._adopt_one(db, sid, DURABLE, summary, meta)
                    added.append(sid)
                elif row == (COMMITTED, summary.checksum):
                    self._add_holder(db, sid, DURABLE)
                    held.append(sid)
                elif row[0] == COMMITTED:
                    skipped.append(f"{sid}: durable checksum {summary.checksum} differs from the catalog's {row[1]}")
                else:
                    skipped.append(f"{sid}: {row[0]} in the catalog")
        for line in skipped:
            log.warning("catalog: not adopted from the durable tier: %s", line)
        return Adopted(tuple(added), tuple(held), tuple(skipped))

    # ---- read ----------------------------------------------------------------------------------------------
    @_counted
    def lookup(self, policy_id: str, version: int | None = None) -> CatalogEntry:
        """The committed entry (the highest committed version when ``version`` is None)."""
        policy_id, version = checked_target(policy_id, version)
        with self._lock:
            row = self._db.execute("SELECT latest FROM policies WHERE pid = ?", (policy_id,)).fetchone()
            if not row or not row[0]:
                known = [p for (p,) in self._db.execute("SELECT pid FROM policies WHERE latest > 0 ORDER BY pid "
                                                         "LIMIT 21")]
                more = " ..." if len(known) > 20 else ""
                hint = f"; known policies: {known[:20]}{more}" if known else " (the store is empty)"
                raise UnknownPolicyError(f"unknown policy {policy_id!r}{hint}")
            sid = SnapshotId(policy_id, row[0] if version is None else version)
            try:
                return self._entry(sid)
            except KeyError:
                versions = [v for (v,) in self._db.execute(
                    "SELECT version FROM snapshots WHERE pid = ? AND state = ? ORDER BY version", (policy_id, COMMITTED)
                )]
                raise UnknownVersionError(
                    f"policy {policy_id!r} has no version {version}; it has {len(versions)} versions "
                    f"({versions[:10]}{' ...' if len(versions) > 10 else ''}, latest {row[0]})"
                ) from None

    @_counted
    def list(self, policy_id: str | None = None, limit: int | None = None,
             after: SnapshotId | tuple[str, int] | None = None) -> list[CatalogEntry]:
        """Every committed snapshot (or every one of ``policy_id``), by policy then version.

        Paged: at most ``limit`` entries, those after the snapshot id ``after`` in (policy, version) order; pass the
        last entry's id back as ``after`` for the next page (an empty page is the end). The cursor need not exist
        (a deleted version is a valid cursor), so paging never skips or repeats an entry."""
        limit, cursor = _check_page(limit, after)
        where, params = "state = ?", [COMMITTED]
        if policy_id is not None:
            self.lookup(policy_id)  # raises the right error for an unknown policy
            where, params = f"pid = ? AND {where}", [policy_id, *params]
        if cursor is not None:
            where, params = f"(pid, version) > (?, ?) AND {where}", [*cursor, *params]
        page = f" LIMIT {limit}" if limit is not None else ""
        with self._lock:
            rows = self._db.execute(f"{_ENTRY} WHERE {where} ORDER BY pid, version{page}", params).fetchall()
            if limit is None and cursor is None:
                span, bounds = ("WHERE pid = ?", [policy_id]) if policy_id is not None else ("", [])
            elif rows:  # only the holders of this page's range (the holders index covers it)
                span, bounds = "WHERE (pid, version) BETWEEN (?, ?) AND (?, ?)", [*rows[0][:2], *rows[-1][:2]]
            else:
                return []
            holder_rows = self._db.execute(f"SELECT pid, version, node FROM holders {span} ORDER BY id",
                                           bounds).fetchall()
        holders: dict[tuple[str, int], list[str]] = {}
        for pid, version, node in holder_rows:
            holders.setdefault((pid, version), []).append(node)
        return [_to_entry(row, holders.get((row[0], row[1]), ())) for row in rows]

    @_counted
    def delete(self, policy_id: str, version: int | None = None, *, tombstones_queued: bool = False
               ) -> list[CatalogEntry]:
        """Remove one version or all of them (those committed when the call arrives); returns the removed entries
        (with their holders to clean up).

        Deleted versions keep a tombstone: their numbers are never handed out again, and a store that comes back
        with a copy is told to discard it. With a durable tier, its tombstones are written there first (DurableTier
        Error naming the tier, and nothing deleted, if it does not take them in time), unless the caller is a
        store that has queued them itself (``tombstones_queued``: recorded on its disk, retried until written).
        """
        entries = self.list(policy_id) if version is None else [self.lookup(policy_id, version)]
        if self._tombstones is not None and not tombstones_queued:
            self._tombstones.write([e.id for e in entries])
        with self._write(durable=True) as db:
            removed = [e for e in entries if db.execute("SELECT state FROM snapshots WHERE pid = ? AND version = ?",
                                                        e.id).fetchone() == (COMMITTED,)]
            for entry in removed:
                self._tombstone(db, entry.id)
            self._refresh_latest(db, policy_id)
        if self._tombstones is not None and not tombstones_queued:
            self._tombstones.remove_later([e.id for e in removed])
        return removed

    @_counted
    def compact_tombstones(self) -> dict[str, int]:
        """Fold the durable tier's tombstones into one floor per policy (the tier keeps a file per deleted version
        otherwise): the floor is just below the policy's oldest version still committed or being published (every
        version of a policy with none), so nothing live is ever below it. Returns the objects removed per policy;
        a no-op without a durable tier."""
        if self._tombstones is None:
            return {}
        with self._lock:
            rows = self._db.execute("SELECT pid, min(CASE WHEN state IN (?, ?) THEN version END), max(version) FROM "
                                    "snapshots GROUP BY pid", (COMMITTED, RESERVED)).fetchall()
        floors = {pid: (oldest_live - 1 if oldest_live is not None else newest) for pid, oldest_live, newest in rows}
        return self._tombstones.compact({pid: floor for pid, floor in floors.items() if floor > 0})

    # ---- watch ---------------------------------------------------------------------------------------------
    def _beat(self) -> None:
        """Ring the doorbell every ``poll_s / 2`` whether or not anything changed: the catalog's own word, to every
        store at once, that it had no news after its ``seq``. Idle stores wait for it on the doorbell
        (``Doorbell.after_beats``) and never call the catalog, so an idle cluster costs the catalog nothing per
        node; a stuck catalog (its lock held) beats no more, and its stores' ``as_of`` stops moving, as it would
        without beats."""
        while not self._closed.wait(self.config.poll_s / 2):
            with self._lock:
                self._beats += 1
                self._ring()

    def _ring(self) -> None:
        """Tell the doorbell the current event number (caller holds the lock: rings go out in order)."""
        self.bell.ring(Ring(self._seq, self._beats, self._epoch))

    @_counted  # outermost: Ray may look through the wrapper to the function, which must carry the group too
    @ray.method(concurrency_group=WATCH_GROUP)
    def watch(self, since: int, timeout_s: float, epoch: str | None = None) -> CatalogEvents:
        """Commits and deletes after event ``since``: at once if there are some, else when one happens or after
        ``timeout_s`` (at most 60 s), whichever is first. A long poll; pass the last answer's ``seq`` (and
        ``epoch``) back in.

        ``reset=True`` (with ``latest`` for every policy, to replace what the watcher knew) when ``since`` is 0
        (a watcher that knows nothing; unless it passes this epoch: it saw the catalog empty), older than the kept
        event log, newer than any event (the watcher knew a database that is gone), or the
        ``epoch`` differs from the catalog's.
        """
        if isinstance(since, bool) or not isinstance(since, int) or since < 0:
            raise InvalidWeightsError(f"watch: since must be an int >= 0, got {since!r}")
        if not isinstance(timeout_s, (int, float)) or not timeout_s >= 0:
            raise InvalidWeightsError(f"watch: timeout_s must be a number >= 0, got {timeout_s!r}")
        deadline = time.monotonic() + min(float(timeout_s), MAX_WATCH_S)
        with self._changed:
            while True:
                behind = since < self._pruned or (since == 0 and self._seq > 0 and epoch != self._epoch)
                if behind or since > self._seq or epoch not in (None, self._epoch):
                    latest = dict(self._db.execute("SELECT pid, latest FROM policies WHERE latest > 0"))
                    return CatalogEvents(seq=self._seq, reset=True, latest=latest, epoch=self._epoch)
                if since < self._seq:
                    return self._events_after(since)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return CatalogEvents(seq=self._seq, reset=False, epoch=self._epoch)
                self._changed.wait(remaining)

    def _events_after(self, since: int) -> CatalogEvents:
        rows = self._db.execute("SELECT seq, kind, pid, version FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
                                (since, MAX_EVENTS)).fetchall()
        if not rows:
            return CatalogEvents(seq=self._seq, reset=False, epoch=self._epoch)
        committed, deleted = {}, []
        for _, kind, pid, version in rows:
            sid = SnapshotId(pid, version)
            if kind == "delete":
                committed.pop(sid, None)
                deleted.append(sid)
            elif kind == "commit":
                with suppress(KeyError):  # deleted since: its delete event follows
                    committed[sid] = self._entry(sid)
        pids = sorted({pid for _, _, pid, _ in rows})
        latest = {pid: v for pid, v in self._db.execute(
            f"SELECT pid, latest FROM policies WHERE latest > 0 AND pid IN ({','.join('?' * len(pids))})", pids)}
        return CatalogEvents(seq=rows[-1][0], reset=False, committed=tuple(committed.values()),
                             deleted=tuple(deleted), latest=latest, epoch=self._epoch)

    # ---- helpers -------------------------------------------------------------------------------------------
    @contextmanager
    def _write(self, *, durable: bool) -> Iterator[Any]:
        """One transaction under the lock; afterwards wake the watchers if it logged events, and prune the log."""
        with self._lock:
            with catalogdb.transaction(self._db, durable=durable) as db:
                yield db
            seq = self._current_seq()
            if seq != self._seq:
                self._seq = seq
                self._changed.notify_all()
                self._ring()
            if self._seq - self._pruned > EVENT_LOG_KEEP + EVENT_LOG_KEEP // 10 + 10:
                self._prune(self._seq - EVENT_LOG_KEEP)

    def _prune(self, through: int) -> None:
        """Forget events up to ``through``; a failure here must not turn the change just made into an error."""
        try:
            with catalogdb.transaction(self._db, durable=False) as db:
                db.execute("DELETE FROM events WHERE seq <= ?", (through,))
                db.execute("DELETE FROM publishes WHERE rowid <= (SELECT max(rowid) FROM publishes) - ?",
                           (EVENT_LOG_KEEP,))
                db.execute("UPDATE info SET value = ? WHERE key = 'pruned_through'", (str(through),))
            self._pruned = through
        except PolicyStoreError as exc:
            log.warning("catalog: could not prune the event log (%s); will try again", exc)

    def _current_seq(self) -> int:
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
        return row[0] if row else 0

    def _block_spent(self, policy_id: str) -> bool:
        """Whether the next version of ``policy_id`` lies beyond its synced block (so this write must sync)."""
        row = self._db.execute("SELECT next, ceiling FROM policies WHERE pid = ?", (policy_id,)).fetchone()
        return row is None or row[0] > row[1]

    def _next_version(self, db: Any, policy_id: str) -> int:
        row = db.execute("SELECT next, ceiling FROM policies WHERE pid = ?", (policy_id,)).fetchone()
        version, ceiling = row or (1, 0)
        if version > MAX_REPORTED_VERSION:  # a version no store could report back after a restart
            raise InvalidPolicyIdError(f"policy {policy_id!r} has used every version up to {MAX_REPORTED_VERSION}: "
                                       "publish under a new policy id")
        if version > ceiling:
            ceiling = version + VERSION_BLOCK - 1
        db.execute("INSERT INTO policies (pid, next, ceiling, latest) VALUES (?, ?, ?, 0) ON CONFLICT (pid) "
                   "DO UPDATE SET next = excluded.next, ceiling = excluded.ceiling", (policy_id, version + 1, ceiling))
        return version

    def _record_commit(self, db: Any, sid: SnapshotId, node_id: str, summary: Summary, meta: str) -> None:
        db.execute("UPDATE snapshots SET state = ?, nbytes = ?, checksum = ?, meta = ?, created = ?, durable = ? "
                   "WHERE pid = ? AND version = ?",
                   (COMMITTED, summary.nbytes, summary.checksum, meta, float(summary.created), summary.durable, *sid))
        db.execute("UPDATE policies SET latest = max(latest, ?) WHERE pid = ?", (sid.version, sid.policy_id))
        self._add_holder(db, sid, node_id)
        self._log_event(db, "commit", sid)

    def _adopt_one(self, db: Any, sid: SnapshotId, holder: str, summary: Summary, meta: str) -> None:
        """A committed snapshot the catalog had no record of; its version counter moves past it."""
        self._raise_counter(db, sid.policy_id, sid.version)
        db.execute("INSERT INTO snapshots (pid, version, state, node) VALUES (?, ?, ?, ?)", (*sid, RESERVED, holder))
        self._record_commit(db, sid, holder, summary, meta)

    @staticmethod
    def _raise_counter(db: Any, policy_id: str, version: int) -> None:
        """Versions of ``policy_id`` continue after ``version`` (never before what they already were)."""
        db.execute("INSERT INTO policies (pid, next, ceiling, latest) VALUES (?, ?, ?, 0) ON CONFLICT (pid) DO "
                   "UPDATE SET next = max(next, excluded.next), ceiling = max(ceiling, excluded.ceiling)",
                   (policy_id, version + 1, version))

    @staticmethod
    def _add_holder(db: Any, sid: SnapshotId, node_id: str) -> None:
        db.execute("INSERT OR IGNORE INTO holders (pid, version, node) SELECT pid, version, ? FROM snapshots "
                   "WHERE pid = ? AND version = ? AND state = ?", (node_id, *sid, COMMITTED))

    def _tombstone(self, db: Any, sid: SnapshotId) -> None:
        """Delete a committed version, keeping its row so that its number is never handed out again."""
        db.execute("UPDATE snapshots SET state = ? WHERE pid = ? AND version = ?", (DELETED, *sid))
        db.execute("DELETE FROM holders WHERE pid = ? AND version = ?", sid)
        self._log_event(db, "delete", sid)

    @staticmethod
    def _log_event(db: Any, kind: str, sid: SnapshotId) -> None:
        db.execute("INSERT INTO events (kind, pid, version) VALUES (?, ?, ?)", (kind, *sid))

    @staticmethod
    def _refresh_latest(db: Any, policy_id: str) -> None:
        """A policy's "latest": its newest committed version some copy can serve (a holder: a node or the durable
        tier); only if none has one, its newest committed version (whose reads then say it is lost)."""
        db.execute("UPDATE policies SET latest = coalesce((SELECT max(s.version) FROM snapshots s WHERE s.pid = ? AND "
                   "s.state = ? AND EXISTS (SELECT 1 FROM holders h WHERE h.pid = s.pid AND h.version = s.version)), "
                   "(SELECT max(version) FROM snapshots WHERE pid = ? AND state = ?), 0) WHERE pid = ?",
                   (policy_id, COMMITTED, policy_id, COMMITTED, policy_id))

    def _holders_changed(self, db: Any, policy_ids: Iterable[str]) -> None:
        """After holders came or went: a policy whose latest version lost its last copy (a store killed before its
        spill) falls back to its newest readable one, and goes forward again when a copy comes back; watchers
        hear of it as a ``latest`` event."""
        for pid in sorted(policy_ids):
            before = db.execute("SELECT latest FROM policies WHERE pid = ?", (pid,)).fetchone()
            self._refresh_latest(db, pid)
            after = db.execute("SELECT latest FROM policies WHERE pid = ?", (pid,)).fetchone()
            if before != after and after and after[0]:
                log.warning("catalog: latest of %r is now v%d (was v%d)%s", pid, after[0], before[0] if before else 0,
                            ": no copy of the newer versions is left" if before and after[0] < before[0] else "")
                self._log_event(db, "latest", SnapshotId(pid, after[0]))

    def _entry(self, sid: SnapshotId) -> CatalogEntry:
        """The committed entry of ``sid``, or KeyError."""
        with self._lock:
            row = self._db.execute(f"{_ENTRY} WHERE pid = ? AND version = ? AND state = ?",
                                   (*sid, COMMITTED)).fetchone()
            if row is None:
                raise KeyError(sid)
            holders = [n for (n,) in self._db.execute(
                "SELECT node FROM holders WHERE pid = ? AND version = ? ORDER BY id", sid)]
        return _to_entry(row, holders)

    # ---- startup -------------------------------------------------------------------------------------------
    def _write_salvage(self, salvage: catalogdb.Salvage) -> None:
        """Rows read back from a damaged database go into the new one (one transaction)."""
        with catalogdb.transaction(self._db, durable=True) as db:
            db.executemany("INSERT OR IGNORE INTO snapshots (pid, version, state, node, nbytes, checksum, meta, "
                           "created, durable) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", salvage.snapshots)
            versions: dict[str, int] = {}
            for pid, version, *_ in salvage.snapshots:
                versions[pid] = max(versions.get(pid, 0), version)
            for pid in set(versions) | set(salvage.policies):
                nxt, ceiling = salvage.policies.get(pid, (1, 0))
                nxt = max(nxt, ceiling + 1, versions.get(pid, 0) + 1)  # the lost rows may have used the block
                db.execute("INSERT INTO policies (pid, next, ceiling, latest) VALUES (?, ?, ?, 0)",
                           (pid, nxt, nxt - 1))
                self._refresh_latest(db, pid)
            for holder in salvage.holders:
                self._add_holder(db, SnapshotId(*holder[:2]), holder[2])

    def _after_reboot(self) -> None:
        """After a machine restart, unsynced publishes may be lost: continue every policy after its synced block,
        and start a new epoch so watchers reset."""
        current = catalogdb.boot_id()
        if self._new or (current and catalogdb.info(self._db, "boot_id") == current):
            return
        with catalogdb.transaction(self._db, durable=True) as db:
            db.execute("UPDATE policies SET next = max(next, ceiling + 1)")
            db.execute("UPDATE info SET value = ? WHERE key = 'epoch'", (uuid.uuid4().hex,))
            db.execute("INSERT OR REPLACE INTO info (key, value) VALUES ('boot_id', ?)", (current,))
        log.info("catalog: the machine restarted since the database was last used; versions continue after "
                 "each policy's synced block and watchers start over (new epoch)")

    def _rebuild(self, seed: Callable[[], tuple[Sequence, Sequence[str], Sequence[SnapshotId]]] | None,
                 holdings: Callable[[], tuple[Sequence[Holdings], Sequence[str]]] | None) -> None:
        """A new database learns the league before it hands out any version: the durable tier's markers first (the
        copy that outlives any node), then every live store's holdings and the highest version each store has seen.
        Whatever fails is reported and skipped: the catalog always starts."""
        before = self.health().snapshots
        if seed is not None:
            try:
                entries, skipped, deleted = seed()
                self._report_skipped(f"durable tier: {line}" for line in skipped)
                with self._write(durable=True) as db:  # deleted versions' numbers stay used
                    for sid in deleted:
                        self._raise_counter(db, *sid)
                answer = self.adopt(entries)
                self._report_skipped(f"not adopted from the durable tier: {line}" for line in answer.skipped)
            except Exception as exc:  # the durable tier unreachable: start, say so; the stores still report
                self._problems.append(f"could not rebuild the catalog from the durable tier: {type(exc).__name__}: "
                                      f"{exc}")
        if holdings is not None:
            try:
                reports, unheard = holdings()
            except Exception as exc:
                reports, unheard = [], [f"could not ask the stores what they hold: {type(exc).__name__}: {exc}"]
            self._problems.extend(unheard)
            for report in reports:
                self._take_holdings(report)
        self._adopted = self.health().snapshots - before
        log.log(logging.WARNING if self._adopted or self._skipped else logging.INFO,
                "catalog: new database, rebuilt %d snapshots from the durable tier and %d stores (%d skipped)",
                self._adopted, len(reports) if holdings is not None else 0, self._skipped)

    def _take_holdings(self, report: Holdings) -> None:
        """One live store's copies (adopted, or a conflict reported) and its high-water marks (counters move past)."""
        try:
            answer = self.reconcile(report.node_id, report.snapshots, restarted=False)
            high = []
            for policy_id, version in dict(report.high_water).items():
                try:
                    high.append(_check_id((policy_id, version)))
                except (PolicyStoreError, TypeError, ValueError) as exc:
                    self._report_skipped([f"node {report.node_id}: high-water mark not taken: {exc}"])
            with self._write(durable=True) as db:
                for sid in high:
                    self._raise_counter(db, *sid)
        except Exception as exc:  # a malformed report: the store re-registers when it sees the new epoch
            self._report_skipped([f"node {report.node_id}: report not taken: {type(exc).__name__}: {exc}"])
            return
        self._report_skipped(f"node {report.node_id}: {sid} not taken: {why}" for sid, why in answer.quarantine)

    def _report_skipped(self, lines: Iterable[str]) -> None:
        for line in lines:
            self._problems.append(line)
            self._skipped += 1

def _to_entry(row: tuple, holders: Sequence[str]) -> CatalogEntry:
    pid, version, nbytes, checksum, meta, created, durable = row
    return CatalogEntry(SnapshotId(pid, version), Summary(nbytes, checksum, json.loads(meta), created, bool(durable)),
                        tuple(holders))


def ask_stores(league: str, timeout_s: float = REBUILD_WAIT_S) -> tuple[list[Holdings], list[str]]:
    """Every live store's holdings in ``league`` (``StoreServer.holdings``), for a catalog rebuilding a new
    database, and one line per store that did not answer within ``timeout_s`` (it re-registers when it sees the new
    catalog)."""
    calls: dict[ray.ObjectRef, str] = {}
    for node in ray.nodes():
        store = remote.running(store_name(node["NodeID"], league)) if node.get("Alive") else None
        if store is not None:  # else no store on that node
            calls[remote.send(store, "holdings")] = node["NodeID"]
    ready, late = ray.wait(list(calls), num_returns=len(calls), timeout=timeout_s) if calls else ([], [])
    reports, problems = [], [f"the store on node {calls[ref]} did not report within {timeout_s:.0f} s" for ref in late]
    for ref in ready:
        try:
            reports.append(remote.get(ref, 0, f"the store on node {calls[ref]}", "holdings"))
        except Exception as exc:
            problems.append(f"the store on node {calls[ref]} could not report: {type(exc).__name__}: "
                            f"{brief(exc)}")
    return reports, problems
