"""Node memory as it really is with shared pages: PSS summed over every process of the Ray session.

RSS counts a shared page once per process that maps it (N workers mapping one snapshot look like N copies); USS
does not count it at all. PSS splits each page among its mappers, so the sum over all processes (raylet, which
holds the object store, the store actors and every worker included) counts it exactly once.
"""

from __future__ import annotations

import ctypes
import gc
import os
import time
from collections.abc import Iterable

import psutil
import ray

MiB = 1024 * 1024  # the one definition: the trainer, workers, benchmarks and tests take it from here
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def return_big_frees_to_the_os(threshold_bytes: int = MiB) -> bool:
    """Have glibc's malloc give every freed buffer of ``threshold_bytes`` or more back to the OS at once, in this
    process. Returns False where malloc is not glibc's (then nothing changes).

    For long-lived processes that handle big transient buffers (the store actor: lz4 attempts on its spill
    thread). By default glibc raises its mmap threshold to the size of the first big buffer freed, after which
    buffers of that size come from a thread's heap and stay resident once freed.
    """
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, int(threshold_bytes)))


def session_processes(extra_pids: Iterable[int] = ()) -> list[psutil.Process]:
    """This driver, every raylet/GCS process of its Ray session on this machine, and all their descendants."""
    roots = {os.getpid(), *extra_pids}
    node = getattr(ray._private.worker, "_global_node", None)
    session = node.get_session_dir_path() if node is not None else None
    if session:
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if any(session in arg for arg in proc.info["cmdline"] or ()):
                    roots.add(proc.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
    found: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            for proc in (root, *root.children(recursive=True)):
                found[proc.pid] = proc
        except psutil.NoSuchProcess:
            continue
    return list(found.values())


def pss_bytes(processes: Iterable[psutil.Process]) -> int:
    total = 0
    for proc in processes:
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def session_pss_bytes(settle_s: float = 0.5) -> int:
    """PSS of the whole Ray session on this node, after a GC in this process and a short settle."""
    gc.collect()
    time.sleep(settle_s)
    return pss_bytes(session_processes())


def system_used_bytes() -> int:
    """Used memory of the whole machine (total - available): the check that nothing hides outside the session."""
    vm = psutil.virtual_memory()
    return vm.total - vm.available


def process_pss_bytes(pid: int | None = None) -> int:
    return psutil.Process(pid or os.getpid()).memory_full_info().pss
