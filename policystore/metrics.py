"""The store's figures in Ray's own metrics system, so they show up on the dashboard and the Prometheus endpoint.

Ray exports every metric defined with ``ray.util.metrics`` from each node's metrics agent (``ray_`` is prefixed,
counters get ``_total``), on its report interval, with no extra setup. Each store tags its figures with its Ray
node id, so one query can sum over the cluster or split by node. The names and queries are in docs/metrics.md.
"""

from __future__ import annotations

from ray.util.metrics import Counter, Gauge, Histogram

from .errors import UnknownMetricError

PREFIX = "policystore_"
TAG = "node_id"

GAUGES: dict[str, str] = {
    "hot_bytes": "Bytes of snapshots this node's store holds in Ray's shared-memory object store.",
    "disk_bytes": "Bytes of snapshot files in this node's spill folder.",
    "hot_snapshots": "Snapshots held in shared memory on this node.",
    "disk_snapshots": "Snapshots with a committed spill file on this node.",
    "durable_pending": "Snapshots on this node's disk still waiting for their durable upload (queued or retrying).",
}
COUNTERS: dict[str, str] = {
    "hits": "Reads the store answered from a copy already in shared memory.",
    "misses": "Reads the store answered by a restore from disk or a fetch from another node.",
    "evictions": "Hot copies dropped from shared memory to stay within the hot capacity (kept on disk).",
    "restores": "Snapshots copied back from this node's disk into shared memory.",
    "fetches": "Snapshots copied from another node's store or the durable tier.",
    "publishes": "New snapshots published through this node's store.",
    "served": "Copies of snapshots this node's store handed to other nodes' stores (each node serves a bounded few "
              "per snapshot: fan-out is a tree).",
    "corrupt_reads": "Copies that failed their checksum or identity check and were refused.",
    "durable_failures": "Failed calls into the durable tier from the upload queue (each is retried with backoff).",
}
HISTOGRAMS: dict[str, str] = {
    "get_latency": "Seconds the store took to hand out a snapshot (hit, restore or fetch).",
    "publish_latency": "Seconds from a publish reaching the store to its commit in the catalog.",
    "restore_latency": "Seconds to read, verify and re-share one snapshot from disk.",
}
# 100 us to 10 s, about three buckets per decade: a hit is ~1 ms, a restore of a large snapshot seconds.
LATENCY_BOUNDARIES: list[float] = [
    1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0
]


class StoreMetrics:
    """One node store's gauges, counters and latency histograms, tagged with that node's id.

    Create it inside the store actor (metrics are recorded by the process that owns them). Unknown names raise
    UnknownMetricError, so a typo in the server fails its tests instead of silently exporting nothing.
    """

    def __init__(self, node_id: str):
        self.node_id = node_id
        self._tags = {TAG: node_id}
        self._gauges = {name: Gauge(PREFIX + name, description=d, tag_keys=(TAG,)) for name, d in GAUGES.items()}
        self._counters = {name: Counter(PREFIX + name, description=d, tag_keys=(TAG,)) for name, d in COUNTERS.items()}
        self._histograms = {
            name: Histogram(PREFIX + name + "_seconds", description=d, boundaries=LATENCY_BOUNDARIES, tag_keys=(TAG,))
            for name, d in HISTOGRAMS.items()
        }

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name`` (e.g. ``count("hits")``)."""
        _lookup(self._counters, name, "counter").inc(n, tags=self._tags)

    def observe(self, name: str, seconds: float) -> None:
        """Record one latency of ``seconds`` in histogram ``name`` (``get_latency``, ``publish_latency``, ...)."""
        _lookup(self._histograms, name, "histogram").observe(seconds, tags=self._tags)

    def set_gauges(self, **values: float) -> None:
        """Set the named gauges to their current values (e.g. ``set_gauges(hot_bytes=..., hot_snapshots=...)``)."""
        gauges = [(_lookup(self._gauges, name, "gauge"), value) for name, value in values.items()]
        for gauge, value in gauges:  # all names checked first: a typo sets none of them
            gauge.set(value, tags=self._tags)


def _lookup(table: dict, name: str, kind: str):
    try:
        return table[name]
    except KeyError:
        raise UnknownMetricError(f"unknown policystore {kind} {name!r}; known: {', '.join(sorted(table))}") from None
