"""An idle league costs the catalog nothing per node: a store's follower waits on the catalog's doorbell for news
or for the catalog's beat, and its ``as_of`` (what bounds a reader's ``max_staleness_s``) moves only on the
catalog's own word: a beat sent after the wait began. A stuck catalog beats no more, and the bound holds."""

from __future__ import annotations

import time

import numpy as np
import ray
from helpers import eventually

from policystore.config import CATALOG_NAME, NAMESPACE, store_name

IDLE_S = 4.0


def age_s(store_actor) -> float:
    """How old the store's view of the catalog is (now less its feed's ``as_of``), on the store's clock."""
    return ray.get(store_actor.__ray_call__.remote(lambda self: time.monotonic() - self.feed._as_of))


def catalog_calls(catalog) -> int:
    return sum(ray.get(catalog.health.remote()).calls.values())


def test_an_idle_store_never_calls_the_catalog_yet_its_staleness_bound_holds(make_store):
    store = make_store(max_staleness_s=1.0)
    store.publish("idle", {"w": np.ones(16, dtype=np.float32)})
    node = ray.get_runtime_context().get_node_id()
    store_actor = ray.get_actor(store_name(node), namespace=NAMESPACE)
    catalog = ray.get_actor(CATALOG_NAME, namespace=NAMESPACE)
    eventually(lambda: age_s(store_actor) < 1.0, "the store hears the catalog")
    before, start = catalog_calls(catalog), time.monotonic()
    ages = []
    while time.monotonic() - start < IDLE_S:
        ages.append(age_s(store_actor))
        time.sleep(0.2)
    calls = catalog_calls(catalog) - before
    assert calls <= 0.1 * IDLE_S, f"an idle store called the catalog {calls} times in {IDLE_S} s"
    assert max(ages) < 1.0, ages  # fresh all along, on beats alone

    # a stuck catalog (its lock held) beats no more: the store's view ages past the bound instead of being renewed
    # by a doorbell that still answers
    held = catalog.__ray_call__.remote(lambda self: (self._lock.acquire(), time.sleep(3.0), self._lock.release()))
    time.sleep(2.5)
    assert age_s(store_actor) > 1.5
    ray.get(held)
    eventually(lambda: age_s(store_actor) < 1.0, "the store hears the catalog again")
    assert store.get("idle").id.version == 1
