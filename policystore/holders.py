"""A store's holder changes for the catalog, sent in batches: one call per interval carries every change.

Each node store tells the catalog which snapshots it gained (a fetch, a durable upload) or dropped. One call per
change would make holds the largest share of the catalog's calls at scale (one per node per snapshot fetched);
batched, a node costs the catalog at most one message per interval whatever it fetched. A change that cannot be
sent (the catalog restarting) is kept and sent with the next batch, and a store that restarts, or sees a new
catalog database, reports all it holds anyway (``reconcile``), so the catalog's list of holders always catches up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from .errors import brief
from .ids import SnapshotId

log = logging.getLogger(__name__)

Change = tuple[SnapshotId, str]  # (snapshot, holder: a node id or wire.DURABLE)
Send = Callable[[Sequence[Change], Sequence[Change]], None]  # (gained, dropped), raises if not delivered


class HolderBatch:
    """Changes queued by the store's threads, sent by one daemon thread at most once per ``interval_s``.

    The latest change of a (snapshot, holder) pair wins: a copy dropped and fetched again within one interval is
    sent as gained."""

    def __init__(self, send: Send, interval_s: float):
        self._send = send
        self._interval_s = interval_s
        self._changes: dict[Change, bool] = {}  # -> held
        self._sending = False
        self._changed = threading.Condition()
        threading.Thread(target=self._run, name="policystore-holders", daemon=True).start()

    def gained(self, sid: SnapshotId, holder: str) -> None:
        self._queue(sid, holder, True)

    def dropped(self, sid: SnapshotId, holder: str) -> None:
        self._queue(sid, holder, False)

    def flush(self, timeout_s: float) -> bool:
        """Wait until every change queued so far has reached the catalog; False if ``timeout_s`` ran out."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._changes and not self._sending, timeout_s)

    def _queue(self, sid: SnapshotId, holder: str, held: bool) -> None:
        with self._changed:
            self._changes[(SnapshotId(*sid), holder)] = held
            self._changed.notify_all()

    def _run(self) -> None:
        failures = 0
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._changes))
            time.sleep(self._interval_s if not failures else min(0.2 * 2**failures, 5.0))  # gather one interval
            with self._changed:
                batch, self._changes, self._sending = self._changes, {}, True
            try:
                self._send([c for c, held in batch.items() if held], [c for c, held in batch.items() if not held])
                failures = 0
            except Exception as exc:  # the catalog restarting: keep the changes (newer ones win) and retry
                failures += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning("could not send %d holder changes to the catalog (%s: %s); retrying", len(batch),
                                type(exc).__name__, brief(exc))
                with self._changed:
                    self._changes = {**batch, **self._changes}
            finally:
                with self._changed:
                    self._sending = False
                    self._changed.notify_all()
