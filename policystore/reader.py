"""Read a folder of snapshot files without Ray or a running store: ``policystore.open_folder(path)``.

    folder = policystore.open_folder("runs/x/store")   # a store's spill folder, or a file:// durable folder
    folder.list()                                       # [FileInfo(id=main_0@v3, path=..., summary=...), ...]
    snap = folder.get("main_0")                         # latest version: read-only tensor views over the file
    weights = folder.tensors("main_0", 2)               # version 2 as plain tensors, yours to change
    folder.verify()                                     # [] when every file is whole, else one line per problem

Two layouts are understood, both ``<folder>/<policy_id>/<version>...`` (``filenames.py``): the spill tier's
``.safetensors[.lz4]`` files, and the durable tier's ``.commit.json`` markers, each naming a ``.safetensors`` data
object with the checksum it must have. Everything served is verified first (checksum, and the policy id and version
recorded in the file); nothing is written, moved or deleted, and no symlink inside the folder is followed.

What is served is read into this process's private memory, never mapped from the file: the folder may belong to
a running store or to other tools, and a mapped file that another process truncates or rewrites would change the
views under their holder, or kill the process with SIGBUS on the next read of a lost page.
"""

from __future__ import annotations

import os
import stat
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from .durable import FLOOR_SUFFIX, MARKER_SUFFIX, TOMBSTONE_SUFFIX, Commit, marker_version
from .errors import CorruptSnapshotError, UnknownPolicyError, UnknownVersionError
from .format import Expected, Header
from .ids import SnapshotId, check_policy_id, check_version
from .snapfile import SpillFile, header_of, load
from .snapshot import Snapshot
from .spill import Survey, open_file, open_folder_fd, survey
from .wire import Summarized, Summary

_MAX_MARKER_BYTES = 1024 * 1024


@dataclass(frozen=True)
class FileInfo(Summarized):
    """One snapshot file, from its header alone (``verify`` or ``get`` read the data); its ``summary`` is read as
    ``nbytes``, ``checksum``, ``meta``, ``created``."""

    id: SnapshotId
    path: str
    summary: Summary
    file_bytes: int  # on disk (smaller when lz4-compressed)
    compressed: bool


@dataclass(frozen=True)
class _Item:
    info: FileInfo
    file: SpillFile
    expect: Expected | None  # what a durable marker says the data must be


def open_folder(path: str | os.PathLike) -> FolderReader:
    """A reader over the snapshot folder at ``path`` (SnapshotFolderError if it is not a folder)."""
    return FolderReader(path)


class FolderReader:
    """Lists, reads and verifies the snapshot files under one folder; every call looks at the folder afresh."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(os.path.abspath(path))
        self._fd = open_folder_fd(self.path, follow=True)  # the folder itself may be reached by a link
        self._closer = weakref.finalize(self, os.close, self._fd)

    def list(self, policy_id: str | None = None) -> list[FileInfo]:
        """Every readable snapshot (of ``policy_id``, or all), by policy then version."""
        items, _ = self._look(policy_id)
        return [item.info for item in items]

    def get(self, policy_id: str, version: int | None = None) -> Snapshot:
        """``policy_id`` at ``version`` (None: the highest on disk) as read-only tensor views of the file's bytes.

        The file is read (an lz4 file decompressed) into a private read-only buffer, which stays whole whatever
        happens to the file afterwards. CorruptSnapshotError if the file does not verify.
        """
        item = self._one(policy_id, version)
        return Snapshot(item.info.id, self._read(item))

    def tensors(self, policy_id: str, version: int | None = None) -> dict[str, torch.Tensor]:
        """``policy_id`` at ``version`` as plain, private tensors (copies), e.g. for ``load_state_dict``."""
        return {name: view.clone() for name, view in self.get(policy_id, version).items()}

    def verify(self, policy_id: str | None = None, version: int | None = None) -> list[str]:
        """Read and check every file (of ``policy_id``, and ``version`` if given); one line per problem found."""
        items, found = self._look(policy_id)
        problems = [reason for sid, _, reason in found.damaged if version is None or sid.version == version]
        for item in items:
            if version is None or item.info.id.version == version:
                try:
                    self._read(item)
                except CorruptSnapshotError as exc:
                    problems.append(str(exc))
        return problems

    def close(self) -> None:
        self._closer()

    def __enter__(self) -> FolderReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FolderReader({str(self.path)!r})"

    # ---- helpers ---------------------------------------------------------------------------------------------
    def _one(self, policy_id: str, version: int | None) -> _Item:
        items, found = self._look(policy_id)
        versions = {item.info.id.version: item for item in items}
        damaged = {sid.version: reason for sid, _, reason in found.damaged}
        if not versions and not damaged:
            known = sorted({i.id.policy_id for i in self.list()})
            raise UnknownPolicyError(f"no snapshot of {policy_id!r} in {self.path}; policies here: {known}")
        version = max(versions.keys() | damaged.keys()) if version is None else check_version(version)
        if version in damaged:
            raise CorruptSnapshotError(damaged[version])
        if version not in versions:
            raise UnknownVersionError(f"{policy_id!r} has no version {version} in {self.path}: {sorted(versions)}")
        return versions[version]

    def _look(self, policy_id: str | None) -> tuple[list[_Item], Survey]:
        found = survey(self.path, self._fd, None if policy_id is None else check_policy_id(policy_id))
        items = []
        for entry in found.entries:
            try:
                items.append(_Item(_info(entry.id, entry.file, entry.header), entry.file, None))
            except ValueError as exc:  # meta that is not JSON
                found.damaged.append((entry.id, entry.file.path, f"{entry.id}: unreadable meta ({exc})"))
        have = {e.id for e in found.entries}
        for sid, marker in _markers(found):
            if sid not in have:
                item = self._durable(sid, marker, found)
                if item is not None:
                    items.append(item)
        return sorted(items, key=lambda i: i.info.id), found

    def _durable(self, sid: SnapshotId, marker: Path, found: Survey) -> _Item | None:
        """The data object a durable commit marker names, checked against the marker (header only)."""
        try:
            commit = Commit.parse(self._small(marker), sid)
            expect = Expected(sid.policy_id, sid.version, commit.checksum)
            path = marker.parent / commit.object
            st = os.stat(self._relative(path), dir_fd=self._fd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{path} is not a regular file")
            file = SpillFile(path, False, st.st_size)
            with self._open(path) as f:
                header = header_of(f, file, sid, expect, versioned=False)
            return _Item(_info(sid, file, header), file, expect)
        except FileNotFoundError as exc:
            found.damaged.append((sid, marker, f"{sid}: committed, but {exc.filename or 'its data'} is missing"))
        except (OSError, ValueError, TypeError, CorruptSnapshotError) as exc:
            found.damaged.append((sid, marker, f"{sid}: unusable commit {marker} ({exc})"))
        return None

    def _read(self, item: _Item) -> np.ndarray:
        try:
            with self._open(item.file.path) as f:
                # private: another process may truncate the file under us; durable objects: their marker names them
                buf, pending = load(f, item.file, item.info.id, str(item.info.id), item.expect,
                                    versioned=item.expect is None, private=True)
            pending.wait()
            return buf
        except OSError as exc:
            raise CorruptSnapshotError(f"{item.info.id}: cannot read {item.file.path} ({exc.strerror})") from None
        except CorruptSnapshotError as exc:
            raise CorruptSnapshotError(f"{exc} [file {item.file.path}]") from None

    def _relative(self, path: Path) -> str:
        return str(path.relative_to(self.path))

    def _open(self, path: Path) -> BinaryIO:
        return open_file(self._fd, self._relative(path.parent), path.name)

    def _small(self, path: Path) -> bytes:
        with self._open(path) as f:
            data = f.read(_MAX_MARKER_BYTES + 1)
        if len(data) > _MAX_MARKER_BYTES:
            raise ValueError(f"larger than {_MAX_MARKER_BYTES} bytes")
        return data


def _markers(found: Survey) -> list[tuple[SnapshotId, Path]]:
    """Durable commit markers among the files the spill survey left alone, less those of deleted snapshots (a
    tombstone, or at or below their policy's floor)."""
    def named(suffix: str) -> dict[SnapshotId, Path]:
        return {SnapshotId(p.parent.name, v): p for p in found.others if (v := marker_version(p.name, suffix))}

    deleted = named(TOMBSTONE_SUFFIX)
    floors: dict[str, int] = {}
    for sid in named(FLOOR_SUFFIX):
        floors[sid.policy_id] = max(floors.get(sid.policy_id, 0), sid.version)
    return [(sid, path) for sid, path in named(MARKER_SUFFIX).items()
            if sid not in deleted and sid.version > floors.get(sid.policy_id, 0)]


def _info(sid: SnapshotId, file: SpillFile, header: Header) -> FileInfo:
    return FileInfo(sid, str(file.path), Summary.of(header), file.file_bytes, file.compressed)
