"""Deadlines on remote calls, on a real local Ray: with the catalog's process stopped (SIGSTOP), reads that need
it and writes raise DeadlineExceededError naming the actor and the call instead of waiting for the whole freeze;
reads that do not need it keep working, and everything works again once the catalog runs (SIGCONT)."""

import os
import signal
from contextlib import contextmanager

import pytest
import ray
import torch
from helpers import eventually

from policystore import DeadlineExceededError, StoreConfig


def catalog_pid(store) -> int:
    return ray.get(store._catalog.__ray_call__.remote(lambda self: os.getpid()))


@contextmanager
def stopped(pid: int):
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_default_deadline_and_publish_deadline_scale_with_size():
    config = StoreConfig()
    assert config.call_timeout_s == 30.0
    assert config.publish_timeout_s(0) == 30.0
    assert config.publish_timeout_s(1 << 30) > config.publish_timeout_s(1 << 20) > 30.0


def test_a_stopped_catalog_is_a_deadline_error_not_a_hang(make_store):
    store = make_store(call_timeout_s=3.0, max_staleness_s=0.5)
    first = store.publish("p", {"w": torch.ones(4)})
    with stopped(catalog_pid(store)):
        # "latest" is served from the push while it is fresh, then needs the catalog: a clear error, not a wait
        def latest_needs_the_catalog():
            try:
                assert store.get("p").id == first  # the pushed latest, within the staleness bound
                return False
            except DeadlineExceededError as exc:
                assert "catalog of league 'default'" in str(exc) and "lookup()" in str(exc)
                return True

        eventually(latest_needs_the_catalog, "latest to need the catalog once the push is stale",
                   ignore=DeadlineExceededError)
        assert store.get("p", first.version)["w"].sum().item() == 4  # a held version needs no catalog
        with pytest.raises(DeadlineExceededError, match="catalog of league 'default' did not answer list"):
            store.list()
        with pytest.raises(DeadlineExceededError, match="store of league 'default' on node .* publish_staged"):
            store.publish("p", {"w": torch.zeros(4)})
    # running again: every call answers; the timed-out publish may or may not have landed, nothing else changed
    assert eventually(lambda: store.get("p").id.version in (1, 2), "reads once the store runs again",
                      ignore=DeadlineExceededError)
    assert [i.id.version for i in store.list("p")] in ([1], [1, 2])
    assert store.publish("p", {"w": torch.full((4,), 2.0)}).version in (2, 3)
    assert store.get("p")["w"][0].item() == 2.0


def test_connect_waits_for_the_store_it_starts_beyond_the_call_deadline(make_store):
    """Starting a store is a process start and torch's import (seconds on a busy node): the handle that creates it
    allows for that, while every call after it keeps the configured deadline."""
    store = make_store(call_timeout_s=0.05)
    assert store.config.call_timeout_s == 0.05
    with stopped(ray.get(store._actor.__ray_call__.remote(lambda self: os.getpid()))):
        with pytest.raises(DeadlineExceededError, match="did not answer stats"):
            store.stats()
