"""Every record that crosses an actor boundary: frozen dataclasses, so both ends agree on fields and types.

The catalog, the per-node stores and the client exchange only these (and ``ObjectRef``s inside lists). A field
added here is added for every side at once; nothing is passed as an ad-hoc dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .ids import SnapshotId

if TYPE_CHECKING:
    from .format import Header

DURABLE = "durable"  # the holder name of the shared durable tier in catalog entries


@dataclass(frozen=True)
class Summary:
    """What a snapshot's header says about it (no bytes), built here and only here from a header.

    The one summary record: the catalog keeps it, a store tells the catalog it at commit, and every listing
    (``SnapshotInfo``, ``reader.FileInfo``, the durable tier's commit marker, the CLI's rows) embeds it beside the
    snapshot's id rather than restating its fields.
    """

    nbytes: int  # the snapshot buffer (header + tensors)
    checksum: str  # "crc32c:xxxxxxxx", recorded at publish: equal checksums, equal bytes
    meta: dict[str, Any]
    created: float
    durable: bool = False  # the publisher asked for the durable tier (what a store tells the catalog)

    @classmethod
    def of(cls, header: Header, durable: bool = False) -> Summary:
        return cls(header.nbytes, header.checksum, header.user_meta, header.created, durable)


class Summarized:
    """The fields of an embedded ``summary`` under the names users read them by (``info.nbytes``, ``info.meta``)."""

    summary: Summary

    @property
    def nbytes(self) -> int:
        return self.summary.nbytes

    @property
    def checksum(self) -> str:
        return self.summary.checksum

    @property
    def meta(self) -> dict[str, Any]:
        return self.summary.meta

    @property
    def created(self) -> float:
        return self.summary.created


@dataclass(frozen=True)
class CatalogEntry:
    """One committed snapshot as the catalog knows it."""

    id: SnapshotId
    summary: Summary
    holders: tuple[str, ...]  # node ids with a copy, and DURABLE once it is in the durable tier

    @property
    def version(self) -> int:
        return self.id.version


@dataclass(frozen=True)
class CatalogEvents:
    """One answer to ``CatalogServer.watch``: what changed since ``since`` up to event number ``seq``.

    ``reset`` means the watcher was too far behind (or the catalog restarted): ``latest`` then holds the newest
    committed version of every policy and replaces what the watcher knew.
    """

    seq: int
    reset: bool
    committed: tuple[CatalogEntry, ...] = ()
    deleted: tuple[SnapshotId, ...] = ()
    latest: dict[str, int] = field(default_factory=dict)  # policy -> highest committed version after these events
    epoch: str = ""  # changes when the catalog's database is new: a watcher that sees a new epoch resets


@dataclass(frozen=True)
class HotSnapshot:
    """A snapshot the node's store holds in shared memory, pushed to the processes that read from it."""

    id: SnapshotId
    header: bytes  # the safetensors header (8-byte length + JSON), so readers parse it off the hot path
    refs: list  # [ObjectRef] (inside a list, so Ray hands the ref over instead of the bytes)


@dataclass(frozen=True)
class FeedEpoch:
    """Which feed a store's events belong to: a restarted store (a new ``store``) or a new catalog database (a new
    ``catalog``, "" until the store has heard from it) starts a new one, and the store's followers reset."""

    store: str
    catalog: str = ""


@dataclass(frozen=True)
class StoreEvents:
    """One answer to ``StoreServer.watch``: the node's view of the league since event ``since``.

    ``as_of`` is the store's ``time.monotonic()`` up to which the store had heard everything the catalog
    committed; readers on the same node compare it with their own clock to bound staleness.
    """

    seq: int
    reset: bool
    as_of: float
    latest: dict[str, int] = field(default_factory=dict)  # policy -> highest committed version (changed ones)
    hot: tuple[HotSnapshot, ...] = ()
    gone: tuple[SnapshotId, ...] = ()  # no longer hot here (evicted or deleted): readers drop their refs
    deleted: tuple[SnapshotId, ...] = ()  # deleted cluster-wide
    epoch: FeedEpoch | None = None


@dataclass(frozen=True)
class Ring:
    """What a doorbell (``watch.Doorbell``) last heard from the store or catalog it stands beside: the newest event
    number of its feed, and (a store's) ``as_of`` that went with it (see ``StoreEvents``)."""

    seq: int
    as_of: float
    epoch: FeedEpoch | str  # a store's feed epoch, or the catalog's: "" until the doorbell was first rung
    # what the news since the previous ring is about: the policies it names, or everyone (deletes, a new epoch,
    # a catalog's ring), so the doorbell wakes early only the followers of those policies
    touched: tuple[str, ...] = ()
    everyone: bool = True


@dataclass(frozen=True)
class SnapshotInfo(Summarized):
    """One row of ``PolicyStore.list()``: a committed snapshot (its ``summary``, read as ``nbytes``, ``checksum``,
    ``meta``, ``created``) and where this node holds it."""

    id: SnapshotId
    summary: Summary
    # on this node: "hot" (shared memory), "disk" (restored on the next get), "remote" (fetched on get), "lost" (no
    # node and no durable tier holds a copy: never answered as latest; a get of it raises SnapshotLostError)
    tier: str
    on_disk: bool
    file_bytes: int
    compressed: bool
    holders: tuple[str, ...]
    error: str | None = None


@dataclass(frozen=True)
class QuarantineRecord:
    """A file the store refused to serve and moved aside (never deleted)."""

    path: str
    reason: str
    when: float


@dataclass(frozen=True)
class StoreStats:
    """``PolicyStore.stats()``: one node's tiers and counters."""

    node_id: str
    spill_dir: str
    durable_uri: str | None
    hot_bytes: int
    hot_snapshots: int
    hot_capacity_bytes: int
    disk_bytes: int
    disk_snapshots: int
    snapshots: int
    pending_spills: int
    watchers: int
    hits: int
    misses: int
    evictions: int
    restores: int
    fetches: int
    publishes: int
    spill_errors: int
    corrupt_reads: int
    quarantined: tuple[QuarantineRecord, ...] = ()
    durable_pending: int = 0  # snapshots on this node's disk whose durable upload is queued or retrying
    durable_failures: int = 0  # failed calls into the durable tier (uploads, tombstones) since the store started
    durable_error: str | None = None  # the last of them, until a call succeeds again
    served: int = 0  # copies of snapshots this store handed to other nodes' stores
    served_max_per_snapshot: int = 0  # the most nodes it handed any one snapshot to (bounded: a fan-out tree)
    unspilled: tuple[str, ...] = ()  # acknowledged snapshots only in memory: their spill failed (retried), no copy


@dataclass(frozen=True)
class VerifyReport:
    """``PolicyStore.verify()``: which copies of one snapshot matched the checksum recorded at publish.

    Each of ``hot``/``disk``/``durable`` is True (checked, good), False (checked, damaged) or None (no copy).
    """

    id: SnapshotId
    hot: bool | None
    disk: bool | None
    durable: bool | None
    problems: tuple[str, ...] = ()
    healed: bool = False  # a damaged copy was dropped; a good copy (another tier, node or the durable tier) replaces it

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class Reconciled:
    """The catalog's answer to a (re)started store that reported the copies on its disk.

    ``discard``: copies of versions never committed (a publish killed midway), aborted or deleted while the store
    was away: remove them. ``quarantine``: copies that conflict with the catalog (another checksum than the one
    recorded at publish, or a version another node is publishing right now), with the reason: move them aside,
    never delete them, never serve them. Every other reported copy is now recorded as held by the store.
    """

    discard: tuple[SnapshotId, ...] = ()
    quarantine: tuple[tuple[SnapshotId, str], ...] = ()


@dataclass(frozen=True)
class Adopted:
    """The catalog's answer to ``adopt``: what it took from the durable tier's list, and why it left the rest."""

    added: tuple[SnapshotId, ...] = ()  # new to the catalog, now committed with the durable tier as holder
    held: tuple[SnapshotId, ...] = ()  # already committed with the same checksum: the durable tier is a holder
    skipped: tuple[str, ...] = ()  # one line per entry not taken (deleted in the catalog, conflicting checksum)


@dataclass(frozen=True)
class Holdings:
    """A store's answer to a catalog that starts with a new database (``StoreServer.holdings``): the copies it
    holds, and per policy the highest version it has seen handed out (held, committed, deleted or reserved), so
    that the new database never hands out one of those numbers again."""

    node_id: str
    snapshots: tuple[tuple[SnapshotId, Summary], ...]
    high_water: dict[str, int]


@dataclass(frozen=True)
class CatalogHealth:
    """What the catalog found when it opened its database, and how big the catalog is.

    ``new``: the database was created by this start (first start, or the old one was lost or damaged and moved
    aside): the catalog rebuilt the league from the durable tier's markers and the live stores' holdings before
    serving anything. ``problems``: everything startup found wrong and what it did about it (damaged database moved
    aside, rows salvaged, markers or reports skipped, stores that did not answer).
    """

    path: str
    epoch: str
    new: bool
    problems: tuple[str, ...]
    adopted: int  # snapshots a new database took from the durable tier and the live stores by this start
    skipped: int  # entries that start refused (bad commit markers, invalid or conflicting reports), in ``problems``
    seq: int
    policies: int
    snapshots: int
    reserved: int  # versions reserved and not (yet) committed or aborted
    calls: dict[str, int] = field(default_factory=dict)  # calls received since this start, by method (health aside)
