"""What this process keeps per league and Ray session: its store handles, followers, snapshots and the versions
it has seen. The user handle (``client.PolicyStore``) reads and writes through it; a new ``ray.init()`` (another
Ray session, or another cluster) starts from nothing, even while handles from the old session are still around.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ray

from .config import StoreConfig
from .ids import SnapshotId
from .staging import StagingFile
from .watch import Follower

if TYPE_CHECKING:
    from torch import nn

    from .snapshot import Snapshot

log = logging.getLogger(__name__)


class Session:
    """What this process keeps for one league in one Ray session of one cluster; dropped whole when another Ray
    session starts."""

    def __init__(self, key: tuple[str, str], league: str):
        self.key = key
        self.league = league
        self.lock = threading.Lock()
        self.clients: dict[str, Any] = {}  # node id -> its PolicyStore handle
        # Snapshots are immutable, so the process reuses the one it holds: (policy, version) -> Snapshot.
        self.snapshots: weakref.WeakValueDictionary[SnapshotId, Snapshot] = weakref.WeakValueDictionary()
        self.followers: dict[str, Follower] = {}
        self.seen: dict[str, int] = {}  # highest version handed out or published here: never go backwards
        self.deleted: set[SnapshotId] = set()  # never served again from pushed state, whatever arrives late
        # policy -> the build callable its last load_module passed: a pushed new version's module is built ahead
        self.builders: dict[str, Callable[[], nn.Module]] = {}
        self.catalog_epoch = ""
        self.closed = False
        self._staging: StagingFile | None = None
        self._staging_failed = False

    def staging(self) -> StagingFile | None:
        """This process's staging file (made on first use; None: /dev/shm unusable, publish by value)."""
        with self.lock:
            if self._staging is None and not self._staging_failed:
                self._staging = StagingFile.create()
                self._staging_failed = self._staging is None
            return self._staging

    def retire(self, staging: StagingFile) -> None:
        """Never pack into ``staging`` again (the next publish makes a new file)."""
        with self.lock:
            if self._staging is staging:
                self._staging = None
        staging.remove()

    def follower(self, node_id: str, config: StoreConfig) -> Follower:
        with self.lock:
            follower = self.followers.get(node_id)
            if follower is None:
                on_deleted = functools.partial(self.drop, deleted=True)
                follower = self.followers[node_id] = Follower(node_id, config, on_deleted, self.catalog,
                                                              ready=self._build_ahead, held=self.snapshots.get)
            return follower

    def _build_ahead(self, snap: Snapshot) -> tuple[Callable[[], nn.Module], nn.Module] | None:
        """On a follower's thread, as a pushed snapshot lands: the module ``load_module`` will hand out for it,
        built with the callable this process last loaded that policy with (None: it never loaded one)."""
        build = self.builders.get(snap.id.policy_id)
        if build is None:
            return None
        from .modules import build_on_views

        try:
            return build, build_on_views(build, snap._buffer, snap._header, str(snap.id))
        except Exception as exc:  # a build that no longer fits: load_module says so when asked
            log.debug("policystore: no module built ahead for %s: %s", snap.id, exc)
            return None

    def latest(self, policy_id: str, follower: Follower | None) -> int | None:
        """The latest version from the push (never below what this process saw), or None: ask the store."""
        version = follower.latest(policy_id) if follower is not None else None
        if version is None:
            return None
        with self.lock:  # seen only ever rises, whatever threads race here (monotonic reads)
            version = max(version, self.seen.get(policy_id, 0))
            if SnapshotId(policy_id, version) in self.deleted:
                return None
            self.seen[policy_id] = version
        return version

    def saw(self, sid: SnapshotId) -> None:
        """This process published or read ``sid``: "latest" never answers below it from now on."""
        with self.lock:
            if sid.version > self.seen.get(sid.policy_id, 0):
                self.seen[sid.policy_id] = sid.version

    def lower(self, policy_id: str, floor: int, version: int) -> None:
        """Version ``floor`` of ``policy_id`` was deleted (or lost) and ``version`` is the latest: lower the floor to
        it, unless this process has seen a later one meanwhile."""
        with self.lock:
            if self.seen.get(policy_id, 0) == floor:
                self.seen[policy_id] = version

    def keep(self, snap: Snapshot) -> Snapshot:
        with self.lock:
            held = self.snapshots.get(snap.id)
            if held is not None and held.header_bytes == snap.header_bytes:
                return held
            self.snapshots[snap.id] = snap
            return snap

    def catalog(self, epoch: str) -> None:
        """The catalog's epoch, as pushed: a different one (a new database) numbers versions anew."""
        if epoch != self.catalog_epoch:
            if self.catalog_epoch:
                self.renumbered(epoch)
            else:
                self.catalog_epoch = epoch

    def renumbered(self, epoch: str) -> None:
        """The cluster's catalog was replaced (by one of ``epoch``; "": not known yet): versions name new snapshots,
        so forget every one this process knew."""
        with self.lock:
            self.snapshots.clear()
            self.seen.clear()
            self.deleted.clear()
            self.catalog_epoch = epoch

    def drop(self, sid: SnapshotId, deleted: bool = False) -> None:
        """A damaged copy: re-fetch on the next get. ``deleted``: a deleted snapshot, never served again by this
        process (views already handed out stay valid)."""
        with self.lock:
            self.snapshots.pop(sid, None)
            if deleted:
                self.deleted.add(sid)
                if self.seen.get(sid.policy_id, 0) <= sid.version:  # nothing newer of it known here
                    # its build callable holds the module spec and, through it, the cached meta skeleton: a league
                    # that churns its opponents would keep both for every policy it ever played
                    self.builders.pop(sid.policy_id, None)
                if self.seen.get(sid.policy_id) == sid.version:
                    del self.seen[sid.policy_id]
            followers = list(self.followers.values())
        for follower in followers:
            follower.drop(sid, deleted)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            followers = list(self.followers.values())
            self.followers.clear()
            self.clients.clear()
            self.snapshots.clear()
            staging, self._staging = self._staging, None
        for follower in followers:
            follower.stop()
        for follower in followers:  # outside the lock: a follower mapping ahead asks this session what it holds
            follower.join()
        if staging is not None:
            staging.remove()


_sessions: dict[str, Session] = {}  # by league, all of one Ray session
_session_lock = threading.Lock()


def session_key() -> tuple[str, str]:
    context = ray.get_runtime_context()
    return context.gcs_address, context.get_session_name()


def current_session(league: str) -> Session:
    """This process's state for ``league`` in the Ray session it is in now (new ones when Ray was restarted)."""
    ensure_ray()
    key = session_key()
    with _session_lock:
        if any(s.key != key for s in _sessions.values()):
            for old in _sessions.values():
                old.close()
            _sessions.clear()
        session = _sessions.get(league)
        if session is None:
            session = _sessions[league] = Session(key, league)
        return session


def close() -> None:
    """End this process's use of the stores: stop its follower threads (waiting until they have ended) and remove
    its staging file; the next call to a store starts afresh. Call it before ``ray.shutdown()`` in a process that
    has read from a store: a follower's Ray call that lands while Ray destroys its core worker ends the process.
    It runs by itself at the interpreter's exit, before Ray's own shutdown there."""
    with _session_lock:
        sessions = list(_sessions.values())
        _sessions.clear()
    for session in sessions:
        session.close()


atexit.register(close)  # registered after `import ray` registered Ray's shutdown, so it runs before it


def clear_cache() -> None:
    """Drop this process's cached snapshots: the next get of each asks again (views already held stay valid)."""
    with _session_lock:
        sessions = list(_sessions.values())
    for session in sessions:
        with session.lock:
            session.snapshots.clear()
            followers = list(session.followers.values())
        for follower in followers:
            follower.unmap()


def ensure_ray() -> None:
    """Join the cluster RAY_ADDRESS names, else start a local Ray (never a stray cluster left on the machine)."""
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS", "local"))
