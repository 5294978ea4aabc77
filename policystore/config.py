"""Store settings, chosen once per node when its store actor starts."""

from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError, InvalidOptionError
from .extras import needs


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
    compress: lz4-compress spill files where lz4 saves at least 10% (others are stored raw). Off by default: an lz4
        file restores at the decompressor's rate (about 0.6 GB/s on 2 cores), a raw one at the disk's or page
        cache's; trained float weights rarely compress, pruned or quantized ones do.
    disk_capacity_bytes: refuse publishes that would grow the spill tier beyond this (None: until the disk is full).
    max_concurrency: threads in the store actor, so reads are never queued behind a slow restore or publish.
    max_watchers: threads of the store's and the catalog's "watch" concurrency group (separate from
        ``max_concurrency``), which answer followers that have news waiting. Followers wait for news on a doorbell
        (coroutines in the store's and the catalog's own process) and hold none of these threads meanwhile, so any
        number of readers and stores follow by push.
    max_staleness_s: how old a reader's pushed view of the league may be before ``get(pid)`` of the latest version
        falls back to asking the store. A version committed more than this long before a ``get(pid)`` is never
        missed; 0 turns pushed reads of "latest" off.
    durable_timeout_s: the longest the store waits for one call into the durable tier (a durable publish's upload,
        a read, a delete) before it fails with DurableTierError naming the tier; background uploads that run
        out of it are retried. Raise it for snapshots that take longer to upload on your link.
    call_timeout_s: the deadline of every remote call a client makes (to its store or the catalog); a call that
        does not answer in time raises DeadlineExceededError naming the actor and the call. A publish gets this
        plus one second per 16 MiB of snapshot (``publish_timeout_s``); ``connect()`` allows a store it has just
        started at least 60 s to come up. The store gives its own calls to the catalog half of it, so a caller
        learns which actor was slow.
    league: the name that scopes every id (snapshots, versions, the store and catalog actors, spill folders and
        the catalog's database), so two jobs on one cluster never share snapshots by accident. None: the job's
        Ray namespace if it named one (``ray.init(namespace=...)``), else ``"default"``, the cluster's shared
        league. See "Tenancy" in docs/reliability.md.
    """

    hot_capacity_bytes: int | None = None
    spill_dir: str | None = None
    durable_uri: str | None = None
    compress: bool = False
    disk_capacity_bytes: int | None = None
    max_concurrency: int = 16
    max_watchers: int = 8
    max_staleness_s: float = 1.0
    durable_timeout_s: float = 60.0
    call_timeout_s: float = 30.0
    league: str | None = None

    def __post_init__(self) -> None:
        for name in ("hot_capacity_bytes", "disk_capacity_bytes"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value <= 0):
                raise ConfigError(f"StoreConfig.{name} must be a positive int or None, got {value!r}")
        for name in ("spill_dir", "durable_uri"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"StoreConfig.{name} must be a non-empty str or None, got {value!r}")
        if not isinstance(self.compress, bool):
            raise ConfigError(f"StoreConfig.compress must be True or False, got {self.compress!r}")
        if not _is_int(self.max_concurrency) or self.max_concurrency < 2:
            raise ConfigError(f"StoreConfig.max_concurrency must be an int >= 2 (reads must not queue behind "
                              f"writes), got {self.max_concurrency!r}")
        if not _is_int(self.max_watchers) or self.max_watchers < 1:
            raise ConfigError(f"StoreConfig.max_watchers must be an int >= 1, got {self.max_watchers!r}")
        staleness = self.max_staleness_s
        if not _is_number(staleness) or not 0 <= staleness < 3600:
            raise ConfigError(f"StoreConfig.max_staleness_s must be a number of seconds in [0, 3600), "
                              f"got {staleness!r}")
        for name in ("call_timeout_s", "durable_timeout_s"):
            value = getattr(self, name)
            if not _is_number(value) or not 0 < value <= 86400:
                raise ConfigError(f"StoreConfig.{name} must be a number of seconds in (0, 86400], got {value!r}")
        if self.league is not None:
            check_league(self.league)
        if self.durable_uri is not None:  # said here, in the process that asked for it, not in a store's log
            with needs("durable", "StoreConfig.durable_uri"):
                import pyarrow.fs  # noqa: F401

    def publish_timeout_s(self, nbytes: int) -> float:
        """The deadline of a publish of ``nbytes``: ``call_timeout_s`` plus one second per 16 MiB (a durable publish
        writes the disk and the durable tier before it returns)."""
        return self.call_timeout_s + nbytes / PUBLISH_BYTES_PER_S

    @property
    def poll_s(self) -> float:
        """Longest wait of a reader following its store: a quarter of the staleness bound (1 s when pushed
        reads are off). The store follows the catalog twice as often, so a reader's pushed view is at most about
        ``max_staleness_s / 2`` old on an idle league (plus call latency), well within the bound."""
        return min(max(self.max_staleness_s / 4, 0.05), 5.0) if self.max_staleness_s else 1.0

    def resolved_spill_dir(self, session_name: str, node_id: str) -> str:
        """The node's spill folder: ``spill_dir`` (or the session's default root, then the node id); a league other
        than the default one keeps its own folder under it (``.leagues/<league>``)."""
        root = self._local_root(session_name)
        return root if self.spill_dir is not None else os.path.join(root, node_id)

    def catalog_db(self, session_name: str) -> str:
        """The catalog's sqlite database: on local disk (beside the spill folders), never on a shared mount."""
        return os.path.join(self._local_root(session_name), "_catalog.sqlite3")

    def _local_root(self, session_name: str) -> str:
        if self.spill_dir:
            return league_folder(os.path.abspath(os.path.expanduser(self.spill_dir)), self.league)
        return league_folder(self.default_root(session_name), self.league)

    @staticmethod
    def default_root(session_name: str) -> str:
        """The folder under which a session's stores keep their spill folders and catalog when spill_dir is None."""
        # not <tmp>/policystore: a folder of the package's name would shadow it for scripts run from <tmp>
        return os.path.join(tempfile.gettempdir(), "policystore-spill", session_name)


DEFAULT_LEAGUE = "default"
PUBLISH_BYTES_PER_S = 16 * 2**20  # the slowest publish (disk, durable tier) a deadline allows for
LEAGUES = ".leagues"  # other leagues' folders under a shared root; spill.py skips it
_LEAGUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_league(league: object) -> str:
    """Return ``league`` if it can name actors and a folder, else raise ConfigError saying why."""
    if not isinstance(league, str) or not _LEAGUE.fullmatch(league):
        raise ConfigError(f"invalid league {league!r}: use 1-64 characters from [A-Za-z0-9._-], starting with a "
                          "letter or digit")
    return league


def check_durable(durable: object) -> bool:
    """Return ``durable`` if it is a publish's ``durable=`` option (True or False), else InvalidOptionError."""
    if not isinstance(durable, bool):
        raise InvalidOptionError(f"durable must be True or False, got {type(durable).__name__} {durable!r}")
    return durable


def league_folder(root: str, league: str | None) -> str:
    """Where a league keeps its files under ``root``: the root itself for the default league, else its own folder
    (a dot folder: never taken for a policy's folder by a default-league store sharing the root)."""
    return root if league in (None, DEFAULT_LEAGUE) else os.path.join(root, LEAGUES, league)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def staging_dir() -> Path:
    """Where publishers on a node pack snapshots for their store to take (shared memory: no disk write, and the
    store maps the same pages). Per user, so two users' stores on one machine never read each other's files."""
    return Path("/dev/shm") / f"policystore-staging-{os.getuid()}"
