"""Several Ray nodes on one machine (ray.cluster_utils.Cluster): a store per node, cross-node fetch, faults."""

import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest
import ray
import torch
from helpers import eventually
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import policystore
from policystore import StoreConfig
from policystore.memory import MiB
from policystore.remote import CATALOG_NAME, NAMESPACE, store_name

STORE_MEMORY = 400 * MiB


def filled(version: int, mib: float = 1.0) -> dict[str, torch.Tensor]:
    """Two tensors whose every element is ``version``: a torn or mixed read cannot go unnoticed."""
    n = int(mib * MiB) // 8
    return {"a": torch.full((n,), float(version)), "b": torch.full((n,), float(version))}


@ray.remote(num_cpus=0.05)
class Peer:
    """A worker process on one node, using that node's store through its own client."""

    def node_and_store(self) -> tuple[str, str]:
        store = policystore.connect()
        return ray.get_runtime_context().get_node_id(), store.node_id

    def publish(self, policy_id: str, version_value: int, mib: float = 1.0, durable: bool = False) -> int:
        return policystore.connect().publish(policy_id, filled(version_value, mib), durable=durable).version

    def get(self, policy_id: str, version: int | None = None) -> tuple[int, float, float]:
        policystore.clear_cache()  # force a trip to the store, as a fresh reader would
        snap = policystore.connect().get(policy_id, version)
        return snap.id.version, float(snap["a"].min()), float(snap["b"].max())

    def hold(self, policy_id: str) -> int:
        self.held = policystore.connect().get(policy_id)
        return self.held.id.version

    def held_value(self) -> float:
        return float(self.held["a"].sum())

    def latest(self, policy_id: str) -> int:
        return policystore.connect().list(policy_id)[-1].id.version

    def stats(self) -> policystore.StoreStats:
        return policystore.connect().stats()

    def store_pid(self) -> int:
        node = policystore.connect().stats().node_id  # waits out a restart in progress
        actor = ray.get_actor(store_name(node), namespace=NAMESPACE)
        return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))

    def read_until(self, policy_id: str, last: int, started: str) -> tuple[int, list[int], list[str]]:
        """Read the latest version over and over until it is ``last``: every snapshot must be whole and versions
        must never go back. The file ``started`` appears after the first read, so a learner can publish while
        every reader reads rather than hope that they overlap."""
        store, versions, problems = policystore.connect(), [], []

        def read_once() -> bool:
            snap = store.get(policy_id)
            v = snap.id.version
            if not (snap["a"] == v).all() or not (snap["b"] == v).all():
                problems.append(f"v{v} torn: a in [{snap['a'].min()}, {snap['a'].max()}]")
            if versions and v < versions[-1]:
                problems.append(f"went back from v{versions[-1]} to v{v}")
            versions.append(v)
            if len(versions) == 1:
                Path(started).touch()
            return v >= last

        eventually(read_once, f"{policy_id}@v{last} read", every_s=0)
        return len(versions), sorted(set(versions)), problems


def on(node_id: str, **options):
    """A new worker process on the node: where the scenario needs one (a reader of its own, the first to connect)."""
    return Peer.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False), **options).remote()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    durable = tmp_path_factory.mktemp("durable")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": STORE_MEMORY,
                                                      "include_dashboard": False})
    for _ in range(2):
        c.add_node(num_cpus=1, object_store_memory=STORE_MEMORY)
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level="warning")
    config = StoreConfig(durable_uri=str(durable))
    stores = policystore.connect_all(config)
    yield c, config, stores
    _peers.clear()
    ray.shutdown()
    c.shutdown()


_peers: dict[str, Peer] = {}


def peer(node_id: str):
    """The module's worker process on the node, for calls that any process there may make (each new one imports
    torch: about 2 s of CPU). Never left busy: every call on it is waited for."""
    if node_id not in _peers:
        _peers[node_id] = on(node_id)
    return _peers[node_id]


def node_ids(c: Cluster) -> list[str]:
    return [c.head_node.node_id] + [n.node_id for n in c.worker_nodes]


def catalog_node() -> str:
    catalog = ray.get_actor(CATALOG_NAME, namespace=NAMESPACE)
    return ray.get(catalog.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))


def test_every_node_gets_its_own_store_including_late_joiners(cluster):
    c, config, stores = cluster
    assert set(stores) == set(node_ids(c))
    peers = [peer(n) for n in node_ids(c)]
    for node, store_node in ray.get([p.node_and_store.remote() for p in peers]):
        assert node == store_node
    late = c.add_node(num_cpus=1, object_store_memory=STORE_MEMORY)
    c.wait_for_nodes()
    stores = policystore.connect_all(config)
    assert late.node_id in stores
    assert ray.get(on(late.node_id).node_and_store.remote()) == (late.node_id, late.node_id)
    c.remove_node(late)


def test_publish_on_one_node_fetch_once_per_node_and_agree(cluster):
    c, _, _ = cluster
    a, b, d = node_ids(c)
    assert ray.get(peer(a).publish.remote("agree", 1)) == 1
    assert ray.get(peer(a).publish.remote("agree", 2)) == 2
    # As soon as publish returns, every node sees the same latest version.
    assert ray.get([peer(n).latest.remote("agree") for n in (a, b, d)]) == [2, 2, 2]
    readers_b = [on(b) for _ in range(3)]
    assert ray.get([r.get.remote("agree") for r in readers_b]) == [(2, 2.0, 2.0)] * 3
    stats_b = ray.get(readers_b[0].stats.remote())
    assert stats_b.fetches == 1  # the bytes crossed once; the other readers were served from B's copy
    assert ray.get(peer(d).get.remote("agree", 1)) == (1, 1.0, 1.0)


def test_fanout_is_a_chain_with_bounded_serves_and_batched_holds(cluster):
    """Each store serves one node per snapshot (a chain): the second fetcher is pointed at the first, whose copy
    may still be landing, so its copy comes from a node that is not the publisher, and no node serves more than
    its share. The holders reach the catalog in batches (update_holders), never one hold per fetch."""
    c, _, _ = cluster
    a, b, d = node_ids(c)
    stores = [ray.get_actor(store_name(n), namespace=NAMESPACE) for n in (a, b, d)]
    catalog = ray.get_actor(CATALOG_NAME, namespace=NAMESPACE)
    assert ray.get([s.__ray_call__.remote(lambda self: self.state.relay.fanout) for s in stores]) == [1, 1, 1]
    assert ray.get(peer(a).publish.remote("tree", 4, mib=4)) == 1
    before = [ray.get(s.stats.remote()) for s in stores]
    calls_before = ray.get(catalog.health.remote()).calls
    assert ray.get([peer(n).get.remote("tree") for n in (b, d)]) == [(1, 4.0, 4.0)] * 2
    after = [ray.get(s.stats.remote()) for s in stores]
    served = [x.served - y.served for x, y in zip(after, before, strict=True)]
    assert [x.fetches - y.fetches for x, y in zip(after, before, strict=True)] == [0, 1, 1]
    assert served[0] == 1 and sorted(served[1:]) == [0, 1]  # one fetcher was served by the other
    ray.get([s.flush.remote() for s in stores])
    assert {a, b, d} <= set(policystore.connect(node_id=a).list("tree")[0].holders)
    calls = ray.get(catalog.health.remote()).calls
    assert calls["update_holders"] > calls_before.get("update_holders", 0)
    assert max(ray.get(s.stats.remote()).served_max_per_snapshot for s in stores) == 1


def test_a_store_that_heard_the_commit_fetches_without_a_lookup_and_asks_when_its_hint_matches_no_copy(cluster):
    """The catalog's watch answer carries a new snapshot's entry: a store that then fetches that version asks the
    catalog nothing more. A hint that no copy matches costs a lookup, never the read (nor a wrong one)."""
    c, _, _ = cluster
    a, b, d = node_ids(c)
    catalog = ray.get_actor(CATALOG_NAME, namespace=NAMESPACE)
    store_b, store_d = (ray.get_actor(store_name(n), namespace=NAMESPACE) for n in (b, d))
    publisher = peer(a)
    assert ray.get(publisher.publish.remote("seeded", 1)) == 1  # (a store that first hears of it in a reset: no entry)
    assert ray.get(publisher.publish.remote("seeded", 2)) == 2

    def heard(store) -> int:
        return ray.get(store.__ray_call__.remote(
            lambda self: getattr(self.follower.committed.get("seeded"), "version", 0)))

    eventually(lambda: heard(store_b) == heard(store_d) == 2, "both stores heard the commit")
    lookups = ray.get(catalog.health.remote()).calls.get("lookup", 0)
    assert ray.get(peer(b).get.remote("seeded", 2)) == (2, 2.0, 2.0)
    assert ray.get(catalog.health.remote()).calls.get("lookup", 0) == lookups

    def wrong(self) -> None:  # a hint no copy matches (its checksum): neither a peer's copy nor the durable tier's
        entry = self.follower.committed["seeded"]
        summary = dataclasses.replace(entry.summary, checksum="crc32c:00000000")
        self.follower.committed["seeded"] = dataclasses.replace(entry, summary=summary)

    ray.get(store_d.__ray_call__.remote(wrong))
    assert ray.get(peer(d).get.remote("seeded", 2)) == (2, 2.0, 2.0)
    assert ray.get(catalog.health.remote()).calls.get("lookup", 0) == lookups + 1


def test_copies_survive_the_loss_of_the_publishing_node(cluster):
    c, _, _ = cluster
    a, b, d = node_ids(c)
    doomed = c.add_node(num_cpus=1, object_store_memory=STORE_MEMORY)
    c.wait_for_nodes()
    publisher = on(doomed.node_id)
    ray.get(publisher.publish.remote("fetched", 7))
    ray.get(publisher.publish.remote("durable_only", 8, durable=True))
    assert ray.get(peer(b).get.remote("fetched")) == (1, 7.0, 7.0)  # B takes its own copy now
    c.remove_node(doomed)
    assert ray.get(peer(b).get.remote("fetched")) == (1, 7.0, 7.0)  # B's copy does not depend on the lost node
    assert ray.get(peer(d).get.remote("durable_only")) == (1, 8.0, 8.0)  # served from the durable tier


def test_sigkilled_store_restarts_and_readers_retry(cluster):
    c, _, _ = cluster
    a, b, _ = node_ids(c)
    ray.get(peer(a).publish.remote("survivor", 3, durable=True))
    reader = peer(b)
    assert ray.get(reader.hold.remote("survivor")) == 1
    before = ray.get(reader.held_value.remote())
    os.kill(ray.get(reader.store_pid.remote()), signal.SIGKILL)
    start = time.monotonic()
    assert ray.get(reader.get.remote("survivor")) == (1, 3.0, 3.0)  # retried through the restart
    assert time.monotonic() - start < policystore.client.RETRY_TIMEOUT_S
    assert ray.get(reader.held_value.remote()) == before  # views taken before the kill stay valid
    assert ray.get(reader.store_pid.remote()) != 0


def _pause_after_spill(flag: str):
    """For the store actor (``__ray_call__``): its next publish writes its spill file, says so in ``flag``, then
    stops there, after the catalog's reservation and before its commit, until the process is killed."""

    def install(server) -> None:
        import time

        write_temp = server.state.disk.write_temp

        def paused(*args, **kwargs):
            temp = write_temp(*args, **kwargs)
            open(flag, "w").close()
            time.sleep(3600)  # holds the publish here until the kill; the test waits for the flag, not for time
            return temp

        server.state.disk.write_temp = paused

    return install


def test_kill_mid_publish_leaves_no_snapshot_and_its_version_is_never_reused(cluster, tmp_path):
    c, _, _ = cluster
    _, b, d = node_ids(c)
    publisher = on(b)
    ray.get(publisher.node_and_store.remote())
    store = ray.get_actor(store_name(b), namespace=NAMESPACE)
    pid = ray.get(store.__ray_call__.remote(lambda self: os.getpid()))
    flag = tmp_path / "spilled"
    ray.get(store.__ray_call__.remote(_pause_after_spill(str(flag))))
    pending = publisher.publish.remote("halfway", 5, mib=8, durable=True)
    eventually(flag.exists, "the publish to stop between its spill file and the catalog's commit")
    os.kill(pid, signal.SIGKILL)
    with pytest.raises((ray.exceptions.RayError, policystore.PolicyStoreError)):
        ray.get(pending)
    assert [i.id for i in policystore.connect(node_id=d).list() if i.id.policy_id == "halfway"] == []
    assert ray.get(on(b).publish.remote("halfway", 6, mib=1, durable=True)) == 2  # v1 was handed out: never again
    assert ray.get(peer(d).get.remote("halfway")) == (2, 6.0, 6.0)
    spill = Path(ray.get(peer(b).stats.remote()).spill_dir) / "halfway"
    assert sorted(f.name for f in spill.iterdir()) == ["0000000002.safetensors"]  # the killed publish left nothing


def test_kill_during_fetch_leaves_the_copy_whole_or_absent(cluster):
    """A store SIGKILLed while it fetches (its miss counted, its copy not yet recorded) comes back with the copy
    whole or absent: the catalog lists it as a holder only with a copy that verifies, and a new get is whole."""
    c, _, _ = cluster
    a, b, _ = node_ids(c)
    ray.get(peer(a).publish.remote("fetched_midway", 6, mib=96))
    reader = on(b)
    store = ray.get_actor(store_name(b), namespace=NAMESPACE)
    misses = ray.get(store.stats.remote()).misses
    pending = reader.get.remote("fetched_midway")
    eventually(lambda: ray.get(store.stats.remote()).misses != misses, "the fetch to begin", every_s=0.01)
    os.kill(ray.get(store.__ray_call__.remote(lambda self: os.getpid())), signal.SIGKILL)
    try:
        assert ray.get(pending) == (1, 6.0, 6.0)  # retried through the restart, or done before the kill
    except (ray.exceptions.RayError, policystore.PolicyStoreError):
        pass
    again = policystore.connect(node_id=b)
    again.flush()
    if b in again.list("fetched_midway")[0].holders:
        assert again.verify("fetched_midway").ok
    assert ray.get(peer(b).get.remote("fetched_midway")) == (1, 6.0, 6.0)


def test_readers_on_every_node_never_see_a_torn_snapshot_while_a_learner_publishes(cluster, tmp_path):
    """Two readers per node, each reading in a busy loop: more only slow the publisher down on two cores."""
    c, _, _ = cluster
    nodes = node_ids(c)
    readers = [on(nodes[i % len(nodes)]) for i in range(2 * len(nodes))]
    ray.get([r.node_and_store.remote() for r in readers])  # all started and connected
    learner = peer(nodes[0])
    ray.get(learner.publish.remote("learner", 1, mib=0.5))
    started = [tmp_path / f"reader{i}" for i in range(len(readers))]
    loops = [r.read_until.remote("learner", 11, str(flag)) for r, flag in zip(readers, started, strict=True)]
    eventually(lambda: all(flag.exists() for flag in started), "every reader's first read")
    published = [ray.get(learner.publish.remote("learner", v, mib=0.5)) for v in range(2, 12)]
    assert published == list(range(2, 12))
    results = ray.get(loops)
    problems = [p for _, _, ps in results for p in ps]
    assert not problems, problems[:5]
    assert all(seen[0] == 1 and seen[-1] == 11 for _, seen, _ in results)  # each read before and after them


def test_sigkilled_catalog_restarts_with_every_version_and_watchers_carry_on(cluster):
    c, _, _ = cluster
    a, b, _ = node_ids(c)
    catalog = ray.get_actor(CATALOG_NAME, namespace=NAMESPACE)
    published = [ray.get(peer(a).publish.remote("ledger", v, mib=0.1)) for v in (1, 2, 3)]
    before = ray.get(catalog.watch.remote(0, 0))
    assert before.reset and before.latest["ledger"] == published[-1]
    os.kill(ray.get(catalog.__ray_call__.remote(lambda self: os.getpid())), signal.SIGKILL)
    entry = eventually(lambda: ray.get(catalog.lookup.remote("ledger"), timeout=30),  # Ray restarts it; it
                       "the catalog back with its database", every_s=0.2,  # reopens its database
                       ignore=(ray.exceptions.ActorUnavailableError, ray.exceptions.ActorDiedError,
                               ray.exceptions.GetTimeoutError))
    assert entry.version == published[-1] and ray.get(catalog.health.remote()).problems == ()
    assert catalog_node() == c.head_node.node_id  # restarted on the head node again
    after = ray.get(catalog.watch.remote(before.seq, 0, before.epoch))
    assert after.epoch == before.epoch and not after.reset  # the same database: the event log goes on
    assert ray.get(peer(b).publish.remote("ledger", 4, mib=0.1)) == published[-1] + 1  # no version handed out twice
    events = ray.get(catalog.watch.remote(before.seq, 30.0, before.epoch))
    assert [e.version for e in events.committed] == [published[-1] + 1]
    assert ray.get(peer(b).get.remote("ledger")) == (4, 4.0, 4.0)


def test_the_catalog_runs_on_the_head_node_whoever_starts_it(cluster):
    """A catalog on a worker node would stall every publish and "latest" lookup when that node goes, until the GCS
    declares it dead. (Last in this module: it stops every store and the catalog.)"""
    c, _, _ = cluster
    _, b, _ = node_ids(c)
    for process in _peers.values():  # none of the module's workers (followers of the old catalog) is left
        ray.kill(process)
    _peers.clear()
    policystore.client.shutdown_all()  # files stay; the next connect starts the catalog again
    assert ray.get(on(b).node_and_store.remote()) == (b, b)  # a worker on node b is the first to connect
    assert catalog_node() == c.head_node.node_id
