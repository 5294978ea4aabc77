"""What every job of a node's store shares: this node's copies (one ``Entry`` per snapshot, versions in increasing
order) under one short lock, its tiers (hot, disk, durable), the feed its readers follow, its counters, and its
calls to the catalog. The jobs (``store_tiers``, ``store_follow``, ``store_publish``, ``store_fetch``) each hold it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from . import remote
from .config import DEFAULT_LEAGUE, StoreConfig
from .format import (
    Header,
)
from .holders import HolderBatch
from .hot import HotTier
from .ids import SnapshotId
from .metrics import COUNTERS, StoreMetrics
from .remote import catalog_name
from .snapfile import SpillFile
from .spill import DiskTier
from .transfer import Relay
from .watch import Feed
from .wire import (
    Summary,
)

if TYPE_CHECKING:
    from .durable import DurableTier
    from .durable_queue import DurableQueue

log = logging.getLogger(__name__)

FETCH_TIMEOUT_S = 120.0
# How long a publish waits for a restarting catalog to answer a call that is safe to repeat, so that a catalog
# killed between its commit and its reply never leaves a version listed whose publish gave up on it.
_CATALOG_RETRY_S = 60.0
HOLD_INTERVAL_S = 0.5  # the holder changes of one interval go to the catalog in one call


@dataclass
class Entry:
    """This node's copy of one snapshot: where it is (hot, on disk, being spilled) and what went wrong with it."""

    header: Header
    durable: bool = False  # published durably (a copy found on disk at startup: not known, False)
    file: SpillFile | None = None  # committed local spill file
    pending: Future | None = None  # background spill in flight
    spill_error: str | None = None  # the background spill failed (disk full): the snapshot can only stay hot
    corrupt: str | None = None  # the hot copy failed its checksum and no good disk copy exists
    fetched: bool = False  # a copy of another node's or of the durable tier's (safe elsewhere if its spill fails)


def _open_durable(uri: str | None) -> DurableTier | None:
    """The durable tier, imported only when configured (pyarrow is heavy for an actor that may not need it)."""
    if uri is None:
        return None
    from .durable import DurableTier

    return DurableTier.open(uri)


def _node_object_store_bytes(node_id: str) -> int:
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return int(node["Resources"].get("object_store_memory", 0))
    raise RuntimeError(f"node {node_id} is not part of this Ray cluster")


class StoreState:
    """A node store's shared state (see the module's docstring); ``uploads`` and ``relay`` are set by the store
    once the jobs they call back into exist."""

    def __init__(self, config: StoreConfig, node_id: str):
        self.config = config
        self.node_id = node_id
        session = ray.get_runtime_context().get_session_name()
        self.disk = DiskTier(config.resolved_spill_dir(session, node_id), compress=config.compress,
                             capacity_bytes=config.disk_capacity_bytes)
        self.durable = _open_durable(config.durable_uri)
        self.uploads: DurableQueue | None = None
        self.relay: Relay | None = None
        self.metrics = StoreMetrics(node_id)
        self.feed = Feed()
        self.hot = HotTier(config.hot_capacity_bytes or _node_object_store_bytes(node_id) // 2, self.feed)
        self.league = config.league or DEFAULT_LEAGUE
        self.catalog = remote.find(catalog_name(self.league))
        self.lock = threading.Lock()
        self.policies: dict[str, dict[int, Entry]] = {}  # this node's copies, versions in increasing order
        self.counters: Counter[str] = Counter()
        self.holders = HolderBatch(self._send_holders, HOLD_INTERVAL_S)
        for found in self.disk.scan().entries:
            self.policies.setdefault(found.id.policy_id, {})[found.id.version] = Entry(found.header, file=found.file)

    def items_locked(self) -> list[tuple[SnapshotId, Entry]]:
        return [(SnapshotId(p, v), e) for p, versions in self.policies.items() for v, e in versions.items()]

    def held_locked(self) -> list[tuple[SnapshotId, Summary]]:
        """This node's copies as the catalog records them (a copy known to be corrupt is none)."""
        return [(sid, Summary.of(e.header, e.durable)) for sid, e in self.items_locked() if not e.corrupt]

    def disk_bytes_locked(self) -> int:
        return sum(e.file.file_bytes for _, e in self.items_locked() if e.file is not None)

    def count(self, name: str) -> None:
        """Bump a counter in ``stats()`` and, where Ray exports it, in the node's metrics."""
        self.counters[name] += 1
        if name in COUNTERS:
            self.metrics.count(name)

    @contextmanager
    def timed(self, histogram: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.metrics.observe(histogram, time.perf_counter() - start)

    def ask(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The catalog's answer within half the call deadline (the caller's own deadline is the whole of it, so
        the caller learns that the catalog, not this store, was slow)."""
        return remote.call(self.catalog, method, *args, timeout_s=self.config.call_timeout_s / 2, **kwargs)

    def on_catalog(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The catalog's answer, asked again while the catalog restarts (up to ``_CATALOG_RETRY_S``): only for
        calls that are safe to repeat (idempotent, or carrying a token)."""
        return self.start_on_catalog(method, *args, **kwargs)()

    def start_on_catalog(self, method: str, *args: Any, **kwargs: Any) -> Callable[[], Any]:
        """``on_catalog`` started now: returns the function that waits for its answer."""
        return remote.begin(self.catalog, method, *args, timeout_s=_CATALOG_RETRY_S, retry_s=_CATALOG_RETRY_S,
                            **kwargs)

    def _send_holders(self, gained: Sequence[tuple[SnapshotId, str]], dropped: Sequence[tuple[SnapshotId, str]]
                      ) -> None:
        remote.call(self.catalog, "update_holders", gained, dropped, timeout_s=self.config.call_timeout_s)

    def gauges_locked(self) -> dict[str, int]:
        """The tiers' sizes and the durable backlog: in ``stats()``, and exported as the node's gauges."""
        return {"hot_bytes": self.hot.bytes, "hot_snapshots": len(self.hot), "disk_bytes": self.disk_bytes_locked(),
                "disk_snapshots": sum(e.file is not None for _, e in self.items_locked()),
                "durable_pending": self.uploads.pending() if self.uploads is not None else 0}

    def durable_deadline(self, started: float, nbytes: int) -> float:
        """How long a call into the durable tier may take for a client call that arrived at ``started`` and moves up
        to ``nbytes`` (its deadline: ``publish_timeout_s(nbytes)``): at most ``durable_timeout_s``, and at most
        three quarters of the client's deadline less what has passed, so the client hears DurableTierError naming
        the tier rather than its own DeadlineExceededError."""
        left = 0.75 * self.config.publish_timeout_s(nbytes) - (time.monotonic() - started)
        return max(min(self.config.durable_timeout_s, left), 1.0)
