"""A node store's publishes: a packed snapshot (by value, or in a publisher's staging file) copied once into the
object store and committed in the catalog; a durable one is reserved, written to disk (and the durable tier) and
then committed, so a store killed anywhere before the commit leaves it complete or absent.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import wait as wait_all
from contextlib import ExitStack, contextmanager

import numpy as np
import ray

from . import remote
from .config import check_durable
from .errors import (
    InvalidWeightsError,
)
from .format import (
    META_POLICY,
    head_bytes,
    parse_header,
)
from .hot import check_fits
from .ids import SnapshotId, check_policy_id
from .protect import shareable
from .staging import StagingMaps
from .store_follow import CatalogFollower
from .store_state import FETCH_TIMEOUT_S, Entry, StoreState
from .store_tiers import Tiers
from .wire import (
    DURABLE,
    CatalogEntry,
    HotSnapshot,
    Summary,
)

log = logging.getLogger(__name__)


class Publisher:
    """Publishes snapshots into a node store (see the module's docstring)."""

    def __init__(self, state: StoreState, tiers: Tiers, follower: CatalogFollower):
        self.state = state
        self.tiers = tiers
        self.follower = follower
        self.staging = StagingMaps()
        # Publishes in flight per policy: the catalog may announce a version before this store has recorded its own
        # copy of it; a get of that version waits for the publish instead of looking elsewhere.
        self._publishing: Counter[str] = Counter()
        self._landed = threading.Condition(state.lock)

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
        sid = self._publish(policy_id, self.staging.view(path, nbytes), durable)
        if not hand_back:
            return sid
        with self.state.lock:
            return self.state.hot.get(sid) or sid

    def _publish(self, policy_id: str, buf: np.ndarray, durable: bool) -> SnapshotId:
        """Copy ``buf`` into the object store and commit it; durable publishes write their files first.

        Non-durable: one catalog call (``publish``) while the copy is made; a copy that fails takes the version back.
        Durable: ``reserve``, fsync'd files, the copy, then ``commit``. Killed anywhere before the commit, a durable
        version is never visible: complete or absent.
        """
        with self.state.timed("publish_latency"):
            return self._publish_timed(policy_id, buf, durable)

    @contextmanager
    def _landing(self, policy_id: str) -> Iterator[None]:
        """A publish of ``policy_id`` between its catalog commit and recording its copy here: gets of a version
        this store does not know wait for it (and only for that: never while a durable upload is under way)."""
        with self.state.lock:
            self._publishing[policy_id] += 1
        try:
            yield
        finally:
            with self.state.lock:
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
        check_fits(header.nbytes, self.state.hot.capacity_bytes, what)
        with self.state.lock:
            pending = sum(e.header.nbytes for _, e in self.state.items_locked() if e.pending is not None)
            committed = self.state.disk_bytes_locked()
        self.state.disk.check_room(header.nbytes, committed, pending, what)
        self.tiers.make_room(header.nbytes, what)
        entry = Entry(header, durable=durable)
        with ExitStack() as landing:
            if durable:
                # its reconcile aborts this node's reservations left by a killed store
                wait_all([self.follower.started])
                sid = SnapshotId(policy_id, self.state.on_catalog("reserve", policy_id, self.state.node_id))
                self.follower.saw(*sid)
                try:
                    entry.file = self.state.disk.commit(self.state.disk.write_temp(sid, buf, header), sid)
                    ref = ray.put(shareable(buf))  # the store's own copy: it must outlive the publisher

                    def commit() -> None:
                        """The commit point. Gets of this version wait from here until it is recorded below (never
                        while the data object uploads)."""
                        landing.enter_context(self._landing(policy_id))
                        self.state.on_catalog("commit", policy_id, sid.version, self.state.node_id,
                                              Summary.of(header, True))

                    if self.state.uploads is not None:  # the marker after the catalog's commit: it never names an
                        # uncommitted version; the upload runs within the tier's deadline
                        self.state.uploads.call(
                            lambda: self.state.durable.write(sid, buf, header, before_marker=commit),
                                          f"commit {sid}", self.state.durable_deadline(started, header.nbytes))
                    else:
                        commit()
                except BaseException:
                    self._withdraw(sid, entry)
                    raise
                if self.state.durable is not None:
                    self.state.holders.gained(sid, DURABLE)
            else:
                # The catalog commits while the copy is made (two waits overlapped, not added): from the commit on,
                # gets of this version wait (``_landing``) until it is recorded below.
                landing.enter_context(self._landing(policy_id))
                token = uuid.uuid4().hex  # the catalog answers a repeated call with the version this one was given
                committed = self.state.start_on_catalog("publish", policy_id, self.state.node_id,
                                                        Summary.of(header, False), token)
                try:
                    ref = ray.put(shareable(buf))
                except BaseException:
                    self._take_back(committed, entry)
                    raise
                sid = committed().id
                self.follower.saw(*sid)
            with self.state.lock:
                self.state.policies.setdefault(policy_id, {})[sid.version] = entry
                self._landed.notify_all()
                self.state.hot.add(sid, ref, header.nbytes, head_bytes(buf))
                self.state.feed.raise_latest(*sid)
                self.state.count("publishes")
                if not durable:
                    entry.pending = self.tiers.spill_soon(sid, entry, ref)
        self.tiers.evict(protect=sid)
        return sid

    def _take_back(self, committed: Callable[[], CatalogEntry], entry: Entry) -> None:
        """After a non-durable publish's copy failed: withdraw the version its catalog call committed, which would
        be listed without a copy otherwise (the copy's error is what the caller hears)."""
        try:
            sid = committed().id
        except Exception as exc:
            log.error("a publish whose copy failed may stay listed without its copy: the catalog did not answer (%s)",
                      exc)
            return
        self._withdraw(sid, entry)

    def _withdraw(self, sid: SnapshotId, entry: Entry) -> None:
        """After a publish failed (durable, or non-durable with its copy failing after the commit): take the version
        back in the catalog (aborted, or deleted if it was committed), then remove what the publish wrote. If the
        catalog cannot be told, the files stay: the call is queued for it, and the store's next reconcile settles
        them."""
        try:
            self.state.on_catalog("withdraw", *sid, self.state.node_id)
        except Exception as exc:
            log.error("could not withdraw %s after its publish failed (%s): its files stay until the catalog "
                      "answers", sid, exc)
            remote.send(self.state.catalog, "withdraw", *sid, self.state.node_id)
            return
        if entry.file is not None:
            self.state.disk.remove(entry.file)
        self.tiers.remove_durable(sid)

    def own_copy_locked(self, sid: SnapshotId) -> Entry | None:
        """This node's entry for ``sid``; if a publish of that policy is in flight here, the copy it is recording
        (its commit reaches readers through the catalog, possibly before the publish has recorded it here)."""
        def found() -> Entry | None:
            return self.state.policies.get(sid.policy_id, {}).get(sid.version)

        self._landed.wait_for(lambda: found() is not None or not self._publishing[sid.policy_id],
                              timeout=FETCH_TIMEOUT_S)
        return found()
