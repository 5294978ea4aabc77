"""The node store actor on a real local Ray: one shared copy per node, tiers, durability, corruption, placement,
concurrency, and what the store itself refuses."""

import ctypes
import gc
import mmap
import os
import threading
from pathlib import Path

import lz4.frame
import pytest
import ray
import torch
from helpers import RESTARTING, eventually
from safetensors import safe_open
from sample_weights import big_net, net, weights_of_mib

import policystore
from policystore import StoreConfig
from policystore.errors import (
    CorruptSnapshotError,
    DiskFullError,
    InvalidOptionError,
    InvalidWeightsError,
    SnapshotTooLargeError,
    UnknownPolicyError,
    UnknownVersionError,
)
from policystore.memory import MiB, session_pss_bytes
from policystore.remote import NAMESPACE, store_name


def store_actor() -> ray.actor.ActorHandle:
    """This node's store actor, found by its name as any Ray program could."""
    return ray.get_actor(store_name(ray.get_runtime_context().get_node_id()), namespace=NAMESPACE)


def store_actor_info() -> tuple[str, int]:
    """(actor id, process id) of this node's store."""
    return ray.get(store_actor().__ray_call__.remote(lambda self: (ray.get_runtime_context().get_actor_id(),
                                                                    os.getpid())))


def write_behind_every_guard(address: int, data: bytes) -> None:
    """A write no guard sees, as a C extension could make it: lift the page protection, write, protect again."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    page = address - address % mmap.PAGESIZE
    span = address + len(data) - page
    assert libc.mprotect(page, span, 0x1 | 0x2) == 0, os.strerror(ctypes.get_errno())
    ctypes.memmove(address, data, len(data))
    libc.mprotect(page, span, 0x1)


def shm_mapping_of(address: int) -> str:
    """The /proc/self/maps line holding ``address``: a /dev/shm plasma mapping for object-store memory."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= address < hi:
            return line
    return ""


@ray.remote(num_cpus=0.1)
class Reader:
    """A worker process on the node that reads through its own client."""

    def load_and_locate(self, policy_id: str) -> list[str]:
        module = policystore.connect().load_module(policy_id, net)
        self.module = module
        return [shm_mapping_of(p.data_ptr()) for p in module.parameters()]

    def publish_nets(self, count: int) -> None:
        store = policystore.connect()  # earlier tests stopped the store this process knew: the handle finds anew
        for i in range(count):
            store.publish(f"big{i}", big_net().state_dict())

    def load(self, count: int, private: bool) -> float:
        """Load ``count`` snapshots as shared views or as private copies, and run each once (pages touched)."""
        store = policystore.connect()
        self.modules = []
        for i in range(count):
            if private:
                module = big_net()
                module.load_state_dict(store.get(f"big{i}"))  # RLlib's way: a private copy per worker
            else:
                module = store.load_module(f"big{i}", big_net)
            self.modules.append(module)
        with torch.no_grad():
            return float(sum(m(torch.ones(1, 512)).sum() for m in self.modules))

    def drop(self) -> None:
        self.modules = []
        policystore.clear_cache()
        gc.collect()

    def store_actor_id(self) -> str:
        policystore.connect().stats()  # finds (or starts) the node's store, as a new worker would
        return store_actor_info()[0]


@pytest.fixture(scope="module")
def readers(ray_session):
    """Worker processes shared by the tests of this module (each new process costs seconds of imports)."""
    actors = [Reader.remote() for _ in range(4)]
    ray.get([a.__ray_ready__.remote() for a in actors])
    return actors


# ---- one copy per node --------------------------------------------------------------------------------------


def test_views_live_in_shared_memory_in_every_reader(make_store, readers):
    store = make_store()
    source = net()
    store.publish("main_0", source.state_dict())
    module = store.load_module("main_0", net)
    x = torch.randn(3, 64)
    assert torch.equal(module(x), source(x))
    for param in module.parameters():
        assert "/dev/shm/plasma" in shm_mapping_of(param.data_ptr())
    lines = ray.get(readers[0].load_and_locate.remote("main_0"))
    assert lines and all("/dev/shm/plasma" in line for line in lines), lines


def test_workers_on_a_node_share_one_copy(make_store, readers):
    """4 workers x 8 snapshots of 4 MiB: the store's one copy serves them all; private copies cost one per worker.

    Node memory = PSS summed over every process of the Ray session (raylet and its object store included),
    measured once the snapshots are published. The claim is a relation measured side by side: all 4 workers on
    views add less than ONE worker's private copies (what the session's other processes grow meanwhile moves with
    the machine's load, so no absolute bound); the figures themselves are the memory_scaling benchmark's job.
    """
    store = make_store()
    k, one_copy = 8, 8 * 4 * MiB
    ray.get(readers[0].publish_nets.remote(k))
    assert store.stats().hot_bytes >= one_copy
    ray.get([r.store_actor_id.remote() for r in readers])  # every worker connected (imports are not snapshots)
    ray.get([r.load.remote(1, private=False) for r in readers])  # and warm: a process's first forward pass starts
    ray.get([r.drop.remote() for r in readers])  # torch's threads (their stacks and heaps are not snapshots either)
    published = session_pss_bytes()
    results = ray.get([r.load.remote(k, private=False) for r in readers])
    assert len(set(results)) == 1  # every worker computes with the same weights
    shared = session_pss_bytes() - published
    ray.get([r.load.remote(k, private=True) for r in readers])
    private = session_pss_bytes() - published
    ray.get([r.drop.remote() for r in readers])
    assert private > 2.5 * one_copy, f"private copies added only {private / one_copy:.2f} copies: method broken?"
    assert shared < private / len(readers), (f"{len(readers)} workers with views added {shared / one_copy:.2f} "
                                             f"copies, private copies {private / one_copy:.2f}")


def test_the_store_process_gives_big_freed_buffers_back_to_the_os(make_store):
    """Without it glibc raises its mmap threshold at the first big free, and the store's later transient buffers
    (lz4 attempts on each spill) stay resident in a thread's heap once freed."""
    make_store()

    def mmapped_after_a_bigger_free(server) -> bool:
        class MallInfo2(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                             "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
        bigger = ctypes.create_string_buffer(16 * MiB)
        del bigger  # by default this raises the threshold past 16 MiB
        before = libc.mallinfo2().hblkhd
        buffer = ctypes.create_string_buffer(4 * MiB)
        mmapped = libc.mallinfo2().hblkhd - before >= 4 * MiB  # its own mapping: unmapped when freed
        del buffer
        return mmapped

    assert ray.get(store_actor().__ray_call__.remote(mmapped_after_a_bigger_free))
    assert not mmapped_after_a_bigger_free(None)  # glibc's default, in this (pytest) process


def test_verify_catches_raw_writes_and_the_store_heals_from_disk(make_store):
    store = make_store()
    source = net()
    store.publish("main_0", source.state_dict(), durable=True)
    module = store.load_module("main_0", net)
    write_behind_every_guard(module[0].weight.data_ptr(), b"\x07" * 64)
    with pytest.raises(CorruptSnapshotError, match="main_0@v1 \\(shared-memory copy\\).*checksum"):
        store.verify("main_0")
    healed = store.load_module("main_0", net)  # verify dropped this process's damaged copy too
    assert healed.policystore_snapshot is not module.policystore_snapshot
    x = torch.randn(2, 64)
    assert torch.equal(healed(x), source(x))
    report = store.verify("main_0")
    assert report.ok and report.hot is True and report.disk is True


# ---- tiers --------------------------------------------------------------------------------------------------


def test_lru_eviction_and_transparent_restore(make_store):
    store = make_store(hot_capacity_bytes=int(2.5 * MiB))
    originals = {f"p{i}": weights_of_mib(1, seed=i) for i in range(4)}
    store.publish("p0", originals["p0"])
    held = store.get("p0")  # a reader holding views across eviction
    store.publish("p1", originals["p1"])
    policystore.clear_cache()  # as another process would, open it anew (the store hears of it: recency)
    store.get("p0")  # touch: p1 is now the least recently used...
    store.flush()  # ...once the store knows (a pushed read tells it with the next long poll, or a flush)
    store.publish("p2", originals["p2"])
    store.flush()
    tiers = {info.id.policy_id: info.tier for info in store.list()}
    assert tiers == {"p0": "hot", "p1": "disk", "p2": "hot"}
    store.publish("p3", originals["p3"])
    tiers = {info.id.policy_id: info.tier for info in store.list()}
    assert tiers["p0"] == "disk" and tiers["p3"] == "hot"
    store.flush()
    stats = store.stats()
    assert stats.hot_bytes <= stats.hot_capacity_bytes and stats.evictions == 2
    assert stats.disk_snapshots == 4 and stats.hot_snapshots == 2
    assert torch.equal(held["w"], originals["p0"]["w"])  # views survive eviction
    for pid, w in originals.items():
        assert torch.equal(store.get(pid)["w"], w["w"]), pid
    assert store.stats().restores >= 2
    store.delete("p0")
    assert torch.equal(held["w"], originals["p0"]["w"])  # ... and deletion


def test_spill_files_are_plain_safetensors_raw_or_lz4(make_store):
    store = make_store(compress=True)
    store.publish("rand", weights_of_mib(1))
    store.publish("round", weights_of_mib(1, compressible=True))
    store.flush()
    infos = {i.id.policy_id: i for i in store.list()}
    assert not infos["rand"].compressed and infos["round"].compressed  # lz4 only where it pays
    assert infos["round"].file_bytes < infos["round"].nbytes
    spill = Path(store.stats().spill_dir)
    raw = spill / "rand" / "0000000001.safetensors"
    with safe_open(raw, framework="pt") as f:
        assert torch.equal(f.get_tensor("w"), weights_of_mib(1)["w"])
    packed = spill / "round" / "0000000001.safetensors.lz4"
    plain = packed.with_suffix("")
    plain.write_bytes(lz4.frame.decompress(packed.read_bytes()))
    with safe_open(plain, framework="pt") as f:
        assert torch.equal(f.get_tensor("w"), weights_of_mib(1, compressible=True)["w"])


@pytest.mark.parametrize("compressible", [False, True], ids=["raw", "lz4"])
@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_spill_file_is_never_served(make_store, compressible, damage):
    store = make_store(hot_capacity_bytes=int(1.5 * MiB), compress=compressible)
    store.publish("victim", weights_of_mib(1, compressible=compressible))
    store.publish("other", weights_of_mib(1, seed=1))  # evicts victim to disk
    store.flush()
    assert {i.id.policy_id: i.tier for i in store.list()}["victim"] == "disk"
    # until this process holds no pushed ref of victim (it never opened it, so none is pushed): no process then
    # keeps the memory copy alive, and the get below must go to the damaged file
    eventually(lambda: ("victim", 1) not in store.push_state().hot, "the eviction pushed to this process")
    path = next((Path(store.stats().spill_dir) / "victim").iterdir())
    data = bytearray(path.read_bytes())
    if damage == "flip":  # 16 bytes: one flipped byte of an lz4 stream can be a match offset that still points at
        for i in range(len(data) // 2, len(data) // 2 + 16):  # equal bytes (the decoded snapshot is then right)
            data[i] ^= 0xFF
    else:
        del data[len(data) // 2 :]
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptSnapshotError, match="victim@v1") as err:
        store.get("victim")
    assert str(path) in str(err.value)
    with pytest.raises(CorruptSnapshotError):
        store.verify("victim")
    assert torch.equal(store.get("other")["w"], weights_of_mib(1, seed=1)["w"])  # the rest is unharmed


def test_durable_publish_is_on_disk_when_it_returns(make_store):
    store = make_store()
    sid = store.publish("main_0", net().state_dict(), durable=True)
    info = store.list("main_0")[0]
    assert info.id == sid and info.on_disk
    assert (Path(store.stats().spill_dir) / "main_0" / "0000000001.safetensors").exists()


def test_restarted_store_rebuilds_its_catalog_from_disk(make_store):
    store = make_store()
    source = net()
    store.publish("main_0", source.state_dict(), meta={"elo": 1200}, durable=True)
    store.publish("main_0", net().state_dict())
    store.flush()
    os.kill(store_actor_info()[1], 9)  # Ray restarts the detached store (max_restarts=-1)
    rows = eventually(lambda: store.list(policy_id="main_0"), "the store back after its kill",
                      ignore=RESTARTING, every_s=0.1)
    assert [(r.id.version, r.tier, r.meta) for r in rows] == [(1, "disk", {"elo": 1200}), (2, "disk", {})]
    policystore.clear_cache()
    x = torch.randn(2, 64)
    assert torch.equal(store.load_module("main_0", net, version=1)(x), source(x))
    assert store.publish("main_0", source.state_dict()).version == 3  # numbering continues
    store.flush()
    # A brand-new store on the same spill dir finds the same catalog.
    spill_dir = store.stats().spill_dir
    store.shutdown()
    fresh = policystore.connect(StoreConfig(spill_dir=spill_dir))
    assert [r.id.version for r in fresh.list("main_0")] == [1, 2, 3]
    assert torch.equal(fresh.load_module("main_0", net)(x), source(x))


# ---- placement and concurrency ------------------------------------------------------------------------------


def test_one_store_per_node_found_by_every_worker_and_taking_no_cpu(make_store, readers):
    store = make_store()
    ids = set(ray.get([r.store_actor_id.remote() for r in readers]))
    assert ids == {store_actor_info()[0]}
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("policystore")]
    # the store and the catalog, each hosting its own doorbell: no other process
    assert sorted(names) == sorted([f"policystore-{store.node_id}", "policystore-catalog"])
    placement = ray.get(store_actor().__ray_call__.remote(
        lambda self: (ray.get_runtime_context().get_node_id(), ray.get_runtime_context().get_assigned_resources())
    ))
    assert placement == (store.node_id, {})  # on its node, holding no CPU slot


def test_concurrent_first_connects_create_one_store(make_store, readers):
    make_store().shutdown()
    ids = ray.get([r.store_actor_id.remote() for r in readers])
    assert len(set(ids)) == 1


def test_store_outlives_the_process_that_created_it(make_store):
    make_store().shutdown()
    creator = Reader.remote()
    store_id = ray.get(creator.store_actor_id.remote())
    ray.kill(creator)
    client = policystore.connect()
    assert store_actor_info()[0] == store_id
    client.publish("alive", net().state_dict())
    assert client.get("alive").id.version == 1


def test_reads_are_not_blocked_behind_a_large_publish(make_store):
    store = make_store(hot_capacity_bytes=900 * MiB, max_staleness_s=0)  # every get of latest asks the store
    store.publish("small", net().state_dict())
    big = weights_of_mib(256, seed=3)
    published = []
    writer = threading.Thread(target=lambda: published.append(store.publish("big", big, durable=True)))
    writer.start()  # durable: copy, checksum, write, fsync
    reads_meanwhile = 0

    def read_until_published() -> bool:
        nonlocal reads_meanwhile
        if not writer.is_alive():
            return True
        policystore.clear_cache()
        store.get("small")
        reads_meanwhile += 1
        return False

    eventually(read_until_published, "the large publish to return", every_s=0)
    writer.join()
    assert published == [("big", 1)]
    assert reads_meanwhile >= 3, f"only {reads_meanwhile} reads completed during the publish"


def test_concurrent_gets_of_an_evicted_snapshot_restore_it_once(make_store):
    store = make_store(hot_capacity_bytes=int(1.5 * MiB))
    store.publish("a", weights_of_mib(1))
    store.publish("b", weights_of_mib(1, seed=1))
    store.flush()
    actor = store_actor()
    answers = ray.get([actor.resolve.remote("a") for _ in range(6)])  # six readers at once, straight to the store
    assert len({a.refs[0].hex() for a in answers}) == 1 and store.stats().restores == 1


# ---- deletes and what the store refuses ---------------------------------------------------------------------


def test_delete_frees_the_version_for_good(make_store):
    store = make_store()
    for _ in range(3):
        store.publish("p", net().state_dict(), durable=True)
    held = store.get("p", version=3)
    assert store.delete("p", version=3) == [policystore.SnapshotId("p", 3)]
    with pytest.raises(UnknownVersionError):
        store.get("p", version=3)
    assert store.get("p").id.version == 2
    assert store.publish("p", net().state_dict()).version == 4  # versions are never reused
    assert held["0.weight"].shape == (128, 64)  # views held stay valid
    assert not (Path(store.stats().spill_dir) / "p" / "0000000003.safetensors").exists()


def _fail_the_next_copy(self) -> None:
    """In the store actor: its next ``ray.put`` of a publish raises (an object store that is full)."""
    import policystore.store_publish as publishing

    real = publishing.ray

    class FailOnce:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def put(value):
            publishing.ray = real
            raise ray.exceptions.ObjectStoreFullError("the object store is full (injected)")

    publishing.ray = FailOnce()


def test_a_publish_whose_copy_fails_after_the_commit_is_taken_back(make_store):
    """A non-durable publish's catalog commit runs while the store copies the snapshot: a copy that fails takes
    the version back, so it is never listed without a copy, and the publisher hears the copy's error."""
    store = make_store()
    kept = store.publish("copy-fails", weights_of_mib(1))
    ray.get(store_actor().__ray_call__.remote(_fail_the_next_copy))
    with pytest.raises(ray.exceptions.ObjectStoreFullError, match="injected"):
        store.publish("copy-fails", weights_of_mib(1))
    assert [info.id for info in store.list("copy-fails")] == [kept]
    assert store.get("copy-fails").id == kept
    assert store.publish("copy-fails", weights_of_mib(1)).version == kept.version + 2  # its number is not reused


def test_bad_weights_and_oversized_snapshots_lose_nothing(make_store):
    store = make_store(hot_capacity_bytes=2 * MiB)
    store.publish("keep", weights_of_mib(1))
    with pytest.raises(InvalidWeightsError, match="weights\\['w'\\] is a list"):
        store.publish("keep", {"w": [1, 2, 3]})
    def staged() -> dict[Path, int]:
        return {f: f.stat().st_size for f in policystore.config.staging_dir().glob(f"{os.getpid()}-*")}

    before = staged()
    with pytest.raises(SnapshotTooLargeError, match="larger than the whole hot tier"):
        store.publish("keep", weights_of_mib(3))
    assert staged() == before  # refused before the staging file grew: /dev/shm holds no copy of it
    pack = policystore.format.pack
    actor = store_actor()
    with pytest.raises(SnapshotTooLargeError):  # the store checks too, not only the client
        ray.get(actor.publish.remote("keep", pack(weights_of_mib(3), policy_id="keep")))
    with pytest.raises(InvalidWeightsError, match="packed for 'other'"):
        ray.get(actor.publish.remote("keep", pack({"w": torch.zeros(1)}, policy_id="other")))
    for durable in ("yes", 1, None):
        with pytest.raises(InvalidOptionError, match="durable must be True or False"):
            store.publish("keep", weights_of_mib(1), durable=durable)
    with pytest.raises(InvalidOptionError, match="staging folder"):  # the store maps only its own staging files
        ray.get(actor.publish_staged.remote("keep", "/etc/passwd", 16))
    folder = policystore.config.staging_dir()
    with pytest.raises(InvalidOptionError, match="positive int"):
        ray.get(actor.publish_staged.remote("keep", str(folder / "1-x"), 0))
    with pytest.raises(InvalidOptionError, match="cannot open staging file"):
        ray.get(actor.publish_staged.remote("keep", str(folder / "1-no-such-file"), 16))
    assert [i.id.version for i in store.list("keep")] == [1]
    assert store.verify("keep").hot is True


def test_disk_quota_refuses_publish_and_keeps_what_is_stored(make_store):
    store = make_store(disk_capacity_bytes=int(2.5 * MiB))
    store.publish("a", weights_of_mib(1), durable=True)
    store.publish("b", weights_of_mib(1, seed=1), durable=True)
    with pytest.raises(DiskFullError, match="disk_capacity_bytes"):
        store.publish("c", weights_of_mib(1, seed=2), durable=True)
    with pytest.raises(UnknownPolicyError):
        store.get("c")
    for pid in ("a", "b"):
        report = store.verify(pid)
        assert report.hot is True and report.disk is True


def test_full_disk_is_a_clear_error_and_loses_nothing(make_store, tiny_disk):
    store = make_store(spill_dir=str(tiny_disk), compress=False)
    store.publish("a", weights_of_mib(1.2), durable=True)
    for durable in (True, False):
        with pytest.raises(DiskFullError, match="no space left for new snapshot of 'b'"):
            store.publish("b", weights_of_mib(1.9, seed=1), durable=durable)
    with pytest.raises(UnknownPolicyError):
        store.get("b")
    report = store.verify("a")
    assert report.hot is True and report.disk is True


