"""A node store's tiers: the background spill of every hot copy to disk (retried while the disk is full), eviction
of least-recently-used hot copies that are on disk, the durable tier's uploads and tombstones, forgetting a
snapshot on this node, and re-checking every copy's checksum (``verify``).
"""

from __future__ import annotations

import errno
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import ray

from . import remote
from .errors import (
    CorruptSnapshotError,
    DiskFullError,
    DurableTierError,
    SnapshotLostError,
    SpillFailedError,
)
from .format import (
    Expected,
    Header,
    parse_header,
    verify_buffer,
)
from .ids import SnapshotId
from .protect import open_shared
from .snapfile import SpillFile
from .spill import TOMBSTONES
from .store_state import Entry, StoreState
from .wire import (
    DURABLE,
    CatalogEntry,
    VerifyReport,
)

if TYPE_CHECKING:
    from .durable_queue import DurableQueue

log = logging.getLogger(__name__)

RETRY_INTERVAL_S = 2.0  # how often failed spills are tried again (and the node's gauges exported)
# A new publish's spill starts this long after it was queued: by then the publish has answered its caller, so the
# disk write (and its compression) never competes with that answer for the CPU; spills queued behind it start at once.
SPILL_SETTLE_S = 0.01


class Tiers:
    """Moves this node's copies between memory, disk and the durable tier (see the module's docstring)."""

    def __init__(self, state: StoreState):
        self.state = state
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="policystore-spill")

    def open_uploads(self) -> DurableQueue | None:
        """The durable tier's work queue, which owns every call into the tier (None without a durable tier)."""
        if self.state.durable is None:
            return None
        from .durable_queue import DurableQueue

        return DurableQueue(self.state.durable, self.state.config.durable_timeout_s, self.state.disk.root / TOMBSTONES,
                            source=self.upload_source, uploaded=self.uploaded, local=self.local_ids)

    def spill_soon(self, sid: SnapshotId, entry: Entry, ref: ray.ObjectRef) -> Future:
        """Queue a new publish's ``spill``, to start once that publish has answered (``SPILL_SETTLE_S``)."""
        due = time.monotonic() + SPILL_SETTLE_S

        def settled() -> None:
            time.sleep(max(due - time.monotonic(), 0.0))
            self.spill(sid, entry, ref)

        return self.writer.submit(settled)

    def spill(self, sid: SnapshotId, entry: Entry, ref: ray.ObjectRef) -> None:
        """Background write of a non-durable publish or a fetched copy to this node's disk; eviction waits for it.
        It never waits for the durable tier: once the file is committed, its upload is queued."""
        with self.state.lock:
            if self.state.policies.get(sid.policy_id, {}).get(sid.version) is not entry:  # deleted before its turn
                entry.pending = None
                return
        copy = remote.get(ref, self.state.config.call_timeout_s, f"this store's copy of {sid}")
        buf = open_shared(copy, strict=False)
        del copy
        try:
            temp = self.state.disk.write_temp(sid, buf, entry.header)
        except CorruptSnapshotError as exc:
            log.error("%s", exc)
            with self.state.lock:
                entry.corrupt, entry.pending = str(exc), None
                self.state.hot.remove(sid)
            return
        except Exception as exc:  # disk full, I/O error: keep serving from memory, retry (``retry_spills``)
            with self.state.lock:
                first = entry.spill_error is None
                entry.spill_error, entry.pending = str(exc), None
                self.state.count("spill_errors")
            if first:
                log.error("could not spill %s (retrying until it lands): %s", sid, exc)
            return
        finally:
            del buf
        with self.state.lock:
            current = self.state.policies.get(sid.policy_id, {}).get(sid.version) is entry
            if not current:  # deleted meanwhile
                self.state.disk.discard(temp)
            else:
                entry.file, entry.spill_error = self.state.disk.commit(temp, sid), None
            entry.pending = None
        if current and self.state.uploads is not None:
            self.state.uploads.upload(sid)

    def unspilled_locked(self) -> list[tuple[SnapshotId, Entry]]:
        """Acknowledged snapshots a store restart would lose: no file, no durable copy, not a copy of another's."""
        return [(sid, e) for sid, e in self.state.items_locked()
                if e.file is None and e.spill_error and not e.durable and not e.fetched]  # a retry may be running

    def retry_spills(self) -> list[Future]:
        """Queue the spill again of every snapshot whose spill failed and that is still hot (periodically, and at
        ``flush``): a disk that fills up delays spills, it never drops them. Returns the spills queued."""
        queued = []
        with self.state.lock:
            for sid, entry in self.state.items_locked():
                hot = self.state.hot.peek(sid)
                if entry.file is None and entry.pending is None and entry.spill_error and hot is not None:
                    entry.pending = self.writer.submit(self.spill, sid, entry, hot.refs[0])
                    queued.append(entry.pending)
        return queued

    def check_spilled(self) -> None:
        """SpillFailedError naming every acknowledged snapshot that is only in memory (see ``unspilled_locked``)."""
        with self.state.lock:
            at_risk = self.unspilled_locked()
        if at_risk:
            names = ", ".join(str(sid) for sid, _ in at_risk[:20]) + (" ..." if len(at_risk) > 20 else "")
            raise SpillFailedError(
                f"{len(at_risk)} acknowledged snapshots are on no disk and not in the durable tier, a store restart "
                f"would lose them: {names} "
                f"(their spill to {self.state.disk.root} failed: {at_risk[-1][1].spill_error}); retrying every "
                f"{RETRY_INTERVAL_S:g} s until they land or are deleted")

    def make_room(self, nbytes: int, what: str) -> None:
        """Refuse a publish with DiskFullError when the hot tier could not take it without growing past its
        capacity because snapshots it holds cannot be spilled (and so cannot be evicted); waits for spills in
        flight first, as eviction does."""
        while True:
            with self.state.lock:
                stuck = [(sid, e) for sid, e in self.state.items_locked() if e.file is None and sid in self.state.hot]
                if sum(e.header.nbytes for _, e in stuck) + nbytes <= self.state.hot.capacity_bytes:
                    return
                wait_for = next((e.pending for _, e in stuck if e.pending is not None), None)
                failed = [(sid, e) for sid, e in stuck if e.spill_error]
            if wait_for is None:
                names = ", ".join(str(sid) for sid, _ in failed[:10]) + (" ..." if len(failed) > 10 else "")
                raise DiskFullError(
                    errno.ENOSPC, f"{what}: refused, the hot tier (hot_capacity_bytes="
                    f"{self.state.hot.capacity_bytes}) is "
                    f"full of snapshots that could not be spilled to {self.state.disk.root} ({names}: "
                    f"{failed[-1][1].spill_error if failed else 'no spill file'}); they are retried until they land")
            wait_for.result()

    def upload_source(self, sid: SnapshotId) -> tuple[np.ndarray, Header] | None:
        """This node's verified bytes of ``sid`` for its durable upload (from its spill file), None if gone."""
        with self.state.lock:
            entry = self.state.policies.get(sid.policy_id, {}).get(sid.version)
            file = entry.file if entry is not None else None
        if file is None:
            return None
        try:
            buf = self.state.disk.read(file, f"{sid} (for its durable upload)",
                                       expect=Expected(*sid, entry.header.checksum))
        except CorruptSnapshotError as exc:  # damaged (now quarantined) or gone: the next get heals it
            self.lost_file(entry, file, exc)
            raise
        return buf, parse_header(buf, name=str(sid))

    def uploaded(self, sid: SnapshotId) -> None:
        self.state.holders.gained(sid, DURABLE)

    def local_ids(self) -> list[SnapshotId]:
        with self.state.lock:
            return [sid for sid, e in self.state.items_locked() if e.file is not None]

    def evict(self, protect: SnapshotId) -> None:
        """Drop least-recently-used hot copies (already on disk) until the hot tier fits its capacity."""
        while True:
            wait_for = None
            with self.state.lock:
                if not self.state.hot.over_capacity():
                    return
                for sid in self.state.hot.lru_order():
                    entry = self.state.policies[sid.policy_id][sid.version]
                    if sid == protect:
                        continue
                    if entry.file is not None:
                        self.state.hot.remove(sid)
                        self.state.count("evictions")
                        break
                    if entry.pending is not None and wait_for is None:
                        wait_for = entry.pending
                else:
                    if wait_for is None:
                        log.warning("hot tier over capacity (%d > %d bytes), nothing evictable: spills failed",
                                    self.state.hot.bytes, self.state.hot.capacity_bytes)
                        return
            if wait_for is not None:
                wait_for.result()

    def forget(self, policy_id: str, version: int) -> None:
        """Drop this node's copies of one snapshot (memory and disk) and its queued spill and upload."""
        with self.state.lock:
            entry = self.state.policies.get(policy_id, {}).pop(version, None)
            self.state.hot.remove(SnapshotId(policy_id, version))
            self.state.relay.forget(SnapshotId(policy_id, version))
            if policy_id in self.state.policies and not self.state.policies[policy_id]:
                del self.state.policies[policy_id]
        if entry is not None:
            self.state.holders.dropped(SnapshotId(policy_id, version), self.state.node_id)
        if self.state.uploads is not None:
            self.state.uploads.cancel(SnapshotId(policy_id, version))
        if entry is not None and entry.file is not None:
            self.state.disk.remove(entry.file)

    def remove_durable(self, sid: SnapshotId) -> None:
        """Take ``sid`` out of the durable tier: a tombstone first (never listed, served or written again), then its
        marker and data, in the upload queue's background (the tier may be what failed)."""
        if self.state.uploads is not None:
            self.state.uploads.tombstone(sid)

    def lost_file(self, entry: Entry, file: SpillFile, exc: CorruptSnapshotError) -> None:
        """``file`` failed a read (and was quarantined if damaged): this node no longer counts it as a copy."""
        with self.state.lock:
            if entry.file == file:
                entry.file = None
                entry.spill_error = str(exc)

    def verify(self, policy_id: str, version: int | None = None) -> VerifyReport:
        """Re-check the recorded checksum on this node's copies (memory, disk) and the durable tier's.

        A corrupt hot copy is dropped (``healed``), so the next get restores the verified disk copy (readers that
        already hold views keep what they have; the client that called verify drops its own). A damaged spill file
        is quarantined and written again from the good hot copy, or (``healed``) replaced from another good copy
        by the next get. A durable tier that does not answer in ``durable_timeout_s`` is reported, not waited for.
        """
        started = time.monotonic()
        info: CatalogEntry = self.state.ask("lookup", policy_id, version)
        sid = info.id
        with self.state.lock:
            entry = self.state.policies.get(policy_id, {}).get(sid.version)
            hot = self.state.hot.get(sid) if entry is not None else None
            file = entry.file if entry is not None else None
        found: dict[str, bool | None] = {"hot": None, "disk": None, "durable": None}
        problems = []
        checks = []
        if hot is not None:
            checks.append(
                ("hot", lambda: open_shared(remote.get(hot.refs[0], self.state.config.call_timeout_s,
                                                       f"this store's copy of {sid}"), strict=False),
                 f"{sid} (shared-memory copy)"))
        expect = Expected(*sid, info.summary.checksum)
        if file is not None:
            checks.append(("disk", lambda: self.state.disk.read(file, f"{sid} (disk copy)", expect=expect), None))
        if self.state.uploads is not None:
            def durable() -> np.ndarray:  # what the client's deadline leaves once the other copies are checked
                return self.state.uploads.call(lambda: self.state.durable.read(sid, expect), f"read {sid}",
                                         self.state.durable_deadline(started, self.state.hot.capacity_bytes))

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
            with self.state.lock:
                self.state.hot.remove(sid)
                healed = found["disk"] is True or found["durable"] is True
                if not healed and entry is not None:
                    entry.corrupt = problems[0]
        if found["disk"] is False and entry is not None and file is not None:
            self.lost_file(entry, file, failed["disk"])
            healed = healed or found["durable"] is True or found["hot"] is True
            if found["hot"] is True:
                with self.state.lock:
                    if entry.pending is None and self.state.policies.get(policy_id, {}).get(sid.version) is entry:
                        entry.pending = self.writer.submit(self.spill, sid, entry, hot.refs[0])
        return VerifyReport(sid, found["hot"], found["disk"], found["durable"], tuple(problems), healed)
