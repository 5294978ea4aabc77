"""The hand-over of a publish between a process and its node's store: a file in /dev/shm that both map.

The publisher packs a snapshot straight into its staging file and sends the store the file's name; the store
copies the bytes into the object store from its own mapping of the same pages. Each publisher keeps one file,
open and mapped in both processes, from publish to publish: fresh shared memory costs more to fault in than to
copy, so reusing the pages is what makes a publish cost about two memcpys. The price is one file the size of the
largest snapshot each publishing process has published, held until that process ends (a process killed before
removing its file leaves it for the store, which sweeps every few seconds: files are named ``<pid>-<random>``).
"""

from __future__ import annotations

import logging
import mmap
import os
import stat
import threading
import uuid
import weakref
from contextlib import suppress
from pathlib import Path

import numpy as np

from .config import staging_dir
from .errors import InvalidOptionError

log = logging.getLogger(__name__)

_MAX_MAPS = 64  # staging files a store keeps mapped (one per publishing process on the node)


class StagingFile:
    """A publisher's staging file. ``lock`` serializes the publishes that use it: the file is rewritten by the
    next pack, so the store must be done copying it (the publish call returned) before that starts."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self.lock = threading.Lock()
        self._fd = fd
        self._map: mmap.mmap | None = None
        self._finalizer = weakref.finalize(self, _remove, path, fd)

    @classmethod
    def create(cls) -> StagingFile | None:
        """A new staging file, or None when /dev/shm cannot be used (snapshots then travel by value)."""
        folder = staging_dir()
        path = folder / f"{os.getpid()}-{uuid.uuid4().hex}"
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        for _ in range(2):  # the second time: a driver that found the folder empty removed it between the steps
            try:
                folder.mkdir(mode=0o700, exist_ok=True)
                return cls(path, os.open(path, flags, 0o600))
            except FileNotFoundError as exc:
                error = exc
            except OSError as exc:
                error = exc
                break
        log.debug("no staging file in %s (%s): publishing by value", folder, error)
        return None

    def alloc(self, nbytes: int) -> np.ndarray:
        """The destination ``pack`` fills: the first ``nbytes`` of the file, grown (and its pages reserved up
        front: a full /dev/shm is an OSError here, never a SIGBUS while writing) when the snapshot is bigger."""
        if self._map is None or len(self._map) < nbytes:
            os.posix_fallocate(self._fd, 0, nbytes)
            if self._map is not None:
                self._map.close()
            self._map = mmap.mmap(self._fd, os.fstat(self._fd).st_size)
        return np.frombuffer(self._map, dtype=np.uint8, count=nbytes)

    def remove(self) -> None:
        """Unmap, close and remove the file, and the folder if it is left empty (also done when the object is
        collected or the process exits)."""
        if self._map is not None:
            with suppress(BufferError):  # an array still views it: unmapped when that goes
                self._map.close()
            self._map = None
        self._finalizer()


def publisher_of(name: str) -> int | None:
    """The pid of the process that made the staging file ``name`` (``<pid>-<random>``); None: not a staging file."""
    pid = name.partition("-")[0]
    return int(pid) if pid.isdigit() else None


def orphans(folder: Path | None = None) -> list[str]:
    """The names of the staging files whose publishing process is gone (Ray kills its workers when a cluster stops,
    so they cannot remove their own)."""
    try:
        names = os.listdir(folder or staging_dir())
    except OSError:
        return []
    gone = []
    for name in names:
        pid = publisher_of(name)
        if pid is None:
            continue  # not ours
        try:
            os.kill(pid, 0)  # a live process: maybe publishing right now
        except ProcessLookupError:
            gone.append(name)
        except OSError:
            continue  # not ours to judge
    return gone


def remove_orphans(folder: Path | None = None) -> None:
    """Remove the staging files of publishers that are gone (``orphans``), then the folder if that left it empty."""
    folder = folder or staging_dir()
    for name in orphans(folder):
        log.info("removing staging file %s of a publisher that is gone", name)
        (folder / name).unlink(missing_ok=True)
    with suppress(OSError):  # not empty: a live publisher's file (or one not ours) keeps it
        folder.rmdir()


def _remove(path: Path, fd: int) -> None:
    """Close and remove a staging file, then its folder if that was the last file (a publisher creating one
    meanwhile makes the folder again: ``StagingFile.create``)."""
    os.close(fd)
    path.unlink(missing_ok=True)
    with suppress(OSError):
        path.parent.rmdir()


class StagingMaps:
    """Store side: the staging files of this node's publishers, each mapped once and reused while it lives."""

    def __init__(self) -> None:
        self.folder = staging_dir()
        self._lock = threading.Lock()
        self._maps: dict[str, tuple[int, mmap.mmap]] = {}  # path -> (inode, read-only mapping)
        self.sweep()

    def view(self, path: str, nbytes: int) -> np.ndarray:
        """The first ``nbytes`` of the staging file at ``path``, checked to be a regular file of this user in the
        staging folder (a publisher names it; the store never maps anything else)."""
        if Path(path).parent != self.folder:
            raise InvalidOptionError(f"staging file {path!r} is not in the staging folder {self.folder}")
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise InvalidOptionError(f"staged snapshot size must be a positive int, got {nbytes!r}")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise InvalidOptionError(f"cannot open staging file {path!r}: {exc}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size < nbytes:
                raise InvalidOptionError(
                    f"staging file {path!r} is not a regular file of this user holding {nbytes} bytes")
            with self._lock:
                inode, mapped = self._maps.get(path, (None, None))
                if mapped is None or inode != info.st_ino or len(mapped) < nbytes:
                    mapped = mmap.mmap(fd, info.st_size, prot=mmap.PROT_READ)
                    self._maps[path] = (info.st_ino, mapped)
        finally:
            os.close(fd)
        return np.frombuffer(mapped, dtype=np.uint8, count=nbytes)

    def sweep(self) -> None:
        """Remove the files of publishers that are gone; unmap files that were removed (and the oldest mappings
        beyond ``_MAX_MAPS``)."""
        remove_orphans(self.folder)
        with self._lock:
            for path in [p for p in self._maps if not os.path.exists(p)] + list(self._maps)[:-_MAX_MAPS]:
                _, mapped = self._maps.pop(path, (None, None))
                if mapped is not None:
                    with suppress(BufferError):  # a publish still copies from it: unmapped once that is done
                        mapped.close()
