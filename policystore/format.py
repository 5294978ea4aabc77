"""The one snapshot format: a safetensors buffer, the same bytes in the object store, on disk and on the wire.

Layout (https://huggingface.co/docs/safetensors): 8-byte little-endian header length N, N bytes of JSON
(``{name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}``, space-padded so the data starts 8-byte
aligned), then the raw tensor bytes with no holes. Tensors are laid out by falling element size, so every tensor
starts aligned to its own element size and can be viewed in place.

``__metadata__`` carries the policystore fields: a checksum (recorded once, at pack time, and re-checked on restore
and by ``verify``), the user's meta as one JSON string, the policy id and the creation time. The checksum is
CRC-32C (``crc32c:xxxxxxxx``, hardware speed) over the tensor index, the metadata present at pack time and the
data; a buffer recording any other checksum does not verify.
Nothing here is pickled, and this module needs no torch: headers parse with numpy alone (the store and catalog
actors hold bytes and names only); torch is imported where torch tensors are packed or viewed.
"""

from __future__ import annotations

import json
import math
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import crc32c
import numpy as np

from .errors import CorruptSnapshotError, InvalidMetaError, InvalidWeightsError, PolicyStoreError, brief
from .ids import SnapshotId

if TYPE_CHECKING:
    import torch

# safetensors dtype code -> (torch dtype name, element size, numpy dtype holding the same bytes)
_CODES: dict[str, tuple[str, int, np.dtype]] = {
    "BOOL": ("bool", 1, np.dtype(np.bool_)),
    "U8": ("uint8", 1, np.dtype(np.uint8)),
    "I8": ("int8", 1, np.dtype(np.int8)),
    "I16": ("int16", 2, np.dtype(np.int16)),
    "U16": ("uint16", 2, np.dtype(np.uint16)),
    "I32": ("int32", 4, np.dtype(np.int32)),
    "U32": ("uint32", 4, np.dtype(np.uint32)),
    "I64": ("int64", 8, np.dtype(np.int64)),
    "U64": ("uint64", 8, np.dtype(np.uint64)),
    "F16": ("float16", 2, np.dtype(np.float16)),
    "BF16": ("bfloat16", 2, np.dtype(np.uint16)),  # numpy has no bfloat16: the raw 16-bit patterns
    "F32": ("float32", 4, np.dtype(np.float32)),
    "F64": ("float64", 8, np.dtype(np.float64)),
    "F8_E4M3": ("float8_e4m3fn", 1, np.dtype(np.uint8)),
    "F8_E5M2": ("float8_e5m2", 1, np.dtype(np.uint8)),
}
_NUMPY_CODES = {np_dtype: code for code, (_, _, np_dtype) in _CODES.items() if code not in ("BF16", "F8_E4M3",
                                                                                          "F8_E5M2")}
_TORCH_CODES: dict[Any, str] = {}  # torch dtype -> code, filled on first use

META_CHECKSUM = "policystore.checksum"
META_USER = "policystore.meta"
META_POLICY = "policystore.policy_id"
META_CREATED = "policystore.created"
META_VERSION = "policystore.version"  # added by the disk tier when it writes a file (versioned_head); not signed
UNSIGNED_META = frozenset({META_CHECKSUM, META_VERSION})
CRC32C = "crc32c"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors limit
MAX_META_BYTES = 64 * 1024  # the user's meta as JSON
MAX_META_DEPTH = 16
_CHUNK = 16 * 1024 * 1024  # checksum pass granularity
_BLOCK = 4 * 1024 * 1024  # pack's copy granularity: its checksum thread trails the copy by one block
# From this much data on, pack checksums on a helper thread; below it (measured: 16 MiB) checksumming the freshly
# copied, still cached bytes at once is faster than starting the thread and handing blocks over.
_OVERLAP_BYTES = 32 * 1024 * 1024
_CHECK_BESIDE_BYTES = 8 * 1024 * 1024  # buffers at least this big are checksummed on a thread while they are copied


@dataclass(frozen=True, slots=True)
class TensorEntry:
    code: str  # safetensors dtype code, e.g. "F32"
    shape: tuple[int, ...]
    start: int  # offsets relative to the data section
    end: int

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype (imports torch)."""
        import torch

        return getattr(torch, _CODES[self.code][0])


@dataclass(frozen=True)
class Header:
    """A parsed, validated header: where each tensor lies in the buffer, plus the metadata."""

    tensors: dict[str, TensorEntry]  # shared by every header with the same tensor index: never modify
    metadata: dict[str, str]
    data_offset: int  # absolute offset of the data section
    nbytes: int  # whole buffer

    @property
    def checksum(self) -> str:
        return self.metadata.get(META_CHECKSUM, "")

    @property
    def user_meta(self) -> dict[str, Any]:
        return json.loads(self.metadata.get(META_USER, "{}"))

    @property
    def created(self) -> float:
        return float(self.metadata.get(META_CREATED, 0))

    def index_bytes(self) -> bytes:
        """Canonical encoding of the tensor index: what the checksum covers besides the data."""
        index = {name: [e.code, list(e.shape), e.start, e.end] for name, e in sorted(self.tensors.items())}
        return json.dumps(index, separators=(",", ":")).encode()

    def signed_bytes(self) -> bytes:
        """What a CRC-32C checksum covers before the data: the tensor index and the metadata set at pack time."""
        signed = {k: v for k, v in self.metadata.items() if k not in UNSIGNED_META}
        return self.index_bytes() + json.dumps(signed, sort_keys=True, separators=(",", ":")).encode()


def _torch_code(dtype: Any) -> str | None:
    if not _TORCH_CODES:
        import torch

        _TORCH_CODES.update({getattr(torch, name): code for code, (name, _, _) in _CODES.items()})
    return _TORCH_CODES.get(dtype)


def check_meta(meta: Mapping[str, Any] | None) -> str:
    """The user's meta as canonical JSON, or InvalidMetaError naming what would not round-trip exactly (or is
    nested deeper than MAX_META_DEPTH, or longer than MAX_META_BYTES as JSON). Iterative: any depth is safe."""
    if meta is None:
        return "{}"
    if not isinstance(meta, Mapping):
        raise InvalidMetaError(f"meta must be a mapping with str keys, got {type(meta).__name__}")
    meta = dict(meta)
    stack: list[tuple[str, Any, int]] = [("meta", meta, 1)]
    while stack:  # iterative: a deeply nested meta must not blow the interpreter's stack
        path, value, depth = stack.pop()
        if isinstance(value, dict):
            for key in value:
                if type(key) is not str:
                    raise InvalidMetaError(
                        f"{path} has key {key!r} of type {type(key).__name__}: meta keys must be str "
                        "(JSON would turn it into a string)"
                    )
            children = [(f"{path}[{k!r}]", v) for k, v in value.items()]
        elif type(value) is list:
            children = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
        elif value is None or type(value) in (str, int, bool):
            continue
        elif type(value) is float:
            if not math.isfinite(value):
                raise InvalidMetaError(f"{path} is {value}: meta must be strict JSON (no NaN or infinity)")
            continue
        else:
            raise InvalidMetaError(
                f"{path} is a {type(value).__name__}: meta values must be JSON types (dict, list, str, int, float, "
                "bool, None); anything else would not come back as it went in"
            )
        if depth > MAX_META_DEPTH:
            raise InvalidMetaError(f"meta is nested deeper than {MAX_META_DEPTH} levels (at {path})")
        stack.extend((child, v, depth + 1) for child, v in children)
    try:
        text = json.dumps(meta, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:  # e.g. an int too long to print
        raise InvalidMetaError(f"meta cannot be written as JSON: {exc}") from None
    size = len(text.encode())
    if size > MAX_META_BYTES:
        raise InvalidMetaError(
            f"meta is {size} bytes as JSON, more than the {MAX_META_BYTES}-byte limit: keep large data elsewhere"
        )
    return text


@dataclass
class _Part:
    name: str
    code: str
    shape: tuple[int, ...]
    value: Any  # the torch tensor or numpy array to copy from
    nbytes: int


def _part(name: str, value: object) -> _Part:
    """Check one tensor or array and describe it; nothing is copied yet."""
    torch = sys.modules.get("torch")  # a torch tensor can exist only if torch is imported
    if torch is not None and isinstance(value, torch.Tensor):
        if value.is_nested:
            raise InvalidWeightsError(f"weights[{name!r}] is a nested tensor; store its components as separate tensors")
        if value.layout != torch.strided:
            raise InvalidWeightsError(f"weights[{name!r}]: only dense tensors can be stored, got {value.layout}")
        if value.device.type == "meta":
            raise InvalidWeightsError(f"weights[{name!r}] is on the meta device: it has no data to store")
        code = _torch_code(value.dtype)
        if code is None:
            raise InvalidWeightsError(f"weights[{name!r}]: dtype {value.dtype} is not supported")
        shape = tuple(value.shape)
        return _Part(name, code, shape, value, math.prod(shape) * _CODES[code][1])
    if isinstance(value, np.ndarray):
        if type(value) not in (np.ndarray, np.memmap):
            raise InvalidWeightsError(
                f"weights[{name!r}] is a {type(value).__name__}; pass a plain numpy.ndarray (np.asarray(...)) so "
                "nothing it carries besides the values is silently dropped"
            )
        if not value.dtype.isnative:
            raise InvalidWeightsError(
                f"weights[{name!r}] has non-native byte order ({value.dtype.str}); convert it first with "
                "arr.astype(arr.dtype.newbyteorder('='))"
            )
        code = _NUMPY_CODES.get(value.dtype)
        if code is None:
            raise InvalidWeightsError(f"weights[{name!r}]: numpy dtype {value.dtype} is not supported")
        return _Part(name, code, tuple(value.shape), value, value.nbytes)
    raise InvalidWeightsError(
        f"weights[{name!r}] is a {type(value).__name__}; snapshot values must be torch.Tensor or numpy.ndarray"
    )


def _copied_blocks(buf: np.ndarray, data_offset: int, entries: dict[str, TensorEntry],
                   parts: list[_Part]) -> Iterator[memoryview]:
    """Copy every part into its slot of ``buf``, yielding the data section in order, each block once it is in
    place (a checksum can follow the copy block by block)."""
    for part in parts:
        entry = entries[part.name]
        dest = buf[data_offset + entry.start : data_offset + entry.end]
        src = _source_bytes(part)
        if src is None:  # a strided numpy array: numpy copies it element-wise, in one go
            dest.view(part.value.dtype).reshape(part.shape)[...] = part.value
            yield memoryview(dest)
            continue
        for lo in range(0, part.nbytes, _BLOCK):
            hi = min(lo + _BLOCK, part.nbytes)
            dest[lo:hi] = src[lo:hi]  # numpy's memcpy: torch's threaded copy_ costs more here
            yield memoryview(dest[lo:hi])


def _source_bytes(part: _Part) -> np.ndarray | None:
    """The part's bytes as a flat uint8 array (None for a strided numpy array, copied element-wise instead)."""
    if isinstance(part.value, np.ndarray):
        return part.value.reshape(-1).view(np.uint8) if part.value.flags.c_contiguous else None
    src = part.value.detach().resolve_neg()
    if src.device.type != "cpu" or not src.is_contiguous():
        src = src.to("cpu").contiguous()  # a GPU or strided tensor: staged once on the host
    import torch

    return src.reshape(-1).view(torch.uint8).numpy()


def _checksum_behind(header: Header, blocks: Iterator[memoryview]) -> str:
    """Run the copy (``blocks``) here while a helper thread checksums each block as it lands. Both release the
    GIL, so a big pack costs about the longer of the two instead of their sum."""
    landed: queue.SimpleQueue = queue.SimpleQueue()
    outcome: list[str] = []
    check = Background(lambda: outcome.append(checksum_of(header, iter(landed.get, None))))
    try:
        for block in blocks:
            landed.put(block)
    finally:
        landed.put(None)
        check.join()
    check.wait()
    return outcome[0]


class Background:
    """``fn`` on a helper thread: a checksum pass releases the GIL, so the caller's copy runs meanwhile. ``wait()``
    joins it and re-raises what it raised; without ``fn`` there is nothing to wait for."""

    def __init__(self, fn: Callable[[], object] | None = None):
        self._error: BaseException | None = None
        self._thread = None if fn is None else threading.Thread(target=self._run, args=(fn,), daemon=True,
                                                                 name="policystore-checksum")
        if self._thread is not None:
            self._thread.start()

    def _run(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except BaseException as exc:  # re-raised by the waiting thread
            self._error = exc

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def wait(self) -> None:
        self.join()
        if self._error is not None:
            raise self._error

    @classmethod
    def check(cls, buf: np.ndarray, header: Header, what: str) -> Background:
        """The checksum check of a buffer about to be copied: on a helper thread for a large one, else done at once
        (a small buffer checks faster than a thread starts)."""
        if header.nbytes < _CHECK_BESIDE_BYTES:
            check_data(header, iter_data(header, buf), what)
            return cls()
        return cls(lambda: check_data(header, iter_data(header, buf), what))


def pack(
    weights: Mapping[str, torch.Tensor | np.ndarray],
    *,
    policy_id: str,
    meta: Mapping[str, Any] | None = None,
    alloc: Callable[[int], np.ndarray] | None = None,
) -> np.ndarray:
    """Serialise ``weights`` into one uint8 buffer in the safetensors layout, with checksum and metadata.

    ``alloc(nbytes)`` supplies the destination (a writable 1-D uint8 array of exactly ``nbytes``; default
    ``np.empty``), so the bytes can go straight into memory the store keeps: one copy of the tensor bytes, and the
    checksum is computed over the destination (for big snapshots on a helper thread, one block behind the copy).
    Every input is checked before ``alloc`` is called.
    """
    if not isinstance(weights, Mapping):
        raise InvalidWeightsError(f"weights must be a mapping of names to tensors, got {type(weights).__name__}")
    if not weights:
        raise InvalidWeightsError("weights is empty: a snapshot needs at least one tensor")
    user_meta = check_meta(meta)
    parts = []
    names: set[str] = set()
    for name, value in weights.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise InvalidWeightsError(f"tensor names must be non-empty strings other than '__metadata__', got {name!r}")
        if name in names:  # a custom Mapping can repeat a key; the file would then not parse
            raise InvalidWeightsError(f"weights name {name!r} twice: tensor names must be unique")
        names.add(name)
        parts.append(_part(name, value))
    parts.sort(key=lambda p: (-_CODES[p.code][1], p.name))  # falling element size keeps every tensor aligned

    entries: dict[str, TensorEntry] = {}
    offset = 0
    for part in parts:
        entries[part.name] = TensorEntry(part.code, part.shape, offset, offset + part.nbytes)
        offset += part.nbytes
    metadata = {
        "format": "pt",
        META_POLICY: str(policy_id),
        META_CREATED: f"{time.time():.6f}",
        META_USER: user_meta,
        META_CHECKSUM: CRC32C + ":" + "0" * 8,  # fixed width: filled in once the data is in place
    }
    data_offset = len(_head(entries, metadata))
    total = data_offset + offset

    buf = alloc(total) if alloc is not None else np.empty(total, dtype=np.uint8)
    if not (isinstance(buf, np.ndarray) and buf.dtype == np.uint8 and buf.shape == (total,)
            and buf.flags.writeable and buf.flags.c_contiguous):
        raise PolicyStoreError(f"pack: alloc({total}) must return a writable contiguous 1-D uint8 array of that size")
    header = Header(entries, metadata, data_offset, total)
    blocks = _copied_blocks(buf, data_offset, entries, parts)
    metadata[META_CHECKSUM] = (_checksum_behind(header, blocks) if offset >= _OVERLAP_BYTES
                               else checksum_of(header, blocks))
    head = _head(entries, metadata, data_offset - 8)
    assert len(head) == data_offset, "checksum field changed width"
    buf[:data_offset] = np.frombuffer(head, dtype=np.uint8)
    return buf


def _head(entries: dict[str, TensorEntry], metadata: dict[str, str], room: int = 0) -> bytes:
    """The length prefix and the header JSON, space-padded to ``room`` bytes where it fits, else just enough for
    the data to start 8-byte aligned."""
    header: dict[str, Any] = {
        name: {"dtype": e.code, "shape": list(e.shape), "data_offsets": [e.start, e.end]} for name, e in entries.items()
    }
    text = json.dumps({**header, "__metadata__": metadata}, separators=(",", ":")).encode()
    length = room if len(text) <= room else len(text) + (-(8 + len(text)) % 8)
    return length.to_bytes(8, "little") + text.ljust(length, b" ")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate key in {sorted(keys)[:8]}")
    return dict(pairs)


def _offset_like(value: object) -> bool:
    return type(value) is int and value >= 0  # bool and float are refused


def header_length(head: bytes | memoryview, total: int, name: str) -> int:
    """The JSON header's length from a buffer's first 8 bytes, checked against the buffer's ``total`` size."""
    if len(head) < 8:
        raise CorruptSnapshotError(f"{name}: {total} bytes is too short for a safetensors header")
    length = int.from_bytes(head[:8], "little")
    if length > min(MAX_HEADER_BYTES, total - 8):
        raise CorruptSnapshotError(f"{name}: header length {length} does not fit a buffer of {total} bytes")
    return length


def parse_header(buf: np.ndarray | memoryview | bytes, *, name: str, total: int | None = None) -> Header:
    """Parse and validate the header at the start of ``buf`` (which may hold only the header).

    ``total`` is the whole buffer's length when ``buf`` is just its start. Every problem, however pathological
    the header, raises CorruptSnapshotError naming ``name``: a snapshot that does not parse is never served.
    """
    view = memoryview(buf).cast("B")
    try:
        return _parse(view, name, len(view) if total is None else total)
    except CorruptSnapshotError:
        raise
    except Exception as exc:
        raise CorruptSnapshotError(f"{name}: unreadable header ({type(exc).__name__}: {brief(exc)})") from None


def parse_head(head: bytes, *, name: str) -> Header:
    """Parse a header sent without its data (the buffer's size is what the header describes)."""
    return parse_header(head, name=name, total=-1)


def read_header(read_at: Callable[[int, int], bytes], *, total: int, name: str) -> Header:
    """Parse the header of a snapshot of ``total`` bytes stored elsewhere (a file, compressed or not), reading
    only its first bytes: ``read_at(offset, n)`` returns the stored snapshot's bytes ``offset .. offset + n``."""
    head = read_at(0, 8)
    return parse_header(head + read_at(8, header_length(head, total, name)), name=name, total=total)


def _parse(view: memoryview, name: str, total: int) -> Header:
    """``total`` -1: the header alone, the buffer as long as it describes."""
    header_len = header_length(view, len(view) if total < 0 else total, name)
    data_offset = 8 + header_len
    if data_offset > len(view):
        raise CorruptSnapshotError(f"{name}: header length {header_len} does not fit a buffer of {len(view)} bytes")
    if data_offset % 8:
        raise CorruptSnapshotError(f"{name}: data section starts at {data_offset}, not 8-byte aligned")
    try:
        raw = json.loads(bytes(view[8:data_offset]), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise CorruptSnapshotError(f"{name}: header is not valid JSON ({brief(exc)})") from None
    if not isinstance(raw, dict):
        raise CorruptSnapshotError(f"{name}: header is not a JSON object")
    metadata = raw.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CorruptSnapshotError(f"{name}: __metadata__ must map strings to strings")
    _check_recorded_meta(metadata, name)
    tensors: dict[str, TensorEntry] = {}
    for key, info in raw.items():
        try:
            code, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
            itemsize = _CODES[code][1]
            if not (isinstance(shape, list) and all(map(_offset_like, shape))
                    and _offset_like(start) and _offset_like(end)):
                raise ValueError("bad shape or offsets")
        except (KeyError, TypeError, ValueError):
            raise CorruptSnapshotError(f"{name}: tensor {key!r} has a malformed entry {str(info)[:200]}") from None
        if end - start != math.prod(shape) * itemsize or start % itemsize:
            raise CorruptSnapshotError(
                f"{name}: tensor {key!r} offsets {start}..{end} do not match {code}{str(shape)[:200]}"
            )
        tensors[key] = TensorEntry(code, tuple(shape), start, end)
    position = 0
    for key, entry in sorted(tensors.items(), key=lambda kv: (kv[1].start, kv[1].end)):
        if entry.start != position:
            raise CorruptSnapshotError(
                f"{name}: tensor {key!r} starts at {entry.start}, expected {position} (overlap or hole)"
            )
        position = entry.end
    total = data_offset + position if total < 0 else total
    if data_offset + position != total:
        raise CorruptSnapshotError(
            f"{name}: data section is {total - data_offset} bytes but the header describes {position}"
        )
    return Header(_shared_layout(tensors), metadata, data_offset, total)


def head_bytes(buf: np.ndarray) -> bytes:
    """The header bytes (length prefix + JSON) of a snapshot buffer: what ``parse_head`` reads."""
    return bytes(buf[: 8 + int.from_bytes(buf[:8].tobytes(), "little")])


def versioned_head(header: Header, version: int) -> bytes:
    """The header with ``META_VERSION`` added to its metadata (not covered by the checksum): the same length when
    the padding has room (it needs about 40 bytes), else longer (the data's offsets are relative, so they do not
    change)."""
    return _head(header.tensors, {**header.metadata, META_VERSION: str(version)}, header.data_offset - 8)


# tensor index -> the one dict of entries every header with that index shares (read-only by convention): a league's
# snapshots mostly share a few architectures, and the store and every reader keep a header per snapshot they know
_LAYOUTS: dict[tuple, dict[str, TensorEntry]] = {}
_MAX_LAYOUTS = 1024


def _shared_layout(tensors: dict[str, TensorEntry]) -> dict[str, TensorEntry]:
    key = tuple((name, e.code, e.shape, e.start, e.end) for name, e in tensors.items())
    shared = _LAYOUTS.get(key)
    if shared is None:
        if len(_LAYOUTS) >= _MAX_LAYOUTS:
            _LAYOUTS.clear()
        shared = _LAYOUTS.setdefault(key, tensors)
    return shared


def _check_recorded_meta(metadata: dict[str, str], name: str) -> None:
    """The user's meta must load as a JSON object (so ``Header.user_meta`` cannot fail later)."""
    text = metadata.get(META_USER)
    if text is None:
        return
    try:
        if not isinstance(json.loads(text), dict):
            raise ValueError("not an object")
    except (ValueError, RecursionError):
        raise CorruptSnapshotError(f"{name}: the recorded meta is not a JSON object") from None


def iter_data(header: Header, buf: np.ndarray | memoryview) -> Iterator[memoryview]:
    """The data section of ``buf`` in chunks (bounded memory for streaming and checksum passes)."""
    view = memoryview(buf).cast("B")
    for start in range(header.data_offset, header.nbytes, _CHUNK):
        yield view[start : min(start + _CHUNK, header.nbytes)]


def checksum_of(header: Header, chunks: Iterator[memoryview | bytes]) -> str:
    """CRC-32C over the tensor index, the metadata set at pack time, then the data: catches flipped bytes,
    renamed or reshaped tensors and changed metadata."""
    crc = crc32c.crc32c(header.signed_bytes())
    for chunk in chunks:
        crc = crc32c.crc32c(chunk, crc)
    return f"{CRC32C}:{crc:08x}"


def verify_buffer(buf: np.ndarray | memoryview, *, name: str) -> Header:
    """Parse ``buf`` and check its data against the recorded checksum; raise CorruptSnapshotError if not."""
    header = parse_header(buf, name=name)
    check_data(header, iter_data(header, buf), name)
    return header


def check_data(header: Header, chunks: Iterator[memoryview | bytes], name: str) -> None:
    """Checksum ``chunks`` (the data section, streamed): CorruptSnapshotError naming ``name`` unless it is the
    checksum recorded in ``header``."""
    actual = checksum_of(header, chunks)
    if not header.checksum or actual != header.checksum:
        raise CorruptSnapshotError(
            f"{name}: checksum mismatch (recorded {header.checksum or 'none'}, computed {actual}): "
            "the bytes changed after publish"
        )


def send_checked(header: Header, buf: np.ndarray, sink: Callable[[memoryview], object], what: str) -> None:
    """Hand ``buf``'s data section to ``sink`` chunk by chunk, checksumming what leaves: CorruptSnapshotError
    naming ``what`` if the bytes changed since they were packed (what was sent must then be dropped)."""
    def sent() -> Iterator[memoryview]:
        for chunk in iter_data(header, buf):
            sink(chunk)
            yield chunk

    check_data(header, sent(), what)


@dataclass(frozen=True)
class Expected:
    """What the catalog recorded at publish: a copy (file, object) must hold exactly this snapshot to be served."""

    policy_id: str
    version: int
    checksum: str

    @property
    def id(self) -> SnapshotId:
        return SnapshotId(self.policy_id, self.version)


def check_identity(header: Header, sid: SnapshotId, expect: Expected | None, what: str, *,
                   versioned: bool = True) -> None:
    """CorruptSnapshotError unless the header is ``sid`` (the policy id packed in it, and the version the disk
    tier recorded) with the checksum the catalog recorded (``expect``). ``versioned=False``: a buffer that need not
    record its version (one about to be written, or a durable data object, which its commit marker names), but if
    it does, it must match."""
    inside = header.metadata.get(META_POLICY)
    if inside != sid.policy_id:
        raise CorruptSnapshotError(f"{what}: the file holds a snapshot of policy {inside!r}, not {sid.policy_id!r}")
    version = header.metadata.get(META_VERSION)
    if version != str(sid.version) and (versioned or version is not None):
        raise CorruptSnapshotError(f"{what}: the file holds version {version!r}, not {sid.version}")
    if expect is not None and header.checksum != expect.checksum:
        raise CorruptSnapshotError(
            f"{what}: the file records checksum {header.checksum or 'none'}, its publish {expect.checksum}"
        )
