"""The hot tier's bookkeeping: which snapshots hold an object-store copy, in least-recently-used order.

Every change is also pushed to the node's readers (``watch.Feed``): a snapshot that becomes hot is announced
with its header and ref, one that stops being hot is announced gone, so readers let go of it and eviction frees
its memory.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import ray

from .errors import SnapshotTooLargeError
from .ids import SnapshotId
from .watch import Feed
from .wire import HotSnapshot


def check_fits(nbytes: int, capacity: int, what: str) -> None:
    """SnapshotTooLargeError unless a snapshot of ``nbytes`` fits in a hot tier of ``capacity`` bytes (a publisher
    checks before it packs, the store again before it copies)."""
    if nbytes > capacity:
        raise SnapshotTooLargeError(f"{what} is {nbytes} bytes, larger than the whole hot tier (hot_capacity_bytes="
                                    f"{capacity}); raise the capacity or shrink the snapshot")


class HotTier:
    """Object refs of the snapshots held in shared memory, with their sizes, oldest use first.

    Not thread-safe: the store actor calls it under its lock.
    """

    def __init__(self, capacity_bytes: int, feed: Feed):
        self.capacity_bytes = capacity_bytes
        self._feed = feed
        self._refs: OrderedDict[SnapshotId, tuple[HotSnapshot, int]] = OrderedDict()
        self.bytes = 0

    def __contains__(self, sid: SnapshotId) -> bool:
        return sid in self._refs

    def __len__(self) -> int:
        return len(self._refs)

    def get(self, sid: SnapshotId) -> HotSnapshot | None:
        """The snapshot's header and object, marked as just used; None if it is not hot."""
        entry = self._refs.get(sid)
        if entry is None:
            return None
        self._refs.move_to_end(sid)
        return entry[0]

    def peek(self, sid: SnapshotId) -> HotSnapshot | None:
        """The snapshot's header and object without marking it used (the store's own work is no use)."""
        entry = self._refs.get(sid)
        return entry[0] if entry is not None else None

    def add(self, sid: SnapshotId, ref: ray.ObjectRef, nbytes: int, header: bytes) -> None:
        """Hold ``ref`` (``header``: the snapshot's header bytes, pushed with the ref to readers)."""
        self.remove(sid)
        snap = HotSnapshot(sid, header, [ref])
        self._refs[sid] = (snap, nbytes)
        self.bytes += nbytes
        self._feed.hot(snap)

    def remove(self, sid: SnapshotId) -> None:
        """Forget the store's copy; readers that still hold views keep the object alive until they let go."""
        entry = self._refs.pop(sid, None)
        if entry is not None:
            self.bytes -= entry[1]
            self._feed.gone(sid)

    def over_capacity(self) -> bool:
        return self.bytes > self.capacity_bytes

    def lru_order(self) -> Iterator[SnapshotId]:
        return iter(list(self._refs))
