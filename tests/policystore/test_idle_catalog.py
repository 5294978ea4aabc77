"""An idle league costs the catalog nothing per node: a store's follower waits on the catalog's doorbell for news
or for the catalog's beat, and its ``as_of`` (what bounds a reader's ``max_staleness_s``) moves only on the
catalog's own word: a beat sent after the wait began. A stuck catalog beats no more, and the bound holds."""

from __future__ import annotations

import time

import numpy as np
import ray
from helpers import eventually

from policystore.remote import CATALOG_NAME, NAMESPACE, store_name

IDLE_S = 10.0


def as_of(store_actor) -> float:
    """When the store last had the catalog's word that it knew everything (its feed's ``as_of``, its clock)."""
    return ray.get(store_actor.__ray_call__.remote(lambda self: self.state.feed._as_of))


def catalog_calls(catalog) -> dict[str, int]:
    return ray.get(catalog.health.remote()).calls


def test_an_idle_store_never_calls_the_catalog_yet_its_staleness_bound_holds(make_store, tmp_path):
    store = make_store(max_staleness_s=1.0)
    store.publish("idle", {"w": np.ones(16, dtype=np.float32)})
    node = ray.get_runtime_context().get_node_id()
    store_actor = ray.get_actor(store_name(node), namespace=NAMESPACE)
    catalog = ray.get_actor(CATALOG_NAME, namespace=NAMESPACE)
    ray.get(store_actor.flush.remote())  # its spill written and its holder changes sent: nothing left to tell
    first = as_of(store_actor)
    eventually(lambda: as_of(store_actor) > first, "the store hears the catalog")
    before, start = catalog_calls(catalog), time.monotonic()
    seen = set()
    while time.monotonic() - start < IDLE_S:
        seen.add(as_of(store_actor))
        time.sleep(0.2)
    after = catalog_calls(catalog)
    calls = {m: n - before.get(m, 0) for m, n in after.items() if n > before.get(m, 0)}
    assert sum(calls.values()) <= 0.1 * IDLE_S, f"an idle store called the catalog in {IDLE_S} s: {calls}"
    assert len(seen) >= IDLE_S / 2, seen  # renewed all along, on beats alone

    # a stuck catalog (its lock held) beats no more: the store's view is not renewed, although the doorbell
    # still answers, and readers that need a fresher one ask the catalog (and wait for it, within their deadline)
    locked = tmp_path / "locked"  # the lock is held from then on (on a loaded machine the call may start late)

    def hold_lock(self) -> None:
        with self._lock:
            locked.touch()
            time.sleep(4.0)

    held = catalog.__ray_call__.remote(hold_lock)
    eventually(locked.exists, "the catalog's lock held")
    time.sleep(0.5)  # a beat sent just before may still be on its way
    stuck = as_of(store_actor)
    time.sleep(1.5)
    assert as_of(store_actor) == stuck
    ray.get(held)
    eventually(lambda: as_of(store_actor) > stuck, "the store hears the catalog again")
    assert store.get("idle").id.version == 1
