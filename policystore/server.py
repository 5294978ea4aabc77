"""The per-node store actor: the catalog, the hot tier in the object store, and the disk tier behind it.

It owns every snapshot object it serves (it ``ray.put``s its own copy: objects die with their owner, and a
learner that published may go away). It is a threaded actor: catalog changes happen under one short lock, and
all heavy work (copies, checksums, disk I/O) happens outside it, so reads never wait behind a large publish or a
slow restore. Concurrent gets of one evicted snapshot share a single restore.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from .config import StoreConfig
from .errors import (
    CorruptSnapshotError,
    InvalidWeightsError,
    SnapshotTooLargeError,
    UnknownPolicyError,
    UnknownVersionError,
)
from .format import META_POLICY, Header, parse_header, verify_buffer
from .hot import HotTier
from .ids import SnapshotId, check_policy_id, check_version
from .spill import DiskTier, SpillFile

log = logging.getLogger(__name__)


@dataclass
class _Entry:
    header: Header
    file: SpillFile | None = None  # committed spill file
    pending: Future | None = None  # background spill in flight
    spill_error: str | None = None  # the background spill failed (disk full): the snapshot can only stay hot
    corrupt: str | None = None  # the hot copy failed its checksum and no good disk copy exists

    @property
    def nbytes(self) -> int:
        return self.header.nbytes


@dataclass
class _Restore:
    future: Future = field(default_factory=Future)


def _node_object_store_bytes(node_id: str) -> int:
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return int(node["Resources"].get("object_store_memory", 0))
    raise RuntimeError(f"node {node_id} is not part of this Ray cluster")


class StoreServer:
    """Run as a Ray actor (see ``client.connect``); every public method is a remote call."""

    def __init__(self, config: StoreConfig, node_id: str):
        self.config = config
        self.node_id = node_id
        spill_dir = config.resolved_spill_dir(ray.get_runtime_context().get_session_name())
        self.disk = DiskTier(spill_dir, compress=config.compress, capacity_bytes=config.disk_capacity_bytes)
        capacity = config.hot_capacity_bytes or _node_object_store_bytes(node_id) // 2
        self.hot = HotTier(capacity)
        self._lock = threading.Lock()
        self._policies: dict[str, dict[int, _Entry]] = {}  # versions in increasing order
        self._next_version: dict[str, int] = {}
        self._restores: dict[SnapshotId, _Restore] = {}
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="policystore-spill")
        self._counters: Counter[str] = Counter()
        for found in self.disk.scan():
            self._policies.setdefault(found.id.policy_id, {})[found.id.version] = _Entry(found.header, found.file)
            self._next_version[found.id.policy_id] = found.id.version + 1
        log.info(
            "policystore on node %s: %d snapshots rebuilt from %s, hot capacity %d bytes",
            node_id, sum(map(len, self._policies.values())), spill_dir, capacity,
        )

    # ---- publish -------------------------------------------------------------------------------------------
    def publish(self, policy_id: str, buf: np.ndarray, durable: bool = False) -> tuple[str, int]:
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
            pending = sum(e.nbytes for e in self._entries_locked() if e.pending is not None)
            committed = self._disk_bytes_locked()
        self.disk.check_room(header.nbytes, committed, pending, what)
        temp = self.disk.write_temp(policy_id, buf, header, what) if durable else None
        try:
            ref = ray.put(buf)  # the store's own copy: it must outlive the publisher
        except BaseException:
            if temp is not None:
                self.disk.discard(temp)
            raise
        with self._lock:
            version = self._next_version.get(policy_id, 1)
            self._next_version[policy_id] = version + 1
            sid = SnapshotId(policy_id, version)
            entry = _Entry(header)
            if temp is not None:
                entry.file = self.disk.commit(temp, sid)
            else:
                entry.pending = self._writer.submit(self._spill, sid, entry, ref)
            self._policies.setdefault(policy_id, {})[version] = entry
            self.hot.add(sid, ref, header.nbytes)
            self._counters["publishes"] += 1
        self._evict(protect=sid)
        return tuple(sid)

    def _spill(self, sid: SnapshotId, entry: _Entry, ref: ray.ObjectRef) -> None:
        """Background write of a non-durable publish; eviction waits for it."""
        try:
            temp = self.disk.write_temp(sid.policy_id, ray.get(ref), entry.header, str(sid))
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
                        log.warning(
                            "hot tier over capacity (%d > %d bytes) and nothing can be evicted: spills failed",
                            self.hot.bytes, self.hot.capacity_bytes,
                        )
                        return
            if wait_for is not None:
                wait_for.result()

    # ---- read ----------------------------------------------------------------------------------------------
    def resolve(self, policy_id: str, version: int | None = None) -> tuple[str, int, list[ray.ObjectRef]]:
        """(policy_id, version, [ref]) of the snapshot, restored from disk first if it was evicted.

        The ref travels inside a list so Ray hands it over instead of fetching the bytes into this reply.
        """
        with self._lock:
            sid, entry = self._lookup_locked(policy_id, version)
            if entry.corrupt:
                raise CorruptSnapshotError(entry.corrupt)
            ref = self.hot.ref(sid)
            if ref is not None:
                self._counters["hits"] += 1
                return (*sid, [ref])
            self._counters["misses"] += 1
            restore = self._restores.get(sid)
            leader = restore is None
            if leader:
                restore = self._restores[sid] = _Restore()
            file = entry.file
        if not leader:
            return (*sid, [restore.future.result()])
        try:
            assert file is not None, f"{sid} is neither hot nor on disk"
            ref = ray.put(self.disk.read(file, str(sid)))
            with self._lock:
                if self._policies.get(sid.policy_id, {}).get(sid.version) is entry:
                    self.hot.add(sid, ref, entry.nbytes)
                self._counters["restores"] += 1
            restore.future.set_result(ref)
        except BaseException as exc:
            self._counters["corrupt_reads"] += isinstance(exc, CorruptSnapshotError)
            restore.future.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._restores.pop(sid, None)
        self._evict(protect=sid)
        return (*sid, [ref])

    def latest_version(self, policy_id: str) -> int:
        with self._lock:
            return self._lookup_locked(policy_id, None)[0].version

    def list(self, policy_id: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            if policy_id is not None:
                self._lookup_locked(policy_id, None)
            rows = []
            for pid, versions in sorted(self._policies.items()):
                if policy_id is not None and pid != policy_id:
                    continue
                for version, entry in versions.items():
                    sid = SnapshotId(pid, version)
                    rows.append(
                        {
                            "policy_id": pid,
                            "version": version,
                            "nbytes": entry.nbytes,
                            "tier": "hot" if sid in self.hot else "disk",
                            "on_disk": entry.file is not None,
                            "file_bytes": entry.file.file_bytes if entry.file else 0,
                            "compressed": bool(entry.file and entry.file.compressed),
                            "meta": entry.header.user_meta,
                            "created": float(entry.header.metadata.get("policystore.created", 0)),
                            "error": entry.corrupt or entry.spill_error,
                        }
                    )
            return rows

    def stats(self) -> dict[str, Any]:
        with self._lock:
            entries = self._entries_locked()
            return {
                "node_id": self.node_id,
                "spill_dir": str(self.disk.root),
                "hot_bytes": self.hot.bytes,
                "hot_snapshots": len(self.hot),
                "hot_capacity_bytes": self.hot.capacity_bytes,
                "disk_bytes": self._disk_bytes_locked(),
                "disk_snapshots": sum(e.file is not None for e in entries),
                "snapshots": len(entries),
                "policies": len(self._policies),
                "pending_spills": sum(e.pending is not None for e in entries),
                **{k: self._counters[k] for k in (
                    "hits", "misses", "evictions", "restores", "publishes", "spill_errors", "corrupt_reads"
                )},
            }

    def store_config(self) -> StoreConfig:
        return self.config

    # ---- maintenance ---------------------------------------------------------------------------------------
    def delete(self, policy_id: str, version: int | None = None) -> list[tuple[str, int]]:
        """Forget one version, or every version when ``version`` is None. Versions are never reused."""
        with self._lock:
            if version is None:
                self._lookup_locked(policy_id, None)
                doomed = list(self._policies[policy_id])
            else:
                doomed = [self._lookup_locked(policy_id, version)[0].version]
            files = []
            for v in doomed:
                entry = self._policies[policy_id].pop(v)
                self.hot.remove(SnapshotId(policy_id, v))
                if entry.file is not None:
                    files.append(entry.file)
            if not self._policies[policy_id]:
                del self._policies[policy_id]
        for file in files:
            self.disk.remove(file)
        return [(policy_id, v) for v in doomed]

    def verify(self, policy_id: str, version: int | None = None) -> dict[str, Any]:
        """Re-check the recorded checksum on the hot copy and the disk copy.

        A corrupt hot copy is dropped, so the next get restores the verified disk copy (readers that already
        hold views keep what they have).
        """
        with self._lock:
            sid, entry = self._lookup_locked(policy_id, version)
            ref = self.hot.ref(sid)
            file = entry.file
        report: dict[str, Any] = {"policy_id": sid.policy_id, "version": sid.version, "hot": None, "disk": None}
        problems = []
        if ref is not None:
            try:
                header = verify_buffer(ray.get(ref), name=f"{sid} (shared-memory copy)")
                if header.checksum != entry.header.checksum:
                    raise CorruptSnapshotError(f"{sid} (shared-memory copy): header checksum was rewritten")
                report["hot"] = True
            except CorruptSnapshotError as exc:
                report["hot"] = False
                problems.append(str(exc))
        if file is not None:
            try:
                self.disk.read(file, f"{sid} (disk copy)")
                report["disk"] = True
            except CorruptSnapshotError as exc:
                report["disk"] = False
                problems.append(str(exc))
        if report["hot"] is False:
            with self._lock:
                self.hot.remove(sid)
                if report["disk"] is not True:
                    entry.corrupt = problems[0]
        report["problems"] = problems
        return report

    def flush(self) -> int:
        """Wait until every background spill has finished; returns how many were waited for."""
        with self._lock:
            pending = [e.pending for e in self._entries_locked() if e.pending is not None]
        for future in pending:
            future.result()
        return len(pending)

    # ---- helpers (caller holds the lock) --------------------------------------------------------------------
    def _lookup_locked(self, policy_id: str, version: int | None) -> tuple[SnapshotId, _Entry]:
        check_policy_id(policy_id)
        versions = self._policies.get(policy_id)
        if not versions:
            known = sorted(self._policies)
            more = " ..." if len(known) > 20 else ""
            hint = f"; known policies: {known[:20]}{more}" if known else " (the store is empty)"
            raise UnknownPolicyError(f"unknown policy {policy_id!r}{hint}")
        if version is None:
            version = next(reversed(versions))
        else:
            check_version(version)
        entry = versions.get(version)
        if entry is None:
            have = list(versions)
            raise UnknownVersionError(
                f"policy {policy_id!r} has no version {version}; it has {len(have)} versions "
                f"({have[:10]}{' ...' if len(have) > 10 else ''}, latest {have[-1]})"
            )
        return SnapshotId(policy_id, version), entry

    def _entries_locked(self) -> list[_Entry]:
        return [e for versions in self._policies.values() for e in versions.values()]

    def _disk_bytes_locked(self) -> int:
        return sum(e.file.file_bytes for e in self._entries_locked() if e.file is not None)
