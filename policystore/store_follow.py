"""A node store following its catalog: the latest versions and deletes applied to the node's feed (waiting on the
catalog's doorbell for news), this node's copies reported to the catalog at startup and to every new catalog
database (``reconcile``), and the versions this store has seen handed out (``holdings``).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from . import remote
from .errors import (
    UnknownPolicyError,
    brief,
)
from .store_state import StoreState
from .store_tiers import Tiers
from .wire import (
    CatalogEntry,
    CatalogEvents,
    Holdings,
    Reconciled,
)

log = logging.getLogger(__name__)


class CatalogFollower:
    """Keeps a node store in step with its catalog (see the module's docstring); ``start`` once the store is wired."""

    def __init__(self, state: StoreState, tiers: Tiers):
        self.state = state
        self.tiers = tiers
        self._high: dict[str, int] = {}  # per policy, the highest version seen handed out (see ``holdings``)
        # per policy, its newest commit as the catalog's watch answer carried it: fetching that version needs no
        # lookup (one catalog call per node per snapshot less); a hint only, see ``Fetcher._fetch_new``
        self.committed: dict[str, CatalogEntry] = {}
        self.heard = threading.Condition(state.lock)  # notified when a catalog answer has been applied
        self._registrar = ThreadPoolExecutor(1, thread_name_prefix="policystore-register")
        self.started: Future | None = None
        self.reconciled: Future | None = None

    def start(self) -> None:
        """Tell the catalog what survived on disk, without blocking startup on another actor (again whenever the
        catalog's database is new), and follow the catalog from a daemon thread."""
        self.started = self.reconciled = self._registrar.submit(self.reconcile, True)
        threading.Thread(target=self._follow, name="policystore-catalog-follower", daemon=True).start()

    def reconcile(self, restarted: bool) -> None:
        """Report this node's copies to the catalog (``restarted``: at startup, before any reservation) and act on
        its answer: discard what was never committed, aborted or deleted (here and in the durable tier),
        quarantine what conflicts."""
        with self.state.lock:
            held = self.state.held_locked()
        reconciled: Reconciled = self.state.on_catalog("reconcile", self.state.node_id, held, restarted=restarted)
        for sid in reconciled.discard:
            log.warning("discarding %s: never committed, aborted or deleted", sid)
            self.tiers.forget(*sid)
            self.tiers.remove_durable(sid)
        for sid, reason in reconciled.quarantine:  # never served, never deleted: moved aside with the reason
            log.error("not serving %s: %s", sid, reason)
            with self.state.lock:
                entry = self.state.policies.get(sid.policy_id, {}).pop(sid.version, None)
                self.state.hot.remove(sid)
            if entry is not None and entry.file is not None:
                self.state.disk.quarantine(entry.file, reason)
        if self.state.uploads is not None:  # what survived here and never reached the durable tier goes there now
            self.state.uploads.resume()

    def holdings(self) -> Holdings:
        """What this node holds, and the highest version of each policy it has seen handed out, for a catalog that
        starts with a new database: it asks every live store before it hands out a version. Served beside the
        readers' long polls, so it never waits behind calls queued on the rebuilding catalog."""
        with self.state.lock:
            snapshots = tuple(self.state.held_locked())
            high = dict(self._high)
        for sid, _ in snapshots:
            high[sid.policy_id] = max(high.get(sid.policy_id, 0), sid.version)
        return Holdings(self.state.node_id, snapshots, high)

    def saw(self, policy_id: str, version: int | None) -> None:
        """Remember that ``version`` of ``policy_id`` was handed out (a new catalog database must skip past it)."""
        if version:
            with self.state.lock:
                self._high[policy_id] = max(self._high.get(policy_id, 0), version)

    def _follow(self) -> None:
        """Keep the feed's latest versions and deletes in step with the catalog (daemon thread): wait on the
        catalog's doorbell for news or the catalog's next beat, and ask the catalog only for news (or when no beat
        came within four polls). Only the catalog's own word moves ``as_of``: its answer, or a beat it sent after
        the wait began (``Doorbell.after_beats``); a doorbell that answers while the catalog is stuck proves
        nothing."""
        since, epoch, failures = 0, None, 0
        heard = None  # the last catalog epoch applied: a different one is a new database, re-register with it
        limit = self.state.config.poll_s * 2 + 10
        while True:
            try:
                if epoch is not None:
                    asked = time.monotonic()
                    ring, proven = remote.call(self.state.catalog, "bell_after_beats", since, epoch,
                                               self.state.config.poll_s * 4, timeout_s=limit)
                    if proven and ring.seq == since and ring.epoch == epoch:  # idle: the catalog's beat says so
                        failures = 0
                        self.state.feed.heard_until(asked)
                        continue
                sent = time.monotonic()
                events: CatalogEvents = remote.call(self.state.catalog, "watch", since if epoch else 0, 0,
                                                    timeout_s=limit)
            except Exception as exc:  # catalog restarting: readers see the feed go stale and ask directly
                failures += 1
                if failures == 1 or failures % 100 == 0:
                    log.warning("following the catalog failed (%s: %s)", type(exc).__name__, brief(exc))
                time.sleep(min(0.05 * failures, 1.0))
                continue
            failures = 0
            if not events.reset and events.epoch != epoch and (epoch is not None or events.seq > 0):
                epoch = None  # a new catalog: start over from its whole state
                continue
            # (a catalog with no event yet answers without a reset: nothing to apply, and from here this follower
            # waits on its doorbell instead of asking again at once)
            try:
                self._apply(events)
            except Exception:  # never let one bad answer stop the follower
                log.exception("applying catalog events failed")
                epoch = None
                continue
            if heard is not None and events.epoch != heard:
                log.warning("the catalog's database is new (epoch %s): reporting this node's copies", events.epoch)
                self.reconciled = self._registrar.submit(self.reconcile, False)
            heard = events.epoch
            since, epoch = events.seq, events.epoch
            self.state.feed.catalog_epoch(epoch)
            self.state.feed.heard_until(sent)

    def _apply(self, events: CatalogEvents) -> None:
        for pid, version in (*events.latest.items(), *(e.id for e in events.committed), *events.deleted):
            self.saw(pid, version)  # every version the catalog names was handed out
        with self.state.lock:
            if events.reset:  # (a new database numbers versions anew) its entries come by lookup until a commit
                self.committed.clear()
            for entry in events.committed:
                if entry.version > getattr(self.committed.get(entry.id.policy_id), "version", 0):
                    self.committed[entry.id.policy_id] = entry
            for sid in events.deleted:
                if getattr(self.committed.get(sid.policy_id), "id", None) == sid:
                    del self.committed[sid.policy_id]
            self.heard.notify_all()
        if events.reset:
            self.state.feed.replace_latest(events.latest)
            return
        for entry in events.committed:
            self.state.feed.raise_latest(*entry.id)
        for sid in events.deleted:
            self.tiers.forget(*sid)
            self.state.feed.deleted(sid)
            feed = self.state.feed
            if sid.policy_id not in events.latest and feed.latest(sid.policy_id, float("inf")) == sid.version:
                self.state.feed.set_latest(sid.policy_id, self.latest_of(sid.policy_id))
        for pid, version in events.latest.items():
            self.state.feed.set_latest(pid, version)

    def latest_of(self, policy_id: str) -> int:
        try:
            return self.state.ask("lookup", policy_id).version
        except UnknownPolicyError:
            return 0
