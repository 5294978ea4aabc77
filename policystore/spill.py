"""The disk tier: one file per snapshot, ``<root>/<policy_id>/<version>.safetensors[.lz4]``.

A file holds exactly the snapshot's buffer (lz4-framed when that saves space), so ``safetensors.safe_open`` reads
it directly, or after ``lz4.frame.decompress``. Writes go to a temp file in the same folder, are fsync'd, and are
renamed into place by ``commit`` (then the folder is fsync'd): a crash leaves either the whole file or none.
The checksum is recomputed while writing and again on every read, so a corrupt file is never served.
"""

from __future__ import annotations

import errno
import itertools
import logging
import mmap
import os
import queue
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import lz4.frame
import numpy as np

from .errors import CorruptSnapshotError, DiskFullError
from .format import (
    Header,
    check_checksum,
    checksum_of,
    iter_data,
    parse_header,
    verify_buffer,
)
from .ids import SnapshotId

log = logging.getLogger(__name__)

RAW_SUFFIX = ".safetensors"
LZ4_SUFFIX = ".safetensors.lz4"
_FILE = re.compile(r"(\d{10})(\.safetensors(?:\.lz4)?)")
_TMP_PREFIX = ".tmp-"
_PROBE_BYTES = 4 * 1024 * 1024  # compress this much first; store raw if lz4 saves < 10% on it
_READ_CHUNK = 16 * 1024 * 1024


@dataclass(frozen=True)
class SpillFile:
    """A snapshot file on disk (committed, or a temp file awaiting commit)."""

    path: Path
    compressed: bool
    file_bytes: int


@dataclass(frozen=True)
class DiskEntry:
    """What a rebuild learns from a file's header without reading its data."""

    id: SnapshotId
    file: SpillFile
    header: Header


class DiskTier:
    def __init__(self, root: str | os.PathLike, *, compress: bool = True, capacity_bytes: int | None = None):
        self.root = Path(root)
        self.compress = compress
        self.capacity_bytes = capacity_bytes
        self.root.mkdir(parents=True, exist_ok=True)

    def path_for(self, sid: SnapshotId, compressed: bool) -> Path:
        return self.root / sid.policy_id / f"{sid.version:010d}{LZ4_SUFFIX if compressed else RAW_SUFFIX}"

    def find(self, sid: SnapshotId) -> SpillFile | None:
        """The committed file of ``sid``, raw or compressed, if there is one."""
        for compressed in (False, True):
            path = self.path_for(sid, compressed)
            if path.exists():
                return SpillFile(path, compressed, path.stat().st_size)
        return None

    # ---- writing -------------------------------------------------------------------------------------------
    def check_room(self, nbytes: int, committed_bytes: int, pending_bytes: int, what: str) -> None:
        """Refuse up front when a snapshot of ``nbytes`` cannot fit beside what is stored and still being written."""
        if self.capacity_bytes is not None and committed_bytes + pending_bytes + nbytes > self.capacity_bytes:
            raise DiskFullError(
                errno.ENOSPC,
                f"spill tier full: {what} needs up to {nbytes} bytes, {committed_bytes + pending_bytes} of "
                f"disk_capacity_bytes={self.capacity_bytes} in use",
            )
        stat = os.statvfs(self.root)
        free = stat.f_bavail * stat.f_frsize - pending_bytes
        if nbytes > free:
            raise DiskFullError(
                errno.ENOSPC,
                f"no space left for {what}: needs up to {nbytes} bytes, {max(free, 0)} free on {self.root}",
            )

    def write_temp(self, policy_id: str, buf: np.ndarray, header: Header, what: str) -> SpillFile:
        """Write ``buf`` to a fsync'd temp file next to its final place; check the checksum on the way."""
        folder = self.root / policy_id
        folder.mkdir(parents=True, exist_ok=True)
        compressed = self.compress and _worth_compressing(buf)
        tmp = folder / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
        view = memoryview(buf).cast("B")
        try:
            with open(tmp, "wb") as f:
                if compressed:
                    with lz4.frame.LZ4FrameCompressor(block_linked=False) as comp:
                        f.write(comp.begin(len(view)))
                        f.write(comp.compress(view[: header.data_offset]))
                        actual = checksum_of(header, _tee(iter_data(header, buf), lambda c: f.write(comp.compress(c))))
                        f.write(comp.flush())
                else:
                    f.write(view[: header.data_offset])
                    actual = checksum_of(header, _tee(iter_data(header, buf), f.write))
                f.flush()
                os.fsync(f.fileno())
            if actual != header.checksum:
                raise CorruptSnapshotError(
                    f"{what}: checksum mismatch while spilling (recorded {header.checksum}, computed {actual}): "
                    "its shared-memory copy was written to after publish"
                )
            return SpillFile(tmp, compressed, tmp.stat().st_size)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFullError(exc.errno, f"disk full while spilling {what} to {folder}: {exc.strerror}") from exc
            raise
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def commit(self, temp: SpillFile, sid: SnapshotId) -> SpillFile:
        """Atomically move a temp file to ``sid``'s place."""
        final = self.path_for(sid, temp.compressed)
        os.replace(temp.path, final)
        _fsync_dir(final.parent)
        return SpillFile(final, temp.compressed, temp.file_bytes)

    def discard(self, file: SpillFile) -> None:
        file.path.unlink(missing_ok=True)

    def remove(self, file: SpillFile) -> None:
        file.path.unlink(missing_ok=True)
        _fsync_dir(file.path.parent)

    # ---- reading -------------------------------------------------------------------------------------------
    def read(self, file: SpillFile, what: str) -> np.ndarray:
        """The snapshot's buffer, checksum verified; CorruptSnapshotError (naming ``what``) otherwise.

        A raw file is not copied at all: the buffer is a read-only map of the file (the kernel reads ahead while
        the checksum runs), and the store's ``ray.put`` copies it from the page cache straight into shared memory.
        Spill files are never changed in place (atomic rename; removal unlinks), so the map stays valid. An lz4
        file is decompressed into one buffer by a helper thread while this thread checksums what has arrived.
        """
        try:
            with open(file.path, "rb", buffering=0) as f:
                if not file.compressed:
                    buf = _map_readonly(f)
                    verify_buffer(buf, name=what)
                    return buf
                size = _lz4_content_size(f)
                if not size:  # a frame written without its size: decompress, then verify
                    buf = np.frombuffer(lz4.frame.decompress(f.read()), dtype=np.uint8)
                    verify_buffer(buf, name=what)
                    return buf
                buf = np.empty(size, dtype=np.uint8)
                _verify_while_filling(buf, lambda progress: _lz4_fill(f, buf, progress), what)
                return buf
        except (RuntimeError, EOFError) as exc:  # lz4 raises RuntimeError on a damaged frame
            raise CorruptSnapshotError(f"{what}: {file.path} is not a valid lz4 frame ({exc})") from None
        except FileNotFoundError:
            raise CorruptSnapshotError(f"{what}: its spill file {file.path} has disappeared") from None
        except CorruptSnapshotError as exc:
            raise CorruptSnapshotError(f"{exc} [file {file.path}]") from None

    def scan(self) -> list[DiskEntry]:
        """Every committed snapshot file under the root (headers only); stray temp files are removed."""
        found: list[DiskEntry] = []
        for folder in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for path in sorted(folder.iterdir()):
                if path.name.startswith(_TMP_PREFIX):
                    log.info("removing unfinished spill file %s", path)
                    path.unlink(missing_ok=True)
                    continue
                match = _FILE.fullmatch(path.name)
                if not match:
                    continue
                sid = SnapshotId(folder.name, int(match.group(1)))
                file = SpillFile(path, match.group(2) == LZ4_SUFFIX, path.stat().st_size)
                try:
                    found.append(DiskEntry(sid, file, _read_header(file, str(sid))))
                except CorruptSnapshotError as exc:
                    log.error("skipping unreadable spill file: %s", exc)
        return found


def _read_header(file: SpillFile, what: str) -> Header:
    """Parse a file's header, decompressing only the first frames of an lz4 file."""
    try:
        with (lz4.frame.open(file.path, "rb") if file.compressed else open(file.path, "rb")) as f:
            head = f.read(8)
            header_len = int.from_bytes(head, "little") if len(head) == 8 else 0
            head += f.read(min(header_len, 100 * 1024 * 1024))
            total = int(lz4.frame.get_frame_info(_first_bytes(file.path))["content_size"]) if file.compressed else (
                file.file_bytes
            )
    except (RuntimeError, EOFError, OSError) as exc:
        raise CorruptSnapshotError(f"{what}: cannot read the header of {file.path} ({exc})") from None
    return parse_header(head, name=what, total=total)


def _lz4_content_size(f) -> int:
    """The uncompressed size recorded in an lz4 frame header (0 if the writer did not record it)."""
    size = int(lz4.frame.get_frame_info(f.read(32))["content_size"])
    f.seek(0)
    return size


def _map_readonly(f) -> np.ndarray:
    """The whole file as a read-only uint8 array over an mmap, read ahead in the background."""
    size = os.fstat(f.fileno()).st_size
    if not size:
        return np.empty(0, dtype=np.uint8)
    mapped = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
    mapped.madvise(mmap.MADV_SEQUENTIAL)
    mapped.madvise(mmap.MADV_WILLNEED)
    return np.frombuffer(mapped, dtype=np.uint8)


def _lz4_fill(f, buf: np.ndarray, progress: Callable[[int], None]) -> int:
    decompressor = lz4.frame.LZ4FrameDecompressor()
    got = 0
    while not decompressor.eof:
        data = f.read(_READ_CHUNK // 4)  # compressed bytes: keep the decompressed pieces a few MiB
        if not data:
            break
        out = decompressor.decompress(data)
        if got + len(out) > len(buf):
            raise RuntimeError(f"the frame holds more than the {len(buf)} bytes its header records")
        buf[got : got + len(out)] = np.frombuffer(out, dtype=np.uint8)
        got += len(out)
        progress(got)
    return got


def _verify_while_filling(buf: np.ndarray, fill: Callable[[Callable[[int], None]], int], what: str) -> None:
    """Run ``fill`` on a helper thread and check the recorded checksum over ``buf`` while it fills.

    ``fill(progress)`` writes ``buf`` front to back, calls ``progress(end)`` as bytes land and returns how many
    it wrote; this thread checksums each landed span meanwhile (lz4 and zlib.crc32 release the GIL, so the two
    passes overlap instead of adding up). CorruptSnapshotError naming ``what`` on a short or damaged file.
    """
    arrived: queue.SimpleQueue = queue.SimpleQueue()

    def work() -> None:
        try:
            arrived.put(("done", fill(arrived.put)))
        except BaseException as exc:  # handed to this thread, which re-raises it
            arrived.put(("error", exc))

    def landed() -> Iterator[int]:
        while not isinstance(item := arrived.get(), tuple):
            yield item
        kind, value = item
        if kind == "error":
            raise value
        if value != len(buf):
            raise CorruptSnapshotError(f"{what}: file is truncated (only {value} of {len(buf)} bytes arrived)")

    threading.Thread(target=work, name="policystore-restore", daemon=True).start()
    view = memoryview(buf)
    progress, filled = landed(), 0
    for filled in progress:  # the header first: it says where the data starts and what it must hash to
        if filled >= 8 and filled >= 8 + int.from_bytes(view[:8], "little"):
            break
    header = parse_header(view[:filled], name=what, total=len(buf))

    def data() -> Iterator[memoryview]:
        start = header.data_offset
        for end in itertools.chain([filled], progress):
            if end > start:
                yield view[start:end]
                start = end

    check_checksum(header, checksum_of(header, data()), what)


def _first_bytes(path: Path, n: int = 32) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def _worth_compressing(buf: np.ndarray) -> bool:
    probe = memoryview(buf).cast("B")[:_PROBE_BYTES]
    return len(lz4.frame.compress(probe)) < 0.9 * len(probe)


def _tee(chunks, sink):
    for chunk in chunks:
        sink(chunk)
        yield chunk


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
