"""Store settings, chosen once per node when its store actor starts."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StoreConfig:
    """How one node's store holds snapshots.

    hot_capacity_bytes: bytes of snapshots kept in the object store before least-recently-used ones are evicted
        to disk. None: half of this node's object store.
    spill_dir: the node's disk tier (node-local). Every snapshot is written here (at once when published durably,
        else in the background); a restarted store rebuilds from it. None: <tmp>/policystore-spill/<session>/<node_id>,
        so neither two clusters nor two nodes on one machine share it.
    durable_uri: where every snapshot is also written, so it survives the loss of the node that published it:
        ``s3://bucket/prefix``, ``gs://...``, ``hdfs://...``, ``file://...`` or a path every node mounts (any
        pyarrow filesystem). A fresh catalog rebuilds the league from it.
    compress: lz4-compress spill files (snapshots that do not compress are stored raw).
    disk_capacity_bytes: refuse publishes that would grow the spill tier beyond this (None: until the disk is full).
    max_concurrency: threads in the store actor, so reads are never queued behind a slow restore or publish.
    max_watchers: reader processes (and the store's own catalog follower) that can follow the league at once: the
        size of the actors' "watch" concurrency group, separate from ``max_concurrency``. Readers beyond it wait
        for a slot, and meanwhile read with a round trip.
    max_staleness_s: how old a reader's pushed view of the league may be before ``get(pid)`` of the latest version
        falls back to asking the store. A version committed more than this long before a ``get(pid)`` is never
        missed; 0 turns pushed reads of "latest" off.
    """

    hot_capacity_bytes: int | None = None
    spill_dir: str | None = None
    durable_uri: str | None = None
    compress: bool = True
    disk_capacity_bytes: int | None = None
    max_concurrency: int = 16
    max_watchers: int = 64
    max_staleness_s: float = 1.0

    def __post_init__(self) -> None:
        for name in ("hot_capacity_bytes", "disk_capacity_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"StoreConfig.{name} must be a positive int or None, got {value!r}")
        if self.max_concurrency < 2:
            raise ValueError("StoreConfig.max_concurrency must be >= 2 (reads must not queue behind writes)")
        if isinstance(self.max_watchers, bool) or not isinstance(self.max_watchers, int) or self.max_watchers < 1:
            raise ValueError(f"StoreConfig.max_watchers must be an int >= 1, got {self.max_watchers!r}")
        staleness = self.max_staleness_s
        if isinstance(staleness, bool) or not isinstance(staleness, (int, float)) or not 0 <= staleness < 3600:
            raise ValueError(f"StoreConfig.max_staleness_s must be a number of seconds in [0, 3600), got {staleness!r}")

    @property
    def poll_s(self) -> float:
        """Long-poll timeout of a reader following its store: a quarter of the staleness bound (1 s when pushed
        reads are off). The store follows the catalog twice as often, so a reader's pushed view is at most about
        ``max_staleness_s / 2`` old on an idle league (plus call latency), well within the bound."""
        return min(max(self.max_staleness_s / 4, 0.05), 5.0) if self.max_staleness_s else 1.0

    def resolved_spill_dir(self, session_name: str, node_id: str) -> str:
        if self.spill_dir is not None:
            return os.path.abspath(os.path.expanduser(self.spill_dir))
        return os.path.join(self.default_root(session_name), node_id)

    def catalog_db(self, session_name: str) -> str:
        """The catalog's sqlite database: on local disk (beside the spill folders), never on a shared mount."""
        return os.path.join(self._local_root(session_name), "_catalog.sqlite3")

    def _local_root(self, session_name: str) -> str:
        if self.spill_dir:
            return os.path.abspath(os.path.expanduser(self.spill_dir))
        return self.default_root(session_name)

    @staticmethod
    def default_root(session_name: str) -> str:
        """The folder under which a session's stores keep their spill folders and catalog when spill_dir is None."""
        # not <tmp>/policystore: a folder of the package's name would shadow it for scripts run from <tmp>
        return os.path.join(tempfile.gettempdir(), "policystore-spill", session_name)


NAMESPACE = "policystore"
CATALOG_NAME = "policystore-catalog"


def store_name(node_id: str) -> str:
    return f"policystore-{node_id}"


def staging_dir() -> Path:
    """Where publishers on a node pack snapshots for their store to take (shared memory: no disk write, and the
    store maps the same pages). Per user, so two users' stores on one machine never read each other's files."""
    return Path("/dev/shm") / f"policystore-staging-{os.getuid()}"
