"""A disk that another writer fills between a publish and its background spill, on a real (tmpfs) file system
with a real store: nothing acknowledged is lost, nothing is hidden, and the hot tier stays within its capacity."""

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
from policystore.config import NAMESPACE, store_name
from policystore.errors import DiskFullError, SpillFailedError

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
        server._writer.submit(wait)

    ray.get(_actor(store).__ray_call__.remote(hold))


def _waiting_for_room(server) -> bool:
    """Whether a thread of the store is in ``_make_room`` (a publish waiting for the hot tier)."""
    import sys

    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code.co_name == "_make_room":
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
