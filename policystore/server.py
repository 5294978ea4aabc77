"""The per-node store actor: the node's copies (hot tier in the object store, disk tier behind it).

It owns every snapshot object it serves (it ``ray.put``s its own copy: objects die with their owner, and a
learner that published may go away). Names and versions come from the cluster catalog (``catalog.py``); bytes
never pass through the catalog: a store that lacks a snapshot fetches it once from a store that has it (or from
the durable tier) and from then on serves its node from its own copy.

It is a threaded actor: local bookkeeping happens under one short lock, and all heavy work (copies, checksums,
disk I/O, fetches) happens outside it, so reads never wait behind a large publish or a slow restore. Concurrent
gets of one missing snapshot share a single restore or fetch.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from .config import CATALOG_NAME, NAMESPACE, StoreConfig, store_name
from .errors import (
    CorruptSnapshotError,
    InvalidWeightsError,
    SnapshotLostError,
    SnapshotTooLargeError,
)
from .format import META_CREATED, META_POLICY, Header, parse_header, verify_buffer
from .hot import HotTier
from .ids import SnapshotId, check_policy_id, check_version
from .spill import DiskTier, SpillFile

log = logging.getLogger(__name__)

DURABLE = "durable"  # the holder name of the shared durable tier in the catalog
_FETCH_TIMEOUT_S = 120.0


@dataclass
class _Entry:
    header: Header
    file: SpillFile | None = None  # committed local spill file
    pending: Future | None = None  # background spill in flight
    spill_error: str | None = None  # the background spill failed (disk full): the snapshot can only stay hot
    corrupt: str | None = None  # the hot copy failed its checksum and no good disk copy exists

    @property
    def nbytes(self) -> int:
        return self.header.nbytes


def _node_object_store_bytes(node_id: str) -> int:
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return int(node["Resources"].get("object_store_memory", 0))
    raise RuntimeError(f"node {node_id} is not part of this Ray cluster")


def _summary(header: Header, durable: bool) -> dict[str, Any]:
    return {
        "nbytes": header.nbytes,
        "checksum": header.checksum,
        "meta": header.user_meta,
        "created": float(header.metadata.get(META_CREATED, 0)),
        "durable": durable,
    }


class StoreServer:
    """Run as a Ray actor (see ``client.connect``); every public method is a remote call."""

    def __init__(self, config: StoreConfig, node_id: str):
        self.config = config
        self.node_id = node_id
        session = ray.get_runtime_context().get_session_name()
        spill_dir = config.resolved_spill_dir(session, node_id)
        self.disk = DiskTier(spill_dir, compress=config.compress, capacity_bytes=config.disk_capacity_bytes)
        durable_dir = config.resolved_durable_dir()
        self.durable = DiskTier(durable_dir, compress=config.compress) if durable_dir else None
        capacity = config.hot_capacity_bytes or _node_object_store_bytes(node_id) // 2
        self.hot = HotTier(capacity)
        self.catalog = ray.get_actor(CATALOG_NAME, namespace=NAMESPACE)
        self._lock = threading.Lock()
        self._policies: dict[str, dict[int, _Entry]] = {}  # this node's copies, versions in increasing order
        self._inflight: dict[SnapshotId, Future] = {}  # restores and fetches, one per snapshot
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="policystore-spill")
        self._counters: Counter[str] = Counter()
        for found in self.disk.scan():
            self._policies.setdefault(found.id.policy_id, {})[found.id.version] = _Entry(found.header, found.file)
        # Tell the catalog what survived on disk, without blocking startup on another actor.
        self._reconciled = ThreadPoolExecutor(1).submit(self._reconcile)
        log.info("policystore on node %s: %d snapshots on %s, hot capacity %d bytes",
                 node_id, sum(map(len, self._policies.values())), spill_dir, capacity)

    def _reconcile(self) -> None:
        with self._lock:
            held = [(sid.policy_id, sid.version, e.header.checksum) for sid, e in self._items_locked()]
        for pid, version in ray.get(self.catalog.reconcile.remote(self.node_id, held)):
            log.warning("discarding %s@v%d: never committed, deleted or conflicting", pid, version)
            self.forget(pid, version)

    # ---- publish -------------------------------------------------------------------------------------------
    def publish(self, policy_id: str, buf: np.ndarray, durable: bool = False) -> tuple[str, int]:
        """Reserve a version, make this node's copies (and files, if durable), then commit it in the catalog.

        Killed anywhere in between, the version is never committed: the snapshot is complete or absent.
        """
        check_policy_id(policy_id)
        if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1:
            raise InvalidWeightsError("publish takes a packed snapshot (1-D uint8 buffer from policystore.format.pack)")
        what = f"new snapshot of {policy_id!r}"
        header = parse_header(buf, name=what)
        if header.metadata.get(META_POLICY) != policy_id:
            raise InvalidWeightsError(f"{what}: buffer was packed for {header.metadata.get(META_POLICY)!r}")
        if header.nbytes > self.hot.capacity_bytes:
            raise SnapshotTooLargeError(
                f"{what} is {header.nbytes} bytes, larger than the whole hot tier "
                f"(hot_capacity_bytes={self.hot.capacity_bytes}); raise the capacity or shrink the snapshot"
            )
        with self._lock:
            pending = sum(e.nbytes for _, e in self._items_locked() if e.pending is not None)
            committed = self._disk_bytes_locked()
        self.disk.check_room(header.nbytes, committed, pending, what)
        sid = SnapshotId(policy_id, ray.get(self.catalog.reserve.remote(policy_id, self.node_id)))
        entry = _Entry(header)
        try:
            if durable:
                entry.file = self.disk.commit(self.disk.write_temp(policy_id, buf, header, str(sid)), sid)
                if self.durable is not None:
                    self.durable.commit(self.durable.write_temp(policy_id, buf, header, str(sid)), sid)
            ref = ray.put(buf)  # the store's own copy: it must outlive the publisher
            with self._lock:
                self._policies.setdefault(policy_id, {})[sid.version] = entry
                self.hot.add(sid, ref, header.nbytes)
            ray.get(self.catalog.commit.remote(policy_id, sid.version, self.node_id, _summary(header, durable)))
            if durable and self.durable is not None:
                self.catalog.hold.remote(policy_id, sid.version, DURABLE)
        except BaseException:
            self.forget(policy_id, sid.version)
            if durable and self.durable is not None and (file := self.durable.find(sid)):
                self.durable.remove(file)
            self.catalog.abort.remote(policy_id, sid.version)
            raise
        with self._lock:
            self._counters["publishes"] += 1
            if not durable:
                entry.pending = self._writer.submit(self._spill, sid, entry, ref)
        self._evict(protect=sid)
        return tuple(sid)

    def _spill(self, sid: SnapshotId, entry: _Entry, ref: ray.ObjectRef) -> None:
        """Background write of a non-durable publish or a fetched copy; eviction waits for it."""
        buf = ray.get(ref)
        try:
            temp = self.disk.write_temp(sid.policy_id, buf, entry.header, str(sid))
            if self.durable is not None and self.durable.find(sid) is None:
                self.durable.commit(self.durable.write_temp(sid.policy_id, buf, entry.header, str(sid)), sid)
                self.catalog.hold.remote(sid.policy_id, sid.version, DURABLE)
        except CorruptSnapshotError as exc:
            log.error("%s", exc)
            with self._lock:
                entry.corrupt, entry.pending = str(exc), None
                self.hot.remove(sid)
            return
        except Exception as exc:  # disk full, I/O error: keep serving from memory, report it
            log.error("could not spill %s: %s", sid, exc)
            with self._lock:
                entry.spill_error, entry.pending = str(exc), None
                self._counters["spill_errors"] += 1
            return
        with self._lock:
            if self._policies.get(sid.policy_id, {}).get(sid.version) is not entry:  # deleted meanwhile
                self.disk.discard(temp)
            else:
                entry.file = self.disk.commit(temp, sid)
            entry.pending = None

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
                        self._counters["evictions"] += 1
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
    def resolve(self, policy_id: str, version: int | None = None) -> tuple[str, int, list[ray.ObjectRef]]:
        """(policy_id, version, [ref]) of this node's copy: restored from disk or fetched from another node first
        if needed. The ref travels inside a list so Ray hands it over instead of fetching the bytes into this reply.
        """
        check_policy_id(policy_id)
        info = None
        if version is None:
            info = ray.get(self.catalog.lookup.remote(policy_id))
            version = info["version"]
        sid = SnapshotId(policy_id, check_version(version))
        with self._lock:
            entry = self._policies.get(policy_id, {}).get(sid.version)
            if entry is not None and entry.corrupt:
                raise CorruptSnapshotError(entry.corrupt)
            ref = self.hot.ref(sid) if entry is not None else None
            if ref is not None:
                self._counters["hits"] += 1
                return (*sid, [ref])
            self._counters["misses"] += 1
            future = self._inflight.get(sid)
            leader = future is None
            if leader:
                future = self._inflight[sid] = Future()
        if not leader:
            return (*sid, [future.result()])
        try:
            if entry is not None:
                ref = self._restore(sid, entry)
            else:
                ref = self._fetch(sid, info or ray.get(self.catalog.lookup.remote(policy_id, sid.version)))
            future.set_result(ref)
        except BaseException as exc:
            future.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._inflight.pop(sid, None)
        self._evict(protect=sid)
        return (*sid, [ref])

    def _restore(self, sid: SnapshotId, entry: _Entry) -> ray.ObjectRef:
        if entry.file is None:
            raise SnapshotLostError(f"{sid} is neither in memory nor on this node's disk ({entry.spill_error})")
        try:
            ref = ray.put(self.disk.read(entry.file, str(sid)))
        except CorruptSnapshotError:
            with self._lock:
                self._counters["corrupt_reads"] += 1
            raise
        with self._lock:
            if self._policies.get(sid.policy_id, {}).get(sid.version) is entry:
                self.hot.add(sid, ref, entry.nbytes)
            self._counters["restores"] += 1
        return ref

    def _fetch(self, sid: SnapshotId, info: dict[str, Any]) -> ray.ObjectRef:
        """Copy a snapshot this node lacks from a node that holds it (or the durable tier): once per node."""
        problems = []
        buf = None
        for holder in [h for h in info["holders"] if h not in (self.node_id, DURABLE)]:
            try:
                peer = ray.get_actor(store_name(holder), namespace=NAMESPACE)
                _, _, (remote,) = ray.get(peer.resolve.remote(*sid), timeout=_FETCH_TIMEOUT_S)
                buf = ray.get(remote, timeout=_FETCH_TIMEOUT_S)  # the bytes cross the network here, once
                verify_buffer(buf, name=f"{sid} from node {holder}")
                break
            except Exception as exc:  # dead node or store, lost object, corrupt copy: try the next holder
                problems.append(f"node {holder}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                buf = None
        if buf is None and self.durable is not None and (file := self.durable.find(sid)) is not None:
            buf = self.durable.read(file, f"{sid} (durable tier)")
        if buf is None:
            raise SnapshotLostError(
                f"{sid} is in the catalog but no live copy could be fetched "
                f"(holders {info['holders']}; {'; '.join(problems) or 'no durable tier'})"
            )
        header = parse_header(buf, name=str(sid))
        if header.checksum != info["checksum"]:
            raise CorruptSnapshotError(f"{sid}: fetched checksum {header.checksum} != catalog {info['checksum']}")
        ref = ray.put(buf)  # this node's own copy: it does not depend on the source node staying alive
        del buf
        entry = _Entry(header)
        with self._lock:
            self._policies.setdefault(sid.policy_id, {})[sid.version] = entry
            self.hot.add(sid, ref, header.nbytes)
            self._counters["fetches"] += 1
            entry.pending = self._writer.submit(self._spill, sid, entry, ref)
        self.catalog.hold.remote(sid.policy_id, sid.version, self.node_id)
        return ref

    def list(self, policy_id: str | None = None) -> list[dict[str, Any]]:
        rows = ray.get(self.catalog.list.remote(policy_id))
        with self._lock:
            for row in rows:
                sid = SnapshotId(row["policy_id"], row["version"])
                entry = self._policies.get(sid.policy_id, {}).get(sid.version)
                row["tier"] = "hot" if sid in self.hot else "disk" if entry is not None else "remote"
                row["on_disk"] = bool(entry and entry.file)
                row["file_bytes"] = entry.file.file_bytes if entry and entry.file else 0
                row["compressed"] = bool(entry and entry.file and entry.file.compressed)
                row["error"] = entry and (entry.corrupt or entry.spill_error)
                if entry is not None:
                    row["nbytes"] = entry.nbytes
        return rows

    def stats(self) -> dict[str, Any]:
        with self._lock:
            entries = [e for _, e in self._items_locked()]
            return {
                "node_id": self.node_id,
                "spill_dir": str(self.disk.root),
                "durable_dir": str(self.durable.root) if self.durable else None,
                "hot_bytes": self.hot.bytes,
                "hot_snapshots": len(self.hot),
                "hot_capacity_bytes": self.hot.capacity_bytes,
                "disk_bytes": self._disk_bytes_locked(),
                "disk_snapshots": sum(e.file is not None for e in entries),
                "snapshots": len(entries),
                "pending_spills": sum(e.pending is not None for e in entries),
                **{k: self._counters[k] for k in (
                    "hits", "misses", "evictions", "restores", "fetches", "publishes", "spill_errors", "corrupt_reads"
                )},
            }

    def store_config(self) -> StoreConfig:
        return self.config

    # ---- maintenance ---------------------------------------------------------------------------------------
    def delete(self, policy_id: str, version: int | None = None) -> list[tuple[str, int]]:
        """Delete one version, or every version when ``version`` is None, on every node. Versions are never reused."""
        removed = ray.get(self.catalog.delete.remote(policy_id, version))
        peers = []
        for entry in removed:
            sid = SnapshotId(policy_id, entry["version"])
            self.forget(*sid)
            for holder in entry["holders"]:
                if holder == DURABLE and self.durable is not None and (file := self.durable.find(sid)):
                    self.durable.remove(file)
                elif holder not in (DURABLE, self.node_id):
                    try:
                        peers.append(ray.get_actor(store_name(holder), namespace=NAMESPACE).forget.remote(*sid))
                    except ValueError:
                        pass  # that node's store is gone, and its copies with it
        ray.wait(peers, num_returns=len(peers), timeout=30)
        return [(policy_id, e["version"]) for e in removed]

    def forget(self, policy_id: str, version: int) -> None:
        """Drop this node's copies of one snapshot (memory and disk)."""
        with self._lock:
            entry = self._policies.get(policy_id, {}).pop(version, None)
            self.hot.remove(SnapshotId(policy_id, version))
            if policy_id in self._policies and not self._policies[policy_id]:
                del self._policies[policy_id]
        if entry is not None and entry.file is not None:
            self.disk.remove(entry.file)

    def verify(self, policy_id: str, version: int | None = None) -> dict[str, Any]:
        """Re-check the recorded checksum on this node's copies (memory, disk) and the durable tier's.

        A corrupt hot copy is dropped, so the next get restores the verified disk copy (readers that already
        hold views keep what they have).
        """
        info = ray.get(self.catalog.lookup.remote(policy_id, version))
        sid = SnapshotId(policy_id, info["version"])
        with self._lock:
            entry = self._policies.get(policy_id, {}).get(sid.version)
            ref = self.hot.ref(sid) if entry is not None else None
            file = entry.file if entry is not None else None
        report: dict[str, Any] = {"policy_id": sid.policy_id, "version": sid.version, "hot": None, "disk": None}
        problems = []
        checks = []
        if ref is not None:
            checks.append(("hot", lambda: ray.get(ref), f"{sid} (shared-memory copy)"))
        if file is not None:
            checks.append(("disk", lambda: self.disk.read(file, f"{sid} (disk copy)"), None))
        if self.durable is not None and (durable_file := self.durable.find(sid)) is not None:
            checks.append(("durable", lambda: self.durable.read(durable_file, f"{sid} (durable copy)"), None))
        for name, load, what in checks:
            try:
                buf = load()
                header = verify_buffer(buf, name=what) if what else parse_header(buf, name=str(sid))
                if header.checksum != info["checksum"]:
                    raise CorruptSnapshotError(f"{sid} ({name} copy): checksum differs from the catalog's")
                report[name] = True
            except CorruptSnapshotError as exc:
                report[name] = False
                problems.append(str(exc))
        if report["hot"] is False:
            with self._lock:
                self.hot.remove(sid)
                if report["disk"] is not True and entry is not None:
                    entry.corrupt = problems[0]
        report["problems"] = problems
        return report

    def flush(self) -> int:
        """Wait until every background spill (and the startup reconcile) has finished; returns how many."""
        self._reconciled.result()
        with self._lock:
            pending = [e.pending for _, e in self._items_locked() if e.pending is not None]
        for future in pending:
            future.result()
        return len(pending)

    # ---- helpers (caller holds the lock) --------------------------------------------------------------------
    def _items_locked(self) -> list[tuple[SnapshotId, _Entry]]:
        return [(SnapshotId(p, v), e) for p, versions in self._policies.items() for v, e in versions.items()]

    def _disk_bytes_locked(self) -> int:
        return sum(e.file.file_bytes for _, e in self._items_locked() if e.file is not None)

