"""Fuzzing the snapshot parser: any byte string either parses to exactly what was packed, or raises
CorruptSnapshotError, using memory bounded by its own size.

Inputs are mutations of valid buffers (flipped, overwritten, inserted and deleted bytes, truncation, a rewritten
header length, spliced JSON) and plain random bytes.
"""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policystore import format as fmt
from policystore.errors import CorruptSnapshotError

FUZZ = settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

DTYPES = [np.float32, np.float16, np.int8, np.int64, np.uint16, np.bool_, np.float64]

shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)
arrays = st.builds(
    lambda dtype, shape, seed: np.random.default_rng(seed).integers(0, 100, size=shape).astype(dtype),
    st.sampled_from(DTYPES), shapes, st.integers(0, 2**16),
)
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12).filter(
    lambda n: n != "__metadata__"
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=10,
)
packed = st.builds(
    lambda weights, meta: (fmt.pack(weights, policy_id="p", meta=meta), meta),
    st.dictionaries(names, arrays, min_size=1, max_size=4),
    st.dictionaries(st.text(max_size=6), json_values, max_size=3),
)


def parsed(buf: np.ndarray) -> tuple:
    """Everything a reader gets from a buffer: the header's content and the data bytes."""
    header = fmt.verify_buffer(buf, name="fuzz")
    return header.tensors, header.metadata, header.user_meta, bytes(buf[header.data_offset :])


def check(original: np.ndarray, candidate: bytes) -> None:
    """``candidate`` parses to exactly what ``original`` holds, or is refused as corrupt; memory stays bounded."""
    expected = parsed(original)
    tracemalloc.start()
    try:
        got = parsed(np.frombuffer(candidate, np.uint8))
    except CorruptSnapshotError:
        got = None
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 64 * len(candidate) + (1 << 20), f"parsing {len(candidate)} bytes took {peak} bytes of memory"
    if got is not None:
        assert got == expected


@st.composite
def mutations(draw: st.DrawFn) -> tuple[np.ndarray, bytes]:
    buf, _ = draw(packed)
    raw = bytearray(buf.tobytes())
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "length", "splice"]))
        at = draw(st.integers(0, max(len(raw) - 1, 0)))
        if kind == "flip" and raw:
            raw[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and raw:
            raw[at] = draw(st.sampled_from(b'{}[]":,0123456789.-e \x00\xff'))
        elif kind == "insert":
            raw[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del raw[at : at + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del raw[at:]
        elif kind == "length":
            raw[:8] = draw(st.sampled_from([0, 1, 7, 8, len(raw), 2**31, 2**63, 2**64 - 1])).to_bytes(8, "little")
        elif kind == "splice":
            fragment = draw(st.sampled_from(
                [b'"data_offsets":[0,0]', b'"shape":[]', b'"dtype":"F64"', b'"shape":[1e3]', b"[" * 64, b"null"]
            ))
            raw[at : at + len(fragment)] = fragment
    return buf, bytes(raw)


@settings(FUZZ, max_examples=200)
@given(mutations())
def test_mutated_buffers_parse_exactly_or_are_corrupt(case):
    original, candidate = case
    check(original, candidate)


ORIGINAL = fmt.pack({"w": np.arange(6, dtype=np.float32)}, policy_id="p", meta={"k": [1, "x"]})


def with_header(text: bytes, data: bytes) -> bytes:
    text += b" " * (-(8 + len(text)) % 8)
    return len(text).to_bytes(8, "little") + text + data


@FUZZ
@given(st.binary(max_size=2048))
def test_random_bytes_are_corrupt(noise):
    check(ORIGINAL, noise)
    check(ORIGINAL, with_header(noise, b""))  # past the length check, into the JSON parser


entries = st.fixed_dictionaries({
    "dtype": st.sampled_from(["F32", "F64", "I8", "BOOL", "BF16", "F8_E5M2", "C64", ""]),
    "shape": st.lists(st.integers(-2, 6) | st.floats(0, 4) | st.booleans(), max_size=3),
    "data_offsets": st.lists(st.integers(-4, 64) | st.floats(0, 64), min_size=0, max_size=3),
})


@FUZZ
@given(st.dictionaries(names, entries, max_size=4), st.binary(max_size=64),
       st.dictionaries(st.text(max_size=20), st.text(max_size=20) | st.integers(), max_size=3))
def test_structured_headers_are_corrupt_or_checked(tensors, data, metadata):
    """Headers that are valid JSON with plausible entries reach every structural check."""
    header = dict(tensors)
    header["__metadata__"] = metadata
    check(ORIGINAL, with_header(json.dumps(header).encode(), data))


@FUZZ
@given(packed)
def test_valid_buffers_round_trip(case):
    buf, meta = case
    header = fmt.verify_buffer(buf, name="fuzz")
    assert header.user_meta == meta
    assert header.checksum.startswith("crc32c:")


@FUZZ
@given(st.binary(min_size=8, max_size=512), st.integers(0, 2**64 - 1))
def test_streamed_header_prefixes_with_any_claimed_total(prefix, total):
    """The disk tier parses a file's first bytes with the file's size: nothing but CorruptSnapshotError escapes."""
    try:
        header = fmt.parse_header(prefix, name="fuzz", total=total)
    except CorruptSnapshotError:
        return
    assert header.nbytes == total and header.data_offset <= len(prefix)
