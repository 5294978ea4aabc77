"""OS-level read-only pages for snapshot buffers in every process that reads them.

torch ignores numpy's read-only flag, and many routes to a tensor's memory never pass through Python-level torch
calls (dispatcher ops, C++ inside nn modules, dlpack, numpy round trips, raw pointers). Only the OS can refuse
them all: every reader ``mprotect``s the snapshot's pages PROT_READ in its own mapping of the node's shared memory,
so a write by any route kills the writing process with SIGSEGV (Ray workers print a Python traceback through
faulthandler; this module turns faulthandler on in processes that have it off) and never reaches another process.

Two constraints shape this module:

- ``mprotect`` works on whole pages, and Ray's object store aligns objects to 64 bytes, not to pages. So the store
  puts ``shareable(buf)``: the snapshot between two 4096-byte pads in one object, which makes the pages holding
  the snapshot's first and last bytes lie wholly inside the object (Ray lays the three out contiguously).
- The object store reuses freed memory for new objects, which this process may then write (``ray.put``). So the
  pages are made writable again BEFORE the buffer is released: the array ``open_shared`` returns owns a reference
  to what ``ray.get`` returned, and a finaliser restores PROT_READ|PROT_WRITE before dropping that reference. Views
  made from the array (numpy, ``torch.frombuffer``, ``memoryview``) keep it, and so the protection, alive.

When ``mprotect`` fails (ENOMEM once the process has ``vm.max_map_count`` mappings, since protecting a range
splits one), a reader refuses the snapshot with WriteProtectionError rather than hand out views that a stray write
could change for every process; the store, which never writes into a snapshot, goes on with the pages writable
(``strict=False``). Whatever the protection step does, the array keeps the buffer it views alive, and pages that
cannot be made writable again keep their buffer for the life of the process: the object store never reuses memory
this process still reads, nor memory it could not unprotect.

Cost: one ``mprotect`` call per snapshot newly opened in a process and one when its last view goes (each is a
system call that updates the page tables of the range, and splits the mapping into up to three kernel VMAs while
it is protected).
"""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import mmap
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import WriteProtectionError

log = logging.getLogger(__name__)

PAD_BYTES = 4096
PAGE = mmap.PAGESIZE
_PROT_READ, _PROT_WRITE = 0x1, 0x2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_libc.mprotect.restype = ctypes.c_int

_lock = threading.Lock()
# page range -> (number of open arrays over it in this process, the mapping generation it was protected in)
_protected: dict[tuple[int, int], tuple[int, object]] = {}
_UNASKED = object()


def _one_generation() -> object:
    """A process whose mapping lives as long as the process (a Ray worker, the store): one generation."""
    return None


_generation: Callable[[], object] = _one_generation
_deferred: list[tuple[int, int, object, Any]] = []  # releases waiting for the lock (see _release)
_stuck: list[Any] = []  # buffers whose pages could not be made writable again: never given back (see _drain)
_announced = False


def follow_generation(current: Callable[[], object]) -> None:
    """Say how to tell the current generation of the shared-memory mapping (the client passes its Ray session:
    ``ray.shutdown()`` unmaps the object store whatever buffers are still referenced). Pages protected in an
    earlier generation are never made writable again: that mapping is gone, and by the time their last view goes
    the addresses may hold something else (a shared library's code would lose its execute bit)."""
    global _generation
    _generation = current


def shareable(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the store ``ray.put``s for snapshot ``buf``: ``(pad_a, buf, pad_b)``.

    The pads are two distinct zero arrays (Ray stores one array object once, however often it appears), so in
    the object store the pages holding ``buf``'s first and last bytes lie wholly inside the object.
    """
    return np.zeros(PAD_BYTES, dtype=np.uint8), buf, np.zeros(PAD_BYTES, dtype=np.uint8)


def unwrap(obj: Any) -> np.ndarray:
    """The snapshot bytes in ``obj`` (what ``ray.get`` returned for ``shareable(buf)``, or a plain buffer), without
    protecting anything: for processes that only checksum, copy or write the bytes elsewhere (the store itself)."""
    return obj[1] if isinstance(obj, (tuple, list)) and len(obj) == 3 else obj


def open_shared(obj: Any, *, strict: bool = True, what: str = "snapshot") -> np.ndarray:
    """A read-only array of the snapshot bytes in ``obj`` (what ``ray.get`` returned for ``shareable(buf)``, or a
    plain buffer) whose pages are write-protected in this process for as long as the array or any view of it lives.

    Only pages wholly inside the object are protected: with the pads that is all of the snapshot; for a plain
    buffer (or a layout that does not check out, which is logged) the partial first and last pages stay writable.
    If the pages cannot be protected, ``strict`` raises WriteProtectionError naming ``what``; else the array is
    handed out over writable pages (for the store, which only reads it). The array holds ``obj`` either way.
    """
    buf = unwrap(obj)
    padded = buf is not obj
    if not (isinstance(buf, np.ndarray) and buf.dtype == np.uint8 and buf.ndim == 1 and buf.flags.c_contiguous):
        raise TypeError(f"open_shared takes a 1-D uint8 snapshot buffer, got {type(buf).__name__}")
    lo, hi = _page_range(buf, obj[0], obj[2]) if padded else _inner_pages(buf)
    holder = _Holder(buf, obj)
    array = np.asarray(holder)  # array.base is the holder: every view of the array keeps it (and obj) alive
    generation = _generation()
    if hi > lo:
        errno = _acquire(lo, hi, generation)
        if errno is None:
            # holds obj (the plasma buffer) until the pages are writable again
            weakref.finalize(holder, _release, lo, hi, generation, obj)
        elif strict:
            raise WriteProtectionError(
                errno,
                f"cannot make the pages of {what} read-only in this process (pid {os.getpid()}): mprotect failed "
                f"({os.strerror(errno)}){_ENOMEM_HINT if errno == _ENOMEM else ''}; refusing views that a stray "
                "write could change for every process on the node",
            )
    return array


_ENOMEM = 12
_ENOMEM_HINT = (" (the process is at the kernel's limit on memory mappings, vm.max_map_count: raise it, or let go of "
                "snapshots this process no longer reads)")


class _Holder:
    """The base object of the array ``open_shared`` returns: its lifetime is the protection's lifetime, and it holds
    the buffer it describes (what ``ray.get`` returned) so the memory stays this snapshot's while it is read."""

    __slots__ = ("__array_interface__", "obj", "__weakref__")

    def __init__(self, buf: np.ndarray, obj: Any):
        self.obj = obj
        self.__array_interface__ = {
            "data": (_address(buf), True),  # read-only
            "shape": (buf.nbytes,),
            "typestr": "|u1",
            "version": 3,
        }


def _page_range(buf: np.ndarray, pad_a: np.ndarray, pad_b: np.ndarray) -> tuple[int, int]:
    """Every page that holds a byte of ``buf``, if they all lie inside the padded object; else the inner pages."""
    start = _address(buf)
    end = start + buf.nbytes
    lo, hi = start - start % PAGE, -(-end // PAGE) * PAGE
    pads = (isinstance(pad_a, np.ndarray) and isinstance(pad_b, np.ndarray)
            and pad_a.nbytes == PAD_BYTES and pad_b.nbytes == PAD_BYTES)
    a, b = (_address(pad_a), _address(pad_b)) if pads else (0, 0)
    if (pads and a <= lo and a + PAD_BYTES <= start and end <= b and hi <= b + PAD_BYTES
            and b - a < buf.nbytes + 3 * PAD_BYTES):  # one object, not three
        return lo, hi
    log.warning(
        "snapshot buffer at %#x is not laid out between its pads; only the pages wholly inside it are write-protected",
        start,
    )
    return _inner_pages(buf)


def _inner_pages(buf: np.ndarray) -> tuple[int, int]:
    start = _address(buf)
    end = start + buf.nbytes
    return -(-start // PAGE) * PAGE, end - end % PAGE


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]  # what array.ctypes.data says, without building a ctypes object


def _mprotect(lo: int, hi: int, prot: int) -> int | None:
    """None once the pages of [lo, hi) have protection ``prot``; else the errno, logged."""
    if _libc.mprotect(lo, hi - lo, prot) == 0:
        return None
    errno = ctypes.get_errno()
    log.warning("mprotect(%#x, %d, %d) failed: %s (errno %d)", lo, hi - lo, prot, os.strerror(errno), errno)
    return errno


def _acquire(lo: int, hi: int, generation: object) -> int | None:
    """Count one more open array over [lo, hi); protect the pages on the first. None once counted, else the errno
    that kept the pages from being protected (nothing is counted then)."""
    global _announced
    with _lock:
        count, protected_in = _protected.get((lo, hi), (0, generation))
        if protected_in != generation:  # left over from a mapping that is gone: this range is new
            count = 0
        if count == 0:
            errno = _mprotect(lo, hi, _PROT_READ)
            if errno is not None:
                return errno
        _protected[(lo, hi)] = (count + 1, generation)
        _drain()
        if not _announced:
            _announced = True
            if not faulthandler.is_enabled():
                faulthandler.enable(file=sys.stderr)
            log.info(  # not a warning: every reader process gets here once and a job has many; the docs say it once
                "policystore: snapshot pages are mapped read-only in this process (pid %d): a write into shared "
                "weights by any route kills this process with SIGSEGV; take a private copy (tensor.clone()) to "
                "change them", os.getpid(),
            )
        return None


def _release(lo: int, hi: int, generation: object, obj: Any) -> None:
    """The last array over [lo, hi) is gone: make the pages writable, then let ``obj`` (the buffer) go.

    A finaliser can run inside any allocation, also while this thread holds the lock: then the release waits in
    ``_deferred`` (keeping ``obj`` alive) and the lock's holder completes it, or the next acquire or release does.
    """
    _deferred.append((lo, hi, generation, obj))
    if _lock.acquire(blocking=False):
        try:
            _drain()
        finally:
            _lock.release()


def _drain() -> None:
    """Complete every deferred release (called with the lock held)."""
    current = _UNASKED
    while _deferred:
        lo, hi, generation, obj = _deferred.pop()
        count, protected_in = _protected.get((lo, hi), (0, None))
        if not count or protected_in != generation:
            continue  # an array of a mapping that is gone (the range was counted anew since, or forgotten)
        if count > 1:
            _protected[(lo, hi)] = (count - 1, protected_in)
            continue
        del _protected[(lo, hi)]
        if current is _UNASKED:
            current = _generation()
        # else the mapping is gone: leave whatever the addresses hold now alone
        if generation == current and _mprotect(lo, hi, _PROT_READ | _PROT_WRITE) is not None:
            # read-only pages the object store would hand to a new object this process may write: keep them ours
            _stuck.append(obj)


def protected_ranges() -> int:
    """How many page ranges this process holds write-protected (for stats and tests)."""
    with _lock:
        _drain()
        return len(_protected)
