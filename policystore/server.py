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
this store's doorbell, hosted in its own process as coroutines (``hosting.py``), so none of them holds a thread
of the store. A publish
arrives as a staging file in /dev/shm that the publisher packed straight into; the store maps it, copies it
once into the object store and removes it.

The store holds bytes and names only: it never imports torch.

Each job has its own class and file, all sharing one ``StoreState`` (this node's copies under one lock): ``Tiers``
(spills, eviction, the durable tier, verify), ``CatalogFollower`` (following the catalog, reconcile),
``Publisher`` (publishes) and ``Fetcher`` (reads, restores, fetches from peers, serving peers). This class is the
Ray actor: it wires them together and keeps the remote methods.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import numpy as np
import ray

from . import leftovers, memory, remote
from .config import StoreConfig
from .ids import SnapshotId
from .remote import WATCH_GROUP, store_name
from .store_fetch import Fetcher
from .store_follow import CatalogFollower
from .store_publish import Publisher
from .store_state import StoreState
from .store_tiers import RETRY_INTERVAL_S, Tiers
from .transfer import Relay, Route
from .watch import Doorbell
from .wire import (
    DURABLE,
    CatalogEntry,
    Holdings,
    HotSnapshot,
    Ring,
    SnapshotInfo,
    StoreEvents,
    StoreStats,
    VerifyReport,
)

log = logging.getLogger(__name__)


class StoreServer:
    """Run as a Ray actor (see ``client.connect``); every public method is a remote call."""

    def __init__(self, config: StoreConfig, node_id: str):
        memory.return_big_frees_to_the_os()  # a store lives long and copies big buffers on many threads
        self.config = config
        self.node_id = node_id
        self.state = state = StoreState(config, node_id)
        # ended sessions' default spill folders on this node go (leftovers.py), off the start's path
        threading.Thread(target=leftovers.sweep, args=(ray.get_runtime_context().get_session_name(),),
                         name="policystore-sweep", daemon=True).start()
        self.tiers = Tiers(state)
        state.uploads = self.tiers.open_uploads()
        self.follower = CatalogFollower(state, self.tiers)
        self.publisher = Publisher(state, self.tiers, self.follower)
        self.fetcher = Fetcher(state, self.tiers, self.follower, self.publisher)
        # other nodes fetch from here
        state.relay = Relay(ray.util.get_node_ip_address(), self.fetcher.whole_copy,
                            on_served=lambda: state.count("served"))
        self.follower.start()
        self.bell = Doorbell()  # where the node's readers wait (coroutines: ``hosting.py``), rung from here
        threading.Thread(target=self._ring_doorbell, name="policystore-doorbell", daemon=True).start()
        threading.Thread(target=self._every_few_seconds, name="policystore-periodic", daemon=True).start()
        log.info("policystore on node %s: %d snapshots on %s, hot capacity %d bytes",
                 node_id, sum(map(len, state.policies.values())), state.disk.root, state.hot.capacity_bytes)

    @ray.method(concurrency_group=WATCH_GROUP)
    def holdings(self) -> Holdings:
        """What this node holds, and the highest version of each policy it has seen handed out, for a catalog that
        starts with a new database: it asks every live store before it hands out a version. Served beside the
        readers' long polls, so it never waits behind calls queued on the rebuilding catalog."""
        return self.follower.holdings()

    @ray.method(concurrency_group=WATCH_GROUP)  # called by every follower: see watch.py
    def watch(self, since: int, timeout_s: float, used: Sequence[SnapshotId] = (), follows: Sequence[str] = (),
              adopt: Sequence[str] = ()) -> StoreEvents:
        """The node's league changes after event ``since`` (waiting at most ``timeout_s`` for one; followers pass
        0 and wait on the doorbell, ``bell_wait``, instead), for readers.

        ``used``: the pushed snapshots the reader opened since its last call, marked recently used here (a read of
        a pushed ref never calls the store, so this is how its reads keep the LRU order honest). ``follows``: the
        policies whose new hot snapshots the reader gets with their refs; ``adopt``: those followed since its
        last call (their newest hot snapshot comes now)."""
        self._used(used)
        return self.state.feed.watch(since, min(float(timeout_s), 60.0), follows, adopt)

    def _used(self, used: Sequence[SnapshotId]) -> None:
        with self.state.lock:
            for sid in used:
                self.state.hot.get(SnapshotId(*sid))

    def publish(self, policy_id: str, buf: np.ndarray, durable: bool = False) -> SnapshotId:
        """Publish a packed snapshot passed by value (a publisher on another node, or without /dev/shm)."""
        return self.publisher.publish(policy_id, buf, durable)

    def publish_staged(self, policy_id: str, path: str, nbytes: int, durable: bool = False, hand_back: bool = False
                       ) -> SnapshotId | HotSnapshot:
        """Publish the snapshot a publisher on this node packed into the first ``nbytes`` of its staging file (the
        file stays: the publisher packs its next snapshot into the same pages). Returns its id, or, ``hand_back``,
        the new snapshot with its ref (if it is still hot), so that a publisher that reads the policy reads its
        own write with no further call (one that only publishes does not borrow it)."""
        return self.publisher.publish_staged(policy_id, path, nbytes, durable, hand_back)

    def resolve(self, policy_id: str, version: int | None = None) -> HotSnapshot:
        """This node's copy (latest version by default): restored from disk or fetched from another node first if
        needed. The ref travels inside a list so Ray hands it over instead of fetching the bytes into this reply.
        """
        return self.fetcher.resolve(policy_id, version)

    def route(self, policy_id: str, version: int, requester: str, force: bool = False) -> Route:
        """Where another node's store (``requester``) gets its copy of a snapshot: from this node, or from the node
        named instead (``transfer.Relay.route``)."""
        return self.fetcher.route(policy_id, version, requester, force)

    def list(self, policy_id: str | None = None, limit: int | None = None,
             after: SnapshotId | None = None) -> list[SnapshotInfo]:
        """The catalog's entries (one page of them with ``limit``/``after``: ``CatalogServer.list``) with where this
        node holds each."""
        entries: list[CatalogEntry] = self.state.ask("list", policy_id, limit, after)
        rows = []
        with self.state.lock:
            for e in entries:
                local = self.state.policies.get(e.id.policy_id, {}).get(e.id.version)
                file = local.file if local is not None else None
                rows.append(SnapshotInfo(
                    id=e.id,
                    summary=e.summary,
                    tier="hot" if e.id in self.state.hot else "disk" if local is not None else "remote" if e.holders
                    else "lost",
                    on_disk=file is not None,
                    file_bytes=file.file_bytes if file is not None else 0,
                    compressed=bool(file and file.compressed),
                    holders=e.holders,
                    error=(local.corrupt or local.spill_error) if local is not None else None if e.holders else
                    "lost: no node and no durable tier holds a copy (a store died before it was spilled)",
                ))
        return rows

    def stats(self) -> StoreStats:
        watchers = self.bell.waiters()
        with self.state.lock:
            entries = [e for _, e in self.state.items_locked()]
            return StoreStats(
                node_id=self.node_id,
                spill_dir=str(self.state.disk.root),
                durable_uri=self.config.durable_uri,
                **self.state.gauges_locked(),
                hot_capacity_bytes=self.state.hot.capacity_bytes,
                snapshots=len(entries),
                pending_spills=sum(e.pending is not None for e in entries),
                watchers=watchers,
                quarantined=tuple(self.state.disk.quarantined()),
                durable_failures=self.state.uploads.failures if self.state.uploads is not None else 0,
                durable_error=self.state.uploads.last_error if self.state.uploads is not None else None,
                served=self.state.counters["served"],
                served_max_per_snapshot=self.state.relay.served_most(),
                unspilled=tuple(str(sid) for sid, _ in self.tiers.unspilled_locked()),
                **{k: self.state.counters[k] for k in (
                    "hits", "misses", "evictions", "restores", "fetches", "publishes", "spill_errors", "corrupt_reads"
                )},
            )

    def store_config(self) -> StoreConfig:
        return self.config

    def delete(self, policy_id: str, version: int | None = None) -> list[SnapshotId]:
        """Delete one version, or every version when ``version`` is None, on every node. Versions are never reused."""
        queued = self.state.uploads is not None  # the tombstones are queued below (recorded on disk)
        removed: list[CatalogEntry] = self.state.ask("delete", policy_id, version, tombstones_queued=queued)
        peers = []
        for entry in removed:
            sid = entry.id
            self.tiers.forget(*sid)
            self.state.feed.deleted(sid)
            self.tiers.remove_durable(sid)  # whether or not it got there yet: an upload may be on its way
            for holder in entry.holders:  # a node whose store is gone has lost its copies with it
                if holder in (DURABLE, self.node_id):
                    continue
                peer = remote.running(store_name(holder, self.state.league))
                if peer is not None:
                    peers.append(remote.send(peer, "forget", *sid))
        if removed:
            self.state.feed.set_latest(policy_id, self.follower.latest_of(policy_id))
        ray.wait(peers, num_returns=len(peers), timeout=30)
        if self.state.uploads is not None and not self.state.uploads.settled([e.id for e in removed]):
            log.error("the durable tier %s has not taken the tombstones of %s yet (retrying in the background; a "
                      "catalog rebuilt from it before then would list them): %s", self.state.durable.uri,
                      [str(e.id) for e in removed], self.state.uploads.last_error)
        return [e.id for e in removed]

    def forget(self, policy_id: str, version: int) -> None:
        """Drop this node's copies of one snapshot (memory and disk) and its queued spill and upload."""
        self.tiers.forget(policy_id, version)

    def verify(self, policy_id: str, version: int | None = None) -> VerifyReport:
        """Re-check the recorded checksum on this node's copies (memory, disk) and the durable tier's.

        A corrupt hot copy is dropped (``healed``), so the next get restores the verified disk copy (readers that
        already hold views keep what they have; the client that called verify drops its own). A damaged spill file
        is quarantined and written again from the good hot copy, or (``healed``) replaced from another good copy
        by the next get. A durable tier that does not answer in ``durable_timeout_s`` is reported, not waited for.
        """
        return self.tiers.verify(policy_id, version)

    def flush(self, used: Sequence[SnapshotId] = ()) -> int:
        """Wait until every background spill (and the startup reconcile) has finished and the holder changes queued
        so far have reached the catalog; returns how many spills.
        ``used``: pushed snapshots the caller opened and has not told yet (see ``watch``)."""
        self._used(used)
        self.follower.reconciled.result()
        with self.state.lock:
            pending = [e.pending for _, e in self.state.items_locked() if e.pending is not None]
        for future in pending:
            future.result()
        for future in self.tiers.retry_spills():  # space may be back: one more try before saying what is at risk
            future.result()
        self.state.holders.flush(self.config.call_timeout_s)
        self.tiers.check_spilled()
        return len(pending)

    def _every_few_seconds(self) -> None:
        """Export the tiers' sizes and the durable backlog (Ray's metrics agent scrapes on its own interval), and
        let go of the staging files of publishers that are gone (their pages stay allocated while this store maps
        them)."""
        reported_failures = 0
        while True:
            self.publisher.staging.sweep()
            self.tiers.retry_spills()
            with self.state.lock:
                gauges = self.state.gauges_locked()
            self.state.metrics.set_gauges(**gauges)
            failures = self.state.uploads.failures if self.state.uploads is not None else 0
            if failures > reported_failures:
                self.state.metrics.count("durable_failures", failures - reported_failures)
                reported_failures = failures
            time.sleep(RETRY_INTERVAL_S)

    def _ring_doorbell(self) -> None:
        """Tell the doorbell every change of the feed (news, a newer ``as_of``), in order, from this one thread."""
        last: Ring | None = None
        while True:
            last = self.state.feed.next_ring(last, self.config.poll_s)
            self.bell.ring(last)
