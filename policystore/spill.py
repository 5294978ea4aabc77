"""The disk tier: one file per snapshot, ``<root>/<policy_id>/<version>.safetensors[.lz4]`` (``filenames.py``).

Each file is written and read by the snapshot-file codec (``snapfile.py``). Writes go to a temp file in the same
folder, are fsync'd, and are renamed into place by ``commit`` (then the folder is fsync'd): a crash leaves either
the whole file or none.

Nothing on disk is trusted. A read checks the file's own checksum, the policy id and version recorded inside it,
and (``expect``) the checksum the catalog recorded at publish; a file that fails is never served and never
deleted: it is moved to ``<root>/.quarantine/`` with a reason. The tier works through file descriptors of its own
folders and opens nothing through a symlink, so nothing outside the root is read, adopted or deleted; the root
must belong to the running user, and the tier creates folders 0700 and files 0600.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TypeVar

import numpy as np

from . import snapfile
from .config import LEAGUES, StoreConfig  # LEAGUES: other leagues' folders under a shared spill root
from .errors import CorruptSnapshotError, DiskFullError, SnapshotFolderError
from .filenames import parse_name, policy_folder, policy_of, version_name
from .format import Background, Expected, Header, check_identity
from .ids import SnapshotId
from .snapfile import LZ4_SUFFIX, RAW_SUFFIX, READ_FLAGS, NotTheFile, SpillFile
from .wire import QuarantineRecord

log = logging.getLogger(__name__)

QUARANTINE = ".quarantine"  # not a valid policy id, so it never clashes with a policy's folder
TOMBSTONES = ".tombstones"  # deletes the durable tier has not taken yet (durable_queue.py), for a restarted store
CATALOG_PREFIX = "_catalog"  # the catalog's database (and any damaged copy set aside) may share the spill root
_TMP_PREFIX = ".tmp-"
_REASON_SUFFIX = ".reason.json"
_NEW_FILE_TRIES = 8  # a spill's tries to create its file while deletes of the policy remove its empty folder
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

T = TypeVar("T")


@dataclass(frozen=True)
class DiskEntry:
    """What a rebuild learns from a file's header without reading its data."""

    id: SnapshotId
    file: SpillFile
    header: Header


@dataclass
class Survey:
    """A read-only look at a snapshot folder: good files, junk left alone, damaged files, unfinished temps."""

    entries: list[DiskEntry] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    damaged: list[tuple[SnapshotId, Path, str]] = field(default_factory=list)
    temps: list[Path] = field(default_factory=list)
    others: list[Path] = field(default_factory=list)  # other regular files in policy folders (also in skipped)


# ---- layout ------------------------------------------------------------------------------------------------
def file_name(version: int, compressed: bool) -> str:
    return version_name(version, LZ4_SUFFIX if compressed else RAW_SUFFIX)


def parse_file_name(name: str) -> tuple[int, bool] | None:
    """(version, compressed) of a committed snapshot file name, else None."""
    for suffix in (LZ4_SUFFIX, RAW_SUFFIX):
        version = parse_name(name, suffix)
        if version is not None:
            return version, suffix == LZ4_SUFFIX
    return None


def open_folder_fd(path: str | os.PathLike, *, follow: bool) -> int:
    """A descriptor of the folder ``path`` (``follow``: the last component may be a symlink); SnapshotFolderError."""
    try:
        return os.open(path, _DIR_FLAGS if not follow else _DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError as exc:
        raise SnapshotFolderError(exc.errno, f"snapshot folder {path}: {_why(exc, path)}") from None


def _why(exc: OSError, path: str | os.PathLike, dir_fd: int | None = None) -> str:
    """What an OSError from opening ``path`` without following symlinks means, in words."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        with suppress(OSError):
            if stat.S_ISLNK(os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                target = "" if dir_fd is not None else f"; give its real path, {os.path.realpath(path)}"
                return f"a symlink (never followed{target})"
    return exc.strerror or str(exc)


@contextmanager
def _subfolder(name: str, dir_fd: int) -> Iterator[int]:
    """A policy folder inside ``dir_fd``, never through a symlink (ELOOP/ENOTDIR raise OSError)."""
    fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def open_file(dir_fd: int, folder: str, name: str) -> BinaryIO:
    """``folder/name`` below the folder ``dir_fd``, opened for reading without following any symlink (OSError)."""
    with _subfolder(folder, dir_fd) as fd:
        return open(os.open(name, READ_FLAGS, dir_fd=fd), "rb", buffering=0)


def survey(root: Path, root_fd: int, policy_id: str | None = None, *, owner: int | None = None) -> Survey:
    """Every snapshot file under ``root_fd`` (or in ``policy_id``'s folder; headers only), changing nothing;
    never raises on junk.

    Only folders named like policy ids are entered and only regular files named like snapshots are read (and,
    given ``owner``, only those that uid owns); a file whose header does not parse, or says it is another
    snapshot than its place says, is ``damaged``.
    """
    found = Survey()
    for name in sorted(os.listdir(root_fd)) if policy_id is None else [policy_id]:
        if name in (QUARANTINE, TOMBSTONES, LEAGUES) or name.startswith(CATALOG_PREFIX):
            continue
        where = root / name
        if policy_of(name) is None:
            found.skipped.append(f"{where}: not a policy folder")
            continue
        try:
            with _subfolder(name, root_fd) as folder_fd:
                if owner is not None and os.fstat(folder_fd).st_uid != owner:
                    found.skipped.append(f"{where}: owned by uid {os.fstat(folder_fd).st_uid}, not {owner}")
                    continue
                _survey_policy(found, where, name, folder_fd, owner)
        except OSError as exc:
            if policy_id is None or exc.errno != errno.ENOENT:
                found.skipped.append(f"{where}: {_why(exc, name, root_fd)}")
    return found


def _survey_policy(found: Survey, folder: Path, policy_id: str, folder_fd: int, owner: int | None) -> None:
    seen: set[int] = set()
    for name in sorted(os.listdir(folder_fd)):
        path = folder / name
        try:
            st = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        except OSError as exc:
            found.skipped.append(f"{path}: {exc.strerror}")
            continue
        parsed = parse_file_name(name)
        if name.startswith(_TMP_PREFIX) and stat.S_ISREG(st.st_mode):
            found.temps.append(path)
        elif parsed is None or not stat.S_ISREG(st.st_mode):
            if stat.S_ISREG(st.st_mode):
                found.others.append(path)
            found.skipped.append(f"{path}: {'not a snapshot file' if parsed is None else 'not a regular file'}")
        elif owner is not None and st.st_uid != owner:
            found.skipped.append(f"{path}: owned by uid {st.st_uid}, not {owner}")
        elif parsed[0] in seen:
            found.skipped.append(f"{path}: a second file for version {parsed[0]}")
        else:
            seen.add(parsed[0])
            sid = SnapshotId(policy_id, parsed[0])
            file = SpillFile(path, parsed[1], st.st_size)
            try:
                with open(os.open(name, READ_FLAGS, dir_fd=folder_fd), "rb", buffering=0) as f:
                    header = snapfile.header_of(f, file, sid)
                found.entries.append(DiskEntry(sid, file, header))
            except OSError as exc:
                found.skipped.append(f"{path}: {exc.strerror}")
            except Exception as exc:  # any header that does not parse: the file is damaged, whatever the error
                found.damaged.append((sid, path, f"{exc} [file {path}]"))


# ---- the tier ------------------------------------------------------------------------------------------------
class DiskTier:
    """One node's spill folder, private to the running user."""

    def __init__(self, root: str | os.PathLike, *, compress: bool = StoreConfig.compress,
                 capacity_bytes: int | None = None):
        self.root = Path(os.path.abspath(root))
        self.compress = compress
        self.capacity_bytes = capacity_bytes
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise SnapshotFolderError(exc.errno, f"cannot create spill folder {self.root}: {exc.strerror}") from None
        self._fd = open_folder_fd(self.root, follow=False)
        weakref.finalize(self, os.close, self._fd)
        # the root must be this user's: another user could swap or read the files otherwise
        st = os.fstat(self._fd)
        if st.st_uid != os.geteuid():
            raise SnapshotFolderError(
                errno.EPERM, f"spill folder {self.root} belongs to uid {st.st_uid}, not to this user "
                f"(uid {os.geteuid()}): refusing to keep snapshots where another user controls them",
            )
        if stat.S_IMODE(st.st_mode) & 0o077:
            log.info("spill folder %s was mode %o: made private (0700)", self.root, stat.S_IMODE(st.st_mode))
            os.fchmod(self._fd, 0o700)

    def path_for(self, sid: SnapshotId, compressed: bool) -> Path:
        return self.root / policy_folder(sid.policy_id) / file_name(sid.version, compressed)

    # ---- writing -------------------------------------------------------------------------------------------
    def check_room(self, nbytes: int, committed_bytes: int, pending_bytes: int, what: str) -> None:
        """Refuse up front when a snapshot of ``nbytes`` cannot fit beside what is stored and still being written."""
        if self.capacity_bytes is not None and committed_bytes + pending_bytes + nbytes > self.capacity_bytes:
            raise DiskFullError(
                errno.ENOSPC,
                f"spill tier full: {what} needs up to {nbytes} bytes, {committed_bytes + pending_bytes} of "
                f"disk_capacity_bytes={self.capacity_bytes} in use",
            )
        st = os.statvfs(self._fd)
        free = st.f_bavail * st.f_frsize - pending_bytes
        if nbytes > free:
            raise DiskFullError(
                errno.ENOSPC,
                f"no space left for {what}: needs up to {nbytes} bytes, {max(free, 0)} free on {self.root}",
            )

    def write_temp(self, sid: SnapshotId, buf: np.ndarray, header: Header, what: str | None = None) -> SpillFile:
        """Write ``buf`` (with ``sid``'s version added to its header) to a fsync'd temp file next to its final
        place; the checksum is recomputed on the way, so a copy changed after publish is never written."""
        what = what or str(sid)
        # never relabel another snapshot's bytes
        check_identity(header, sid, None, f"{what} (while spilling)", versioned=False)
        tmp = f"{_TMP_PREFIX}{uuid.uuid4().hex}"
        try:
            with self._new_file(sid.policy_id, tmp) as (folder, fd):
                try:
                    with open(fd, "wb") as f:
                        compressed = snapfile.write(f, buf, header, sid.version, compress=self.compress, what=(
                            f"{what} (while spilling: its shared-memory copy was written to)"))
                        f.flush()
                        os.fsync(f.fileno())
                        size = f.tell()
                except BaseException:
                    os.unlink(tmp, dir_fd=folder)
                    self._drop_folder_if_empty(sid.policy_id)
                    raise
            return SpillFile(self.root / sid.policy_id / tmp, compressed, size)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise DiskFullError(exc.errno, f"disk full while spilling {what} to {self.root}: {exc.strerror}") from exc

    def commit(self, temp: SpillFile, sid: SnapshotId) -> SpillFile:
        """Atomically move a temp file to ``sid``'s place."""
        policy_id, name = self._locate(temp)
        if policy_id != sid.policy_id or not name.startswith(_TMP_PREFIX):
            raise NotTheFile(f"{temp.path} is not a temp file of {sid.policy_id!r}: cannot commit it as {sid}")
        final = file_name(sid.version, temp.compressed)
        with self._folder(policy_id) as folder:
            os.replace(name, final, src_dir_fd=folder, dst_dir_fd=folder)
            os.fsync(folder)
        return SpillFile(self.path_for(sid, temp.compressed), temp.compressed, temp.file_bytes)

    def discard(self, file: SpillFile) -> None:
        self._unlink(file, sync=False)

    def remove(self, file: SpillFile) -> None:
        self._unlink(file, sync=True)

    # ---- reading -------------------------------------------------------------------------------------------
    def read(self, file: SpillFile, what: str, *, expect: Expected | None = None) -> np.ndarray:
        """The snapshot's buffer, verified as the module docstring says; CorruptSnapshotError (naming ``what``)
        otherwise. A raw file is not copied: the buffer is a read-only map of it, which ``ray.put`` copies once."""
        return self.restore(file, what, expect=expect, put=lambda buf: buf)

    def restore(self, file: SpillFile, what: str, *, expect: Expected | None = None,
                put: Callable[[np.ndarray], T]) -> T:
        """``put(buffer)`` for the file's snapshot, returned only if the buffer verifies (as ``read``).

        The checksum of a raw file runs while ``put`` copies it (e.g. ``lambda b: ray.put(protect.shareable(b))``)
        instead of before, so a restore costs about one copy; if the check fails, put's result is dropped.
        """
        try:
            buf, pending = self._load(file, what, expect)
        except CorruptSnapshotError as exc:
            raise self._refuse(file, exc) from None
        try:
            out = put(buf)  # put's own errors pass through untouched: they are not the file's fault
        finally:
            pending.join()
        try:
            pending.wait()
        except CorruptSnapshotError as exc:
            raise self._refuse(file, exc) from None
        return out

    def _load(self, file: SpillFile, what: str, expect: Expected | None) -> tuple[np.ndarray, Background]:
        try:
            policy_id, name = self._locate(file)
            with open_file(self._fd, policy_id, name) as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                    raise NotTheFile(f"{what}: {file.path} is not a regular file of this user")
                version = parse_file_name(name)
                if version is None:
                    raise NotTheFile(f"{what}: {file.path} is not a committed snapshot file")
                return snapfile.load(f, file, SnapshotId(policy_id, version[0]), what, expect)
        except OSError as exc:
            gone = "has disappeared" if exc.errno == errno.ENOENT else f"cannot be read ({exc.strerror})"
            raise NotTheFile(f"{what}: its spill file {file.path} {gone}") from None

    def _refuse(self, file: SpillFile, exc: CorruptSnapshotError) -> CorruptSnapshotError:
        """The error to raise for a read that failed; a file at fault is moved to quarantine first."""
        if isinstance(exc, NotTheFile):
            return exc
        moved = self.quarantine(file, f"{exc} [file {file.path}]")
        return CorruptSnapshotError(f"{exc} [file {file.path}, moved to {moved}]")

    def scan(self) -> Survey:
        """Every committed snapshot file under the root (headers only). Never raises on junk: unfinished temp
        files are removed, damaged or misplaced snapshot files are quarantined (``quarantined()`` lists them),
        anything else is left alone and reported in ``skipped``."""
        found = survey(self.root, self._fd, owner=os.geteuid())
        for path in found.temps:
            log.info("removing unfinished spill file %s", path)
            self._unlink(SpillFile(path, False, 0), sync=False)
        for _sid, path, reason in found.damaged:
            self.quarantine(SpillFile(path, False, 0), reason)
        for line in found.skipped:
            log.warning("spill scan: left alone %s", line)
        return found

    # ---- quarantine ------------------------------------------------------------------------------------------
    def quarantine(self, file: SpillFile, reason: str) -> str | None:
        """Move a file the tier refuses to serve into ``<root>/.quarantine/`` with a reason beside it (never
        deleted: an operator decides). Returns where it went, or None if it had already gone."""
        policy_id, name = self._locate(file)
        target = f"{policy_id}.{name}.{time.time_ns()}"
        try:
            with suppress(FileExistsError):
                os.mkdir(QUARANTINE, 0o700, dir_fd=self._fd)
            with _subfolder(QUARANTINE, self._fd) as qfd, self._folder(policy_id) as folder:
                try:
                    os.rename(name, target, src_dir_fd=folder, dst_dir_fd=qfd)
                except FileNotFoundError:
                    return None
                record = json.dumps({"path": str(file.path), "reason": reason, "when": time.time()}).encode()
                fd = os.open(target + _REASON_SUFFIX, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600, dir_fd=qfd)
                with open(fd, "wb") as f:
                    f.write(record)
                    os.fsync(f.fileno())
                os.fsync(qfd)
                os.fsync(folder)
        except OSError as exc:  # the file stays where it is, and is still refused on every read
            log.error("could not quarantine %s (%s): %s", file.path, exc, reason)
            return None
        moved = str(self.root / QUARANTINE / target)
        log.error("quarantined %s as %s: %s", file.path, moved, reason)
        return moved

    def quarantined(self) -> list[QuarantineRecord]:
        """Every file in quarantine, oldest first, with why it was moved there."""
        records = []
        try:
            with _subfolder(QUARANTINE, self._fd) as qfd:
                for name in os.listdir(qfd):
                    if not name.endswith(_REASON_SUFFIX):
                        continue
                    moved = str(self.root / QUARANTINE / name.removesuffix(_REASON_SUFFIX))
                    try:
                        fd = os.open(name, READ_FLAGS, dir_fd=qfd)
                        with open(fd, "rb") as f:
                            info = json.loads(f.read(64 * 1024))
                        records.append(QuarantineRecord(moved, str(info["reason"]), float(info["when"])))
                    except (OSError, ValueError, KeyError, TypeError) as exc:
                        records.append(QuarantineRecord(moved, f"(reason unreadable: {exc})", 0.0))
        except OSError as exc:  # none yet (or not a real folder: nothing is read through a symlink)
            if exc.errno != errno.ENOENT:
                log.warning("cannot list %s: %s", self.root / QUARANTINE, exc)
        return sorted(records, key=lambda r: (r.when, r.path))

    # ---- helpers -----------------------------------------------------------------------------------------------
    def _locate(self, file: SpillFile) -> tuple[str, str]:
        """(policy folder, file name) of a file of this tier; nothing outside the root is ever touched."""
        path = Path(file.path)
        if path.parent.parent != self.root:
            raise NotTheFile(f"{path} is not a file of the spill folder {self.root}")
        return policy_folder(path.parent.name), path.name

    @contextmanager
    def _new_file(self, policy_id: str, name: str) -> Iterator[tuple[int, int]]:
        """(folder fd, fd of the new file ``name`` in it), the policy's folder made if missing. A delete of the
        policy's last file removes its folder (``_unlink``), maybe between the steps here: then they are tried
        again, so a spill racing a delete of the same policy never fails for want of its folder."""
        for attempt in range(_NEW_FILE_TRIES):
            with suppress(FileExistsError):
                os.mkdir(policy_id, 0o700, dir_fd=self._fd)
            try:
                folder = self._open_folder(policy_id)
            except SnapshotFolderError as exc:
                if exc.errno == errno.ENOENT and attempt < _NEW_FILE_TRIES - 1:
                    continue
                raise
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=folder)
            except BaseException as exc:
                os.close(folder)
                if isinstance(exc, FileNotFoundError) and attempt < _NEW_FILE_TRIES - 1:
                    continue
                raise
            break
        try:
            yield folder, fd
        finally:
            os.close(folder)

    def _open_folder(self, policy_id: str) -> int:
        try:
            return os.open(policy_id, _DIR_FLAGS, dir_fd=self._fd)
        except OSError as exc:
            raise SnapshotFolderError(exc.errno, f"{self.root / policy_id}: {_why(exc, policy_id, self._fd)}") from None

    @contextmanager
    def _folder(self, policy_id: str) -> Iterator[int]:
        fd = self._open_folder(policy_id)
        try:
            yield fd
        finally:
            os.close(fd)

    def _unlink(self, file: SpillFile, *, sync: bool) -> None:
        """Remove one regular file of the tier; a symlinked folder or file is never followed."""
        policy_id, name = self._locate(file)
        try:
            with self._folder(policy_id) as folder:
                if stat.S_ISREG(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=folder)
                    if sync:
                        os.fsync(folder)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                log.warning("not removing %s: %s", file.path, exc)
                return
        self._drop_folder_if_empty(policy_id)

    def _drop_folder_if_empty(self, policy_id: str) -> None:
        """The policy's last file gone: its folder too (a folder holding anything, a temp file of a spill under way
        included, stays; a spill that finds its folder gone makes it again: _new_file)."""
        try:
            os.rmdir(policy_id, dir_fd=self._fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.EBUSY):
                log.warning("not removing the empty folder %s: %s", self.root / policy_id, exc)
