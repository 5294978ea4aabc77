"""The hot tier's bookkeeping: which snapshots hold an object-store copy, in least-recently-used order."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import ray

from .ids import SnapshotId


class HotTier:
    """Object refs of the snapshots held in shared memory, with their sizes, oldest use first.

    Not thread-safe: the store actor calls it under its catalog lock.
    """

    def __init__(self, capacity_bytes: int):
        self.capacity_bytes = capacity_bytes
        self._refs: OrderedDict[SnapshotId, tuple[ray.ObjectRef, int]] = OrderedDict()
        self.bytes = 0

    def __contains__(self, sid: SnapshotId) -> bool:
        return sid in self._refs

    def __len__(self) -> int:
        return len(self._refs)

    def ref(self, sid: SnapshotId) -> ray.ObjectRef | None:
        """The snapshot's object, marked as just used; None if it is not hot."""
        entry = self._refs.get(sid)
        if entry is None:
            return None
        self._refs.move_to_end(sid)
        return entry[0]

    def add(self, sid: SnapshotId, ref: ray.ObjectRef, nbytes: int) -> None:
        self.remove(sid)
        self._refs[sid] = (ref, nbytes)
        self.bytes += nbytes

    def remove(self, sid: SnapshotId) -> ray.ObjectRef | None:
        """Forget the store's copy; readers that still hold views keep the object alive until they let go."""
        entry = self._refs.pop(sid, None)
        if entry is None:
            return None
        self.bytes -= entry[1]
        return entry[0]

    def over_capacity(self) -> bool:
        return self.bytes > self.capacity_bytes

    def lru_order(self) -> Iterator[SnapshotId]:
        return iter(list(self._refs))
