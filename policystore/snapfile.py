"""One snapshot file: its buffer as written to disk, raw (``.safetensors``) or as one lz4 frame (``.lz4``).

The file holds the snapshot's buffer, so ``safetensors.safe_open`` reads a raw file directly, or after
``lz4.frame.decompress``; the writer adds the version to the header's metadata (``format.versioned_head``), so a
file says which snapshot it is. Nothing read is trusted: ``load`` checks the file's own checksum, the policy id and
version recorded inside it and (``expect``) the checksum the catalog recorded, and never allocates more than the
header describes (an lz4 file may claim at most MAX_LZ4_RATIO times its size). Which folder a file lives in, and
what happens to one that fails, is the disk tier's business (``spill.py``); this module only reads and writes.
"""

from __future__ import annotations

import itertools
import mmap
import os
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import lz4.frame
import numpy as np

from .errors import CorruptSnapshotError
from .format import (
    Background,
    Expected,
    Header,
    check_data,
    check_identity,
    parse_header,
    read_header,
    send_checked,
    versioned_head,
)
from .ids import SnapshotId

RAW_SUFFIX = ".safetensors"
LZ4_SUFFIX = ".safetensors.lz4"
MAX_LZ4_RATIO = 32  # an lz4 file may claim at most this many bytes per stored byte (the writer keeps to it)
_LZ4_FLOOR = 1024 * 1024  # ... or this much, for tiny files
_PROBE_BYTES = 4 * 1024 * 1024  # compress this much first; store raw if lz4 saves < 10% on it
_LZ4_STEP = 256 * 1024  # bytes in and at most out per decompression step: the pieces stay in cache
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO in place of a file cannot hang us
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux: map and read the whole file in one call


@dataclass(frozen=True)
class SpillFile:
    """A snapshot file on disk (committed, or a temp file awaiting commit)."""

    path: Path
    compressed: bool
    file_bytes: int


class NotTheFile(CorruptSnapshotError):
    """A read failed for a reason that is not the file's fault (gone, I/O error, wrong request): no quarantine."""


# ---- reading -------------------------------------------------------------------------------------------------
def header_of(f: BinaryIO, file: SpillFile, sid: SnapshotId, expect: Expected | None = None, *,
              versioned: bool = True) -> Header:
    """Parse a file's header (bounded reads; only the first frames of an lz4 file) and check it is ``sid``
    (with ``expect``'s checksum; ``versioned``: see ``format.check_identity``)."""
    what = str(sid)
    if file.compressed:
        total = _lz4_claimed_size(f, file.file_bytes, what)
        header = read_header(lambda start, n: _lz4_prefix(f, n, skip=start), total=total, name=what)
    else:
        header = read_header(lambda start, n: os.pread(f.fileno(), n, start), total=file.file_bytes, name=what)
    check_identity(header, sid, expect, what, versioned=versioned)
    return header


def load(f: BinaryIO, file: SpillFile, sid: SnapshotId, what: str, expect: Expected | None, *,
         versioned: bool = True, private: bool = False) -> tuple[np.ndarray, Background]:
    """The file's snapshot buffer, and its checksum check: ``wait()`` for it before using the buffer.

    A raw file is mapped read-only and read in by the map call (``private``: copied into private memory instead,
    for a caller that keeps the buffer); a large one's checksum then runs on a helper thread, so the caller can
    copy the buffer meanwhile (both release the GIL) and the check adds little to the copy. An lz4 file is
    decompressed into a buffer no larger than its header describes (and at most MAX_LZ4_RATIO times the file)
    while this thread checksums what has arrived. Content problems raise CorruptSnapshotError, anything else
    NotTheFile.
    """
    if expect is not None and expect.id != sid:
        raise NotTheFile(f"{what}: asked to read {file.path} as {expect.id}")
    try:
        if file.compressed:
            return _lz4_read_verified(f, file, sid, what, expect), Background()
        buf = _read_private(f, what) if private else _map_readonly(f)
        header = parse_header(buf, name=what)
        check_identity(header, sid, expect, what, versioned=versioned)
        return buf, Background.check(buf, header, what)
    except (RuntimeError, EOFError) as exc:  # lz4 raises RuntimeError on a damaged frame
        raise CorruptSnapshotError(f"{what}: not a valid lz4 frame ({exc})") from None
    except OSError as exc:
        raise NotTheFile(f"{what}: cannot read {file.path} ({exc.strerror})") from None


def _map_readonly(f: BinaryIO) -> np.ndarray:
    """The whole file as a read-only uint8 array over a shared read-only map, read in by the map call itself."""
    size = os.fstat(f.fileno()).st_size
    if not size:
        return np.empty(0, dtype=np.uint8)
    mapped = mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
    return np.frombuffer(mapped, dtype=np.uint8)


def _read_private(f: BinaryIO, what: str) -> np.ndarray:
    """The whole file as a read-only uint8 array in private memory. A buffer kept for long (a Ray-free reader's
    views) must not be a shared map of the file: another process truncating the file would make the next read
    of the lost pages kill this process with SIGBUS."""
    size = os.fstat(f.fileno()).st_size
    buf = np.empty(size, dtype=np.uint8)
    view = memoryview(buf)
    done = 0
    while done < size:
        n = f.readinto(view[done:])
        if not n:
            raise CorruptSnapshotError(f"{what}: the file shrank to {done} of {size} bytes while being read")
        done += n
    buf.flags.writeable = False
    return buf


def _lz4_claimed_size(f: BinaryIO, file_bytes: int, what: str) -> int:
    """The decompressed size an lz4 frame records, refused unless a file of ``file_bytes`` can honestly hold it."""
    size = int(lz4.frame.get_frame_info(f.read(32))["content_size"])
    f.seek(0)
    if not size:
        raise CorruptSnapshotError(f"{what}: the lz4 frame does not record its size (policystore always does)")
    if size > max(file_bytes * MAX_LZ4_RATIO, _LZ4_FLOOR):
        raise CorruptSnapshotError(
            f"{what}: an lz4 file of {file_bytes} bytes claims {size} bytes (more than {MAX_LZ4_RATIO}x): refused"
        )
    return size


def _lz4_prefix(f: BinaryIO, n: int, *, skip: int = 0) -> bytes:
    """Bytes ``skip .. skip + n`` of the decompressed stream (from the start of the frame), never more."""
    f.seek(0)
    decompressor = lz4.frame.LZ4FrameDecompressor()
    out = bytearray()
    while len(out) < skip + n and not decompressor.eof:
        data = f.read(64 * 1024) if decompressor.needs_input else b""
        if not data and decompressor.needs_input:
            break
        out += decompressor.decompress(data, max_length=skip + n - len(out))
    return bytes(out[skip : skip + n])


def _lz4_read_verified(f: BinaryIO, file: SpillFile, sid: SnapshotId, what: str,
                       expect: Expected | None) -> np.ndarray:
    """Decompress on a helper thread into a buffer of the recorded size; check header and checksum meanwhile."""
    buf = np.empty(_lz4_claimed_size(f, file.file_bytes, what), dtype=np.uint8)
    arrived: queue.SimpleQueue = queue.SimpleQueue()  # how many bytes are in place; None once the fill ended
    stop = threading.Event()

    def fill() -> None:
        try:
            filled = _lz4_fill(f, buf, arrived.put, stop)
            if filled != len(buf):
                raise CorruptSnapshotError(f"{what}: file is truncated (only {filled} of {len(buf)} bytes arrived)")
        finally:
            arrived.put(None)

    def landed() -> Iterator[int]:
        yield from iter(arrived.get, None)
        worker.wait()  # the fill's error, if any

    worker = Background(fill)
    try:
        view = memoryview(buf)
        progress, filled = landed(), 0
        for filled in progress:  # the header first: it says where the data starts and what it must hash to
            if filled >= 8 and filled >= 8 + int.from_bytes(view[:8], "little"):
                break
        header = parse_header(view[:filled], name=what, total=len(buf))
        check_identity(header, sid, expect, what)

        def data() -> Iterator[memoryview]:
            start = header.data_offset
            for end in itertools.chain([filled], progress):
                if end > start:
                    yield view[start:end]
                    start = end

        check_data(header, data(), what)
    finally:
        stop.set()
        worker.join()
    return buf


def _lz4_fill(f: BinaryIO, buf: np.ndarray, progress: Callable[[int], None], stop: threading.Event) -> int:
    decompressor = lz4.frame.LZ4FrameDecompressor()
    got = 0
    while not decompressor.eof and not stop.is_set():
        data = f.read(_LZ4_STEP) if decompressor.needs_input else b""
        if not data and decompressor.needs_input:
            break
        out = decompressor.decompress(data, max_length=min(_LZ4_STEP, len(buf) - got + 1))
        if got + len(out) > len(buf):
            raise CorruptSnapshotError(f"the lz4 frame holds more than the {len(buf)} bytes it records")
        buf[got : got + len(out)] = np.frombuffer(out, dtype=np.uint8)
        got += len(out)
        progress(got)
    if decompressor.eof and (decompressor.unused_data or f.read(1)):
        raise CorruptSnapshotError("bytes follow the end of the lz4 frame")
    return got


# ---- writing -------------------------------------------------------------------------------------------------
def write(f: BinaryIO, buf: np.ndarray, header: Header, version: int, *, compress: bool, what: str) -> bool:
    """Write the snapshot in ``buf`` to the empty file ``f`` as ``version`` (lz4-framed when ``compress`` and that
    saves space); returns whether it is compressed. The checksum is recomputed over what is written, so a buffer
    changed since it was packed raises CorruptSnapshotError naming ``what`` (the file must then be dropped)."""
    head = versioned_head(header, version)
    total = len(head) + header.nbytes - header.data_offset
    compressed = compress and _worth_compressing(buf)
    _write(f, head, buf, header, total, compressed, what)
    if compressed and f.tell() * MAX_LZ4_RATIO < total:  # too good: readers would refuse it
        f.seek(0)
        f.truncate()
        compressed = False
        _write(f, head, buf, header, total, compressed, what)
    return compressed


def _write(f: BinaryIO, head: bytes, buf: np.ndarray, header: Header, total: int, compressed: bool,
           what: str) -> None:
    """Write the file (raw or one lz4 frame recording ``total``), checking the checksum of what was written."""
    if not compressed:
        f.write(head)
        return send_checked(header, buf, f.write, what)
    with lz4.frame.LZ4FrameCompressor(block_linked=False) as comp:
        f.write(comp.begin(total))
        f.write(comp.compress(head))
        send_checked(header, buf, lambda chunk: f.write(comp.compress(chunk)), what)
        f.write(comp.flush())


def _worth_compressing(buf: np.ndarray) -> bool:
    probe = memoryview(buf).cast("B")[:_PROBE_BYTES]
    return len(lz4.frame.compress(probe)) < 0.9 * len(probe)
