"""Acknowledged snapshots without a copy on disk, with a real store on real file systems: a disk that another
writer fills (a tmpfs) between a publish and its background spill loses nothing, hides nothing and never grows
the hot tier past its capacity; a version whose last copy died with its store is listed as lost and is never
"latest"; a durable marker without its data is never adopted."""

import functools
import os
import signal
import subprocess
import threading

import pytest
import ray
import torch
from helpers import RESTARTING, eventually

import policystore
from policystore.durable import DurableTier
from policystore.errors import DiskFullError, SnapshotLostError, SpillFailedError
from policystore.format import pack, parse_header
from policystore.ids import SnapshotId
from policystore.remote import NAMESPACE, store_name

MiB = 1024 * 1024


def _weights(v: int) -> dict[str, torch.Tensor]:  # random floats: lz4 cannot shrink them, each spill needs 1 MiB
    return {"w": torch.randn(MiB // 4, generator=torch.Generator().manual_seed(v))}


def _actor(store):
    return ray.get_actor(store_name(store.stats().node_id), namespace=NAMESPACE)


def _hold_spills(store, gate: str) -> None:
    """Queue a job on the store's one spill thread that waits for the file ``gate``: spills queue up behind it."""
    def hold(server):
        def wait():
            import os
            import time
            while not os.path.exists(gate):
                time.sleep(0.02)
        server.tiers.writer.submit(wait)

    ray.get(_actor(store).__ray_call__.remote(hold))


def _waiting_for_room(server) -> bool:
    """Whether a thread of the store is in ``Tiers.make_room`` (a publish waiting for the hot tier)."""
    import sys

    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code.co_name == "make_room":
                return True
            frame = frame.f_back
    return False


def _fill(disk) -> None:
    """Another writer takes every free byte of the file system."""
    subprocess.run(["dd", "if=/dev/zero", f"of={disk / 'filler'}", "bs=64k"], capture_output=True, check=False)


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_spills_that_fail_on_a_full_disk_are_retried_and_never_hidden(make_store, small_disk, tmp_path):
    store = make_store(spill_dir=str(small_disk / "spill"), hot_capacity_bytes=4 * MiB + 64 * 1024)
    gate = str(tmp_path / "go")
    _hold_spills(store, gate)
    versions = (1, 2, 3, 4)
    for v in versions:  # acknowledged, their spills queued behind the held thread
        assert store.publish("full", _weights(v)).version == v
    refused: list = []
    fifth = threading.Thread(target=lambda: refused.append(_catch(lambda: store.publish("full", _weights(5)))))
    fifth.start()  # the hot tier is full of unspilled snapshots: it waits for their spills
    eventually(lambda: ray.get(_actor(store).__ray_call__.remote(_waiting_for_room)), "the fifth publish waiting")
    _fill(small_disk)
    open(gate, "w").close()
    fifth.join(120)
    assert refused and isinstance(refused[0], DiskFullError), refused  # never past the hot tier's capacity
    assert "could not be spilled" in str(refused[0]) and "full@v4" in str(refused[0])
    stats = eventually(lambda: (s := store.stats()).unspilled and s, "the failed spills in stats")
    assert stats.hot_bytes <= stats.hot_capacity_bytes and stats.disk_snapshots == 0
    assert stats.unspilled == tuple(f"full@v{v}" for v in versions)
    with pytest.raises(SpillFailedError, match="full@v1, full@v2, full@v3, full@v4"):
        store.flush()
    report = store.verify("full", 2)
    assert report.hot and report.disk is None and "only in memory" in " ".join(report.problems)
    assert [r.id.version for r in store.list("full")] == list(versions)  # the refused publish took no version
    (small_disk / "filler").unlink()  # space is back: the retries land without anyone asking
    eventually(lambda: store.stats().disk_snapshots == len(versions), "the retried spills")
    store.flush()
    assert store.stats().unspilled == ()
    os.kill(ray.get(_actor(store).__ray_call__.remote(lambda self: os.getpid())), signal.SIGKILL)
    policystore.clear_cache()
    for v in versions:
        got = eventually(functools.partial(store.get, "full", v), f"full@v{v} after the kill", ignore=RESTARTING)
        assert torch.equal(got["w"], _weights(v)["w"])
    assert store.publish("full", _weights(5)).version == 5


def _catch(fn):
    try:
        return fn()
    except Exception as exc:
        return exc


def test_a_version_no_copy_can_serve_is_marked_lost_and_never_latest(make_store, tmp_path):
    """A non-durable publish acknowledged just before its store is killed (its spill not yet run): the restarted
    store lists it as lost, "latest" falls back to the newest readable version, and a later publish moves on."""
    store = make_store()
    assert store.publish("kept", _weights(1)).version == 1
    store.flush()
    _hold_spills(store, str(tmp_path / "never"))
    assert store.publish("kept", _weights(2)).version == 2
    os.kill(ray.get(_actor(store).__ray_call__.remote(lambda self: os.getpid())), signal.SIGKILL)
    policystore.clear_cache()
    rows = eventually(lambda: (r := store.list("kept")) and r[-1].tier == "lost" and r, "v2 listed as lost",
                      ignore=RESTARTING)
    assert [(r.id.version, r.tier) for r in rows] == [(1, "disk"), (2, "lost")] and "lost" in rows[1].error
    # another process (this one never reads older than its own publishes): latest is the newest readable version
    latest, got, w = ray.get(_fresh_reader.remote("kept"))
    assert (latest, got) == (1, 1) and torch.equal(w, _weights(1)["w"])
    # this process too, although it published v2: a version no copy serves is not a floor for "latest"
    assert store.get("kept").id.version == 1
    with pytest.raises(SnapshotLostError):
        store.get("kept", 2)
    assert store.publish("kept", _weights(3)).version == 3  # numbers are never reused
    # (within the staleness bound a reader's latest may lag the catalog's: the store may still be recording v3)
    latest, got, w = eventually(lambda: (r := ray.get(_fresh_reader.remote("kept")))[:2] == (3, 3) and r, "v3 read")
    assert torch.equal(w, _weights(3)["w"])


@ray.remote(num_cpus=0.1)
def _fresh_reader(policy_id: str) -> tuple[int, int, torch.Tensor]:
    store = policystore.connect()
    snap = store.get(policy_id)
    return store.latest_version(policy_id), snap.id.version, snap["w"].clone()


def test_a_durable_marker_is_adopted_only_with_its_data(make_store, tmp_path):
    """A fresh catalog on a durable URI adopts a marker only if its data object exists, has the size the marker
    says and is the snapshot it names; the others are skipped with the reason, and never listed."""
    uri = tmp_path / "durable"
    tier = DurableTier.open(str(uri))
    for v in (1, 2, 3):
        buf = pack(_weights(v), policy_id="d")
        tier.write(SnapshotId("d", v), buf, parse_header(buf, name="d"))
    data = {v: next((uri / "d").glob(f"{v:010d}.*.safetensors")) for v in (1, 2, 3)}
    data[2].unlink()  # missing
    data[3].write_bytes(data[1].read_bytes())  # another snapshot's bytes (same size)
    skipped: list[str] = []
    assert [sid for sid, _ in tier.list_committed(skipped)] == [SnapshotId("d", 1)]
    assert "d@v2" in skipped[0] and "missing" in skipped[0] and "d@v3" in skipped[1] and "match" in skipped[1]
    store = make_store(durable_uri=str(uri))  # a new catalog database: rebuilt from these markers
    assert [(r.id.version, r.tier) for r in store.list("d")] == [(1, "remote")]
    assert store.latest_version("d") == 1
