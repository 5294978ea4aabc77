"""Remote calls (``policystore.remote``), on a real local Ray: every call has a deadline and Ray's errors reach
callers as policystore errors. With the catalog's process stopped (SIGSTOP), reads that need it and writes raise
DeadlineExceededError naming the actor and the call instead of waiting for the whole freeze; reads that do not
need it keep working, and everything works again once the catalog runs (SIGCONT). A store SIGKILLed under a
publish is a StoreUnavailableError, Ray's error kept as its cause."""

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest
import ray
import torch
from helpers import eventually

from policystore import DeadlineExceededError, InvalidOptionError, StoreConfig, StoreUnavailableError, remote


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


def test_the_store_and_the_catalog_start_with_two_malloc_arenas(make_store):
    """glibc reads its arena limit once, when a process starts: the actors' Ray options carry it to their processes."""
    store = make_store()
    for actor in (store._actor, store._catalog):
        assert ray.get(actor.__ray_call__.remote(lambda self: os.environ.get("MALLOC_ARENA_MAX")),
                       timeout=60) == "2"


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
        with pytest.raises(DeadlineExceededError, match="store of league 'default' on node .* publish_staged") as exc:
            store.publish("p", {"w": torch.zeros(4)})
        assert "publish of 'p' may still commit after this error: list('p') shows whether it did" in str(exc.value)
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


def test_a_publish_cut_by_a_store_sigkill_is_a_store_unavailable_error(make_store, tmp_path):
    """The store dies under a publish: the publisher gets a PolicyStoreError naming the store and the call (with
    Ray's error as its cause), not Ray's ActorUnavailableError; the restarted store takes the next publish."""
    store = make_store()
    flag = str(tmp_path / "publishing")

    def hang_in_publish(server):
        def hang(*args, **kwargs):
            open(flag, "w").close()
            time.sleep(600)

        server.publisher._publish_timed = hang
        return os.getpid()

    pid = ray.get(store._actor.__ray_call__.remote(hang_in_publish))
    killer = threading.Thread(target=lambda: eventually(lambda: os.path.exists(flag), "the publish to start")
                              and os.kill(pid, signal.SIGKILL))
    killer.start()
    with pytest.raises(StoreUnavailableError, match="store of league 'default' on node .* publish") as raised:
        store.publish("cut", {"w": torch.ones(4)})
    killer.join()
    assert not isinstance(raised.value, DeadlineExceededError)
    assert isinstance(raised.value.__cause__, ray.exceptions.RayActorError)
    assert eventually(lambda: store.publish("cut", {"w": torch.ones(4)}), "a publish to the restarted store",
                      ignore=StoreUnavailableError).version >= 1


class Probe:
    """A plain actor to call: it answers, sleeps, raises a policystore error, or fails for another reason."""

    def echo(self, value, *, twice=False):
        return (value, value) if twice else value

    def sleep(self, seconds):
        time.sleep(seconds)

    def refuse(self):
        raise InvalidOptionError("refused by the actor")

    def crash(self):
        raise RuntimeError("a bug in the actor")

    def pid(self):
        return os.getpid()


def test_call_maps_each_of_rays_errors_to_a_policystore_error(ray_session):
    probe = remote.start(Probe, "remote-test-probe", options={"max_restarts": 0})
    try:
        assert remote.call(probe, "echo", 3, twice=True, timeout_s=60) == (3, 3)
        assert remote.running("remote-test-probe") == probe
        with pytest.raises(InvalidOptionError, match="refused by the actor") as own:  # as itself, not Ray's wrapping
            remote.call(probe, "refuse", timeout_s=60)
        assert not isinstance(own.value, ray.exceptions.RayError)
        with pytest.raises(ray.exceptions.RayTaskError, match="a bug in the actor"):  # a bug stays a bug
            remote.call(probe, "crash", timeout_s=60)
        with pytest.raises(DeadlineExceededError, match=r"'remote-test-probe' did not answer sleep\(\) within 0.5 s"):
            remote.call(probe, "sleep", 3, timeout_s=0.5)
        ref = remote.send(probe, "sleep", 3)
        started = time.monotonic()
        assert remote.get(ref, 60, "the probe", "sleep", stop=lambda: time.monotonic() - started > 0.3) is None
        assert time.monotonic() - started < 2.5  # stopped waiting long before the answer
    finally:
        assert remote.kill("remote-test-probe")
    assert remote.running("remote-test-probe") is None and not remote.kill("remote-test-probe")
    with pytest.raises(StoreUnavailableError, match="during echo") as gone:
        remote.call(probe, "echo", 1, timeout_s=60)
    assert isinstance(gone.value.__cause__, ray.exceptions.ActorDiedError) and remote.died(gone.value)
    with pytest.raises(StoreUnavailableError, match="'remote-test-probe' is not running") as missing:
        remote.find("remote-test-probe")
    assert remote.died(missing.value)


def test_begin_waits_later_and_its_deadline_counts_from_the_start(ray_session):
    probe = remote.start(Probe, "remote-test-begin", options={"max_restarts": 0})
    try:
        echoed = remote.begin(probe, "echo", 7, timeout_s=60)
        assert echoed() == 7
        started = time.monotonic()
        slept = remote.begin(probe, "sleep", 30, timeout_s=1.0)
        time.sleep(0.8)  # the caller's own work, while the actor sleeps
        with pytest.raises(DeadlineExceededError, match=r"did not answer sleep\(\) within 1 s"):
            slept()
        assert time.monotonic() - started < 10  # the deadline counted from begin: not 1 s after the wait started
    finally:
        remote.kill("remote-test-begin")


_AFTER_SHUTDOWN = """
import ray
from policystore import StoreUnavailableError, remote

ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="error")
probe = ray.remote(num_cpus=0.1)(type("Probe", (), {"echo": lambda self, v: v})).remote()
assert ray.get(probe.echo.remote(1)) == 1
ray.shutdown()
for attempt in (lambda: remote.send_in_background(probe, "echo", 2),
                lambda: remote.find("policystore-anything", background=True)):
    try:
        attempt()
        print("no error")
    except StoreUnavailableError as exc:
        print("refused:", exc)
print("session:", remote.session_name())
print("ray restarted:", ray.is_initialized())
"""


def test_a_background_thread_never_starts_ray_after_the_driver_shut_it_down():
    """Ray's auto-init starts a new local Ray for an actor call made after ``ray.shutdown()``: a follower thread
    that raced a driver's shutdown left one running (and the driver's next ``ray.init`` failed). The calls the
    followers make refuse instead (a fresh process: this one's shared Ray session must stay up)."""
    run = subprocess.run([sys.executable, "-c", _AFTER_SHUTDOWN], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RAY_ADDRESS": ""})
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert [line.partition(":")[0] for line in lines] == ["refused", "refused", "session", "ray restarted"], lines
    assert all("Ray is not running" in line for line in lines[:2])
    assert lines[2:] == ["session: None", "ray restarted: False"]


def test_retry_s_rides_out_a_restart_and_a_finder_reaches_a_successor(ray_session):
    probe = remote.start(Probe, "remote-test-restarts")
    try:
        pid = remote.call(probe, "pid", timeout_s=60)
        os.kill(pid, signal.SIGKILL)  # Ray restarts it (max_restarts=-1)
        assert remote.call(probe, "pid", timeout_s=60, retry_s=60) != pid
    finally:
        remote.kill("remote-test-restarts")
    found = []

    def find(again: bool):
        found.append(again)
        return remote.start(Probe, "remote-test-restarts") if again else probe

    assert remote.call(find, "echo", 5, timeout_s=60, retry_s=60) == 5  # the first stopped for good: its successor
    assert found == [False, True]
    remote.kill("remote-test-restarts")
