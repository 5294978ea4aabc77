"""The one snapshot format: a safetensors buffer, the same bytes in the object store, on disk and on the wire.

Layout (https://huggingface.co/docs/safetensors): 8-byte little-endian header length N, N bytes of JSON
(``{name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}``, space-padded so the data starts 8-byte
aligned), then the raw tensor bytes with no holes. Tensors are laid out by falling element size, so every tensor
starts aligned to its own element size and can be viewed in place.

``__metadata__`` carries the policystore fields: a CRC-32 over the tensor index and the data (recorded once, at
pack time, and re-checked on restore and by ``verify``), the user's meta as one JSON string, the policy id and the
creation time. Nothing here is pickled.
"""

from __future__ import annotations

import json
import math
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .errors import CorruptSnapshotError, InvalidWeightsError

# safetensors dtype code <-> torch dtype
_CODES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": torch.uint16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "I64": torch.int64,
    "U64": torch.uint64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
_DTYPE_CODES = {dtype: code for code, dtype in _CODES.items()}
_ITEMSIZE = {code: torch.empty((), dtype=dtype).element_size() for code, dtype in _CODES.items()}

META_CHECKSUM = "policystore.checksum"
META_USER = "policystore.meta"
META_POLICY = "policystore.policy_id"
META_CREATED = "policystore.created"
_CHECKSUM_WIDTH = len("crc32:00000000")
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors limit
_CHUNK = 16 * 1024 * 1024  # checksum pass granularity


@dataclass(frozen=True)
class TensorEntry:
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # offsets relative to the data section
    end: int


@dataclass(frozen=True)
class Header:
    """A parsed, validated header: where each tensor lies in the buffer, plus the metadata."""

    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]
    data_offset: int  # absolute offset of the data section
    nbytes: int  # whole buffer

    @property
    def checksum(self) -> str:
        return self.metadata.get(META_CHECKSUM, "")

    @property
    def user_meta(self) -> dict[str, Any]:
        return json.loads(self.metadata.get(META_USER, "{}"))

    def index_bytes(self) -> bytes:
        """Canonical encoding of the tensor index: what the checksum covers besides the data."""
        index = {
            name: [_DTYPE_CODES[e.dtype], list(e.shape), e.start, e.end] for name, e in sorted(self.tensors.items())
        }
        return json.dumps(index, separators=(",", ":")).encode()


def _raw_bytes(name: str, value: object) -> tuple[str, tuple[int, ...], np.ndarray]:
    """(dtype code, shape, contiguous uint8 view of the bytes) of one tensor or array, on the host."""
    if isinstance(value, torch.Tensor):
        if value.is_sparse or value.layout != torch.strided:
            raise InvalidWeightsError(f"weights[{name!r}]: only dense tensors can be stored, got {value.layout}")
        code = _DTYPE_CODES.get(value.dtype)
        if code is None:
            raise InvalidWeightsError(f"weights[{name!r}]: dtype {value.dtype} is not supported")
        host = value.detach().to("cpu").contiguous()  # the GPU path: one copy to the host
        flat = host.reshape(-1).view(torch.uint8) if host.numel() else torch.empty(0, dtype=torch.uint8)
        return code, tuple(host.shape), flat.numpy()
    if isinstance(value, np.ndarray):
        try:
            code = _DTYPE_CODES[torch.from_numpy(np.empty(0, dtype=value.dtype)).dtype]
        except (TypeError, KeyError):
            raise InvalidWeightsError(f"weights[{name!r}]: numpy dtype {value.dtype} is not supported") from None
        arr = np.ascontiguousarray(value)
        return code, tuple(arr.shape), arr.reshape(-1).view(np.uint8)
    raise InvalidWeightsError(
        f"weights[{name!r}] is a {type(value).__name__}; snapshot values must be torch.Tensor or numpy.ndarray"
    )


def pack(
    weights: Mapping[str, torch.Tensor | np.ndarray], *, policy_id: str, meta: Mapping[str, Any] | None = None
) -> np.ndarray:
    """Serialise ``weights`` into one uint8 buffer in the safetensors layout, with checksum and metadata."""
    if not isinstance(weights, Mapping):
        raise InvalidWeightsError(f"weights must be a mapping of names to tensors, got {type(weights).__name__}")
    if not weights:
        raise InvalidWeightsError("weights is empty: a snapshot needs at least one tensor")
    try:
        user_meta = json.dumps(dict(meta or {}), sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise InvalidWeightsError(f"meta must be JSON-serialisable: {exc}") from None
    parts = []
    for name, value in weights.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise InvalidWeightsError(f"tensor names must be non-empty strings other than '__metadata__', got {name!r}")
        parts.append((name, *_raw_bytes(name, value)))
    parts.sort(key=lambda p: (-_ITEMSIZE[p[1]], p[0]))  # falling element size keeps every tensor aligned

    header: dict[str, Any] = {}
    offset = 0
    for name, code, shape, raw in parts:
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + raw.nbytes]}
        offset += raw.nbytes
    metadata = {
        "format": "pt",
        META_POLICY: policy_id,
        META_CREATED: f"{time.time():.6f}",
        META_USER: user_meta,
        META_CHECKSUM: "crc32:" + "0" * 8,  # fixed width: filled in once the data is in place
    }
    header["__metadata__"] = metadata
    header_json = json.dumps(header, separators=(",", ":")).encode()
    header_len = len(header_json) + (-(8 + len(header_json)) % 8)
    data_offset = 8 + header_len

    buf = np.empty(data_offset + offset, dtype=np.uint8)
    for name, _code, _shape, raw in parts:
        start, end = header[name]["data_offsets"]
        buf[data_offset + start : data_offset + end] = raw

    entries = {
        name: TensorEntry(_CODES[code], shape, *header[name]["data_offsets"]) for name, code, shape, _ in parts
    }
    metadata[META_CHECKSUM] = compute_checksum(Header(entries, metadata, data_offset, len(buf)), buf)
    header_json = json.dumps(header, separators=(",", ":")).encode()
    assert len(header_json) <= header_len, "checksum field changed width"
    buf[:8] = np.frombuffer(header_len.to_bytes(8, "little"), dtype=np.uint8)
    buf[8:data_offset] = np.frombuffer(header_json.ljust(header_len, b" "), dtype=np.uint8)
    return buf


def parse_header(buf: np.ndarray | memoryview | bytes, *, name: str, total: int | None = None) -> Header:
    """Parse and validate the header at the start of ``buf`` (which may hold only the header).

    ``total`` is the whole buffer's length when ``buf`` is just its start. Every structural problem raises
    CorruptSnapshotError naming ``name``: a snapshot that does not parse is never served.
    """
    view = memoryview(buf).cast("B")
    total = len(view) if total is None else total
    if len(view) < 8:
        raise CorruptSnapshotError(f"{name}: {total} bytes is too short for a safetensors header")
    header_len = int.from_bytes(view[:8], "little")
    if header_len > MAX_HEADER_BYTES or 8 + header_len > total or 8 + header_len > len(view):
        raise CorruptSnapshotError(f"{name}: header length {header_len} does not fit a buffer of {total} bytes")
    try:
        raw = json.loads(bytes(view[8 : 8 + header_len]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptSnapshotError(f"{name}: header is not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise CorruptSnapshotError(f"{name}: header is not a JSON object")
    metadata = raw.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CorruptSnapshotError(f"{name}: __metadata__ must map strings to strings")
    data_offset = 8 + header_len
    tensors: dict[str, TensorEntry] = {}
    for key, info in raw.items():
        try:
            code, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
            dtype = _CODES[code]
            if not all(isinstance(d, int) and d >= 0 for d in shape) or not isinstance(start, int):
                raise ValueError("bad shape or offsets")
        except (KeyError, TypeError, ValueError):
            raise CorruptSnapshotError(f"{name}: tensor {key!r} has a malformed entry {info!r}") from None
        if end - start != math.prod(shape) * _ITEMSIZE[code] or start % _ITEMSIZE[code]:
            raise CorruptSnapshotError(f"{name}: tensor {key!r} offsets {start}..{end} do not match {code}{shape}")
        tensors[key] = TensorEntry(dtype, tuple(shape), start, end)
    position = 0
    for key, entry in sorted(tensors.items(), key=lambda kv: (kv[1].start, kv[1].end)):
        if entry.start != position:
            raise CorruptSnapshotError(f"{name}: tensor {key!r} starts at {entry.start}, expected {position}")
        position = entry.end
    if data_offset + position != total:
        raise CorruptSnapshotError(
            f"{name}: data section is {total - data_offset} bytes but the header describes {position}"
        )
    return Header(tensors, metadata, data_offset, total)


def iter_data(header: Header, buf: np.ndarray | memoryview) -> Iterator[memoryview]:
    """The data section of ``buf`` in chunks (bounded memory for streaming and checksum passes)."""
    view = memoryview(buf).cast("B")
    for start in range(header.data_offset, header.nbytes, _CHUNK):
        yield view[start : min(start + _CHUNK, header.nbytes)]


def checksum_of(header: Header, chunks: Iterator[memoryview | bytes]) -> str:
    """CRC-32 over the tensor index then the data: catches flipped bytes, renamed or reshaped tensors."""
    crc = zlib.crc32(header.index_bytes())
    for chunk in chunks:
        crc = zlib.crc32(chunk, crc)
    return f"crc32:{crc:08x}"


def compute_checksum(header: Header, buf: np.ndarray | memoryview) -> str:
    return checksum_of(header, iter_data(header, buf))


def verify_buffer(buf: np.ndarray | memoryview, *, name: str) -> Header:
    """Parse ``buf`` and check its data against the recorded checksum; raise CorruptSnapshotError if not."""
    header = parse_header(buf, name=name)
    check_checksum(header, compute_checksum(header, buf), name)
    return header


def check_checksum(header: Header, actual: str, name: str) -> None:
    """Raise CorruptSnapshotError naming ``name`` unless ``actual`` is the checksum recorded in ``header``."""
    if not header.checksum or actual != header.checksum:
        raise CorruptSnapshotError(
            f"{name}: checksum mismatch (recorded {header.checksum or 'none'}, computed {actual}): "
            "the bytes changed after publish"
        )
