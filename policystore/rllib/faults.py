"""Naming, in the driver, the frozen module behind an EnvRunner killed by a write into shared weights.

A frozen module's weights are read-only pages (``policystore.protect``): a write by a route torch does not see
(``p.detach().numpy()[...] = 0``, ``data_ptr()``, dlpack) kills the writing EnvRunner with SIGSEGV, by design. Ray
restarts it, and all RLlib's driver says is "taking actor N out of service" (``foreach_env_runner`` returns no
result for it). So an EnvRunner that attaches frozen modules puts a SIGSEGV handler in front of faulthandler's:
it looks the faulting address up among the address ranges of its frozen modules' weights, leaves one line naming
the module in the job's folder (and on stderr, the EnvRunner's log), and hands the signal on (faulthandler prints
the Python stack of the write, then the process dies as before). The driver logs that line as an error as soon as
RLlib takes the EnvRunner out of service, and at the end of ``train()``.

The handler is Python called through ctypes on the faulting thread, which holds the GIL (the write was Python
code or a C call made from it); it only compares integers, writes a prepared line and re-installs the handler
it replaced. Linux only (the ``siginfo_t``/``sigaction`` layouts below); elsewhere nothing is installed.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)
FOLDER = "policystore-faults"  # in the Algorithm's log directory: one file per EnvRunner killed by a write
_RLLIB_LOGGER = "ray.rllib.utils.actor_manager"  # logs "taking actor N out of service"
_SA_SIGINFO, _SA_RESETHAND = 0x4, 0x80000000
_SI_ADDR_OFFSET = 16  # siginfo_t on 64-bit Linux: three ints, then the (8-aligned) union whose first field it is


class _Sigaction(ctypes.Structure):
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                ("restorer", ctypes.c_void_p)]


_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.sigaction.argtypes = (ctypes.c_int, ctypes.POINTER(_Sigaction), ctypes.POINTER(_Sigaction))
_lock = threading.Lock()
# (first address, end, the line to leave, the file it goes to or None) per frozen module of this process
_ranges: tuple[tuple[int, int, bytes, bytes | None], ...] = ()
_by_owner: dict[int, tuple[tuple[int, int, bytes, bytes | None], ...]] = {}  # per EnvRunner of this process
_previous = _Sigaction()
_installed: Any = None  # the ctypes handler, kept alive while installed


def _on_segv(signum: int, info: int, context: int) -> None:
    try:
        address = ctypes.c_void_p.from_address(info + _SI_ADDR_OFFSET).value or 0
        hit = next(((line, record) for lo, hi, line, record in _ranges if lo <= address < hi), None)
        if hit is not None:
            line, record = hit
            os.write(2, line)
            if record is not None:
                fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                os.write(fd, line)
                os.close(fd)
    finally:  # the write runs again on return and meets faulthandler's handler (or the default): the process dies
        _libc.sigaction(signal.SIGSEGV, ctypes.byref(_previous), None)


def watch(owner: object, modules: Iterable[tuple[str, Any, Any]], who: str, log_dir: str | None) -> None:
    """Name these frozen modules of ``owner`` (an EnvRunner: ``(module id, snapshot id, module)`` of its
    store-backed ones) if a write into their weights kills this process; ``who`` says which EnvRunner and pid. A
    later call for the same owner replaces its modules; ``forget`` drops them."""
    global _installed
    if not sys.platform.startswith("linux"):
        return
    record = os.path.join(log_dir, FOLDER, f"{os.getpid()}.txt").encode() if log_dir is not None else None
    ranges = []
    for module_id, snapshot, module in modules:
        tensors = [t for t in module.state_dict().values() if t.device.type == "cpu" and t.numel()]
        if tensors:
            line = (f"policystore: {who} was killed by SIGSEGV: it wrote into the shared weights of frozen module "
                    f"{module_id!r} (snapshot {snapshot}), read-only for every process on the node; to change "
                    f"them, copy them first ({{k: v.clone() for k, v in module.state_dict().items()}}) and freeze "
                    f"the copy under a new id\n")
            ranges.append((min(t.data_ptr() for t in tensors),
                           max(t.data_ptr() + t.numel() * t.element_size() for t in tensors), line.encode(), record))
    if ranges and log_dir is not None:
        os.makedirs(os.path.join(log_dir, FOLDER), exist_ok=True)
    with _lock:
        _set(owner, tuple(ranges))
        if _installed is None and ranges:
            handler = _HANDLER(_on_segv)
            action = _Sigaction(handler=ctypes.cast(handler, ctypes.c_void_p).value,
                                flags=_SA_SIGINFO | _SA_RESETHAND)
            if _libc.sigaction(signal.SIGSEGV, ctypes.byref(action), ctypes.byref(_previous)) == 0:
                _installed = handler


def forget(owner: object) -> None:
    """``owner`` (an EnvRunner being stopped) no longer holds frozen modules: their addresses may hold anything."""
    with _lock:
        _set(owner, ())


def _set(owner: object, ranges: tuple[tuple[int, int, bytes, bytes | None], ...]) -> None:
    global _ranges
    if ranges:
        _by_owner[id(owner)] = ranges
    else:
        _by_owner.pop(id(owner), None)
    _ranges = tuple(r for owned in _by_owner.values() for r in owned)  # one assignment: the handler reads it whole


def report(log_dir: str) -> list[str]:
    """Log (as errors) and clear the lines that EnvRunners of the job in ``log_dir`` left as they died."""
    folder = Path(log_dir, FOLDER)
    lines = []
    for path in sorted(folder.glob("*.txt")) if folder.is_dir() else []:
        lines += [line for line in path.read_text().splitlines() if line]
        path.unlink(missing_ok=True)
    for line in lines:
        logger.error("%s", line)
    return lines


class _Reporter(logging.Handler):
    """Reports the job's lines when RLlib takes an actor out of service (the moment the driver sees the death)."""

    def __init__(self, log_dir: str) -> None:
        super().__init__(logging.ERROR)
        self.log_dir = log_dir

    def emit(self, record: logging.LogRecord) -> None:
        if "out of service" in record.getMessage():
            report(self.log_dir)


def report_from_driver(log_dir: str) -> None:
    """Have this (driver) process report the job's lines as soon as RLlib takes an EnvRunner out of service."""
    rllib = logging.getLogger(_RLLIB_LOGGER)
    if not any(isinstance(h, _Reporter) and h.log_dir == log_dir for h in rllib.handlers):
        rllib.addHandler(_Reporter(log_dir))


def stop_reporting(log_dir: str) -> None:
    """The job ends: report what is left, stop listening, and remove the (empty) folder."""
    report(log_dir)
    rllib = logging.getLogger(_RLLIB_LOGGER)
    for handler in [h for h in rllib.handlers if isinstance(h, _Reporter) and h.log_dir == log_dir]:
        rllib.removeHandler(handler)
    try:
        Path(log_dir, FOLDER).rmdir()
    except OSError:
        pass
