"""The user-facing handle: ``connect()`` finds (or starts) this node's store and returns a ``PolicyStore``.

Reads are served from what the node's store pushes (``watch.py``) whenever that is fresh: ``get(pid)`` of the
latest version is a dict lookup, and a get of a new version of a policy this process has opened before is one
``ray.get`` of a ref it already holds. Otherwise (a policy it never opened, push stale, store restarting, a
version not hot) a get asks the store: one round trip (no catalog call when the node holds the snapshot).
What this process keeps across calls (clients, snapshots, pushed refs, versions seen) is its ``session.Session``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import ray

from . import remote
from .config import DEFAULT_LEAGUE, StoreConfig, check_durable, check_league
from .errors import (
    ConfigError,
    CorruptSnapshotError,
    DeadlineExceededError,
    SnapshotLostError,
    StoreUnavailableError,
    UnknownVersionError,
)
from .format import pack
from .hot import check_fits
from .ids import SnapshotId, check_policy_id, checked_target
from .latest import read_latest
from .protect import follow_generation, open_shared
from .remote import catalog_name, store_name
from .session import Session, clear_cache, current_session, ensure_ray, session_key
from .staging import StagingFile
from .watch import Pushed, PushState
from .wire import CatalogEntry, HotSnapshot, SnapshotInfo, StoreStats, VerifyReport

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .snapshot import Snapshot

log = logging.getLogger(__name__)

# ray.shutdown() unmaps the object store: pages protected in one Ray session are never unprotected in another
follow_generation(remote.session_name)

# A store that dies is restarted by Ray and rebuilds from disk; reads retry across that for this long. It is also
# what a handle allows a store it just created for its start (a process and torch's import: seconds on a busy node).
RETRY_TIMEOUT_S = 60.0


# the namespace Ray gives a job that names none: a random UUID
_ANONYMOUS = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def job_league() -> str:
    """The league a job uses when it names none: its Ray namespace if it named one, else the default league.

    Ray gives a job that names no namespace an anonymous one (a random UUID) that no other job can name; such jobs
    share the cluster's default league, as every job did before leagues existed (the CLI and scripts run beside a
    job find it there)."""
    ensure_ray()
    namespace = ray.get_runtime_context().namespace
    if not namespace or _ANONYMOUS.fullmatch(namespace):
        return DEFAULT_LEAGUE
    try:
        return check_league(namespace)
    except ConfigError:
        raise ConfigError(f"the job's Ray namespace {namespace!r} cannot name a league: pass "
                          "connect(league=...) or StoreConfig(league=...)") from None


def _league(config: StoreConfig | None, league: str | None) -> tuple[StoreConfig | None, str]:
    """The league to use and ``config`` bound to it (``league=`` and ``config.league`` must agree)."""
    if league is not None:
        check_league(league)
    if config is not None and not isinstance(config, StoreConfig):
        raise ConfigError(f"connect() takes a StoreConfig, got {type(config).__name__}")
    named = config.league if config is not None else None
    if league is not None and named is not None and league != named:
        raise ConfigError(f"connect(league={league!r}) disagrees with StoreConfig(league={named!r})")
    league = league or named or job_league()
    return (dataclasses.replace(config, league=league) if config is not None else None), league


def connect(config: StoreConfig | None = None, *, node_id: str | None = None, league: str | None = None
            ) -> PolicyStore:
    """This node's store of ``league`` (``node_id`` for another node's), started if missing.

    Starts a local Ray if none is running, and the league's catalog if it is missing. ``league`` (or
    ``config.league``) scopes every id: None is the job's Ray namespace if it named one, else the cluster's default
    league (see ``job_league``). The store is a named, detached actor pinned to its node, taking no CPU slot;
    concurrent ``connect()`` calls from many workers find the same one (creation is atomic in Ray's GCS). The
    first ``config`` given in a league becomes the league's: stores started later on any node (by a bare
    ``connect()`` in a worker) use it. Passing a different one to a running store is an error.
    """
    config, league = _league(config, league)
    session = current_session(league)
    node_id = node_id or ray.get_runtime_context().get_node_id()
    with session.lock:
        client = session.clients.get(node_id)
    if client is None or not client._current():
        client = PolicyStore(node_id, config, league=league)
        with session.lock:
            session.clients[node_id] = client
    if config is not None and client.config != config:
        raise ConfigError(
            f"the store on node {node_id} already runs with {client.config}; connect() was given {config}"
        )
    return client


def connect_all(config: StoreConfig | None = None, *, league: str | None = None) -> dict[str, PolicyStore]:
    """A store on every alive node (nodes that joined since the last call get theirs now), by node id."""
    ensure_ray()
    return {n["NodeID"]: connect(config, node_id=n["NodeID"], league=league) for n in ray.nodes() if n["Alive"]}


def _catalog_actor(config: StoreConfig) -> ray.actor.ActorHandle:
    """The league's catalog: found by name, or created with ``config`` as the league's store settings."""
    found = remote.running(catalog_name(config.league))
    if found is not None:
        return found
    from . import launch  # only when one is missing: a reader never loads the catalog's code

    return launch.catalog(config)


def _store_actor(node_id: str, config: StoreConfig | None, league: str) -> ray.actor.ActorHandle:
    """The node's store actor of ``league``: found by name, or created (atomically, in Ray's GCS) with ``config``
    (None: the league's settings, kept by its catalog)."""
    catalog = _catalog_actor(config or StoreConfig(league=league))
    found = remote.running(store_name(node_id, league))
    if found is not None:
        return found
    if config is None:
        config = remote.call(catalog, "store_config", timeout_s=StoreConfig().call_timeout_s)
    from . import launch  # only when one is missing: a reader never loads the store's code

    return launch.store(node_id, config)


class PolicyStore:
    """Handle on one node's store. Thread-safe; get one per process with ``connect()``."""

    def __init__(self, node_id: str, config: StoreConfig | None, *, league: str = DEFAULT_LEAGUE):
        self.node_id = node_id
        self.league = league
        self._asked = config
        self.config: StoreConfig = config or StoreConfig(league=league)  # the running store's, once bound
        self._local = False
        self._bind()

    def _bind(self) -> None:
        """Attach to the current Ray session's store (again, if Ray was restarted since this handle was made: a
        handle on its own node's store then follows the new session's node)."""
        self._session = current_session(self.league)
        if self._local:
            self.node_id = ray.get_runtime_context().get_node_id()
        self._actor = _store_actor(self.node_id, self._asked, self.league)
        self._catalog = remote.find(catalog_name(self.league))
        starting = max(self.config.call_timeout_s, RETRY_TIMEOUT_S)  # the store may have just been created
        self.config = self._call("store_config", timeout_s=starting)
        self._hot_capacity = self._call("stats", timeout_s=starting).hot_capacity_bytes
        self._local = self.node_id == ray.get_runtime_context().get_node_id()
        # Same node, same monotonic clock: only a local store's push can be checked for staleness.
        self._follower = self._session.follower(self.node_id, self.config) if self._local else None

    def _current(self) -> bool:
        """Whether the node's store is still the actor this handle talks to (not stopped and replaced since)."""
        return remote.running(store_name(self.node_id, self.league)) == self._actor

    def _live(self) -> Session:
        session = self._session
        if session.closed or not ray.is_initialized() or session.key != session_key():
            self._bind()
        return self._session

    def _call(self, method: str, *args: Any, on_catalog: bool = False, idempotent: bool = True,
              timeout_s: float | None = None) -> Any:
        """Run ``method`` on the store's actor (on the catalog's, ``on_catalog``) within ``timeout_s`` (default
        ``config.call_timeout_s``), riding out a restart (Ray restarts it; it rebuilds from disk) for reads.
        Writes are not retried: whether a publish landed must be visible."""
        return remote.call(self._find_catalog if on_catalog else self._find_store, method, *args,
                           timeout_s=timeout_s or self.config.call_timeout_s,
                           retry_s=RETRY_TIMEOUT_S if idempotent else 0.0)

    def _find_store(self, again: bool) -> ray.actor.ActorHandle:
        """The store's actor; ``again``: it was stopped for good, find or start its successor."""
        if again:
            self._actor = _store_actor(self.node_id, self.config, self.league)
            self._catalog = remote.find(catalog_name(self.league))
        return self._actor

    def _find_catalog(self, again: bool) -> ray.actor.ActorHandle:
        if again:
            self._find_store(True)
        return self._catalog

    # ---- publish -------------------------------------------------------------------------------------------
    def publish(
        self,
        policy_id: str,
        weights: Mapping[str, torch.Tensor | np.ndarray],
        meta: Mapping[str, Any] | None = None,
        *,
        durable: bool = False,
    ) -> SnapshotId:
        """Store a new version of ``policy_id``; returns its id. Tensors on a GPU are copied to the host once.

        ``durable=True`` returns only once the snapshot is on disk (fsync'd, and in the durable tier if one is
        configured); otherwise it is written in the background and served from memory right away. This process
        reads its own write at once: ``get(policy_id)`` returns at least this version.
        """
        check_policy_id(policy_id)
        check_durable(durable)
        session = self._live()
        before = session.seen.get(policy_id, 0)  # seen before this publish began: its version must be higher
        sid, staging = None, session.staging() if self._local else None
        # the staging file is busy until the store has copied it: another publish of this process (a durable one
        # may wait for its tier) never makes this one wait, it goes by value instead
        try:
            if staging is not None and staging.lock.acquire(blocking=False):
                try:
                    sid = self._publish_staged(session, staging, policy_id, weights, meta, durable)
                finally:
                    staging.lock.release()
            if sid is None:  # another node's store, no /dev/shm, or /dev/shm full: the snapshot travels by value
                alloc = self._sized(policy_id, functools.partial(np.empty, dtype=np.uint8))
                buf = pack(weights, policy_id=policy_id, meta=meta, alloc=alloc)
                sid = self._call("publish", policy_id, buf, durable, idempotent=False,
                                 timeout_s=self.config.publish_timeout_s(len(buf)))
        except DeadlineExceededError as exc:  # the store got the publish and may still commit it (seen: after a
            raise DeadlineExceededError(       # network partition heals, every such publish landed)
                f"{exc}. The publish of {policy_id!r} may still commit after this error: list({policy_id!r}) "
                "shows whether it did; publishing again adds another version") from exc.__cause__
        if isinstance(sid, HotSnapshot):  # the store handed back its ref: this process reads it with no call
            hot, sid = sid, sid.id
            if self._follower is not None:
                self._follower.own(sid, hot.refs[0], hot.header)
        if sid.version <= before:  # versions never repeat within one catalog (another thread's publish, in
            session.renumbered(epoch="")  # flight meanwhile, may well have got a lower one)
        session.saw(sid)
        return sid

    def _publish_staged(self, session: Session, staging: StagingFile, policy_id: str,
                        weights: Mapping[str, torch.Tensor | np.ndarray], meta: Mapping[str, Any] | None,
                        durable: bool) -> SnapshotId | HotSnapshot | None:
        """Pack into this process's staging file and hand its name to the store (None: /dev/shm is full, publish
        by value). A publish that fails after the hand-over retires the file: the store may still be reading it."""
        try:
            nbytes = len(pack(weights, policy_id=policy_id, meta=meta, alloc=self._sized(policy_id, staging.alloc)))
        except OSError as exc:
            log.warning("policystore: staging in %s failed (%s); publishing by value", staging.path, exc)
            session.retire(staging)
            return None
        try:
            reads = self._follower is not None and self._follower.reads(policy_id)
            return self._call("publish_staged", policy_id, str(staging.path), nbytes, durable, reads,
                              idempotent=False, timeout_s=self.config.publish_timeout_s(nbytes))
        except BaseException:
            session.retire(staging)
            raise

    def _sized(self, policy_id: str, alloc: Callable[[int], np.ndarray]) -> Callable[[int], np.ndarray]:
        """``alloc`` for ``pack`` that refuses a snapshot larger than the hot tier before any memory (or staging
        file) is grown for it."""
        def checked(nbytes: int) -> np.ndarray:
            check_fits(nbytes, self._hot_capacity, f"snapshot of {policy_id!r}")
            return alloc(nbytes)

        return checked

    # ---- read ----------------------------------------------------------------------------------------------
    def get(self, policy_id: str, version: int | None = None) -> Snapshot:
        """The snapshot (latest version by default) as zero-copy read-only views; restored from disk, or fetched
        from another node, if this node's store does not hold it in memory.

        "Latest" is at most ``StoreConfig.max_staleness_s`` old (never older than this process's own publishes,
        and never older than a version this process already got, unless that version was deleted or no copy of it
        is left: then the newest readable one).
        """
        policy_id, version = checked_target(policy_id, version)
        session = self._live()
        if version is not None:
            return self._get_version(session, SnapshotId(policy_id, version))
        return read_latest(policy_id, session.latest(policy_id, self._follower),
                           lambda heard: self._get_version(session, SnapshotId(policy_id, heard)),
                           lambda: self._resolve(session, policy_id, None), "the store")

    def _get_version(self, session: Session, sid: SnapshotId) -> Snapshot:
        """One version: held by this process, pushed to it, or asked of the store."""
        snap = session.snapshots.get(sid)
        if snap is not None:
            return snap
        pushed = self._follower.hot(sid) if self._follower is not None else None
        if pushed is not None and sid not in session.deleted:
            snap = self._open_pushed(session, sid, pushed)
            if snap is not None:
                return snap
        return self._resolve(session, sid.policy_id, sid.version)

    def _map(self, ref: ray.ObjectRef, sid: SnapshotId) -> np.ndarray:
        """The read-only bytes of a snapshot's object on this node: a local map. One that has not arrived within
        ``call_timeout_s`` never will (seen: a pushed ref whose get waited forever): DeadlineExceededError, and
        StoreUnavailableError for an object gone with its store."""
        return open_shared(remote.get(ref, self.config.call_timeout_s, f"the store's copy of {sid}"), what=str(sid))

    def _open_pushed(self, session: Session, sid: SnapshotId, pushed: Pushed) -> Snapshot | None:
        """A snapshot the push handed this process: mapped ahead already, or one ``ray.get`` of its ref; no call to
        the store."""
        from .snapshot import Snapshot

        if pushed.snapshot is not None:
            self._follower.used(sid)
            return session.keep(pushed.snapshot)
        try:
            buffer = self._map(pushed.ref, sid)
        except StoreUnavailableError as exc:  # the store restarted (the push brings its new refs), or the ref is stuck
            if isinstance(exc, DeadlineExceededError):
                log.warning("policystore: the pushed copy of %s did not arrive within %.0f s; asking the store",
                            sid, self.config.call_timeout_s)
            self._follower.drop(sid)
            return None
        self._follower.used(sid)  # told to the store with the next long poll, for its LRU order
        return session.keep(Snapshot(sid, buffer, pushed.ref, pushed.header))

    def _resolve(self, session: Session, policy_id: str, version: int | None) -> Snapshot:
        """Ask the store (one round trip): it restores or fetches the snapshot first if it is not hot."""
        from .snapshot import Snapshot

        deadline = time.monotonic() + RETRY_TIMEOUT_S
        while True:
            hot: HotSnapshot = self._call("resolve", policy_id, version, timeout_s=self._long_timeout_s())
            sid = hot.id
            floor = session.seen.get(policy_id, 0)
            if version is None and sid.version < floor:  # that store is behind this process: ask for what we saw
                try:
                    return self._resolve(session, policy_id, floor)
                except (UnknownVersionError, SnapshotLostError):  # deleted, or no copy serves it: the store's
                    session.lower(policy_id, floor, sid.version)     # answer is the latest readable after all
            if version is None:
                session.saw(sid)
            snap = session.snapshots.get(sid)
            if snap is not None and snap.header_bytes == hot.header:  # else another catalog's snapshot of that name
                return snap
            try:
                buffer = self._map(hot.refs[0], sid)
            except StoreUnavailableError as exc:  # the store restarted between resolve and get (its old objects
                if time.monotonic() > deadline:  # died with it)
                    raise type(exc)(f"{sid}: the store's copy did not reach this process within "
                                    f"{RETRY_TIMEOUT_S:.0f} s ({type(exc.__cause__).__name__})") from exc
                continue
            if self._follower is not None:  # from now on its new versions are pushed to this process
                self._follower.used(sid)
            return session.keep(Snapshot(sid, buffer, hot.refs[0]))

    def load_module(self, policy_id: str, build: Callable[[], nn.Module], version: int | None = None) -> nn.Module:
        """An eval-mode module whose parameters and buffers ARE the snapshot's shared views.

        ``build`` runs on the meta device, so the module costs no parameter memory of its own; writes into it,
        and rebinding its tensors (``.half()``, ``.to(dtype)``, ``.data =``), raise ReadOnlyWeightsError: take a
        private copy (``copy.deepcopy(module)``) to change or convert it. Each module has tensor objects of its own.
        """
        from .modules import build_on_views

        snap = self.get(policy_id, version)
        self._session.builders[policy_id] = build  # its next pushed version's module is built ahead with it
        ahead = self._follower.take_ahead(snap.id) if self._follower is not None else None
        if ahead is not None and ahead[0] is build:
            module = ahead[1]
        else:
            module = build_on_views(build, snap._buffer, snap._header, str(snap.id))
        module.policystore_snapshot = snap  # the module's provenance, and keeps the snapshot cached
        return module

    def latest_version(self, policy_id: str) -> int:
        """The newest committed version of ``policy_id`` (within ``max_staleness_s``, never below one this process
        published or got)."""
        check_policy_id(policy_id)
        session = self._live()
        version = session.latest(policy_id, self._follower)
        if version is None:
            entry: CatalogEntry = self._call("lookup", policy_id, on_catalog=True)
            session.saw(entry.id)
            version = max(entry.version, session.seen.get(policy_id, 0))
        return version

    def push_state(self) -> PushState:
        """What the node's store has pushed to this process (for tests, debugging and operations)."""
        self._live()
        if self._follower is None:
            return PushState(False, False, float("inf"), {}, ())
        return self._follower.state()

    # ---- listing and maintenance ---------------------------------------------------------------------------
    def list(self, policy_id: str | None = None, *, limit: int | None = None,
             after: SnapshotId | tuple[str, int] | None = None) -> list[SnapshotInfo]:
        """Every snapshot in the cluster (or of one policy), by policy then version, with where this node holds it.

        Paged for big leagues: at most ``limit`` rows, those after the snapshot id ``after``; pass the last row's id
        as ``after`` to get the next page (an empty page is the end). Without them, everything."""
        if policy_id is not None:
            check_policy_id(policy_id)
        self._live()
        return self._call("list", policy_id, limit, after)

    def stats(self) -> StoreStats:
        """This node's tiers and counters."""
        self._live()
        return self._call("stats")

    def delete(self, policy_id: str, version: int | None = None) -> list[SnapshotId]:
        """Delete one version, or all versions of ``policy_id``, on every node. Views already held stay valid."""
        checked_target(policy_id, version)
        session = self._live()
        deleted = self._call("delete", policy_id, version, idempotent=False)
        for sid in deleted:
            session.drop(sid, deleted=True)
        return deleted

    def verify(self, policy_id: str, version: int | None = None) -> VerifyReport:
        """Re-check the checksum recorded at publish on this node's copies and the durable tier's; raise
        CorruptSnapshotError if one fails (a durable tier that does not answer is only reported, in ``problems``).

        Catches what the write guard cannot (raw writes through ``untyped_storage()``/``data_ptr()``). A corrupt
        shared-memory copy is dropped by the store and by this process, so the next get here serves the verified
        disk copy (other processes keep the views they hold until they let go).
        """
        checked_target(policy_id, version)
        session = self._live()
        report: VerifyReport = self._call("verify", policy_id, version, timeout_s=self._long_timeout_s())
        if False in (report.hot, report.disk, report.durable):
            if report.hot is False:
                session.drop(report.id)
            raise CorruptSnapshotError("; ".join(report.problems))
        return report

    def flush(self) -> None:
        """Wait until every snapshot published so far is on disk, and the store knows of every read so far (reads
        of pushed snapshots reach its LRU order with the next long poll, a fraction of a second later, or now).
        SpillFailedError, naming them, while acknowledged snapshots are only in memory (their spill failed: a full
        disk; the store retries until they land)."""
        self._live()
        self._call("flush", self._follower.take_used() if self._follower is not None else (),
                   timeout_s=self._long_timeout_s())

    def _long_timeout_s(self) -> float:
        """The deadline of calls that may move up to a hot tier's worth of bytes (a ``get`` may restore or fetch a
        snapshot, ``verify`` reads every copy of one, ``flush`` waits for every pending spill): that of a publish of
        the whole hot tier. What the store asks the catalog meanwhile has the short deadline."""
        return self.config.publish_timeout_s(self._hot_capacity)

    def drop_cache(self) -> None:
        """Drop this process's cached snapshots (``policystore.clear_cache()``)."""
        clear_cache()

    def shutdown(self) -> None:
        """Stop this node's store; see ``policystore.client.shutdown``."""
        shutdown(self.node_id, league=self.league)


def shutdown(node_id: str | None = None, *, league: str | None = None) -> bool:
    """Stop a node's store of ``league`` (None: the job's), whoever started it (what is on disk stays); the next
    ``connect()`` starts a new one.

    For tests and reconfiguration: views other processes hold stay valid, but their handles go stale.
    Returns whether a store was running.
    """
    league = _league(None, league)[1]
    session = current_session(league)
    node_id = node_id or ray.get_runtime_context().get_node_id()
    with session.lock:
        session.clients.pop(node_id, None)
        follower = session.followers.pop(node_id, None)
        session.snapshots.clear()
    if follower is not None:
        follower.stop()
        follower.join()  # ended before a ray.shutdown() that may follow (Algorithm.stop() ends here)
    return remote.kill(store_name(node_id, league))


def shutdown_all(*, league: str | None = None) -> None:
    """Stop every node's store of ``league`` (None: the job's) and its catalog (files stay on disk)."""
    league = _league(None, league)[1]
    for node in ray.nodes():
        shutdown(node["NodeID"], league=league)
    remote.kill(catalog_name(league))
    current_session(league).renumbered(epoch="")  # the next catalog's first push must not wipe what is got from it
