"""The per-node store actor: the node's copies (hot tier in the object store, disk tier behind it).

It owns every snapshot object it serves (it ``ray.put``s its own copy: objects die with their owner, and a
learner that published may go away). Names and versions come from the cluster catalog (``catalog.py``); bytes
never pass through the catalog: a store that lacks a snapshot fetches it once from a store that has it (or from
the durable tier) and from then on serves its node from its own copy.

It is a threaded actor: local bookkeeping happens under one short lock, and all heavy work (copies, checksums,
disk I/O, fetches) happens outside it, so reads never wait behind a large publish or a slow restore. Concurrent
gets of one missing snapshot share a single restore or fetch.

It pushes rather than being polled (``watch.py``): a thread follows the catalog (latest versions, deletes),
waiting for news on the catalog's doorbell, and ``watch`` hands the node's readers those changes plus the
snapshots that become hot here, with their refs, for the policies each reader follows. Readers wait for news on
this store's doorbell (a small async actor it starts and rings), so none of them holds a thread here. A publish
arrives as a staging file in /dev/shm that the publisher packed straight into; the store maps it, copies it
once into the object store and removes it.

The store holds bytes and names only: it never imports torch.
"""

from __future__ import annotations

import errno
import logging
import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import ray

from . import leftovers, memory, remote
from .config import DEFAULT_LEAGUE, StoreConfig, check_durable
from .errors import (
    CorruptSnapshotError,
    DiskFullError,
    DurableTierError,
    InvalidWeightsError,
    PolicyStoreError,
    SnapshotLostError,
    SpillFailedError,
    UnknownPolicyError,
    UnknownVersionError,
    brief,
)
from .format import (
    META_POLICY,
    Background,
    Expected,
    Header,
    head_bytes,
    parse_header,
    verify_buffer,
)
from .holders import HolderBatch
from .hot import HotTier, check_fits
from .ids import SnapshotId, check_policy_id, check_version
from .metrics import COUNTERS, StoreMetrics
from .protect import open_shared, shareable, unwrap
from .remote import WATCH_GROUP, catalog_name, store_name
from .snapfile import SpillFile
from .spill import TOMBSTONES, DiskTier
from .staging import StagingMaps
from .transfer import Relay, Route
from .watch import Bell, Feed, node_doorbell
from .wire import (
    DURABLE,
    CatalogEntry,
    CatalogEvents,
    Holdings,
    HotSnapshot,
    Reconciled,
    Ring,
    SnapshotInfo,
    StoreEvents,
    StoreStats,
    Summary,
    VerifyReport,
)

if TYPE_CHECKING:
    from .durable import DurableTier
    from .durable_queue import DurableQueue

log = logging.getLogger(__name__)

_FETCH_TIMEOUT_S = 120.0
# How long a publish waits for a restarting catalog to answer a call that is safe to repeat, so that a catalog
# killed between its commit and its reply never leaves a version listed whose publish gave up on it.
_CATALOG_RETRY_S = 60.0
_GAUGE_INTERVAL_S = 2.0
HOLD_INTERVAL_S = 0.5  # the holder changes of one interval go to the catalog in one call
# How long a fetch of a version this store has not heard committed waits for its catalog follower (whose answer
# carries the entry) before it asks the catalog instead.
_HINT_WAIT_S = 0.25


@dataclass
class _Entry:
    header: Header
    durable: bool = False  # published durably (a copy found on disk at startup: not known, False)
    file: SpillFile | None = None  # committed local spill file
    pending: Future | None = None  # background spill in flight
    spill_error: str | None = None  # the background spill failed (disk full): the snapshot can only stay hot
    corrupt: str | None = None  # the hot copy failed its checksum and no good disk copy exists
    fetched: bool = False  # a copy of another node's or of the durable tier's (safe elsewhere if its spill fails)


def _open_durable(uri: str | None) -> DurableTier | None:
    """The durable tier, imported only when configured (pyarrow is heavy for an actor that may not need it)."""
    if uri is None:
        return None
    from .durable import DurableTier

    return DurableTier.open(uri)


def _open_queue(server: StoreServer) -> DurableQueue | None:
    """The durable tier's work queue, which owns every call into the tier (None without a durable tier)."""
    if server.durable is None:
        return None
    from .durable_queue import DurableQueue

    return DurableQueue(server.durable, server.config.durable_timeout_s, server.disk.root / TOMBSTONES,
                        source=server._upload_source, uploaded=server._uploaded, local=server._local_ids)


def _node_object_store_bytes(node_id: str) -> int:
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return int(node["Resources"].get("object_store_memory", 0))
    raise RuntimeError(f"node {node_id} is not part of this Ray cluster")


class StoreServer:
    """Run as a Ray actor (see ``client.connect``); every public method is a remote call."""

    def __init__(self, config: StoreConfig, node_id: str):
        memory.return_big_frees_to_the_os()  # a store lives long and copies big buffers on many threads
        self.config = config
        self.node_id = node_id
        session = ray.get_runtime_context().get_session_name()
        # ended sessions' default spill folders on this node go (leftovers.py), off the start's path
        threading.Thread(target=leftovers.sweep, args=(session,), name="policystore-sweep", daemon=True).start()
        spill_dir = config.resolved_spill_dir(session, node_id)
        self.disk = DiskTier(spill_dir, compress=config.compress, capacity_bytes=config.disk_capacity_bytes)
        self.durable = _open_durable(config.durable_uri)
        self.metrics = StoreMetrics(node_id)
        capacity = config.hot_capacity_bytes or _node_object_store_bytes(node_id) // 2
        self.feed = Feed()
        self.hot = HotTier(capacity, self.feed)
        self.league = config.league or DEFAULT_LEAGUE
        self.catalog = remote.find(catalog_name(self.league))
        self._staging = StagingMaps()
        self._lock = threading.Lock()
        # Publishes in flight per policy: the catalog may announce a version before this store has recorded its own
        # copy of it; a get of that version waits for the publish instead of looking elsewhere.
        self._publishing: Counter[str] = Counter()
        self._landed = threading.Condition(self._lock)
        self._policies: dict[str, dict[int, _Entry]] = {}  # this node's copies, versions in increasing order
        self._inflight: dict[SnapshotId, Future] = {}  # restores and fetches, one per snapshot
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="policystore-spill")
        self._counters: Counter[str] = Counter()
        # other nodes fetch from here
        self.relay = Relay(ray.util.get_node_ip_address(), self._whole_copy, on_served=lambda: self._count("served"))
        self.holders = HolderBatch(self._send_holders, HOLD_INTERVAL_S)
        self.uploads = _open_queue(self)
        self._high: dict[str, int] = {}  # per policy, the highest version seen handed out (see ``holdings``)
        # per policy, its newest commit as the catalog's watch answer carried it: fetching that version needs no
        # lookup (one catalog call per node per snapshot less); a hint only, see ``_fetch_new``
        self._committed: dict[str, CatalogEntry] = {}
        self._heard = threading.Condition(self._lock)  # notified when a catalog answer has been applied
        for found in self.disk.scan().entries:
            self._policies.setdefault(found.id.policy_id, {})[found.id.version] = _Entry(found.header, file=found.file)
        # Tell the catalog what survived on disk, without blocking startup on another actor; again whenever the
        # catalog's database is new (``_follow_catalog``).
        self._registrar = ThreadPoolExecutor(1, thread_name_prefix="policystore-register")
        self._started = self._reconciled = self._registrar.submit(self._reconcile, True)
        # the node's readers wait on its doorbell, not on threads of this actor
        self._bell = node_doorbell(node_id, store_name(node_id, self.league))
        threading.Thread(target=self._ring_doorbell, name="policystore-doorbell", daemon=True).start()
        threading.Thread(target=self._follow_catalog, name="policystore-catalog-follower", daemon=True).start()
        threading.Thread(target=self._every_few_seconds, name="policystore-periodic", daemon=True).start()
        log.info("policystore on node %s: %d snapshots on %s, hot capacity %d bytes",
                 node_id, sum(map(len, self._policies.values())), spill_dir, capacity)

    def _reconcile(self, restarted: bool) -> None:
        """Report this node's copies to the catalog (``restarted``: at startup, before any reservation) and act on
        its answer: discard what was never committed, aborted or deleted (here and in the durable tier),
        quarantine what conflicts."""
        with self._lock:
            held = self._held_locked()
        reconciled: Reconciled = self._on_catalog("reconcile", self.node_id, held, restarted=restarted)
        for sid in reconciled.discard:
            log.warning("discarding %s: never committed, aborted or deleted", sid)
            self.forget(*sid)
            self._remove_durable(sid)
        for sid, reason in reconciled.quarantine:  # never served, never deleted: moved aside with the reason
            log.error("not serving %s: %s", sid, reason)
            with self._lock:
                entry = self._policies.get(sid.policy_id, {}).pop(sid.version, None)
                self.hot.remove(sid)
            if entry is not None and entry.file is not None:
                self.disk.quarantine(entry.file, reason)
        if self.uploads is not None:  # what survived here and never reached the durable tier goes there now
            self.uploads.resume()

    @ray.method(concurrency_group=WATCH_GROUP)
    def holdings(self) -> Holdings:
        """What this node holds, and the highest version of each policy it has seen handed out, for a catalog that
        starts with a new database: it asks every live store before it hands out a version. Served beside the
        readers' long polls, so it never waits behind calls queued on the rebuilding catalog."""
        with self._lock:
            snapshots = tuple(self._held_locked())
            high = dict(self._high)
        for sid, _ in snapshots:
            high[sid.policy_id] = max(high.get(sid.policy_id, 0), sid.version)
        return Holdings(self.node_id, snapshots, high)

    def _saw(self, policy_id: str, version: int | None) -> None:
        """Remember that ``version`` of ``policy_id`` was handed out (a new catalog database must skip past it)."""
        if version:
            with self._lock:
                self._high[policy_id] = max(self._high.get(policy_id, 0), version)

    # ---- push ----------------------------------------------------------------------------------------------
    def _follow_catalog(self) -> None:
        """Keep the feed's latest versions and deletes in step with the catalog (daemon thread): wait on the
        catalog's doorbell for news or the catalog's next beat, and ask the catalog only for news (or when no beat
        came within four polls). Only the catalog's own word moves ``as_of``: its answer, or a beat it sent after
        the wait began (``Doorbell.after_beats``); a doorbell that answers while the catalog is stuck proves
        nothing."""
        since, epoch, failures = 0, None, 0
        heard = None  # the last catalog epoch applied: a different one is a new database, re-register with it
        bell = None
        limit = self.config.poll_s * 2 + 10
        while True:
            try:
                if bell is None:
                    bell = remote.call(self.catalog, "doorbell", timeout_s=limit)
                if epoch is not None:
                    asked = time.monotonic()
                    ring, proven = remote.get(bell.after_beats(since, epoch, self.config.poll_s * 4), limit,
                                               "the catalog's doorbell", "after_beats")
                    if proven and ring.seq == since and ring.epoch == epoch:  # idle: the catalog's beat says so
                        failures = 0
                        self.feed.heard_until(asked)
                        continue
                sent = time.monotonic()
                events: CatalogEvents = remote.call(self.catalog, "watch", since if epoch else 0, 0, timeout_s=limit)
            except Exception as exc:  # catalog restarting: readers see the feed go stale and ask directly
                bell = None  # a restarted catalog may stand on another node
                failures += 1
                if failures == 1 or failures % 100 == 0:
                    log.warning("following the catalog failed (%s: %s)", type(exc).__name__, brief(exc))
                time.sleep(min(0.05 * failures, 1.0))
                continue
            failures = 0
            if not events.reset and events.epoch != epoch and (epoch is not None or events.seq > 0):
                epoch = None  # a new catalog: start over from its whole state
                continue
            # (a catalog with no event yet answers without a reset: nothing to apply, and from here this follower
            # waits on its doorbell instead of asking again at once)
            try:
                self._apply_catalog(events)
            except Exception:  # never let one bad answer stop the follower
                log.exception("applying catalog events failed")
                epoch = None
                continue
            if heard is not None and events.epoch != heard:
                log.warning("the catalog's database is new (epoch %s): reporting this node's copies", events.epoch)
                self._reconciled = self._registrar.submit(self._reconcile, False)
            heard = events.epoch
            since, epoch = events.seq, events.epoch
            self.feed.catalog_epoch(epoch)
            self.feed.heard_until(sent)

    def _ring_doorbell(self) -> None:
        """Tell the doorbell every change of the feed (news, a newer ``as_of``), in order, from this one thread."""
        last: Ring | None = None
        while True:
            ring = self.feed.next_ring(last, self.config.poll_s)
            try:
                self._bell.ring(ring)
            except Exception as exc:  # Ray restarts it; the next ring tells it again
                log.warning("ringing the doorbell failed (%s)", type(exc).__name__)
            last = ring

    def _apply_catalog(self, events: CatalogEvents) -> None:
        for pid, version in (*events.latest.items(), *(e.id for e in events.committed), *events.deleted):
            self._saw(pid, version)  # every version the catalog names was handed out
        with self._lock:
            if events.reset:  # (a new database numbers versions anew) its entries come by lookup until a commit
                self._committed.clear()
            for entry in events.committed:
                if entry.version > getattr(self._committed.get(entry.id.policy_id), "version", 0):
                    self._committed[entry.id.policy_id] = entry
            for sid in events.deleted:
                if getattr(self._committed.get(sid.policy_id), "id", None) == sid:
                    del self._committed[sid.policy_id]
            self._heard.notify_all()
        if events.reset:
            self.feed.replace_latest(events.latest)
            return
        for entry in events.committed:
            self.feed.raise_latest(*entry.id)
        for sid in events.deleted:
            self.forget(*sid)
            self.feed.deleted(sid)
            if sid.policy_id not in events.latest and self.feed.latest(sid.policy_id, float("inf")) == sid.version:
                self.feed.set_latest(sid.policy_id, self._catalog_latest(sid.policy_id))
        for pid, version in events.latest.items():
            self.feed.set_latest(pid, version)

    def _catalog_latest(self, policy_id: str) -> int:
        try:
            return self._ask("lookup", policy_id).version
        except UnknownPolicyError:
            return 0

    @ray.method(concurrency_group=WATCH_GROUP)
    def doorbell(self) -> Bell:
        """Where readers wait for news of this store's feed: its channel on the node's ``watch.Doorbell``."""
        return self._bell

    @ray.method(concurrency_group=WATCH_GROUP, enable_task_events=False)  # called by every follower: see watch.py
    def watch(self, since: int, timeout_s: float, used: Sequence[SnapshotId] = (), follows: Sequence[str] = (),
              adopt: Sequence[str] = ()) -> StoreEvents:
        """The node's league changes after event ``since`` (waiting at most ``timeout_s`` for one; followers pass
        0 and wait on the doorbell instead), for readers.

        ``used``: the pushed snapshots the reader opened since its last call, marked recently used here (a read of
        a pushed ref never calls the store, so this is how its reads keep the LRU order honest). ``follows``: the
        policies whose new hot snapshots the reader gets with their refs; ``adopt``: those followed since its
        last call (their newest hot snapshot comes now)."""
        self._used(used)
        return self.feed.watch(since, min(float(timeout_s), 60.0), follows, adopt)

    def _used(self, used: Sequence[SnapshotId]) -> None:
        with self._lock:
            for sid in used:
                self.hot.get(SnapshotId(*sid))

    # ---- publish -------------------------------------------------------------------------------------------
    def publish(self, policy_id: str, buf: np.ndarray, durable: bool = False) -> SnapshotId:
        """Publish a packed snapshot passed by value (a publisher on another node, or without /dev/shm)."""
        if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1:
            raise InvalidWeightsError("publish takes a packed snapshot (1-D uint8 buffer from policystore.format.pack)")
        return self._publish(policy_id, buf, durable)

    def publish_staged(self, policy_id: str, path: str, nbytes: int, durable: bool = False, hand_back: bool = False
                       ) -> SnapshotId | HotSnapshot:
        """Publish the snapshot a publisher on this node packed into the first ``nbytes`` of its staging file (the
        file stays: the publisher packs its next snapshot into the same pages). Returns its id, or, ``hand_back``,
        the new snapshot with its ref (if it is still hot), so that a publisher that reads the policy reads its
        own write with no further call (one that only publishes does not borrow it)."""
        sid = self._publish(policy_id, self._staging.view(path, nbytes), durable)
        if not hand_back:
            return sid
        with self._lock:
            return self.hot.get(sid) or sid

    def _publish(self, policy_id: str, buf: np.ndarray, durable: bool) -> SnapshotId:
        """Copy ``buf`` into the object store and commit it; durable publishes write their files first.

        Non-durable: one catalog call (``publish``) after the copy. Durable: ``reserve``, fsync'd files, the copy,
        then ``commit``. Killed anywhere before the commit, the version is never visible: complete or absent.
        """
        with self._timed("publish_latency"):
            return self._publish_timed(policy_id, buf, durable)

    @contextmanager
    def _landing(self, policy_id: str) -> Iterator[None]:
        """A publish of ``policy_id`` between its catalog commit and recording its copy here: gets of a version
        this store does not know wait for it (and only for that: never while a durable upload is under way)."""
        with self._lock:
            self._publishing[policy_id] += 1
        try:
            yield
        finally:
            with self._lock:
                self._publishing[policy_id] -= 1
                if not self._publishing[policy_id]:
                    del self._publishing[policy_id]
                self._landed.notify_all()

    def _publish_timed(self, policy_id: str, buf: np.ndarray, durable: bool) -> SnapshotId:
        started = time.monotonic()
        check_policy_id(policy_id)
        check_durable(durable)
        what = f"new snapshot of {policy_id!r}"
        header = parse_header(buf, name=what)
        if header.metadata.get(META_POLICY) != policy_id:
            raise InvalidWeightsError(f"{what}: buffer was packed for {header.metadata.get(META_POLICY)!r}")
        check_fits(header.nbytes, self.hot.capacity_bytes, what)
        with self._lock:
            pending = sum(e.header.nbytes for _, e in self._items_locked() if e.pending is not None)
            committed = self._disk_bytes_locked()
        self.disk.check_room(header.nbytes, committed, pending, what)
        self._make_room(header.nbytes, what)
        entry = _Entry(header, durable=durable)
        with ExitStack() as landing:
            if durable:
                wait_all([self._started])  # its reconcile aborts this node's reservations left by a killed store
                sid = SnapshotId(policy_id, self._on_catalog("reserve", policy_id, self.node_id))
                self._saw(*sid)
                try:
                    entry.file = self.disk.commit(self.disk.write_temp(sid, buf, header), sid)
                    ref = ray.put(shareable(buf))  # the store's own copy: it must outlive the publisher

                    def commit() -> None:
                        """The commit point. Gets of this version wait from here until it is recorded below (never
                        while the data object uploads)."""
                        landing.enter_context(self._landing(policy_id))
                        self._on_catalog("commit", policy_id, sid.version, self.node_id, Summary.of(header, True))

                    if self.uploads is not None:  # the marker after the catalog's commit: it never names an
                        # uncommitted version; the upload runs within the tier's deadline
                        self.uploads.call(lambda: self.durable.write(sid, buf, header, before_marker=commit),
                                          f"commit {sid}", self._durable_deadline(started, header.nbytes))
                    else:
                        commit()
                except BaseException:
                    self._withdraw(sid, entry)
                    raise
                if self.durable is not None:
                    self.holders.gained(sid, DURABLE)
            else:
                ref = ray.put(shareable(buf))
                landing.enter_context(self._landing(policy_id))
                token = uuid.uuid4().hex  # the catalog answers a repeated call with the version this one was given
                sid = self._on_catalog("publish", policy_id, self.node_id, Summary.of(header, False), token).id
                self._saw(*sid)
            with self._lock:
                self._policies.setdefault(policy_id, {})[sid.version] = entry
                self._landed.notify_all()
                self.hot.add(sid, ref, header.nbytes, head_bytes(buf))
                self.feed.raise_latest(*sid)
                self._count("publishes")
                if not durable:
                    entry.pending = self._writer.submit(self._spill, sid, entry, ref)
        self._evict(protect=sid)
        return sid

    def _spill(self, sid: SnapshotId, entry: _Entry, ref: ray.ObjectRef) -> None:
        """Background write of a non-durable publish or a fetched copy to this node's disk; eviction waits for it.
        It never waits for the durable tier: once the file is committed, its upload is queued."""
        with self._lock:
            if self._policies.get(sid.policy_id, {}).get(sid.version) is not entry:  # deleted before its turn
                entry.pending = None
                return
        buf = open_shared(remote.get(ref, self.config.call_timeout_s, f"this store's copy of {sid}"), strict=False)
        try:
            temp = self.disk.write_temp(sid, buf, entry.header)
        except CorruptSnapshotError as exc:
            log.error("%s", exc)
            with self._lock:
                entry.corrupt, entry.pending = str(exc), None
                self.hot.remove(sid)
            return
        except Exception as exc:  # disk full, I/O error: keep serving from memory, retry (``_retry_spills``)
            with self._lock:
                first = entry.spill_error is None
                entry.spill_error, entry.pending = str(exc), None
                self._count("spill_errors")
            if first:
                log.error("could not spill %s (retrying until it lands): %s", sid, exc)
            return
        finally:
            del buf
        with self._lock:
            current = self._policies.get(sid.policy_id, {}).get(sid.version) is entry
            if not current:  # deleted meanwhile
                self.disk.discard(temp)
            else:
                entry.file, entry.spill_error = self.disk.commit(temp, sid), None
            entry.pending = None
        if current and self.uploads is not None:
            self.uploads.upload(sid)

    # ---- spills that failed (a full disk) -------------------------------------------------------------------
    def _unspilled_locked(self) -> list[tuple[SnapshotId, _Entry]]:
        """Acknowledged snapshots a store restart would lose: no file, no durable copy, not a copy of another's."""
        return [(sid, e) for sid, e in self._items_locked()
                if e.file is None and e.spill_error and not e.durable and not e.fetched]  # a retry may be running

    def _retry_spills(self) -> list[Future]:
        """Queue the spill again of every snapshot whose spill failed and that is still hot (periodically, and at
        ``flush``): a disk that fills up delays spills, it never drops them. Returns the spills queued."""
        queued = []
        with self._lock:
            for sid, entry in self._items_locked():
                hot = self.hot.peek(sid)
                if entry.file is None and entry.pending is None and entry.spill_error and hot is not None:
                    entry.pending = self._writer.submit(self._spill, sid, entry, hot.refs[0])
                    queued.append(entry.pending)
        return queued

    def _check_spilled(self) -> None:
        """SpillFailedError naming every acknowledged snapshot that is only in memory (see ``_unspilled_locked``)."""
        with self._lock:
            at_risk = self._unspilled_locked()
        if at_risk:
            names = ", ".join(str(sid) for sid, _ in at_risk[:20]) + (" ..." if len(at_risk) > 20 else "")
            raise SpillFailedError(
                f"{len(at_risk)} acknowledged snapshots are on no disk and not in the durable tier, a store restart "
                f"would lose them: {names} "
                f"(their spill to {self.disk.root} failed: {at_risk[-1][1].spill_error}); retrying every "
                f"{_GAUGE_INTERVAL_S:g} s until they land or are deleted")

    def _make_room(self, nbytes: int, what: str) -> None:
        """Refuse a publish with DiskFullError when the hot tier could not take it without growing past its
        capacity because snapshots it holds cannot be spilled (and so cannot be evicted); waits for spills in
        flight first, as eviction does."""
        while True:
            with self._lock:
                stuck = [(sid, e) for sid, e in self._items_locked() if e.file is None and sid in self.hot]
                if sum(e.header.nbytes for _, e in stuck) + nbytes <= self.hot.capacity_bytes:
                    return
                wait_for = next((e.pending for _, e in stuck if e.pending is not None), None)
                failed = [(sid, e) for sid, e in stuck if e.spill_error]
            if wait_for is None:
                names = ", ".join(str(sid) for sid, _ in failed[:10]) + (" ..." if len(failed) > 10 else "")
                raise DiskFullError(
                    errno.ENOSPC, f"{what}: refused, the hot tier (hot_capacity_bytes={self.hot.capacity_bytes}) is "
                    f"full of snapshots that could not be spilled to {self.disk.root} ({names}: "
                    f"{failed[-1][1].spill_error if failed else 'no spill file'}); they are retried until they land")
            wait_for.result()

    def _upload_source(self, sid: SnapshotId) -> tuple[np.ndarray, Header] | None:
        """This node's verified bytes of ``sid`` for its durable upload (from its spill file), None if gone."""
        with self._lock:
            entry = self._policies.get(sid.policy_id, {}).get(sid.version)
            file = entry.file if entry is not None else None
        if file is None:
            return None
        try:
            buf = self.disk.read(file, f"{sid} (for its durable upload)", expect=Expected(*sid, entry.header.checksum))
        except CorruptSnapshotError as exc:  # damaged (now quarantined) or gone: the next get heals it
            self._lost_file(entry, file, exc)
            raise
        return buf, parse_header(buf, name=str(sid))

    def _uploaded(self, sid: SnapshotId) -> None:
        self.holders.gained(sid, DURABLE)

    def _send_holders(self, gained: Sequence[tuple[SnapshotId, str]], dropped: Sequence[tuple[SnapshotId, str]]
                      ) -> None:
        remote.call(self.catalog, "update_holders", gained, dropped, timeout_s=self.config.call_timeout_s)

    def _local_ids(self) -> list[SnapshotId]:
        with self._lock:
            return [sid for sid, e in self._items_locked() if e.file is not None]

    def _evict(self, protect: SnapshotId) -> None:
        """Drop least-recently-used hot copies (already on disk) until the hot tier fits its capacity."""
        while True:
            wait_for = None
            with self._lock:
                if not self.hot.over_capacity():
                    return
                for sid in self.hot.lru_order():
                    entry = self._policies[sid.policy_id][sid.version]
                    if sid == protect:
                        continue
                    if entry.file is not None:
                        self.hot.remove(sid)
                        self._count("evictions")
                        break
                    if entry.pending is not None and wait_for is None:
                        wait_for = entry.pending
                else:
                    if wait_for is None:
                        log.warning("hot tier over capacity (%d > %d bytes), nothing evictable: spills failed",
                                    self.hot.bytes, self.hot.capacity_bytes)
                        return
            if wait_for is not None:
                wait_for.result()

    # ---- read ----------------------------------------------------------------------------------------------
    def resolve(self, policy_id: str, version: int | None = None) -> HotSnapshot:
        """This node's copy (latest version by default): restored from disk or fetched from another node first if
        needed. The ref travels inside a list so Ray hands it over instead of fetching the bytes into this reply.
        """
        with self._timed("get_latency"):
            return self._resolve(policy_id, version)

    def _resolve(self, policy_id: str, version: int | None) -> HotSnapshot:
        check_policy_id(policy_id)
        if version is not None:
            return self._copy_of(SnapshotId(policy_id, check_version(version)))
        heard = self.feed.latest(policy_id, self.config.max_staleness_s)
        if heard is not None:
            try:
                return self._copy_of(SnapshotId(policy_id, heard))
            except UnknownVersionError:  # deleted since the feed heard of it: "latest" is the catalog's to say
                log.info("%s@v%d was deleted since this store heard of it; asking the catalog", policy_id, heard)
            except SnapshotLostError:  # its last copy died: the catalog's latest falls back to a readable one
                log.info("%s@v%d has no copy left; asking the catalog for the newest readable", policy_id, heard)
        info = self._ask("lookup", policy_id)
        return self._copy_of(info.id, info)

    def _copy_of(self, sid: SnapshotId, info: CatalogEntry | None = None) -> HotSnapshot:
        """This node's hot copy of ``sid``: restored from its spill file, or fetched from another node (``info``:
        the catalog's entry, when the caller just looked it up) if this node has none."""
        with self._lock:
            entry = self._own_copy_locked(sid)
            if entry is not None and entry.corrupt:
                raise CorruptSnapshotError(entry.corrupt)
            hot = self.hot.get(sid) if entry is not None else None
            if hot is not None:
                self._count("hits")
                return hot
            self._count("misses")
            future = self._inflight.get(sid)
            leader = future is None
            if leader:
                future = self._inflight[sid] = Future()
        if not leader:
            return future.result()
        try:
            if entry is not None:
                hot = self._restore(sid, entry)
            else:
                hot = self._fetch(sid, info) if info is not None else self._fetch_new(sid)
            future.set_result(hot)
        except BaseException as exc:
            future.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._inflight.pop(sid, None)
        self._evict(protect=sid)
        return hot

    def _own_copy_locked(self, sid: SnapshotId) -> _Entry | None:
        """This node's entry for ``sid``; if a publish of that policy is in flight here, the copy it is recording
        (its commit reaches readers through the catalog, possibly before the publish has recorded it here)."""
        def found() -> _Entry | None:
            return self._policies.get(sid.policy_id, {}).get(sid.version)

        self._landed.wait_for(lambda: found() is not None or not self._publishing[sid.policy_id],
                              timeout=_FETCH_TIMEOUT_S)
        return found()

    def _restore(self, sid: SnapshotId, entry: _Entry) -> HotSnapshot:
        """This node's copy back into shared memory from its spill file; if the file is damaged or gone, healed
        from another good copy (another node, the durable tier), which becomes this node's copy."""
        file = entry.file
        damaged: CorruptSnapshotError | None = None
        if file is not None:
            try:
                return self._restore_file(sid, entry, file)
            except CorruptSnapshotError as exc:  # quarantined (damaged) or unreadable: never served from here
                damaged = exc
                self._lost_file(entry, file, exc)
        try:
            hot = self._fetch(sid, self._ask("lookup", *sid))
        except PolicyStoreError as exc:
            if damaged is not None:
                raise CorruptSnapshotError(f"{damaged}; no other good copy: {exc}") from None
            raise SnapshotLostError(f"{sid} is neither in memory nor on this node's disk "
                                    f"({entry.spill_error or 'its file is gone'}); {exc}") from None
        if damaged is not None:
            log.warning("healed %s from another copy after its spill file failed: %s", sid, damaged)
        return hot

    def _restore_file(self, sid: SnapshotId, entry: _Entry, file: SpillFile) -> HotSnapshot:
        expect = Expected(*sid, entry.header.checksum)  # checked against the catalog's at startup (reconcile)
        try:  # the checksum runs while the copy into the object store does
            with self._timed("restore_latency"):
                hot = self.disk.restore(file, str(sid), expect=expect,
                                        put=lambda buf: HotSnapshot(sid, head_bytes(buf), [ray.put(shareable(buf))]))
        except CorruptSnapshotError:
            with self._lock:
                self._count("corrupt_reads")
            raise
        with self._lock:
            if self._policies.get(sid.policy_id, {}).get(sid.version) is entry:
                self.hot.add(sid, hot.refs[0], entry.header.nbytes, hot.header)
            self._count("restores")
        return hot

    def _lost_file(self, entry: _Entry, file: SpillFile, exc: CorruptSnapshotError) -> None:
        """``file`` failed a read (and was quarantined if damaged): this node no longer counts it as a copy."""
        with self._lock:
            if entry.file == file:
                entry.file = None
                entry.spill_error = str(exc)

    def route(self, policy_id: str, version: int, requester: str, force: bool = False) -> Route:
        """Where another node's store (``requester``) gets its copy of a snapshot: from this node, or from the node
        named instead (``transfer.Relay.route``)."""
        return self.relay.route(SnapshotId(check_policy_id(policy_id), check_version(version)), requester, force)

    def _whole_copy(self, sid: SnapshotId) -> np.ndarray | None:
        """This node's whole copy of ``sid`` (restored into memory if only on disk) for a peer, or None. A copy
        whose bytes have all landed but that is not recorded yet (its checksum and own copy under way) is waited
        for: the relay no longer serves it as landing, and the peer must not leave for another source."""
        with self._lock:
            entry = self._policies.get(sid.policy_id, {}).get(sid.version)
            landing = self._inflight.get(sid) if entry is None else None
        if (entry is None and landing is None) or (entry is not None and entry.corrupt):
            return None
        hot = landing.result(_FETCH_TIMEOUT_S) if entry is None else self._copy_of(sid)
        return unwrap(remote.get(hot.refs[0], _FETCH_TIMEOUT_S, f"this store's copy of {sid}"))

    def _fetch(self, sid: SnapshotId, info: CatalogEntry) -> HotSnapshot:
        """Copy a snapshot this node lacks from a node that holds it (or the durable tier): once per node."""
        problems: list[str] = []
        started = time.monotonic()
        copy = self._from_peers(sid, info, problems)
        if copy is None and self.uploads is not None:
            expect = Expected(*sid, info.summary.checksum)
            try:
                buf = self.uploads.call(lambda: self.durable.read(sid, expect), f"read {sid}",
                                        self._durable_deadline(started, self.hot.capacity_bytes))
                copy = self._own_copy(sid, buf, info.summary.checksum, "the durable tier", verified=True)
                del buf
            except (SnapshotLostError, DurableTierError, CorruptSnapshotError) as exc:
                problems.append(f"durable tier: {brief(exc)}")
        if copy is None:
            raise SnapshotLostError(
                f"{sid} is in the catalog but no live copy could be fetched "
                f"(holders {list(info.holders) or 'none'}; {'; '.join(problems) or 'no durable tier'})"
            )
        hot, header = copy
        entry = _Entry(header, fetched=True)
        with self._lock:
            self._policies.setdefault(sid.policy_id, {})[sid.version] = entry
            self.hot.add(sid, hot.refs[0], header.nbytes, hot.header)
            self._count("fetches")
            entry.pending = self._writer.submit(self._spill, sid, entry, hot.refs[0])
        self.holders.gained(sid, self.node_id)
        return hot

    def _fetch_new(self, sid: SnapshotId) -> HotSnapshot:
        """``_fetch`` with the entry the catalog's watch answer carried, when it was for this version: no lookup
        (a version this store has not heard committed yet waits up to ``_HINT_WAIT_S`` for that answer). Only if
        no copy matches the hint (its holders gone since, the snapshot deleted) does the catalog's current entry
        decide, as it would without the hint."""
        def heard() -> bool:  # the commit reached this store, or is not news (the store knew a later version)
            seeded = self._committed.get(sid.policy_id)
            return (seeded is not None and seeded.version >= sid.version) or (
                self.feed.latest(sid.policy_id, math.inf) or 0) >= sid.version

        with self._lock:  # a reader told of a commit by another route may ask before this store's follower heard it
            self._heard.wait_for(heard, timeout=_HINT_WAIT_S)
            seeded = self._committed.get(sid.policy_id)
        if seeded is not None and seeded.id == sid:
            try:
                return self._fetch(sid, seeded)
            except PolicyStoreError as exc:
                log.info("fetching %s from the holders at its commit failed (%s); asking the catalog", sid, exc)
        return self._fetch(sid, self._ask("lookup", *sid))

    def _from_peers(self, sid: SnapshotId, info: CatalogEntry, problems: list[str]
                    ) -> tuple[HotSnapshot, Header] | None:
        """This node's own copy, streamed from other nodes' stores as a pipeline (``transfer``), or None
        (``problems`` says why)."""
        def ask(node: str, force: bool) -> Route:
            peer = remote.find(store_name(node, self.league))
            return remote.call(peer, "route", *sid, self.node_id, force, timeout_s=self.config.call_timeout_s)

        holders = [h for h in info.holders if h not in (self.node_id, DURABLE)]
        buf = self.relay.fetch(sid, holders, ask, problems)  # the bytes cross the network here, once
        if buf is None:
            return None
        try:
            return self._own_copy(sid, buf, info.summary.checksum, "other nodes")
        except CorruptSnapshotError as exc:
            problems.append(brief(exc))
            return None

    def _own_copy(self, sid: SnapshotId, buf: np.ndarray, checksum: str, source: str, *,
                  verified: bool = False) -> tuple[HotSnapshot, Header]:
        """This node's own copy of a fetched buffer: it does not depend on the source staying alive. The checksum
        runs while the copy into the object store does (unless ``verified`` already); a copy that fails it is
        dropped and CorruptSnapshotError raised."""
        what = f"{sid} from {source}"
        header = parse_header(buf, name=what)
        if header.checksum != checksum:
            raise CorruptSnapshotError(f"{what}: checksum {header.checksum} != catalog {checksum}")
        pending = Background() if verified else Background.check(buf, header, what)
        try:
            hot = HotSnapshot(sid, head_bytes(buf), [ray.put(shareable(buf))])
        finally:
            pending.join()
        pending.wait()
        return hot, header

    def list(self, policy_id: str | None = None, limit: int | None = None,
             after: SnapshotId | None = None) -> list[SnapshotInfo]:
        """The catalog's entries (one page of them with ``limit``/``after``: ``CatalogServer.list``) with where this
        node holds each."""
        entries: list[CatalogEntry] = self._ask("list", policy_id, limit, after)
        rows = []
        with self._lock:
            for e in entries:
                local = self._policies.get(e.id.policy_id, {}).get(e.id.version)
                file = local.file if local is not None else None
                rows.append(SnapshotInfo(
                    id=e.id,
                    nbytes=local.header.nbytes if local is not None else e.summary.nbytes,
                    tier="hot" if e.id in self.hot else "disk" if local is not None else "remote" if e.holders
                    else "lost",
                    on_disk=file is not None,
                    file_bytes=file.file_bytes if file is not None else 0,
                    compressed=bool(file and file.compressed),
                    meta=e.summary.meta,
                    created=e.summary.created,
                    checksum=e.summary.checksum,
                    holders=e.holders,
                    error=(local.corrupt or local.spill_error) if local is not None else None if e.holders else
                    "lost: no node and no durable tier holds a copy (a store died before it was spilled)",
                ))
        return rows

    def stats(self) -> StoreStats:
        watchers = self._waiting()
        with self._lock:
            entries = [e for _, e in self._items_locked()]
            return StoreStats(
                node_id=self.node_id,
                spill_dir=str(self.disk.root),
                durable_uri=self.config.durable_uri,
                **self._gauges_locked(),
                hot_capacity_bytes=self.hot.capacity_bytes,
                snapshots=len(entries),
                pending_spills=sum(e.pending is not None for e in entries),
                watchers=watchers,
                quarantined=tuple(self.disk.quarantined()),
                durable_failures=self.uploads.failures if self.uploads is not None else 0,
                durable_error=self.uploads.last_error if self.uploads is not None else None,
                served=self._counters["served"],
                served_max_per_snapshot=self.relay.served_most(),
                unspilled=tuple(str(sid) for sid, _ in self._unspilled_locked()),
                **{k: self._counters[k] for k in (
                    "hits", "misses", "evictions", "restores", "fetches", "publishes", "spill_errors", "corrupt_reads"
                )},
            )

    def _waiting(self) -> int:
        """Readers waiting on the doorbell now (-1: it did not answer within a second)."""
        try:
            return remote.get(self._bell.waiters(), 1.0, "the node's doorbell", "waiters")
        except Exception:
            return -1

    def store_config(self) -> StoreConfig:
        return self.config

    # ---- maintenance ---------------------------------------------------------------------------------------
    def delete(self, policy_id: str, version: int | None = None) -> list[SnapshotId]:
        """Delete one version, or every version when ``version`` is None, on every node. Versions are never reused."""
        removed: list[CatalogEntry] = self._ask("delete", policy_id, version,
                                                tombstones_queued=self.uploads is not None)  # queued below, on disk
        peers = []
        for entry in removed:
            sid = entry.id
            self.forget(*sid)
            self.feed.deleted(sid)
            self._remove_durable(sid)  # whether or not it got there yet: an upload may be on its way
            for holder in entry.holders:  # a node whose store is gone has lost its copies with it
                if holder in (DURABLE, self.node_id):
                    continue
                peer = remote.running(store_name(holder, self.league))
                if peer is not None:
                    peers.append(remote.send(peer, "forget", *sid))
        if removed:
            self.feed.set_latest(policy_id, self._catalog_latest(policy_id))
        ray.wait(peers, num_returns=len(peers), timeout=30)
        if self.uploads is not None and not self.uploads.settled([e.id for e in removed]):
            log.error("the durable tier %s has not taken the tombstones of %s yet (retrying in the background; a "
                      "catalog rebuilt from it before then would list them): %s", self.durable.uri,
                      [str(e.id) for e in removed], self.uploads.last_error)
        return [e.id for e in removed]

    def forget(self, policy_id: str, version: int) -> None:
        """Drop this node's copies of one snapshot (memory and disk) and its queued spill and upload."""
        with self._lock:
            entry = self._policies.get(policy_id, {}).pop(version, None)
            self.hot.remove(SnapshotId(policy_id, version))
            self.relay.forget(SnapshotId(policy_id, version))
            if policy_id in self._policies and not self._policies[policy_id]:
                del self._policies[policy_id]
        if entry is not None:
            self.holders.dropped(SnapshotId(policy_id, version), self.node_id)
        if self.uploads is not None:
            self.uploads.cancel(SnapshotId(policy_id, version))
        if entry is not None and entry.file is not None:
            self.disk.remove(entry.file)

    def verify(self, policy_id: str, version: int | None = None) -> VerifyReport:
        """Re-check the recorded checksum on this node's copies (memory, disk) and the durable tier's.

        A corrupt hot copy is dropped (``healed``), so the next get restores the verified disk copy (readers that
        already hold views keep what they have; the client that called verify drops its own). A damaged spill file
        is quarantined and written again from the good hot copy, or (``healed``) replaced from another good copy
        by the next get. A durable tier that does not answer in ``durable_timeout_s`` is reported, not waited for.
        """
        started = time.monotonic()
        info: CatalogEntry = self._ask("lookup", policy_id, version)
        sid = info.id
        with self._lock:
            entry = self._policies.get(policy_id, {}).get(sid.version)
            hot = self.hot.get(sid) if entry is not None else None
            file = entry.file if entry is not None else None
        found: dict[str, bool | None] = {"hot": None, "disk": None, "durable": None}
        problems = []
        checks = []
        if hot is not None:
            checks.append(
                ("hot", lambda: open_shared(remote.get(hot.refs[0], self.config.call_timeout_s, f"this store's copy of "
                                                       f"{sid}"), strict=False), f"{sid} (shared-memory copy)"))
        expect = Expected(*sid, info.summary.checksum)
        if file is not None:
            checks.append(("disk", lambda: self.disk.read(file, f"{sid} (disk copy)", expect=expect), None))
        if self.uploads is not None:
            def durable() -> np.ndarray:  # what the client's deadline leaves once the other copies are checked
                return self.uploads.call(lambda: self.durable.read(sid, expect), f"read {sid}",
                                         self._durable_deadline(started, self.hot.capacity_bytes))

            checks.append(("durable", durable, None))
        failed: dict[str, CorruptSnapshotError] = {}
        for name, load, what in checks:
            try:
                buf = load()
                header = verify_buffer(buf, name=what) if what else parse_header(buf, name=str(sid))
                del buf
                if header.checksum != info.summary.checksum:
                    raise CorruptSnapshotError(f"{sid} ({name} copy): checksum differs from the catalog's")
                found[name] = True
            except SnapshotLostError:  # not committed in the durable tier (yet)
                pass
            except DurableTierError as exc:  # down or hanging: nothing learned about the copy
                problems.append(str(exc))
            except CorruptSnapshotError as exc:
                found[name] = False
                failed[name] = exc
                problems.append(str(exc))
        if entry is not None and file is None and entry.spill_error and found["durable"] is not True:
            if hot is None:
                found["disk"] = False  # its file failed a read before (quarantined or gone) and nothing replaced it
                problems.append(entry.spill_error)
            else:  # no copy on disk (not a damaged one): its spill failed and is being retried
                problems.append(f"{sid} is only in memory (a store restart would lose it): {entry.spill_error}; "
                                "retrying")
        healed = False
        if found["hot"] is False:
            with self._lock:
                self.hot.remove(sid)
                healed = found["disk"] is True or found["durable"] is True
                if not healed and entry is not None:
                    entry.corrupt = problems[0]
        if found["disk"] is False and entry is not None and file is not None:
            self._lost_file(entry, file, failed["disk"])
            healed = healed or found["durable"] is True or found["hot"] is True
            if found["hot"] is True:
                with self._lock:
                    if entry.pending is None and self._policies.get(policy_id, {}).get(sid.version) is entry:
                        entry.pending = self._writer.submit(self._spill, sid, entry, hot.refs[0])
        return VerifyReport(sid, found["hot"], found["disk"], found["durable"], tuple(problems), healed)

    def flush(self, used: Sequence[SnapshotId] = ()) -> int:
        """Wait until every background spill (and the startup reconcile) has finished and the holder changes queued
        so far have reached the catalog; returns how many spills.
        ``used``: pushed snapshots the caller opened and has not told yet (see ``watch``)."""
        self._used(used)
        self._reconciled.result()
        with self._lock:
            pending = [e.pending for _, e in self._items_locked() if e.pending is not None]
        for future in pending:
            future.result()
        for future in self._retry_spills():  # space may be back: one more try before saying what is at risk
            future.result()
        self.holders.flush(self.config.call_timeout_s)
        self._check_spilled()
        return len(pending)

    def _ask(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The catalog's answer within half the call deadline (the caller's own deadline is the whole of it, so
        the caller learns that the catalog, not this store, was slow)."""
        return remote.call(self.catalog, method, *args, timeout_s=self.config.call_timeout_s / 2, **kwargs)

    # ---- metrics and the durable tier ----------------------------------------------------------------------
    def _count(self, name: str) -> None:
        """Bump a counter in ``stats()`` and, where Ray exports it, in the node's metrics."""
        self._counters[name] += 1
        if name in COUNTERS:
            self.metrics.count(name)

    @contextmanager
    def _timed(self, histogram: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.metrics.observe(histogram, time.perf_counter() - start)

    def _every_few_seconds(self) -> None:
        """Export the tiers' sizes and the durable backlog (Ray's metrics agent scrapes on its own interval), and
        let go of the staging files of publishers that are gone (their pages stay allocated while this store maps
        them)."""
        reported_failures = 0
        while True:
            self._staging.sweep()
            self._retry_spills()
            with self._lock:
                gauges = self._gauges_locked()
            self.metrics.set_gauges(**gauges)
            failures = self.uploads.failures if self.uploads is not None else 0
            if failures > reported_failures:
                self.metrics.count("durable_failures", failures - reported_failures)
                reported_failures = failures
            time.sleep(_GAUGE_INTERVAL_S)

    def _on_catalog(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The catalog's answer, asked again while the catalog restarts (up to ``_CATALOG_RETRY_S``): only for
        calls that are safe to repeat (idempotent, or carrying a token)."""
        return remote.call(self.catalog, method, *args, timeout_s=_CATALOG_RETRY_S, retry_s=_CATALOG_RETRY_S, **kwargs)

    def _withdraw(self, sid: SnapshotId, entry: _Entry) -> None:
        """After a durable publish failed: take the version back in the catalog (aborted, or deleted if it was
        committed), then remove what the publish wrote. If the catalog cannot be told, the files stay: the call is
        queued for it, and the store's next reconcile settles them."""
        try:
            self._on_catalog("withdraw", *sid, self.node_id)
        except Exception as exc:
            log.error("could not withdraw %s after its publish failed (%s): its files stay until the catalog "
                      "answers", sid, exc)
            remote.send(self.catalog, "withdraw", *sid, self.node_id)
            return
        if entry.file is not None:
            self.disk.remove(entry.file)
        self._remove_durable(sid)

    def _durable_deadline(self, started: float, nbytes: int) -> float:
        """How long a call into the durable tier may take for a client call that arrived at ``started`` and moves up
        to ``nbytes`` (its deadline: ``publish_timeout_s(nbytes)``): at most ``durable_timeout_s``, and at most
        three quarters of the client's deadline less what has passed, so the client hears DurableTierError naming
        the tier rather than its own DeadlineExceededError."""
        left = 0.75 * self.config.publish_timeout_s(nbytes) - (time.monotonic() - started)
        return max(min(self.config.durable_timeout_s, left), 1.0)

    def _remove_durable(self, sid: SnapshotId) -> None:
        """Take ``sid`` out of the durable tier: a tombstone first (never listed, served or written again), then its
        marker and data, in the upload queue's background (the tier may be what failed)."""
        if self.uploads is not None:
            self.uploads.tombstone(sid)

    # ---- helpers (caller holds the lock) --------------------------------------------------------------------
    def _items_locked(self) -> list[tuple[SnapshotId, _Entry]]:
        return [(SnapshotId(p, v), e) for p, versions in self._policies.items() for v, e in versions.items()]

    def _held_locked(self) -> list[tuple[SnapshotId, Summary]]:
        """This node's copies as the catalog records them (a copy known to be corrupt is none)."""
        return [(sid, Summary.of(e.header, e.durable)) for sid, e in self._items_locked() if not e.corrupt]

    def _gauges_locked(self) -> dict[str, int]:
        """The tiers' sizes and the durable backlog: in ``stats()``, and exported as the node's gauges."""
        return {"hot_bytes": self.hot.bytes, "hot_snapshots": len(self.hot), "disk_bytes": self._disk_bytes_locked(),
                "disk_snapshots": sum(e.file is not None for _, e in self._items_locked()),
                "durable_pending": self.uploads.pending() if self.uploads is not None else 0}

    def _disk_bytes_locked(self) -> int:
        return sum(e.file.file_bytes for _, e in self._items_locked() if e.file is not None)

