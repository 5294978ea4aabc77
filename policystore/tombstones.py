"""The catalog's side of a delete in the durable tier: tombstones written before the delete is acknowledged.

A delete that reaches the catalog directly (its actor is reachable by name from any driver) has no store to queue
the durable tier's tombstones, so the catalog writes them itself, all at once on a few threads of its own and
within a deadline shorter than its caller's, before it deletes anything: a tombstone is what keeps a snapshot
deleted for ``policystore --dir <uri>``, ``open_folder`` and any catalog rebuilt from the tier. The markers and
data objects are removed afterwards, in the background (the tombstone already hides them; a store's durable queue
and a later delete remove them too).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from typing import TYPE_CHECKING

from .errors import DurableTierError
from .ids import SnapshotId

if TYPE_CHECKING:
    from .durable import DurableTier

log = logging.getLogger(__name__)

_THREADS = 8  # tombstones written at once; a hanging tier holds at most this many threads


class Tombstones:
    """Writes the durable tier's tombstones for the catalog (the tier opened on first use)."""

    def __init__(self, uri: str, timeout_s: float):
        self.uri = uri
        self.timeout_s = timeout_s
        self._tier: DurableTier | None = None
        self._pool = ThreadPoolExecutor(_THREADS, thread_name_prefix="policystore-catalog-tombstone")
        self._cleaner = ThreadPoolExecutor(1, thread_name_prefix="policystore-catalog-remove")

    def write(self, sids: Sequence[SnapshotId]) -> None:
        """Every tombstone of ``sids`` written, or DurableTierError naming the tier (within ``timeout_s``)."""
        if not sids:
            return
        tier = self._open()
        futures = [self._pool.submit(tier.tombstone, sid) for sid in sids]
        done, late = wait_all(futures, timeout=self.timeout_s)
        failed = [f.exception() for f in done if f.exception() is not None]
        if late or failed:
            for future in late:
                future.cancel()
            why = (f"did not answer within {self.timeout_s:g} s" if late else f"failed: {failed[0]}")
            raise DurableTierError(f"durable tier {tier.uri} {why} while writing the tombstones of "
                                   f"{', '.join(map(str, sids[:5]))}{' ...' if len(sids) > 5 else ''}: nothing was "
                                   "deleted (deletes leave a tombstone in the durable tier before they are done)")

    def compact(self, floors: dict[str, int]) -> dict[str, int]:
        """Fold each policy's tombstones up to its floor (``DurableTier.compact``); objects removed per policy, or
        DurableTierError naming the tier (within ``timeout_s``)."""
        tier = self._open()
        futures = {pid: self._pool.submit(tier.compact, pid, floor) for pid, floor in floors.items()}
        done, late = wait_all(futures.values(), timeout=self.timeout_s)
        failed = [f.exception() for f in done if f.exception() is not None]
        if late or failed:
            raise DurableTierError(f"durable tier {tier.uri} "
                                   f"{'did not answer in time' if late else f'failed: {failed[0]}'} while compacting "
                                   "its tombstones (nothing is lost: they stay until the next try)")
        return {pid: future.result() for pid, future in futures.items()}

    def remove_later(self, sids: Sequence[SnapshotId]) -> None:
        """Remove the markers and data objects of deleted snapshots in the background (best effort)."""
        for sid in sids:
            self._cleaner.submit(self._remove, sid)

    def _remove(self, sid: SnapshotId) -> None:
        try:
            self._open().remove(sid)
        except Exception as exc:  # the tombstone hides it; the stores' queues and gc remove it later
            log.warning("catalog: could not remove %s from the durable tier %s yet: %s", sid, self.uri, exc)

    def _open(self) -> DurableTier:
        if self._tier is None:
            from .durable import DurableTier

            self._tier = DurableTier.open(self.uri)
        return self._tier
