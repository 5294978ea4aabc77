"""The node store on a real local Ray: zero-copy, tiers, durability, corruption, placement, bad input."""

import ctypes
import gc
import mmap
import os
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path

import lz4.frame
import pytest
import ray
import torch
from helpers import RESTARTING, eventually
from safetensors import safe_open
from sample_weights import mixed_weights, same_bits
from torch import nn

import policystore
from policystore import StoreConfig
from policystore.config import NAMESPACE, store_name
from policystore.errors import (
    ConfigError,
    CorruptSnapshotError,
    DiskFullError,
    InvalidOptionError,
    InvalidPolicyIdError,
    InvalidWeightsError,
    PolicyStoreError,
    ReadOnlyWeightsError,
    SnapshotTooLargeError,
    UnknownPolicyError,
    UnknownVersionError,
)
from policystore.memory import MiB, session_pss_bytes


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))


def big_net() -> nn.Module:
    """4 MiB of float32 weights."""
    return nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512))


def weights_of_mib(mib: float, seed: int = 0, compressible: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = int(mib * MiB) // 4
    w = torch.randn(n, generator=g)
    return {"w": torch.round(w) if compressible else w}


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


# ---- round trips and zero-copy ------------------------------------------------------------------------------


def test_every_dtype_round_trips_bitwise_through_the_store(make_store):
    store = make_store()
    weights = mixed_weights()
    sid = store.publish("mixed", weights, meta={"step": 3, "tag": "x"})
    assert sid == policystore.SnapshotId("mixed", 1)
    snap = store.get("mixed")
    assert snap.id == sid and snap.meta == {"step": 3, "tag": "x"} and snap.nbytes > 0
    for name, tensor in weights.items():
        assert same_bits(snap[name], tensor), name
    assert [store.publish("mixed", weights).version for _ in range(2)] == [2, 3]
    assert store.get("mixed").id.version == 3
    assert store.get("mixed", version=1) is snap  # process-local cache of immutable snapshots


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
    measured once the snapshots are published. The bounds are deliberately generous; the exact figures (and the
    publish-side transients) are the memory_scaling benchmark's job.
    """
    store = make_store()
    k, one_copy = 8, 8 * 4 * MiB
    ray.get(readers[0].publish_nets.remote(k))
    assert store.stats().hot_bytes >= one_copy
    ray.get([r.store_actor_id.remote() for r in readers])  # every worker connected (imports are not snapshots)
    published = session_pss_bytes()
    results = ray.get([r.load.remote(k, private=False) for r in readers])
    assert len(set(results)) == 1  # every worker computes with the same weights
    shared = session_pss_bytes() - published
    ray.get([r.load.remote(k, private=True) for r in readers])
    private = session_pss_bytes() - published
    ray.get([r.drop.remote() for r in readers])
    assert shared < 0.5 * one_copy, f"{len(readers)} workers with views added {shared / one_copy:.2f} copies"
    assert private > 2.5 * one_copy, f"private copies added only {private / one_copy:.2f} copies: method broken?"


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


def test_write_guard_through_the_store(make_store):
    store = make_store()
    store.publish("main_0", net().state_dict())
    module = store.load_module("main_0", net)
    with pytest.raises(ReadOnlyWeightsError, match="main_0@v1"):
        module[0].weight.add_(1.0)
    with pytest.raises(ReadOnlyWeightsError, match="main_0@v1"):
        module.load_state_dict(net().state_dict())
    with pytest.raises(ReadOnlyWeightsError):
        store.get("main_0")["0.bias"].zero_()
    assert store.verify("main_0").hot is True


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
    store = make_store()
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
    store = make_store(hot_capacity_bytes=int(1.5 * MiB))
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
    # the store, the catalog, and the node's doorbell that both ring (one per node, shared)
    assert sorted(names) == sorted([f"policystore-{store.node_id}", "policystore-catalog",
                                    f"policystore-doorbell-{store.node_id}"])
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
    while writer.is_alive():
        policystore.clear_cache()
        store.get("small")
        reads_meanwhile += 1
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


# ---- bad input ----------------------------------------------------------------------------------------------

BAD_IDS = ["../x", "", "/", "a/b", "..", ".hidden", "x" * 200, 3, None, "sp ace"]


@pytest.mark.parametrize("bad", BAD_IDS, ids=[repr(b)[:12] for b in BAD_IDS])
def test_bad_policy_ids_are_refused_everywhere(make_store, bad):
    store = make_store()
    for call in (lambda: store.publish(bad, {"w": torch.zeros(1)}), lambda: store.get(bad), lambda: store.delete(bad)):
        with pytest.raises(InvalidPolicyIdError, match="policy id"):
            call()
    assert store.list() == []


def test_unknown_policy_and_version_and_bad_versions(make_store):
    store = make_store()
    store.publish("main_0", net().state_dict())
    with pytest.raises(UnknownPolicyError, match="unknown policy 'main_1'.*main_0"):
        store.get("main_1")
    with pytest.raises(UnknownVersionError, match="no version 5.*latest 1"):
        store.get("main_0", version=5)
    for bad in (0, -1, "2", True, 1.0):
        with pytest.raises(InvalidPolicyIdError, match="version"):
            store.get("main_0", version=bad)
    with pytest.raises(UnknownPolicyError):
        store.delete("nobody")


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


def test_list_pages_through_the_store_and_refuses_bad_cursors(make_store):
    store = make_store()
    for pid in ("b", "a", "b", "c", "a", "b"):
        store.publish(pid, net().state_dict())
    store.delete("b", version=2)
    everything = store.list()
    assert [tuple(i.id) for i in everything] == [("a", 1), ("a", 2), ("b", 1), ("b", 3), ("c", 1)]
    pages, after = [], None
    while page := store.list(limit=2, after=after):
        pages.append([tuple(i.id) for i in page])
        after = page[-1].id
    assert pages == [[("a", 1), ("a", 2)], [("b", 1), ("b", 3)], [("c", 1)]]
    assert [i.id.version for i in store.list("b", limit=5, after=("b", 1))] == [3]
    assert store.list("b", after=("b", 2)) == store.list("b")[1:]  # a deleted version is a valid cursor
    for limit, after in ((0, None), (False, None), ("3", None), (None, "b@v1"), (None, ("b", -1))):
        with pytest.raises(policystore.PolicyStoreError):
            store.list(limit=limit, after=after)


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


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 3 MiB file system: the spill tier hits ENOSPC for real."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


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


def test_running_out_of_space_mid_write_leaves_no_partial_file(tiny_disk):
    from policystore.format import pack, parse_header
    from policystore.spill import DiskTier

    disk = DiskTier(tiny_disk, compress=False)
    buf = pack(weights_of_mib(4), policy_id="big")
    with pytest.raises(DiskFullError, match="disk full while spilling big"):
        disk.write_temp(policystore.SnapshotId("big", 1), buf, parse_header(buf, name="big"), "big")
    assert list((tiny_disk / "big").iterdir()) == []


def test_connect_with_a_different_config_is_an_error(make_store):
    store = make_store(hot_capacity_bytes=5 * MiB)
    with pytest.raises(PolicyStoreError, match="already runs with"):
        policystore.connect(StoreConfig(hot_capacity_bytes=6 * MiB, spill_dir=store.config.spill_dir))


class _RepeatingMapping(Mapping):
    """A custom Mapping whose items() repeat a name (a dict cannot)."""

    def __init__(self, tensor: torch.Tensor):
        self._tensor = tensor

    def __getitem__(self, key):
        return self._tensor

    def __len__(self):
        return 2

    def __iter__(self):
        return iter(["w", "w"])


def test_out_of_range_versions_and_repeated_names_are_bad_input(make_store):
    store = make_store()
    store.publish("p", {"w": torch.ones(4)})
    for bad in (2**63, 2**64, -1, True):
        for call in (store.get, store.delete, store.verify, store.load_module):
            args = ("p", net) if call == store.load_module else ("p",)
            with pytest.raises(InvalidPolicyIdError, match="version must be an int"):
                call(*args, version=bad)
    with pytest.raises(InvalidWeightsError, match="'w' twice"):
        store.publish("p", _RepeatingMapping(torch.zeros(2)))
    assert [i.id.version for i in store.list("p")] == [1]
    assert store.verify("p").hot is True


BAD_CONFIGS = [dict(spill_dir=123), dict(spill_dir=""), dict(durable_uri=123), dict(hot_capacity_bytes=-1),
               dict(hot_capacity_bytes=True), dict(max_concurrency=1), dict(max_concurrency=2.5),
               dict(max_watchers=0), dict(max_staleness_s=float("nan")), dict(call_timeout_s=0),
               dict(call_timeout_s="30"), dict(compress="yes"), dict(league="a/b"), dict(league="")]


@pytest.mark.parametrize("fields", BAD_CONFIGS, ids=[repr(f)[:30] for f in BAD_CONFIGS])
def test_bad_store_config_is_a_config_error(fields):
    with pytest.raises(ConfigError, match=f"StoreConfig.{next(iter(fields))}|invalid league") as raised:
        StoreConfig(**fields)
    assert isinstance(raised.value, ValueError)  # older except-clauses still catch it


def test_connect_with_an_unusable_spill_dir_names_the_folder(make_store, tmp_path):
    make_store()
    policystore.client.shutdown_all()
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("x")
    with pytest.raises(PolicyStoreError, match=f"could not start.*{not_a_folder}"):
        policystore.connect(StoreConfig(spill_dir=str(not_a_folder)))
    policystore.client.shutdown_all()
    store = make_store()  # a usable folder works again at once
    assert store.publish("p", {"w": torch.ones(1)}).version == 1


def test_compile_and_weight_norm_work_on_store_built_modules(make_store):
    store = make_store()
    source = net()
    store.publish("p", source.state_dict())
    x = torch.randn(3, 64)
    expected = source(x)

    compiled = torch.compile(store.load_module("p", net), backend="eager")  # dynamo traces the guarded weights
    assert torch.allclose(compiled(x), expected)

    def write(weight):
        weight.add_(1)

    with pytest.raises(ReadOnlyWeightsError):  # the guard holds inside compiled code too
        torch.compile(write, backend="eager")(store.load_module("p", net)[0].weight)

    normed = store.load_module("p", net)
    nn.utils.parametrizations.weight_norm(normed[0])  # nn.Parameter(shared Parameter): a guarded alias
    assert torch.allclose(normed(x), expected, atol=1e-5)
    with pytest.raises(ReadOnlyWeightsError):
        normed[0].parametrizations.weight.original1.add_(1)
    assert not isinstance(store.load_module("p", net).state_dict()["0.weight"], nn.Parameter)
    assert torch.equal(store.load_module("p", net)[0].weight, source[0].weight)  # every other module unchanged
    assert store.verify("p").hot is True
