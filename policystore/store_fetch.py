"""A node store's reads: the hot copy of a snapshot, restored from this node's disk or fetched from other nodes
(``transfer``) or the durable tier when the node has none, once per snapshot however many readers ask at once;
and the copies other nodes' stores fetch from this one.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import Future

import numpy as np
import ray

from . import remote
from .errors import (
    CorruptSnapshotError,
    DurableTierError,
    PolicyStoreError,
    SnapshotLostError,
    brief,
)
from .format import (
    Background,
    Expected,
    Header,
    head_bytes,
    parse_header,
)
from .ids import SnapshotId, checked_id, checked_target
from .latest import read_latest
from .protect import shareable, unwrap
from .remote import store_name
from .snapfile import SpillFile
from .store_follow import CatalogFollower
from .store_publish import Publisher
from .store_state import FETCH_TIMEOUT_S, Entry, StoreState
from .store_tiers import Tiers
from .transfer import Route
from .wire import (
    DURABLE,
    CatalogEntry,
    HotSnapshot,
)

log = logging.getLogger(__name__)

# How long a fetch of a version this store has not heard committed waits for its catalog follower (whose answer
# carries the entry) before it asks the catalog instead.
_HINT_WAIT_S = 0.25


class Fetcher:
    """Serves a node's copies, restoring or fetching them first (see the module's docstring)."""

    def __init__(self, state: StoreState, tiers: Tiers, follower: CatalogFollower, publisher: Publisher):
        self.state = state
        self.tiers = tiers
        self.follower = follower
        self.publisher = publisher
        self._inflight: dict[SnapshotId, Future] = {}  # restores and fetches, one per snapshot

    def resolve(self, policy_id: str, version: int | None = None) -> HotSnapshot:
        """This node's copy (latest version by default): restored from disk or fetched from another node first if
        needed. The ref travels inside a list so Ray hands it over instead of fetching the bytes into this reply.
        """
        with self.state.timed("get_latency"):
            return self._resolve(policy_id, version)

    def _resolve(self, policy_id: str, version: int | None) -> HotSnapshot:
        policy_id, version = checked_target(policy_id, version)
        if version is not None:
            return self.copy_of(SnapshotId(policy_id, version))
        def lookup() -> HotSnapshot:
            info = self.state.ask("lookup", policy_id)
            return self.copy_of(info.id, info)

        return read_latest(policy_id, self.state.feed.latest(policy_id, self.state.config.max_staleness_s),
                           lambda heard: self.copy_of(SnapshotId(policy_id, heard)), lookup, "the catalog")

    def copy_of(self, sid: SnapshotId, info: CatalogEntry | None = None) -> HotSnapshot:
        """This node's hot copy of ``sid``: restored from its spill file, or fetched from another node (``info``:
        the catalog's entry, when the caller just looked it up) if this node has none."""
        with self.state.lock:
            entry = self.publisher.own_copy_locked(sid)
            if entry is not None and entry.corrupt:
                raise CorruptSnapshotError(entry.corrupt)
            hot = self.state.hot.get(sid) if entry is not None else None
            if hot is not None:
                self.state.count("hits")
                return hot
            self.state.count("misses")
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
            with self.state.lock:
                self._inflight.pop(sid, None)
        self.tiers.evict(protect=sid)
        return hot

    def _restore(self, sid: SnapshotId, entry: Entry) -> HotSnapshot:
        """This node's copy back into shared memory from its spill file; if the file is damaged or gone, healed
        from another good copy (another node, the durable tier), which becomes this node's copy."""
        file = entry.file
        damaged: CorruptSnapshotError | None = None
        if file is not None:
            try:
                return self._restore_file(sid, entry, file)
            except CorruptSnapshotError as exc:  # quarantined (damaged) or unreadable: never served from here
                damaged = exc
                self.tiers.lost_file(entry, file, exc)
        try:
            hot = self._fetch(sid, self.state.ask("lookup", *sid))
        except PolicyStoreError as exc:
            if damaged is not None:
                raise CorruptSnapshotError(f"{damaged}; no other good copy: {exc}") from None
            raise SnapshotLostError(f"{sid} is neither in memory nor on this node's disk "
                                    f"({entry.spill_error or 'its file is gone'}); {exc}") from None
        if damaged is not None:
            log.warning("healed %s from another copy after its spill file failed: %s", sid, damaged)
        return hot

    def _restore_file(self, sid: SnapshotId, entry: Entry, file: SpillFile) -> HotSnapshot:
        expect = Expected(*sid, entry.header.checksum)  # checked against the catalog's at startup (reconcile)
        try:  # the checksum runs while the copy into the object store does
            with self.state.timed("restore_latency"):
                hot = self.state.disk.restore(file, str(sid), expect=expect,
                                        put=lambda buf: HotSnapshot(sid, head_bytes(buf), [ray.put(shareable(buf))]))
        except CorruptSnapshotError:
            with self.state.lock:
                self.state.count("corrupt_reads")
            raise
        with self.state.lock:
            if self.state.policies.get(sid.policy_id, {}).get(sid.version) is entry:
                self.state.hot.add(sid, hot.refs[0], entry.header.nbytes, hot.header)
            self.state.count("restores")
        return hot

    def route(self, policy_id: str, version: int, requester: str, force: bool = False) -> Route:
        """Where another node's store (``requester``) gets its copy of a snapshot: from this node, or from the node
        named instead (``transfer.Relay.route``)."""
        return self.state.relay.route(checked_id(policy_id, version), requester, force)

    def whole_copy(self, sid: SnapshotId) -> np.ndarray | None:
        """This node's whole copy of ``sid`` (restored into memory if only on disk) for a peer, or None. A copy
        whose bytes have all landed but that is not recorded yet (its checksum and own copy under way) is waited
        for: the relay no longer serves it as landing, and the peer must not leave for another source."""
        with self.state.lock:
            entry = self.state.policies.get(sid.policy_id, {}).get(sid.version)
            landing = self._inflight.get(sid) if entry is None else None
        if (entry is None and landing is None) or (entry is not None and entry.corrupt):
            return None
        hot = landing.result(FETCH_TIMEOUT_S) if entry is None else self.copy_of(sid)
        return unwrap(remote.get(hot.refs[0], FETCH_TIMEOUT_S, f"this store's copy of {sid}"))

    def _fetch(self, sid: SnapshotId, info: CatalogEntry) -> HotSnapshot:
        """Copy a snapshot this node lacks from a node that holds it (or the durable tier): once per node."""
        problems: list[str] = []
        started = time.monotonic()
        copy = self._from_peers(sid, info, problems)
        if copy is None and self.state.uploads is not None:
            expect = Expected(*sid, info.summary.checksum)
            try:
                buf = self.state.uploads.call(lambda: self.state.durable.read(sid, expect), f"read {sid}",
                                        self.state.durable_deadline(started, self.state.hot.capacity_bytes))
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
        entry = Entry(header, fetched=True)
        with self.state.lock:
            self.state.policies.setdefault(sid.policy_id, {})[sid.version] = entry
            self.state.hot.add(sid, hot.refs[0], header.nbytes, hot.header)
            self.state.count("fetches")
            entry.pending = self.tiers.writer.submit(self.tiers.spill, sid, entry, hot.refs[0])
        self.state.holders.gained(sid, self.state.node_id)
        return hot

    def _fetch_new(self, sid: SnapshotId) -> HotSnapshot:
        """``_fetch`` with the entry the catalog's watch answer carried, when it was for this version: no lookup
        (a version this store has not heard committed yet waits up to ``_HINT_WAIT_S`` for that answer). Only if
        no copy matches the hint (its holders gone since, the snapshot deleted) does the catalog's current entry
        decide, as it would without the hint."""
        def heard() -> bool:  # the commit reached this store, or is not news (the store knew a later version)
            seeded = self.follower.committed.get(sid.policy_id)
            return (seeded is not None and seeded.version >= sid.version) or (
                self.state.feed.latest(sid.policy_id, math.inf) or 0) >= sid.version

        # a reader told of a commit by another route may ask before this store's follower heard it
        with self.state.lock:
            self.follower.heard.wait_for(heard, timeout=_HINT_WAIT_S)
            seeded = self.follower.committed.get(sid.policy_id)
        if seeded is not None and seeded.id == sid:
            try:
                return self._fetch(sid, seeded)
            except PolicyStoreError as exc:
                log.info("fetching %s from the holders at its commit failed (%s); asking the catalog", sid, exc)
        return self._fetch(sid, self.state.ask("lookup", *sid))

    def _from_peers(self, sid: SnapshotId, info: CatalogEntry, problems: list[str]
                    ) -> tuple[HotSnapshot, Header] | None:
        """This node's own copy, streamed from other nodes' stores as a pipeline (``transfer``), or None
        (``problems`` says why)."""
        def ask(node: str, force: bool) -> Route:
            peer = remote.find(store_name(node, self.state.league))
            return remote.call(peer, "route", *sid, self.state.node_id, force,
                               timeout_s=self.state.config.call_timeout_s)

        holders = [h for h in info.holders if h not in (self.state.node_id, DURABLE)]
        buf = self.state.relay.fetch(sid, holders, ask, problems)  # the bytes cross the network here, once
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
