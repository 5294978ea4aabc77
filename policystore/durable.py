"""The durable tier: every snapshot also lands in shared storage that outlives any node (S3, GCS, HDFS, a folder).

Any URI ``pyarrow.fs.FileSystem.from_uri`` understands works (``s3://bucket/prefix``, ``gs://``, ``hdfs://``,
``file://``), and so does a plain path. Object stores have no rename and no append, so a snapshot is committed in
two steps that need neither:

1. its bytes (the safetensors buffer, unchanged) go to an immutable data object under a name used once,
   ``<root>/<policy_id>/<version>.<token>.safetensors`` (names: ``filenames.py``); the writer checksums the bytes
   as they leave and checks the stored object's size;
2. then a small commit marker, ``<root>/<policy_id>/<version>.commit.json``, names that data object with its
   size, its checksum and the snapshot's summary. A publish writes it only after the catalog's commit (the one
   commit point, ``write(before_marker=...)``), so a marker never names a version the cluster did not commit.

A reader trusts only a marker, and verifies the data object against it (size, then the checksum over the bytes
it read), so an upload that died halfway, or a data object without its marker, is never read as a snapshot.
The markers alone describe the league: ``list_committed`` lets a fresh catalog rebuild every policy and version
from the URI, with one listing and one small read per snapshot (no data is read).

A delete leaves a tombstone, ``<root>/<policy_id>/<version>.deleted.json``, before it removes the marker and
the data, and it is never removed: an upload still in flight somewhere (a node spilling a copy in the background,
a write that outlived its deadline) may commit the snapshot again after the delete, and the tombstone keeps it
deleted for every reader and for any catalog rebuilt from the URI (such a write also undoes itself when it sees
the tombstone).
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import stat
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import (
    CorruptSnapshotError,
    DurableTierError,
    InvalidWeightsError,
    SnapshotLostError,
)
from .extras import missing_extra
from .filenames import parse_name, policy_folder, policy_of, split_name, version_name
from .format import (
    META_POLICY,
    Expected,
    Header,
    check_identity,
    read_header,
    send_checked,
    verify_buffer,
)
from .ids import SnapshotId, check_version
from .wire import Summarized, Summary

try:
    import pyarrow as pa
    import pyarrow.fs as pafs
except ImportError as exc:  # the marker format below serves the Ray-free reader without it; open() says what to install
    pa = pafs = None
    _NO_PYARROW: ImportError | None = exc
else:
    _NO_PYARROW = None

log = logging.getLogger(__name__)

DATA_SUFFIX = ".safetensors"
MARKER_SUFFIX = ".commit.json"
TOMBSTONE_SUFFIX = ".deleted.json"
FLOOR_SUFFIX = ".floor"  # <version>.floor: every version up to it is deleted (tombstones folded by ``compact``)
LAYOUT = 1  # marker format version
_TMP_PREFIX = ".tmp-"
# Filesystems with an atomic rename get the marker through a temp name, so no reader ever sees a partial one;
# object stores make a single small PUT atomic by themselves.
_RENAMES = {"local", "hdfs"}


@dataclass(frozen=True)
class Commit(Summarized):
    """The content of a commit marker: which data object holds the snapshot, and its summary (what it must hash to).

    The marker's JSON stays flat (``policy_id``, ``version``, ``object``, the summary's fields but ``durable``,
    ``layout``), so markers written by every earlier release still read.
    """

    id: SnapshotId
    object: str  # data object name, in the policy's folder
    summary: Summary  # durable=True: the durable tier holds it
    layout: int = LAYOUT

    def body(self) -> bytes:
        """The marker's JSON."""
        s = self.summary
        return json.dumps({"policy_id": self.id.policy_id, "version": self.id.version, "object": self.object,
                           "nbytes": s.nbytes, "checksum": s.checksum, "meta": s.meta, "created": s.created,
                           "layout": self.layout}, sort_keys=True).encode()

    @classmethod
    def parse(cls, body: bytes, sid: SnapshotId) -> Commit:
        """A marker's content, checked to describe ``sid`` and to name a data object of its version in its own
        folder; ValueError or TypeError otherwise."""
        def marker(policy_id: str, version: int, object: str, nbytes: int, checksum: str, meta: dict[str, Any],
                   created: float, layout: int = LAYOUT) -> Commit:
            return cls(SnapshotId(policy_id, version), object, Summary(nbytes, checksum, meta, created, True), layout)

        commit = marker(**json.loads(body))  # TypeError for a missing or unknown field, or JSON that is no object
        if not (commit.id == sid and isinstance(commit.nbytes, int) and isinstance(commit.checksum, str)
                and isinstance(commit.object, str) and posixpath.basename(commit.object) == commit.object
                and data_version(commit.object) == sid.version):
            raise ValueError(f"it does not describe {sid}")
        return commit


class DurableTier:
    """Snapshots in shared storage, written as immutable objects with an explicit commit point."""

    def __init__(self, filesystem: pafs.FileSystem, root: str, *, uri: str | None = None):
        self.fs = filesystem
        self.root = root.rstrip("/")
        self.uri = uri or f"{filesystem.type_name}:{self.root}"
        self._renames = filesystem.type_name in _RENAMES
        if filesystem.type_name == "local":
            self._make_folder(self.root, f"create the durable folder {self.uri}")

    @classmethod
    def open(cls, uri: str) -> DurableTier:
        """The durable tier at ``uri``: ``s3://bucket/prefix``, ``gs://...``, ``hdfs://...``, ``file://...`` or a
        path. Options ride in the URI (``s3://b/p?endpoint_override=host:port&scheme=http``); credentials come
        from the environment, as for any pyarrow filesystem."""
        if not isinstance(uri, str) or not uri:
            raise DurableTierError(f"durable_uri must be a non-empty string, got {uri!r}")
        if _NO_PYARROW is not None:
            raise missing_extra("durable", "the durable tier", _NO_PYARROW)
        if "://" not in uri:
            return cls(pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(uri)), uri=uri)
        shown = _without_credentials(uri)
        try:
            filesystem, root = pafs.FileSystem.from_uri(uri)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise DurableTierError(f"cannot open durable_uri {shown!r}: {_first_line(exc)}") from None
        return cls(filesystem, root, uri=shown)

    # ---- layout --------------------------------------------------------------------------------------------
    def _folder(self, policy_id: str) -> str:
        return posixpath.join(self.root, policy_folder(policy_id))

    def _path(self, sid: SnapshotId, suffix: str = MARKER_SUFFIX) -> str:
        """Where ``sid``'s commit marker (or, by ``suffix``, its tombstone) lives."""
        return posixpath.join(self._folder(sid.policy_id), version_name(sid.version, suffix))

    # ---- writing -------------------------------------------------------------------------------------------
    def write(self, sid: SnapshotId, buf: np.ndarray, header: Header, *,
              before_marker: Callable[[], None] | None = None) -> None:
        """Store ``buf`` (the packed snapshot ``header`` describes) as ``sid`` and commit it.

        ``before_marker`` runs once the data object is stored and checked, before the marker is written (the
        catalog's commit): if it raises, no marker is written and the data object is removed.

        Returns once the marker is written. Raises DurableTierError if the storage fails (nothing is committed
        then, unless the failure hit the reply to the marker's own write: a later ``list_committed`` tells), and
        CorruptSnapshotError if the bytes no longer match their checksum (the shared copy was written to).
        Writing a snapshot that is already committed with the same checksum does nothing.
        """
        what = f"{sid} (durable tier {self.uri})"
        if header.metadata.get(META_POLICY) != sid.policy_id:
            raise InvalidWeightsError(f"{what}: buffer was packed for {header.metadata.get(META_POLICY)!r}")
        if len(buf) != header.nbytes:
            raise InvalidWeightsError(f"{what}: buffer is {len(buf)} bytes, its header describes {header.nbytes}")
        if self.deleted(sid):
            raise DurableTierError(f"{what} was deleted: it is never written again")
        existing = self._commit(sid)
        if existing is not None:
            if existing.checksum == header.checksum:
                if before_marker is not None:
                    before_marker()
                return
            raise DurableTierError(
                f"{what} is already committed with checksum {existing.checksum}, not {header.checksum}"
            )
        folder = self._folder(sid.policy_id)
        name = version_name(sid.version, f".{uuid.uuid4().hex}{DATA_SUFFIX}")
        path = posixpath.join(folder, name)
        committing = False
        try:
            self._make_folder(folder, f"create {folder} for {what}")
            _io(lambda: self._upload(path, buf, header, f"{what} (while uploading: its shared-memory copy was "
                                                        "written to)"), f"upload {path} for {what}")
            stored = _io(lambda: self.fs.get_file_info(path), f"check {path} for {what}")
            if stored.size != header.nbytes:
                raise DurableTierError(f"{what}: stored object {path} is {stored.size} bytes, wrote {header.nbytes}")
            commit = Commit(sid, name, Summary.of(header, durable=True))
            if before_marker is not None:
                before_marker()
            committing = True
            _io(lambda: self._put_marker(sid, commit), f"commit {what}")
            try:
                deleted = self.deleted(sid)
            except DurableTierError as exc:  # committed, unchecked: as when a marker's reply is lost
                raise DurableTierError(f"{what}: committed, but whether it was deleted meanwhile could not be "
                                       f"checked (a later list tells): {exc}") from exc
            if deleted:  # deleted while this write was under way: the tombstone wins
                raise DurableTierError(f"{what} was deleted while it was being written: undone")
        except BaseException:
            self._undo(sid, path, committing)
            raise

    def _undo(self, sid: SnapshotId, path: str, committing: bool) -> None:
        """Clean up after a failed write without ever leaving a marker that names a deleted object.

        A marker write can fail on the way back (the object store stored it, the reply was lost): then the
        marker is ours and is removed first; if that cannot be checked or done, the data object stays too, and
        the snapshot stays committed and whole.
        """
        if committing:
            try:
                current = self._commit(sid)
            except DurableTierError:
                return
            if current is not None and current.object == posixpath.basename(path):
                if not self._delete_quietly(self._path(sid)):
                    return
        self._delete_quietly(path)

    def _make_folder(self, folder: str, doing: str) -> None:
        _io(lambda: self.fs.create_dir(folder, recursive=True), doing)
        _io(lambda: _private_local(self.fs, folder), doing)

    def _upload(self, path: str, buf: np.ndarray, header: Header, what: str) -> None:
        """Stream the buffer to a new object, checking the checksum of what leaves (CorruptSnapshotError)."""
        with self.fs.open_output_stream(path) as out:
            out.write(memoryview(buf).cast("B")[: header.data_offset])
            send_checked(header, buf, out.write, what)
        _private_local(self.fs, path)
        _sync_local(self.fs, path)

    def _put_marker(self, sid: SnapshotId, commit: Commit) -> None:
        self._put_small(self._path(sid), commit.body())

    def _put_small(self, final: str, body: bytes) -> None:
        """Write a small object whole (through a temp name where the filesystem renames atomically)."""
        target = final
        if self._renames:
            target = posixpath.join(posixpath.dirname(final), f"{_TMP_PREFIX}{uuid.uuid4().hex}")
        with self.fs.open_output_stream(target) as out:
            out.write(body)
        _private_local(self.fs, target)
        _sync_local(self.fs, target)
        if target != final:
            self.fs.move(target, final)
            _sync_local(self.fs, posixpath.dirname(final))

    # ---- reading -------------------------------------------------------------------------------------------
    def deleted(self, sid: SnapshotId) -> bool:
        """Whether ``sid`` has a tombstone here or lies at or below its policy's floor (it was deleted, and is
        never served or written again)."""
        path = self._path(sid, TOMBSTONE_SUFFIX)
        if _io(lambda: self.fs.get_file_info(path),
               f"check whether {sid} was deleted ({path})").type == pafs.FileType.File:
            return True
        return sid.version <= self.floor(sid.policy_id)

    def floor(self, policy_id: str) -> int:
        """The policy's floor: every version up to it is deleted (0: none)."""
        folder = self._folder(policy_id)
        infos = _io(lambda: self.fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True)), f"list {folder}")
        return max((parse_name(i.base_name, FLOOR_SUFFIX) or 0 for i in infos if i.type == pafs.FileType.File),
                   default=0)

    def compact(self, policy_id: str, floor: int) -> int:
        """Fold every tombstone of ``policy_id`` up to ``floor`` into one floor object, and remove what lies below
        it (tombstones, leftover markers and data objects, older floors); returns how many objects went.

        The caller (the catalog) guarantees that no version up to ``floor`` is live or being published: they are
        all deleted or aborted, so each stays deleted for every reader, writer and rebuilt catalog."""
        check_version(floor)
        if floor <= self.floor(policy_id):
            return 0
        folder = self._folder(policy_id)
        kept = version_name(floor, FLOOR_SUFFIX)
        _io(lambda: self._put_small(posixpath.join(folder, kept), json.dumps(
            {"policy_id": policy_id, "floor": floor, "compacted": time.time()}).encode()), f"write {folder}/{kept}")
        removed = 0
        for info in _io(lambda: self.fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True)),
                        f"list {folder}"):
            parsed = split_name(info.base_name)  # every object of a version starts with it: tombstones, markers, ...
            if parsed is not None and parsed[0] <= floor and info.base_name != kept and self._delete_quietly(info.path):
                removed += 1
        return removed

    def read(self, sid: SnapshotId, expect: Expected | None = None) -> np.ndarray:
        """The committed snapshot's bytes, verified against its marker (and ``expect``, the catalog's record).

        SnapshotLostError if ``sid`` is not committed here; CorruptSnapshotError if the data object is missing,
        of the wrong size, fails its checksum, or is not the snapshot the marker or ``expect`` names.
        """
        what = f"{sid} (durable tier {self.uri})"
        commit = self._commit(sid)
        if commit is None or self.deleted(sid):
            raise SnapshotLostError(f"{what} is not committed" if commit is None else f"{what} was deleted")
        if expect is not None and (
            (expect.policy_id, expect.version) != tuple(sid) or expect.checksum != commit.checksum
        ):
            raise CorruptSnapshotError(
                f"{what}: committed with checksum {commit.checksum}, the catalog expects "
                f"{expect.policy_id}@v{expect.version} with {expect.checksum}"
            )
        path = posixpath.join(self._folder(sid.policy_id), commit.object)
        try:
            with self.fs.open_input_file(path) as f:
                size = f.size()
                if size != commit.nbytes:
                    raise CorruptSnapshotError(f"{what}: {path} is {size} bytes, its commit says {commit.nbytes}")
                buf = np.frombuffer(f.read_buffer(size), dtype=np.uint8)
        except FileNotFoundError:
            raise CorruptSnapshotError(f"{what}: its committed data object {path} is missing") from None
        except (pa.ArrowException, OSError) as exc:
            raise DurableTierError(f"cannot read {path} for {what}: {_first_line(exc)}") from None
        if len(buf) != commit.nbytes:
            raise CorruptSnapshotError(f"{what}: read {len(buf)} of {commit.nbytes} bytes from {path}")
        check_identity(verify_buffer(buf, name=what), sid, Expected(*sid, commit.checksum), f"{what} at {path}",
                       versioned=False)
        return buf

    def list_committed(self, skipped: list[str] | None = None) -> list[tuple[SnapshotId, Summary]]:
        """Every committed snapshot, ``(id, summary)`` in id order, from its marker and its data object's header.

        This is how a fresh catalog learns the league from the URI: summaries have the fields of
        ``wire.Summary``. Unreadable or inconsistent markers, and markers whose data object is missing, of another
        size or another snapshot (its header read, not its data), are logged and skipped, never raised (and said in
        ``skipped``, one line each, when given): a catalog never lists a version no copy can serve.
        """
        found = []
        for sid in sorted(self.committed_ids()):
            commit = self._commit(sid, skipped)
            if commit is not None and self._data_matches(commit, skipped):
                found.append((sid, commit.summary))
        return found

    def _data_matches(self, commit: Commit, skipped: list[str] | None) -> bool:
        """Whether the data object ``commit`` names exists, has its size and a header of its snapshot."""
        path = posixpath.join(self._folder(commit.id.policy_id), commit.object)
        what = f"{commit.id} (durable tier {self.uri}, {path})"
        try:
            with self.fs.open_input_file(path) as f:
                if f.size() != commit.nbytes:
                    raise CorruptSnapshotError(f"{what}: {f.size()} bytes, its commit marker says {commit.nbytes}")
                header = read_header(lambda start, n: f.read_at(n, start), total=commit.nbytes, name=what)
            check_identity(header, commit.id, Expected(*commit.id, commit.checksum), what, versioned=False)
            return True
        except FileNotFoundError:
            problem = f"ignoring the commit marker of {what}: its data object is missing"
        except (pa.ArrowException, OSError) as exc:
            raise DurableTierError(f"cannot read {path} for {what}: {_first_line(exc)}") from None
        except CorruptSnapshotError as exc:
            problem = f"ignoring the commit marker of {commit.id}: its data object does not match ({exc})"
        log.warning("%s", problem)
        if skipped is not None:
            skipped.append(problem)
        return False

    def committed_ids(self) -> set[SnapshotId]:
        """The snapshots with a commit marker, no tombstone and above their policy's floor, from one listing (no
        marker is read)."""
        marked, deleted, floors = self._listing()
        return {sid for sid in marked - deleted if sid.version > floors.get(sid.policy_id, 0)}

    def deleted_ids(self) -> set[SnapshotId]:
        """The snapshots with a tombstone, and each policy's floor as an id: deleted, their numbers used (a
        catalog rebuilt from the URI must number new versions past them, or their uploads would be refused)."""
        _, deleted, floors = self._listing()
        return deleted | {SnapshotId(pid, floor) for pid, floor in floors.items()}

    def _listing(self) -> tuple[set[SnapshotId], set[SnapshotId], dict[str, int]]:
        """(snapshots with a marker, snapshots with a tombstone, each policy's floor), from one listing."""
        selector = pafs.FileSelector(self.root, recursive=True, allow_not_found=True)
        infos = _io(lambda: self.fs.get_file_info(selector), f"list {self.uri}")
        floors: dict[str, int] = {}
        for sid in (sid for info in infos if (sid := self._marker_id(info, FLOOR_SUFFIX)) is not None):
            floors[sid.policy_id] = max(floors.get(sid.policy_id, 0), sid.version)
        return ({sid for info in infos if (sid := self._marker_id(info)) is not None},
                {sid for info in infos if (sid := self._marker_id(info, TOMBSTONE_SUFFIX)) is not None}, floors)

    def _marker_id(self, info: pafs.FileInfo, suffix: str = MARKER_SUFFIX) -> SnapshotId | None:
        """The snapshot a listed object is the marker (or, by ``suffix``, the tombstone) of, if it is one (in a
        valid policy folder)."""
        version = marker_version(info.base_name, suffix)
        folder = posixpath.dirname(info.path)
        if info.type != pafs.FileType.File or version is None or posixpath.dirname(folder) != self.root:
            return None
        policy_id = policy_of(posixpath.basename(folder))
        return SnapshotId(policy_id, version) if policy_id is not None else None

    def _commit(self, sid: SnapshotId, skipped: list[str] | None = None) -> Commit | None:
        """The marker of ``sid`` if it exists and names ``sid``; an unreadable one counts as absent (logged, and
        said in ``skipped`` when given)."""
        path = self._path(sid)
        try:
            with self.fs.open_input_stream(path) as f:
                return Commit.parse(f.read(), sid)
        except FileNotFoundError:
            return None
        except (pa.ArrowException, OSError) as exc:
            raise DurableTierError(f"cannot read the commit marker {path}: {_first_line(exc)}") from None
        except (ValueError, TypeError) as exc:  # torn or foreign JSON, or a marker of something else
            problem = f"ignoring unusable commit marker {path}: {exc}"
        log.warning("%s", problem)
        if skipped is not None:
            skipped.append(problem)
        return None

    # ---- removal -------------------------------------------------------------------------------------------
    def tombstone(self, sid: SnapshotId) -> None:
        """Mark ``sid`` deleted for good (never listed, served or written again): the first step of ``remove``."""
        body = json.dumps({"policy_id": sid.policy_id, "version": sid.version, "deleted": time.time()}).encode()
        folder = self._folder(sid.policy_id)
        self._make_folder(folder, f"create {folder} for the tombstone of {sid}")
        tombstone = self._path(sid, TOMBSTONE_SUFFIX)
        _io(lambda: self._put_small(tombstone, body), f"write the tombstone of {sid} to {self.uri}")

    def remove(self, sid: SnapshotId) -> None:
        """Delete ``sid`` for good: its tombstone first, then its marker, then its data objects (leftovers of
        failed writes included)."""
        self.tombstone(sid)
        folder = self._folder(sid.policy_id)
        marker = self._path(sid)
        if not self._delete_quietly(marker):
            raise DurableTierError(f"could not remove the commit marker {marker} of {sid} from {self.uri}")
        selector = pafs.FileSelector(folder, allow_not_found=True)
        for info in _io(lambda: self.fs.get_file_info(selector), f"list {folder}"):
            if data_version(info.base_name) == sid.version:
                self._delete_quietly(info.path)

    def _delete_quietly(self, path: str) -> bool:
        """Delete one object; False (logged) if the storage failed. A missing object counts as deleted."""
        try:
            self.fs.delete_file(path)
        except FileNotFoundError:
            pass
        except (pa.ArrowException, OSError) as exc:
            log.warning("could not delete %s from the durable tier: %s", path, _first_line(exc))
            return False
        return True


def _io(action, doing: str):
    """Run a storage call; storage failures become DurableTierError saying what was being done."""
    try:
        return action()
    except (CorruptSnapshotError, DurableTierError):
        raise
    except (pa.ArrowException, OSError) as exc:
        raise DurableTierError(f"could not {doing}: {_first_line(exc)}") from None


def _private_local(filesystem: pafs.FileSystem, path: str) -> None:
    """A local durable folder 0700, a file 0600, as in the spill tier: another OS user reads and lists nothing
    (object storage: the bucket's policy decides; see docs/reliability.md)."""
    if filesystem.type_name != "local":
        return
    st = os.stat(path)
    mode = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
    if stat.S_IMODE(st.st_mode) != mode:
        try:
            os.chmod(path, mode)
        except PermissionError:  # another user's folder (a shared mount): its owner decides who reads it
            log.warning("durable folder %s is mode %o and belongs to uid %d: cannot make it private", path,
                        stat.S_IMODE(st.st_mode), st.st_uid)


def _sync_local(filesystem: pafs.FileSystem, path: str) -> None:
    """fsync a local file or folder (pyarrow's local streams do not): the commit must survive a power cut."""
    if filesystem.type_name != "local":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _without_credentials(uri: str) -> str:
    """``uri`` as it may be shown in errors and logs: ``s3://key:secret@bucket/...`` loses ``key:secret@``."""
    scheme, _, rest = uri.partition("://")
    authority, slash, path = rest.partition("/")
    return f"{scheme}://{authority.rpartition('@')[2]}{slash}{path}"


def marker_version(name: str, suffix: str = MARKER_SUFFIX) -> int | None:
    """The version whose marker (or, by ``suffix``, tombstone) is called ``name``, if it is one."""
    return parse_name(name, suffix)


def data_version(name: str) -> int | None:
    """The version a data object called ``name`` (``<version>.<token>.safetensors``) belongs to, if it is one."""
    parsed = split_name(name)
    if parsed is None or not parsed[1].endswith(DATA_SUFFIX) or parsed[1].count(".") != 2:
        return None
    return parsed[0]


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def survey(uri: str) -> tuple[list[tuple[SnapshotId, Summary]], list[str], list[SnapshotId]]:
    """The committed snapshots at ``uri``, one line per marker skipped, and the deleted (tombstoned) ids, whose
    numbers a rebuilt catalog must never hand out again; a plain function, so that ``functools.partial(survey,
    uri)`` can travel to the catalog actor (as its ``seed``) and open the storage there."""
    tier = DurableTier.open(uri)
    skipped: list[str] = []
    return tier.list_committed(skipped), skipped, sorted(tier.deleted_ids())
