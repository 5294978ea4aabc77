"""OS-level write protection of snapshot pages, with real Ray worker processes.

A write into a snapshot by any route must kill the writing process (SIGSEGV, with a traceback in its log) and never
reach another process; once the last view is gone the pages are writable again, so the object store can reuse the
memory for new objects without crashing the process that writes them.
"""

from __future__ import annotations

import ctypes
import errno
import faulthandler
import gc
import glob
import os
import zlib
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
import torch.nn.functional as F
from helpers import eventually
from torch import nn

import policystore
from policystore import format as fmt
from policystore import protect
from policystore.views import tensor_views

MiB = 1024 * 1024


def snapshot_bytes() -> np.ndarray:
    torch.manual_seed(0)
    return fmt.pack({"w": torch.randn(256, 256), "e": torch.randn(512, 64) * 10}, policy_id="p")


def page_perms(addr: int) -> str:
    """The permissions of this process's mapping that holds ``addr`` (from /proc/self/maps)."""
    with open("/proc/self/maps") as f:
        for line in f:
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= addr < hi:
                return perms
    raise AssertionError(f"{addr:#x} is not mapped")


def plain(arr: np.ndarray, name: str) -> torch.Tensor:
    """A tensor view of one snapshot tensor with the torch guard stripped (as_subclass), as a hostile user would."""
    header = fmt.parse_header(arr, name="p")
    return tensor_views(arr, header, "p@v1")[name].as_subclass(torch.Tensor)


def aten_add(arr: np.ndarray) -> None:
    """A dispatcher-level op (a named function: workers import it, torch.ops cannot be pickled by value)."""
    torch.ops.aten.add_.Tensor(plain(arr, "w"), 1.0)


# Routes that get past the torch-level guard; each must die on the OS protection.
ROUTES = {
    "ctypes": lambda arr: ctypes.memset(arr.ctypes.data + arr.nbytes // 2, 0xAB, 64),
    "from_numpy(view.numpy())": lambda arr: torch.from_numpy(
        tensor_views(arr, fmt.parse_header(arr, name="p"), "p")["w"].numpy()).add_(1),
    "as_subclass": lambda arr: plain(arr, "w").mul_(2),
    "dlpack": lambda arr: torch.from_dlpack(plain(arr, "w")).zero_(),
    "as_tensor": lambda arr: torch.as_tensor(arr).fill_(0),
    "frombuffer": lambda arr: torch.frombuffer(arr, dtype=torch.uint8).__setitem__(slice(-8, None), 1),
    "aten.add_": aten_add,
    "embedding max_norm": lambda arr: nn.Embedding.from_pretrained(plain(arr, "e"), max_norm=1.0)(
        torch.tensor([0, 1])),
    "relu inplace": lambda arr: F.relu(plain(arr, "w"), inplace=True),
}


@ray.remote(num_cpus=0.1, max_restarts=0)
class Holder:
    """A process that opens the snapshot and keeps it open."""

    def open(self, refs: list) -> int:
        self.arr = protect.open_shared(ray.get(refs[0]))
        return os.getpid()

    def crc(self) -> int:
        return zlib.crc32(self.arr)

    def perms(self) -> str:
        return page_perms(self.arr.ctypes.data + self.arr.nbytes // 2)

    def write(self, route: str) -> str:
        # Python's traceback first: Ray's own SIGSEGV handler runs ahead of it otherwise, and on a loaded machine
        # its slow stack symbolization can outlast the process before Python's handler writes a line.
        faulthandler.disable()
        faulthandler.enable()
        ROUTES[route](self.arr)
        return "survived"

    def reuse(self, rounds: int) -> tuple[int, str]:
        """Open an object this process owns, drop it, then fill the freed memory with new objects."""
        ref = ray.put(protect.shareable(np.full(MiB, 7, np.uint8)))
        arr = protect.open_shared(ray.get(ref))
        addr = arr.ctypes.data + arr.nbytes // 2
        view = torch.frombuffer(arr, dtype=torch.uint8)[10:20]  # a view keeps the protection alive
        del arr
        held = (protect.protected_ranges(), page_perms(addr))
        assert int(view[0]) == 7
        del view, ref
        after = page_perms(addr)
        for i in range(rounds):  # the store reuses the freed memory; writing it must not fault
            new = ray.put(protect.shareable(np.full(MiB, i % 250, np.uint8)))
            assert int(ray.get(new)[1][0]) == i % 250
            del new
        return held, after, protect.protected_ranges()


@pytest.fixture(scope="module")
def shared(ray_session):
    buf = snapshot_bytes()
    ref = ray.put(protect.shareable(buf))
    holder = Holder.remote()
    ray.get(holder.open.remote([ref]))
    yield ref, zlib.crc32(buf), holder
    ray.kill(holder)


def worker_log(pid: int) -> str:
    """Everything the worker process ``pid`` wrote to its stderr log (Ray's per-worker .err file), once it holds
    the traceback of a segfault."""

    def traceback() -> str | None:
        # Not through session_latest: another test process's Ray session can repoint it between glob and open.
        files = [f for f in glob.glob(f"/tmp/ray/session_*/logs/worker-*-{pid}.err") if "/session_latest/" not in f]
        text = "".join(Path(f).read_text(errors="replace") for f in files)
        return text if "Segmentation fault" in text and "(most recent call first)" in text else None

    return eventually(traceback, f"the segfault's traceback in worker {pid}'s log", 30, every_s=0.5)


def test_pages_are_read_only_in_every_reader(shared):
    ref, _, holder = shared
    assert ray.get(holder.perms.remote()).startswith("r--")
    arr = protect.open_shared(ray.get(ref))
    assert page_perms(arr.ctypes.data).startswith("r--")
    assert not arr.flags.writeable


@pytest.mark.parametrize("route", ROUTES)
def test_a_write_by_any_route_kills_the_writer_and_reaches_no_one(shared, route):
    ref, crc, holder = shared
    writer = Holder.remote()
    pid = ray.get(writer.open.remote([ref]))
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(writer.write.remote(route))
    log = worker_log(pid)
    assert "Segmentation fault" in log and "in write" in log, log[-2000:]
    assert ray.get(holder.crc.remote()) == crc  # another process still reads the original bytes
    assert zlib.crc32(ray.get(ref)[1]) == crc


def test_pages_are_writable_again_once_the_last_view_is_gone_and_memory_reuse_is_safe(ray_session):
    holder = Holder.remote()
    (held_ranges, held_perms), after, left = ray.get(holder.reuse.remote(40))
    assert held_ranges == 1 and held_perms.startswith("r--")
    assert after.startswith("rw")
    assert left == 0
    ray.kill(holder)


def test_a_plain_buffer_protects_only_the_pages_wholly_inside_it():
    buf = np.zeros(5 * protect.PAGE, np.uint8)
    arr = protect.open_shared(buf[100 : 100 + 3 * protect.PAGE])
    inner = -(-arr.ctypes.data // protect.PAGE) * protect.PAGE
    assert page_perms(inner).startswith("r--")
    assert page_perms(arr.ctypes.data).startswith("rw")  # the partial first page is shared with other memory
    del arr
    assert page_perms(inner).startswith("rw")


@pytest.fixture
def ranges_before() -> int:
    """Ranges protected before the test: views that tests of other modules run in this process still hold."""
    gc.collect()
    return protect.protected_ranges()


def test_unwrap_gives_the_snapshot_bytes_without_protecting_them(ranges_before):
    buf = np.arange(10, dtype=np.uint8)
    padded = protect.shareable(buf)
    assert protect.unwrap(padded) is buf and protect.unwrap(buf) is buf
    assert padded[0] is not padded[2] and padded[0].nbytes == padded[2].nbytes == protect.PAD_BYTES
    assert protect.protected_ranges() == ranges_before


def test_a_release_while_the_lock_is_held_waits_and_never_deadlocks(ranges_before):
    """A finaliser can fire inside an allocation made while this thread holds the lock (the GC runs anywhere)."""
    buf = np.ones(6 * protect.PAGE, np.uint8)
    arr = protect.open_shared(buf)
    inner = -(-arr.ctypes.data // protect.PAGE) * protect.PAGE
    with protect._lock:
        del arr  # the finaliser runs now, on this thread, with the lock held
        assert page_perms(inner).startswith("r--")  # still protected: the buffer is still held
    assert protect.protected_ranges() == ranges_before
    assert page_perms(inner).startswith("rw")


def test_pages_of_an_earlier_mapping_generation_are_never_made_writable_again(ranges_before):
    """After ``ray.shutdown()`` the object store's mapping is gone, and its addresses may hold something else by the
    time the last view of an old snapshot goes: such a release must leave the pages alone, and must not disturb a
    range counted anew in the current generation."""
    generation = ["session-1"]
    buf = np.ones(6 * protect.PAGE, np.uint8)
    inner, end = protect._inner_pages(buf)
    protect.follow_generation(lambda: generation[0])
    try:
        old = protect.open_shared(buf)
        generation[0] = "session-2"  # Ray was shut down and started again
        new = protect.open_shared(buf)  # the same addresses, counted anew
        del old
        assert page_perms(inner).startswith("r--")  # the old release did not touch the new range
        generation[0] = "session-3"
        del new
        assert page_perms(inner).startswith("r--")  # left alone: the mapping it was protected in is gone
        assert protect.protected_ranges() == ranges_before
    finally:
        protect.follow_generation(protect._one_generation)
        protect._mprotect(inner, end, protect._PROT_READ | protect._PROT_WRITE)  # before buf's memory is freed


@ray.remote(num_cpus=0.1, max_restarts=0)
class Cramped:
    """A reader process at the kernel's limit on memory maps: its ``mprotect`` calls with a protection in ``fail``
    fail with ENOMEM, as they do at ``vm.max_map_count`` (protecting part of a mapping splits it in two)."""

    def __init__(self, fail: tuple[int, ...]):
        real = protect._libc.mprotect

        def mprotect(addr: int, size: int, prot: int) -> int:
            if prot in fail:
                ctypes.set_errno(errno.ENOMEM)
                return -1
            return real(addr, size, prot)

        protect._libc = type("Libc", (), {"mprotect": staticmethod(mprotect)})

    def get(self, policy_id: str) -> str:
        try:
            policystore.connect().get(policy_id)
        except policystore.PolicyStoreError as exc:
            return f"{type(exc).__name__}: {exc} [ranges {protect.protected_ranges()}]"
        return "served"

    def open_unprotected(self, refs: list) -> tuple[int, str]:
        """What the store does: read a snapshot whose pages it could not protect, and keep only the array."""
        self.arr = protect.open_shared(ray.get(refs[0]), strict=False)
        return zlib.crc32(self.arr), page_perms(self.arr.ctypes.data + self.arr.nbytes // 2)

    def open_and_drop(self, refs: list) -> None:
        """Protect a snapshot's pages (that works), then drop it: making them writable again fails."""
        arr = protect.open_shared(ray.get(refs[0]))
        assert page_perms(arr.ctypes.data).startswith("r--")
        del arr

    def crc(self) -> int:
        return zlib.crc32(self.arr)

    def churn(self, rounds: int, nbytes: int) -> int:
        """Fill the object store's free memory with objects of ``nbytes`` this process writes (ray.put)."""
        for i in range(rounds):
            new = ray.put(protect.shareable(np.full(nbytes, i % 250, np.uint8)))
            assert int(ray.get(new)[1][0]) == i % 250
            del new
        return len(protect._stuck)


def test_a_reader_that_cannot_protect_pages_refuses_the_snapshot_with_a_clear_error(make_store):
    store = make_store()
    store.publish("cramped", {"w": torch.randn(512, 512)})
    reader = Cramped.remote((protect._PROT_READ,))
    answer = ray.get(reader.get.remote("cramped"))
    assert answer.startswith("WriteProtectionError: [Errno 12] cannot make the pages of cramped@v1 read-only"), answer
    assert "vm.max_map_count" in answer and answer.endswith("[ranges 0]")
    assert issubclass(policystore.WriteProtectionError, policystore.PolicyStoreError)
    ray.kill(reader)


def test_an_unprotected_array_keeps_its_buffer_after_the_object_is_deleted_and_the_memory_reused(ray_session):
    """The store's mode (strict=False): the array still pins the buffer, so freeing the object and filling the
    object store with new objects never puts other bytes under it."""
    buf = snapshot_bytes()
    ref = ray.put(protect.shareable(buf))
    reader = Cramped.remote((protect._PROT_READ,))
    crc, perms = ray.get(reader.open_unprotected.remote([ref]))
    assert crc == zlib.crc32(buf) and perms.startswith("rw")  # served, over writable pages
    del ref  # the owner lets the object go: only the reader's array still holds it
    ray.get(reader.churn.remote(500, buf.nbytes))
    assert ray.get(reader.crc.remote()) == zlib.crc32(buf)
    ray.kill(reader)


def test_pages_that_cannot_be_made_writable_again_keep_their_buffer_for_good(ray_session):
    """Read-only pages handed back to the object store would crash this process's next put there: the buffer is
    kept instead, and the process goes on putting objects."""
    buf = snapshot_bytes()
    ref = ray.put(protect.shareable(buf))
    reader = Cramped.remote((protect._PROT_READ | protect._PROT_WRITE,))
    ray.get(reader.open_and_drop.remote([ref]))
    del ref
    assert ray.get(reader.churn.remote(500, buf.nbytes)) == 1  # alive, and the one buffer is kept
    ray.kill(reader)
