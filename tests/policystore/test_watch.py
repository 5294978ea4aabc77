"""The push (catalog -> node store -> reader processes) on a real local Ray: delivery, reading one's own write,
fallback when the push is stale or the store restarts, deletes, eviction letting go of memory, Ray sessions,
followers beyond the store's watch threads, and refs pushed only for what a reader opened."""

import asyncio
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import ray
import torch
from helpers import WAIT_S, eventually
from torch import nn

import policystore
from policystore.errors import UnknownPolicyError, UnknownVersionError
from policystore.ids import SnapshotId
from policystore.remote import CATALOG_NAME, NAMESPACE, catalog_name, store_name
from policystore.watch import Doorbell, Feed, Pushed
from policystore.wire import FeedEpoch, HotSnapshot

MiB = 1024 * 1024


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def seeded_net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return net()


def weights_of_mib(mib: float, seed: int = 0) -> dict[str, torch.Tensor]:
    return {"w": torch.randn(int(mib * MiB) // 4, generator=torch.Generator().manual_seed(seed))}


def actor_pid(name: str) -> int:
    actor = ray.get_actor(name, namespace=NAMESPACE)
    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))


def round_trips(store: policystore.PolicyStore) -> int:
    """Gets that reached the store (pushed reads do not)."""
    stats = store.stats()
    return stats.hits + stats.misses


@ray.remote(num_cpus=0.1)
class Reader:
    """Another process on the node, reading through its own client."""

    def push_state(self):
        return policystore.connect().push_state()

    def get(self, policy_id: str, version: int | None = None):
        """The version got, and whether the store was asked."""
        store = policystore.connect()
        before = round_trips(store)
        snap = store.get(policy_id, version)
        self.held = snap  # keep it, as a worker playing it would
        return snap.id, round_trips(store) - before

    def open(self, policy_id: str) -> tuple[str, int]:
        """Get the latest version and let go of it (from now on the reader follows the policy)."""
        return policystore.connect().get(policy_id).id

    def load_twice(self, policy_id: str) -> bool:
        store = policystore.connect()
        a, b = store.load_module(policy_id, net), store.load_module(policy_id, net)
        return a.policystore_snapshot is b.policystore_snapshot

    def get_behind(self, policy_id: str, heard: int) -> SnapshotId:
        """The latest, asked while this process's push still names ``heard`` and brought no ref: the window
        between a change in the catalog and the push that tells this process of it."""
        store = policystore.connect()
        follower = store._follower
        follower.latest, follower.hot = (lambda _policy_id: heard), (lambda _sid: None)
        try:
            return store.get(policy_id).id
        finally:
            del follower.latest, follower.hot

    def publish(self, policy_id: str, seed: int) -> int:
        """Publish ``seeded_net(seed)``'s weights, as a learner in another process does."""
        return policystore.connect().publish(policy_id, seeded_net(seed).state_dict()).version

    def get_error(self, policy_id: str, version: int | None = None) -> str:
        try:
            policystore.connect().get(policy_id, version)
        except UnknownPolicyError as exc:
            return type(exc).__name__
        return "no error"


@pytest.fixture(scope="module")
def reader(ray_session):
    actor = Reader.remote()
    ray.get(actor.__ray_ready__.remote())
    return actor


def pushed(reader, policy_id: str, version: int):
    state = ray.get(reader.push_state.remote())
    return state.fresh and state.latest.get(policy_id) == version and (policy_id, version) in state.hot


def known(reader, policy_id: str, version: int):
    """The reader knows ``version`` is the latest (with or without a ref: it gets refs of what it opened only)."""
    state = ray.get(reader.push_state.remote())
    return state.fresh and state.latest.get(policy_id) == version


def test_the_feed_hands_each_follower_the_changes_since_its_last_event():
    """The store's feed on its own (no Ray): what changed after an event number, refs only of followed policies,
    evictions and deletes apart, and a new catalog database as a new epoch, after which followers reset."""
    feed = Feed()
    a1, a2, b1 = SnapshotId("a", 1), SnapshotId("a", 2), SnapshotId("b", 1)
    for sid in (a1, b1):
        feed.raise_latest(*sid)
        feed.hot(HotSnapshot(sid, b"", [None]))
    start = feed.watch(0, 0, follows=["a"])
    assert start.reset and start.latest == {"a": 1, "b": 1} and [s.id for s in start.hot] == [a1]
    assert start.epoch == feed.epoch and start.epoch.catalog == ""
    feed.raise_latest(*a2)
    feed.hot(HotSnapshot(a2, b"", [None]))
    feed.gone(a1)
    feed.deleted(b1)
    feed.set_latest("b", 0)
    changes = feed.watch(start.seq, 0, follows=["a"])
    assert not changes.reset and changes.latest == {"a": 2, "b": 0}
    assert [s.id for s in changes.hot] == [a2] and changes.gone == (a1,) and changes.deleted == (b1,)
    assert feed.watch(changes.seq, 0, follows=["a"]).latest == {}  # nothing new
    feed.catalog_epoch("db1")
    assert feed.epoch == FeedEpoch(start.epoch.store, "db1") and feed.ring().epoch == feed.epoch
    assert feed.watch(changes.seq, 0).epoch == feed.epoch != start.epoch  # a follower of the old epoch resets


def test_the_doorbell_wakes_a_follower_early_only_for_news_about_what_it_follows():
    """The feed's rings name the policies their news is about (deletes and new epochs: everyone), and the doorbell
    (its class on one event loop, no Ray, rung from another thread as the store does) wakes a follower of ``p``
    for ``p``'s news and a delete at once, while news about ``q`` reaches it only with its heartbeat; a follower of
    everything wakes for any news."""
    feed, bell = Feed(), Doorbell()

    async def rung(last):
        ring = feed.next_ring(last, 0)
        await asyncio.to_thread(bell.ring, ring)
        await asyncio.sleep(0.05)  # the woken waiters run
        return ring

    async def scenario():
        first = await rung(None)
        assert first.everyone
        of_p = asyncio.ensure_future(bell.wait(first.seq, first.epoch, WAIT_S, ["p"]))
        of_all = asyncio.ensure_future(bell.wait(first.seq, first.epoch, WAIT_S))
        feed.raise_latest("q", 1)
        ring = await rung(first)
        assert (ring.touched, ring.everyone) == (("q",), False)
        assert of_all.done() and not of_p.done()
        feed.raise_latest("p", 1)
        feed.hot(HotSnapshot(SnapshotId("p", 1), b"", [None]))
        ring = await rung(ring)
        assert (ring.touched, ring.everyone) == (("p",), False) and of_p.done() and of_p.result().seq == ring.seq
        of_p = asyncio.ensure_future(bell.wait(ring.seq, ring.epoch, WAIT_S, ["p"]))
        feed.deleted(SnapshotId("q", 1))
        ring = await rung(ring)
        assert ring.everyone and of_p.done()
        feed.raise_latest("q", 2)
        ring = await rung(ring)
        heartbeat = await bell.wait(ring.seq - 1, ring.epoch, 0.2, ["p"])  # times out, then tells the news
        assert heartbeat.seq == ring.seq

    asyncio.run(scenario())


def test_a_settling_doorbell_wakes_its_followers_once_after_the_settle_time_with_the_newest_ring():
    """The catalog's doorbell settles (``settle_s``): a follower woken by a commit wakes only after that time, and
    news rung meanwhile reaches it in the same wake (so the committing store's answer goes first, and a burst of
    commits costs each follower one call)."""
    feed, bell = Feed(), Doorbell(settle_s=0.2)

    async def scenario():
        first = feed.next_ring(None, 0)
        bell.ring(first)
        waiting = asyncio.ensure_future(bell.wait(first.seq, first.epoch, WAIT_S))
        await asyncio.sleep(0.01)
        feed.raise_latest("p", 1)
        await asyncio.to_thread(bell.ring, feed.next_ring(first, 0))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # still settling
        feed.raise_latest("p", 2)
        newest = feed.next_ring(None, 0)
        await asyncio.to_thread(bell.ring, newest)
        ring = await asyncio.wait_for(waiting, 5)
        assert ring.seq == newest.seq  # one wake, with both commits

    asyncio.run(scenario())


def test_commits_reach_other_processes_and_their_gets_skip_the_store(make_store, reader):
    store = make_store(max_staleness_s=2.0)
    source = net()
    store.publish("p", net().state_dict())
    eventually(lambda: known(reader, "p", 1), "p@v1's number pushed to the reader")
    assert ray.get(reader.get.remote("p")) == (("p", 1), 1)  # first get of the policy: one call to the store
    store.publish("p", source.state_dict(), meta={"elo": 1})
    eventually(lambda: pushed(reader, "p", 2), "p@v2 pushed to the reader, with its ref")
    assert ray.get(reader.get.remote("p")) == (("p", 2), 0)  # latest: a lookup, and one ray.get of a held ref
    assert ray.get(reader.load_twice.remote("p"))  # held: the same snapshot, not fetched again
    eventually(lambda: store.stats().watchers >= 1, "the reader waiting on the store's doorbell")


def test_a_publisher_reads_its_own_write_at_once(make_store):
    store = make_store(max_staleness_s=30.0)  # a push this old still counts as fresh: only the floor helps
    for version in range(1, 6):
        assert store.publish("mine", weights_of_mib(0.01, version)).version == version
        assert store.get("mine").id.version == version
        assert store.latest_version("mine") == version


def test_a_played_update_is_mapped_and_its_module_built_before_it_is_read(make_store, reader):
    """The played update's fast path: once this process plays a policy, the follower maps each new version pushed
    to it and builds its module with the same ``build``, so ``load_module`` asks nobody and hands that module out
    (once); the module already played keeps its version."""
    store = make_store(max_staleness_s=30.0)
    ray.get(reader.publish.remote("played", 1))  # a learner in another process
    first = store.load_module("played", net)  # this process plays it from now on
    sid = SnapshotId("played", ray.get(reader.publish.remote("played", 2)))

    def ready() -> bool:
        pushed = store._follower.hot(sid)
        return pushed is not None and pushed.snapshot is not None and pushed.ahead is not None

    eventually(ready, "the new version mapped and its module built ahead")
    built = store._follower.hot(sid).ahead[1]
    before = round_trips(store)
    module = store.load_module("played", net)
    assert module is built and round_trips(store) == before
    assert module.policystore_snapshot.id == sid
    assert torch.equal(module[0].weight, seeded_net(2)[0].weight)
    again = store.load_module("played", net)
    assert again is not module and torch.equal(again[0].weight, module[0].weight)  # handed out once
    assert first.policystore_snapshot.id.version == 1 and torch.equal(first[0].weight, seeded_net(1)[0].weight)


def test_reads_never_go_backwards_whatever_threads_race(make_store):
    """Monotonic reads in one process: two threads publish one policy at once while a third reads "latest"
    (``latest_version``, ``get``, ``load_module``) without pause. No read answers below a publish acknowledged
    before it began, and the reader never answers below what it answered before; once both publishes returned,
    "latest" is at least the higher of the two."""
    store = make_store(max_staleness_s=30.0)  # a push this old still counts as fresh: only the floor helps
    weights = {kind: weights_of_mib(1, seed=seed) for seed, kind in enumerate(("first", "second"))}

    class Weights(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("w", torch.empty_like(weights["first"]["w"]))

    acked: list[tuple[float, int]] = []  # (when acknowledged, version)
    reads: list[tuple[float, int]] = []  # (when the read began, version answered)
    stop = threading.Event()

    def reader() -> None:
        reads_of = (lambda: store.latest_version("race"), lambda: store.get("race").id.version,
                    lambda: store.load_module("race", Weights).policystore_snapshot.id.version)
        while not stop.is_set():
            for read in reads_of:
                began = time.monotonic()
                reads.append((began, read()))

    def publisher(kind: str) -> None:
        version = store.publish("race", weights[kind]).version
        acked.append((time.monotonic(), version))

    store.publish("race", weights["first"])
    poller = threading.Thread(target=reader)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns far more often than by default: more interleavings tried
    poller.start()
    try:
        for _ in range(40):
            racers = [threading.Thread(target=publisher, args=(kind,)) for kind in weights]
            for racer in racers:
                racer.start()
            for racer in racers:
                racer.join()
            highest = max(version for _, version in acked[-2:])
            assert store.latest_version("race") >= highest
            assert store.get("race").id.version >= highest
    finally:
        stop.set()
        poller.join()
        sys.setswitchinterval(switch)
    answered = [version for _, version in reads]
    assert answered == sorted(answered), "a read answered older than an earlier read of this process"
    for began, version in reads:
        floor = max((v for when, v in acked if when < began), default=0)
        assert version >= floor, f"a read begun after v{floor} was acknowledged answered v{version}"


def test_stale_push_falls_back_to_the_store_and_held_refs_still_serve(make_store, reader):
    store = make_store(max_staleness_s=0.4)
    store.publish("p", net().state_dict())
    ray.get(reader.open.remote("p"))
    eventually(lambda: pushed(reader, "p", 1), "p@v1 pushed")
    catalog = actor_pid(CATALOG_NAME)
    os.kill(catalog, signal.SIGSTOP)  # the store hears nothing more: its push goes stale, then the readers'
    try:
        eventually(lambda: not ray.get(reader.push_state.remote()).fresh, "the reader's push to go stale")
        assert ray.get(reader.get.remote("p", 1)) == (("p", 1), 0)  # a pushed ref needs neither store nor catalog
        answer = []
        getter = threading.Thread(target=lambda: answer.append(ray.get(reader.get.remote("p"))))
        getter.start()  # latest, stale: asks the store, which asks the (stopped) catalog
        getter.join(timeout=1.0)
        assert getter.is_alive(), "a stale push answered 'latest' without asking"
    finally:
        os.kill(catalog, signal.SIGCONT)
    getter.join(timeout=WAIT_S)
    assert answer == [(("p", 1), 1)]


def test_latest_never_fails_on_a_version_deleted_since_the_push_named_it(make_store, reader):
    """"Latest" within the staleness window may name a version deleted meanwhile, in the reader's push or in the
    node store's own feed: the get then answers the latest that is left, not UnknownVersionError."""
    store = make_store(max_staleness_s=30.0)  # every push counts as fresh: only the fallback can help
    for seed in range(3):
        store.publish("p", weights_of_mib(0.01, seed))
    assert store.delete("p", 1) == [("p", 1)]
    assert ray.get(reader.get_behind.remote("p", 1)) == ("p", 3)
    server = ray.get_actor(store_name(store.node_id), namespace=NAMESPACE)

    def feed_behind(self):  # the node store's feed, too, has not heard of the delete
        self.state.feed.latest = lambda _policy_id, _max_staleness_s: 1

    ray.get(server.__ray_call__.remote(feed_behind))
    assert ray.get(server.resolve.remote("p")).id == ("p", 3)


def test_a_restarted_store_is_followed_again(make_store, reader):
    store = make_store(max_staleness_s=0.4)
    source = net()
    store.publish("p", source.state_dict(), durable=True)
    ray.get(reader.open.remote("p"))
    eventually(lambda: pushed(reader, "p", 1), "p@v1 pushed")
    os.kill(actor_pid(store_name(store.node_id)), signal.SIGKILL)  # Ray restarts it; it rebuilds from disk
    policystore.clear_cache()
    x = torch.randn(3, 16)
    assert torch.equal(store.load_module("p", net)(x), source(x))  # rides out the restart with round trips
    eventually(lambda: pushed(reader, "p", 1), "the restarted store's copy pushed")  # new epoch, new ref
    assert ray.get(reader.get.remote("p"))[0] == ("p", 1)


def test_deletes_are_pushed_and_never_served_again(make_store, reader):
    store = make_store(max_staleness_s=2.0)
    for _ in range(2):
        store.publish("p", net().state_dict())
    ray.get(reader.open.remote("p"))
    eventually(lambda: pushed(reader, "p", 2), "p@v2 pushed")
    assert ray.get(reader.get.remote("p"))[0] == ("p", 2)  # the reader holds v2 now
    assert store.delete("p", 2) == [("p", 2)]
    assert store.get("p").id.version == 1  # the deleting process at once
    eventually(lambda: known(reader, "p", 1) and ("p", 2) not in ray.get(reader.push_state.remote()).hot,
             "the delete pushed")
    assert ray.get(reader.get.remote("p"))[0] == ("p", 1)
    assert ray.get(reader.get_error.remote("p", 2)) == UnknownVersionError.__name__
    store.delete("p")
    eventually(lambda: "p" not in ray.get(reader.push_state.remote()).latest, "the policy's end pushed")
    assert ray.get(reader.get_error.remote("p")) == UnknownPolicyError.__name__


def test_eviction_is_pushed_and_readers_let_go_of_the_memory(make_store, reader):
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    def object_store_used() -> int:
        reply = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address))
        return int(reply.store_stats.object_store_bytes_used)

    store = make_store(hot_capacity_bytes=int(5.5 * MiB), max_staleness_s=2.0)
    store.publish("a", weights_of_mib(4))
    ray.get(reader.open.remote("a"))
    eventually(lambda: pushed(reader, "a", 1), "a pushed")
    assert object_store_used() >= 4 * MiB
    store.publish("b", weights_of_mib(1, seed=1))
    store.publish("c", weights_of_mib(1, seed=2))  # over capacity: a is evicted (it is on disk by now)
    # each process's follower hears of the eviction on its own long poll: wait for both, in either order
    eventually(lambda: ("a", 1) not in ray.get(reader.push_state.remote()).hot, "a's eviction pushed to the reader")
    eventually(lambda: ("a", 1) not in store.push_state().hot, "a's eviction pushed to this process")
    eventually(lambda: object_store_used() < 3 * MiB, "a's memory freed once no process holds it")
    assert ray.get(reader.get.remote("a"))[0] == ("a", 1)  # and it comes back from disk on demand


def test_more_followers_than_watch_threads_all_get_pushes(make_store, reader):
    store = make_store(max_watchers=1, max_staleness_s=2.0)  # one thread answers followers in store and catalog
    readers = [reader, *(Reader.remote() for _ in range(3))]
    store.publish("p", net().state_dict())
    for r in readers:
        assert ray.get(r.open.remote("p")) == ("p", 1)
    actor = ray.get_actor(store_name(store.node_id), namespace=NAMESPACE)
    ring = ray.get(actor.bell_wait.remote(0, "", 0))
    waits = [actor.bell_wait.remote(ring.seq, ring.epoch, WAIT_S) for _ in range(200)]  # more than any thread pool
    eventually(lambda: store.stats().watchers >= 200, "200 waiters on the doorbell at once")
    store.publish("p", net().state_dict())
    assert all(r.seq > ring.seq for r in ray.get(waits, timeout=WAIT_S))  # every waiter woke with the news
    for r in readers:
        eventually(lambda r=r: pushed(r, "p", 2), "p@v2 pushed to every reader")
        assert ray.get(r.get.remote("p")) == (("p", 2), 0)  # by push, not by a round trip
    eventually(lambda: store.stats().watchers >= len(readers), "every reader waiting on the doorbell, no thread")


def test_a_reader_gets_refs_only_of_what_it_opened(make_store, reader):
    store = make_store(max_staleness_s=2.0)
    for pid in ("u", "v", "w"):  # policies the module's reader has never opened
        store.publish(pid, weights_of_mib(0.01))
    eventually(lambda: all(known(reader, pid, 1) for pid in "uvw"), "the versions pushed")
    state = ray.get(reader.push_state.remote())
    assert not {("u", 1), ("v", 1), ("w", 1)} & set(state.hot)  # hot on the node, never opened: no ref held
    assert ray.get(reader.get.remote("v")) == (("v", 1), 1)  # opened: one call to the store
    eventually(lambda: pushed(reader, "v", 1), "v's ref pushed once the reader follows v")
    for pid in ("u", "v"):
        store.publish(pid, weights_of_mib(0.01, seed=2))
    eventually(lambda: pushed(reader, "v", 2) and known(reader, "u", 2), "the new versions pushed")
    state = ray.get(reader.push_state.remote())
    assert "v" in state.follows and "u" not in state.follows
    assert {sid for sid in state.hot if sid.policy_id in "uvw"} == {("v", 2)}  # u's: its number; v@1: let go of


def test_first_get_of_an_unopened_hot_snapshot_never_asks_the_catalog(make_store, reader):
    store = make_store(max_staleness_s=60.0)  # the push stays fresh while the catalog is stopped
    store.publish("q", weights_of_mib(0.01))
    store.publish("r", weights_of_mib(0.01))  # neither ever opened by the reader
    eventually(lambda: known(reader, "q", 1) and known(reader, "r", 1), "the versions pushed")
    catalog = actor_pid(CATALOG_NAME)
    os.kill(catalog, signal.SIGSTOP)  # any call to the catalog would hang
    try:
        assert ray.get(reader.get.remote("q"), timeout=WAIT_S) == (("q", 1), 1)  # latest by push, then the store
        assert ray.get(reader.get.remote("r", 1), timeout=WAIT_S) == (("r", 1), 1)
    finally:
        os.kill(catalog, signal.SIGCONT)


@ray.remote(num_cpus=0)
class Never:
    def value(self) -> None:
        threading.Event().wait()  # a result that never comes


def test_a_pushed_ref_that_never_arrives_is_dropped_and_the_store_asked(make_store):
    """A pushed ref whose ``ray.get`` waits forever (seen once in a loaded suite run) costs a read one call
    deadline, then the store is asked: the read returns the snapshot instead of hanging."""
    store = make_store(call_timeout_s=2.0, max_staleness_s=60.0)
    store.publish("stuck", weights_of_mib(0.1, seed=3))
    sid = store.get("stuck").id  # opened (and let go): its pushes now come with refs
    follower = store._follower
    eventually(lambda: follower.state().fresh and follower.hot(sid) is not None, "the pushed ref")
    never = Never.remote()
    follower._hot[sid] = Pushed(never.value.remote(), follower.hot(sid).header)  # the fault: a ref that never resolves
    before = round_trips(store)
    snap = store.get("stuck")
    assert snap.id == sid and torch.equal(snap["w"], weights_of_mib(0.1, seed=3)["w"])
    assert round_trips(store) - before == 1  # the stuck ref was given up on and the store asked
    ray.kill(never)


def test_a_store_ref_that_never_arrives_ends_in_an_error_naming_the_snapshot(make_store, monkeypatch):
    """After its retries, a read whose store copy never reaches the process raises the store's own deadline error
    naming the snapshot (not Ray's bare GetTimeoutError)."""
    store = make_store(call_timeout_s=1.0, max_staleness_s=60.0)
    store.publish("lost", weights_of_mib(0.1, seed=4))
    never = Never.remote()
    stuck = never.value.remote()
    answer = store._call

    def call(method, *args, **kwargs):  # the fault: the store's answer carries a ref that never resolves
        hot = answer(method, *args, **kwargs)
        return dataclasses.replace(hot, refs=[stuck]) if method == "resolve" else hot

    monkeypatch.setattr(store, "_call", call)
    monkeypatch.setattr(policystore.client, "RETRY_TIMEOUT_S", 1.5)
    with pytest.raises(policystore.DeadlineExceededError, match="lost@v1"):
        store.get("lost")
    ray.kill(never)


def test_clear_cache_drops_this_process_snapshots(make_store):
    store = make_store()  # a new catalog (the previous test's was stopped): its epoch is pushed to this process
    store.publish("p", net().state_dict())
    first = store.get("p")
    catalog = ray.get(ray.get_actor(CATALOG_NAME, namespace=NAMESPACE).health.remote()).epoch
    eventually(lambda: store.push_state().catalog_epoch == catalog, "the new catalog's epoch pushed to this process")
    assert store.get("p") is first  # what this process got from the new catalog is not forgotten as 'renumbered'
    policystore.clear_cache()
    again = store.get("p")
    assert again is not first and again.id == first.id
    store.drop_cache()
    assert store.get("p") is not again
    assert torch.equal(again["0.weight"], first["0.weight"])


_NEW_SESSION = """
import ray, torch, policystore
def start():
    ray.init(address="local", num_cpus=1, object_store_memory=200_000_000, include_dashboard=False,
             logging_level="error")
start()
old = policystore.connect()
old.publish("p", {"w": torch.ones(4)})
held = old.get("p")                         # kept alive on purpose, like an old Algorithm object
ray.shutdown()
start()                                     # a new session in the same process: its store is empty
try:
    old.get("p")
    print("REUSED")
except policystore.UnknownPolicyError:
    print("EMPTY")
new = policystore.connect()
print("NEW" if new is not old else "SAME")
print(new.publish("p", {"w": torch.zeros(4)}).version, float(old.get("p")["w"].sum()))
policystore.client.shutdown_all()
ray.shutdown()
"""


def test_a_new_ray_session_never_reuses_the_old_sessions_state():
    short = tempfile.mkdtemp(prefix="ps-", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    try:
        done = subprocess.run([sys.executable, "-c", _NEW_SESSION], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "TMPDIR": short})
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["EMPTY", "NEW", "1", "0.0"], done.stdout


def followers_running() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("policystore-follow-")]


def test_close_ends_the_follower_threads_before_it_returns_and_the_next_call_starts_afresh(make_store):
    """Before ``ray.shutdown()``: a follower's Ray call that lands while Ray destroys its core worker ends the whole
    process, so ``close`` returns only once every follower thread has ended."""
    store = make_store()
    store.publish("p", net().state_dict())
    first = store.get("p")
    assert followers_running()
    policystore.close()
    assert followers_running() == []
    again = store.get("p")  # the handle still works: a new follower, a new cache
    assert again is not first and torch.equal(again["0.weight"], first["0.weight"])
    assert followers_running()


_EXIT_WITHOUT_CLOSE = """
import atexit, threading, ray, torch
ray.init(address="local", num_cpus=1, object_store_memory=200_000_000, include_dashboard=False,
         logging_level="error")
# runs after policystore's exit handler (registered later, when it starts following) and before Ray's shutdown
# (registered at `import ray`): the order atexit keeps
atexit.register(lambda: print("at Ray's shutdown:", sorted(t.name[:19] for t in threading.enumerate()
                                                           if t.name.startswith("policystore-follow-"))))
import policystore
store = policystore.connect()
store.publish("p", {"w": torch.ones(4)})
print("following:", [t.name[:19] for t in threading.enumerate() if t.name.startswith("policystore-follow-")])
"""


def test_at_exit_the_followers_end_before_rays_own_shutdown_runs():
    short = tempfile.mkdtemp(prefix="ps-", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    try:
        done = subprocess.run([sys.executable, "-c", _EXIT_WITHOUT_CLOSE], capture_output=True, text=True,
                              timeout=300, env={**os.environ, "TMPDIR": short, "RAY_ADDRESS": ""})
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["following: ['policystore-follow-']", "at Ray's shutdown: []"], done.stdout


@ray.remote(num_cpus=0.1)
class Publisher:
    def publish(self, version_seed: int) -> tuple[int, list[str]]:
        policystore.connect().publish("from_actor", weights_of_mib(0.25, seed=version_seed))
        folder = policystore.config.staging_dir()
        return os.getpid(), [str(p) for p in folder.iterdir() if p.name.startswith(f"{os.getpid()}-")]


def test_one_staging_file_per_publisher_reused_and_removed_once_it_is_gone(make_store):
    folder = policystore.config.staging_dir()
    folder.mkdir(mode=0o700, exist_ok=True)
    orphan = folder / "999999999-left-by-a-killed-publisher"  # no such process
    live = folder / f"{os.getpid()}-being-packed"  # this process: maybe publishing right now
    orphan.write_bytes(b"x" * 4096)
    live.write_bytes(b"x")
    try:
        store = make_store()
        assert not orphan.exists() and live.exists()
        publisher = Publisher.remote()
        pid, files = ray.get(publisher.publish.remote(0))
        assert len(files) == 1  # one file per publishing process...
        assert ray.get(publisher.publish.remote(1)) == (pid, files)  # ...reused by its next publish
        assert torch.equal(store.get("from_actor", 1)["w"], weights_of_mib(0.25, seed=0)["w"])
        assert torch.equal(store.get("from_actor", 2)["w"], weights_of_mib(0.25, seed=1)["w"])
        os.kill(pid, signal.SIGKILL)  # killed: nothing of it removes its file; the store's sweep does
        eventually(lambda: not os.path.exists(files[0]), "the killed publisher's staging file is removed")
        store.publish("p", net().state_dict())
        assert live.exists()  # a live process's file is never taken
        assert store.get("p")["0.weight"].shape == (32, 16)
    finally:
        live.unlink(missing_ok=True)
        orphan.unlink(missing_ok=True)


def test_a_store_follows_a_catalog_with_nothing_committed_on_its_doorbell_not_in_a_busy_loop(make_store):
    """Before a league's first commit the catalog answers a store's follower without a reset; the follower must
    still wait on the doorbell between calls (a heartbeat, about 8 calls a second), not ask again at once (it did:
    about a thousand calls a second per store until something was published)."""
    league = "nothing-committed"
    store = make_store(league=league)
    try:
        catalog = ray.get_actor(catalog_name(league), namespace=NAMESPACE)

        def watch_calls() -> int:
            return ray.get(catalog.health.remote()).calls.get("watch", 0)

        eventually(watch_calls, "the store follows its catalog")
        before = watch_calls()
        time.sleep(2.0)
        assert watch_calls() - before < 100, "the follower asks the catalog again at once"
        store.publish("first", net().state_dict())
        eventually(lambda: store.push_state().latest.get("first") == 1, "the first commit is pushed")
    finally:
        policystore.client.shutdown_all(league=league)
