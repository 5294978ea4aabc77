"""The snapshot format: bitwise round trips of every dtype, safetensors compatibility, corruption detection."""

import json
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load as st_load
from sample_weights import mixed_weights, same_bits

from policystore import format as fmt
from policystore.errors import CorruptSnapshotError, InvalidWeightsError, PolicyStoreError
from policystore.views import tensor_views


def test_every_dtype_round_trips_bitwise_through_views():
    weights = mixed_weights()
    buf = fmt.pack(weights, policy_id="p", meta={"step": 7})
    header = fmt.verify_buffer(buf, name="p")
    views = tensor_views(buf, header, "p@v1")
    assert set(views) == set(weights)
    for name, tensor in weights.items():
        assert same_bits(views[name], tensor), name
    assert header.user_meta == {"step": 7}


def test_every_tensor_is_aligned_for_in_place_viewing():
    buf = fmt.pack(mixed_weights(), policy_id="p")
    header = fmt.parse_header(buf, name="p")
    assert header.data_offset % 8 == 0
    for entry in header.tensors.values():
        assert entry.start % torch.empty((), dtype=entry.dtype).element_size() == 0


def test_numpy_inputs_and_non_contiguous_tensors():
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = torch.arange(12, dtype=torch.int64).reshape(3, 4).t()  # non-contiguous
    buf = fmt.pack({"a": arr, "b": t}, policy_id="p")
    views = tensor_views(buf, fmt.verify_buffer(buf, name="p"), "p")
    assert np.array_equal(views["a"].numpy(), arr)
    assert torch.equal(views["b"], t)


def test_buffer_is_plain_safetensors(tmp_path):
    weights = mixed_weights()
    buf = fmt.pack(weights, policy_id="p", meta={"k": "v"})
    loaded = st_load(buf.tobytes())
    for name, tensor in weights.items():
        assert same_bits(loaded[name], tensor), name
    path = tmp_path / "s.safetensors"
    path.write_bytes(buf.tobytes())
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
        assert json.loads(meta[fmt.META_USER]) == {"k": "v"}
        assert meta[fmt.META_CHECKSUM].startswith("crc32c:")
        assert same_bits(f.get_tensor("t.bfloat16"), weights["t.bfloat16"])


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda b: b.__setitem__(-1, b[-1] ^ 0xFF),  # a data byte
        lambda b: b.__setitem__(slice(0, 8), np.frombuffer((10**9).to_bytes(8, "little"), np.uint8)),  # header size
        lambda b: b.__setitem__(9, ord("!")),  # header JSON
    ],
    ids=["data-byte", "header-length", "header-json"],
)
def test_corruption_is_detected(corrupt):
    buf = fmt.pack({"w": torch.randn(64)}, policy_id="p")
    corrupt(buf)
    with pytest.raises(CorruptSnapshotError, match="p"):
        fmt.verify_buffer(buf, name="p")


def test_renamed_tensor_fails_checksum():
    buf = fmt.pack({"aaaa": torch.randn(8), "bbbb": torch.randn(8)}, policy_id="p")
    raw = bytearray(buf.tobytes())
    i = raw.index(b'"aaaa"')
    raw[i + 1 : i + 5] = b"cccc"
    with pytest.raises(CorruptSnapshotError, match="checksum"):
        fmt.verify_buffer(np.frombuffer(bytes(raw), np.uint8), name="p")


def test_headers_of_one_layout_share_their_tensor_index():
    weights = {"w": torch.zeros(4, 3), "b": torch.zeros(3), "n": torch.zeros((), dtype=torch.int64)}
    a = fmt.parse_header(fmt.pack(weights, policy_id="p", meta={"k": 1}), name="a")
    b = fmt.parse_header(fmt.pack({k: v + 1 for k, v in weights.items()}, policy_id="q"), name="b")
    other = fmt.parse_header(fmt.pack({"w": torch.zeros(4, 4)}, policy_id="p"), name="c")
    assert a.tensors is b.tensors  # one copy per process of what every snapshot of an architecture repeats
    assert a.checksum != b.checksum and a.user_meta == {"k": 1} and b.user_meta == {}
    assert other.tensors is not a.tensors and other.tensors["w"].shape == (4, 4)


def test_truncated_buffer_is_rejected():
    buf = fmt.pack({"w": torch.randn(64)}, policy_id="p")
    with pytest.raises(CorruptSnapshotError, match="data section"):
        fmt.parse_header(buf[:-4], name="p")


@pytest.mark.parametrize(
    "weights, match",
    [
        ([torch.zeros(1)], "mapping"),
        ({}, "empty"),
        ({"w": [1.0, 2.0]}, "weights\\['w'\\] is a list"),
        ({"w": "abc"}, "is a str"),
        ({1: torch.zeros(1)}, "names must be"),
        ({"w": torch.zeros(2, dtype=torch.complex64)}, "not supported"),
        ({"w": np.array(["a"])}, "not supported"),
        ({"w": torch.zeros(4).to_sparse()}, "dense"),
    ],
)
def test_bad_weights_get_named_errors(weights, match):
    with pytest.raises(InvalidWeightsError, match=match):
        fmt.pack(weights, policy_id="p")


def test_meta_must_be_json():
    with pytest.raises(InvalidWeightsError, match="JSON"):
        fmt.pack({"w": torch.zeros(1)}, policy_id="p", meta={"f": object()})


def with_metadata(buf: np.ndarray, **changes: str) -> np.ndarray:
    """``buf`` with its header's metadata changed (re-padded, data moved), as a file writer would rewrite it."""
    header = fmt.parse_header(buf, name="p")
    raw = json.loads(bytes(buf[8 : header.data_offset]))
    raw["__metadata__"].update(changes)
    text = json.dumps(raw, separators=(",", ":")).encode()
    text = text.ljust(len(text) + (-(8 + len(text)) % 8), b" ")
    return np.frombuffer(len(text).to_bytes(8, "little") + text + bytes(buf[header.data_offset :]), np.uint8).copy()


def test_checksum_is_crc32c_and_no_other_algorithm_verifies():
    buf = fmt.pack({"w": torch.randn(64), "b": np.arange(3, dtype=np.int16)}, policy_id="p", meta={"k": 1})
    header = fmt.verify_buffer(buf, name="p")
    assert header.checksum.startswith("crc32c:") and len(header.checksum) == len("crc32c:") + 8
    crc = zlib.crc32(memoryview(buf)[header.data_offset :], zlib.crc32(header.index_bytes()))
    with pytest.raises(CorruptSnapshotError, match="checksum"):  # zlib CRC-32 of index and data: not a format
        fmt.verify_buffer(with_metadata(buf, **{fmt.META_CHECKSUM: f"crc32:{crc:08x}"}), name="p")


def test_crc32c_covers_the_metadata_set_at_pack_time_but_not_the_disk_version():
    buf = fmt.pack({"w": torch.randn(8)}, policy_id="p", meta={"step": 7})
    assert fmt.verify_buffer(with_metadata(buf, **{fmt.META_VERSION: "3"}), name="p").metadata[fmt.META_VERSION] == "3"
    for key, value in [(fmt.META_USER, '{"step":8}'), (fmt.META_POLICY, "q"), (fmt.META_CREATED, "1.0")]:
        with pytest.raises(CorruptSnapshotError, match="checksum"):
            fmt.verify_buffer(with_metadata(buf, **{key: value}), name="p")


def test_pack_writes_into_the_memory_alloc_supplies():
    weights = {"a": torch.randn(5, 3), "b": torch.arange(10).reshape(2, 5).t(), "c": np.ones((2, 2), np.float64)}
    given = []

    def alloc(nbytes: int) -> np.ndarray:
        given.append(np.zeros(nbytes, np.uint8))
        return given[-1]

    buf = fmt.pack(weights, policy_id="p", alloc=alloc)
    assert buf is given[0]
    views = tensor_views(buf, fmt.verify_buffer(buf, name="p"), "p")
    assert torch.equal(views["a"], weights["a"]) and torch.equal(views["b"], weights["b"])
    assert np.array_equal(views["c"].numpy(), weights["c"])
    with pytest.raises(PolicyStoreError, match="alloc"):
        fmt.pack(weights, policy_id="p", alloc=lambda n: np.empty(n + 1, np.uint8))


@pytest.mark.parametrize("overlap", [False, True], ids=["checksum-at-once", "checksum-thread"])
def test_pack_copies_in_blocks_and_the_recorded_checksum_is_the_whole_buffers(monkeypatch, overlap):
    # small blocks, so that tensors span several and end mid-block; the thread path is taken for any size
    monkeypatch.setattr(fmt, "_BLOCK", 4096)
    monkeypatch.setattr(fmt, "_OVERLAP_BYTES", 0 if overlap else 1 << 62)
    weights = {
        "big": torch.randn(10_001),
        "strided": np.arange(4000, dtype=np.float32).reshape(40, 100)[:, ::3],
        "empty": torch.empty(0),
        "strided_tensor": torch.arange(10_000.0)[::2],
        "bytes": np.ones(9_999, np.uint8),
    }
    buf = fmt.pack(weights, policy_id="p", meta={"k": 1})
    views = tensor_views(buf, fmt.verify_buffer(buf, name="p"), "p")  # recomputes the checksum in one pass
    for name, value in weights.items():
        expected = torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value
        assert torch.equal(views[name], expected), name


def test_format_imports_and_parses_without_torch():
    """The store and catalog actors hold bytes and names only: format.py must not need torch."""
    code = textwrap.dedent(f"""
        import sys, types
        sys.modules["torch"] = None  # any import of torch now fails
        pkg = types.ModuleType("policystore")
        pkg.__path__ = [{str(Path(fmt.__file__).parent)!r}]
        sys.modules["policystore"] = pkg
        import numpy as np
        from policystore import format as fmt
        arr = np.arange(6, dtype=np.float32).reshape(2, 3)
        buf = fmt.pack({{"w": arr, "s": np.array(2, np.int64)}}, policy_id="p", meta={{"k": [1]}})
        header = fmt.verify_buffer(buf, name="p")
        assert header.tensors["w"].code == "F32" and header.tensors["s"].shape == ()
        assert header.user_meta == {{"k": [1]}}
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


NUMPY_DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
                np.float16, np.float32, np.float64]


@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3, 1)], ids=str)
def test_numpy_arrays_round_trip_exactly_with_their_shape(shape):
    rng = np.random.default_rng(0)
    arrays = {str(np.dtype(d)): rng.integers(0, 2, size=shape).astype(d) for d in NUMPY_DTYPES}
    buf = fmt.pack(arrays, policy_id="p")
    header = fmt.verify_buffer(buf, name="p")
    for name, arr in arrays.items():
        entry = header.tensors[name]
        assert entry.shape == shape
        back = buf[header.data_offset + entry.start : header.data_offset + entry.end].view(arr.dtype)
        assert back.reshape(shape).dtype == arr.dtype and np.array_equal(back.reshape(shape), arr), name
    views = tensor_views(buf, header, "p")
    assert views["float32"].shape == shape  # a 0-d array stays 0-d, not (1,)


class Unpicklable:
    pass


def deep(levels: int) -> dict:
    meta: dict = {}
    for _ in range(levels - 1):
        meta = {"a": meta}
    return meta


@pytest.mark.parametrize(
    "weights, meta, match",
    [
        ({"w": np.arange(4, dtype=">f4")}, None, "byte order"),
        ({"w": torch.empty(3, device="meta")}, None, "meta device"),
        ({"w": torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], layout=torch.jagged)}, None, "nested"),
        ({"w": np.ma.masked_array([1.0, 2.0], mask=[0, 1])}, None, "plain numpy"),
        ({"w": np.zeros(2, dtype=np.complex64)}, None, "not supported"),
        ({"w": torch.zeros(2)}, {1: "a"}, "key 1 of type int"),
        ({"w": torch.zeros(2)}, {"a": {2: "b"}}, "key 2 of type int"),
        ({"w": torch.zeros(2)}, {"a": (1, 2)}, "tuple"),
        ({"w": torch.zeros(2)}, {"a": {1, 2}}, "set"),
        ({"w": torch.zeros(2)}, {"a": b"x"}, "bytes"),
        ({"w": torch.zeros(2)}, {"a": np.float32(1.0)}, "float32"),
        ({"w": torch.zeros(2)}, {"a": float("nan")}, "NaN"),
        ({"w": torch.zeros(2)}, {"a": Unpicklable()}, "Unpicklable"),
        ({"w": torch.zeros(2)}, deep(17), "deeper than 16"),
        ({"w": torch.zeros(2)}, deep(100_000), "deeper than 16"),
        ({"w": torch.zeros(2)}, {"a": "x" * 70_000}, "65536-byte limit"),
        ({"w": torch.zeros(2)}, [("a", 1)], "mapping"),
    ],
    ids=["byte-order", "meta-device", "nested", "masked", "complex", "int-key", "nested-int-key", "tuple", "set",
         "bytes", "numpy-scalar", "nan", "object", "depth-17", "depth-100k", "size", "meta-not-mapping"],
)
def test_bad_input_is_refused_by_name_before_anything_is_allocated(weights, meta, match):
    calls = []
    with pytest.raises(InvalidWeightsError, match=match):
        fmt.pack(weights, policy_id="p", meta=meta, alloc=lambda n: calls.append(n) or np.empty(n, np.uint8))
    assert calls == []


def test_meta_round_trips_exactly_at_the_limits():
    meta = {"nested": deep(15), "list": [1, 2.5, None, True, "s", [{"k": []}]], "big": 10**30, "u": "é☃"}
    buf = fmt.pack({"w": torch.zeros(1)}, policy_id="p", meta=meta)
    assert fmt.verify_buffer(buf, name="p").user_meta == meta


def crafted(entries: dict, data: bytes, metadata: dict | None = None, pad_to: int = 8) -> np.ndarray:
    header = dict(entries)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text = text.ljust(len(text) + (-(8 + len(text)) % pad_to), b" ")
    return np.frombuffer(len(text).to_bytes(8, "little") + text + data, np.uint8)


@pytest.mark.parametrize(
    "buf, match",
    [
        (crafted({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0.0, 8.0]}}, bytes(8)), "malformed"),
        (crafted({"a": {"dtype": "F32", "shape": [2], "data_offsets": [False, 8]}}, bytes(8)), "malformed"),
        (crafted({"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}, bytes(8)), "malformed"),
        (crafted({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, -8]}}, bytes(8)), "malformed"),
        (crafted({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)), "overlap"),
        (crafted({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(8)), "overlap"),
        (crafted({"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, bytes(8)), "malformed"),
        (crafted({"a": {"dtype": "F32", "shape": [10**12], "data_offsets": [0, 8]}}, bytes(8)), "do not match"),
        (crafted({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(8),
                 {fmt.META_USER: "[" * 100_000}), "meta is not a JSON object"),
        (crafted({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(8), {"k": 1}), "strings"),
        (np.frombuffer(b"\x10\x00\x00\x00\x00\x00\x00\x00" + b'{"a":1, "a":2}  ', np.uint8), "duplicate"),
        (np.frombuffer(b"\x10\x00\x00\x00\x00\x00\x00\x00" + b"[" * 16, np.uint8), "not valid JSON"),
        (np.frombuffer((2**63).to_bytes(8, "little") + b"{}", np.uint8), "header length"),
        (np.frombuffer(b"\x05\x00\x00\x00\x00\x00\x00\x00" + b"{}   ", np.uint8), "aligned"),
    ],
    ids=["float-offsets", "bool-offset", "float-shape", "negative", "overlap", "same-range", "dtype", "huge-shape",
         "deep-meta", "non-str-meta", "duplicate-keys", "deep-header", "huge-length", "unaligned"],
)
def test_crafted_headers_are_corrupt_not_crashes(buf, match):
    with pytest.raises(CorruptSnapshotError, match=match):
        fmt.verify_buffer(buf, name="p")


def test_shared_views_strided_and_negative_view_tensors_pack_exactly():
    weights = mixed_weights()
    buf = fmt.pack(weights, policy_id="p")
    buf.flags.writeable = False
    views = tensor_views(buf, fmt.verify_buffer(buf, name="p"), "p@v1")
    again = fmt.pack(views, policy_id="p")  # republishing what a reader holds
    for name, tensor in tensor_views(again, fmt.verify_buffer(again, name="p"), "p@v2").items():
        assert same_bits(tensor, weights[name]), name
    base = torch.randn(4, 6)
    odd = {"strided": base[:, ::2], "neg": torch._neg_view(base), "t": base.t()}
    packed = fmt.pack(odd, policy_id="p")
    out = tensor_views(packed, fmt.verify_buffer(packed, name="p"), "p")
    for name, tensor in odd.items():
        assert torch.equal(out[name], tensor), name
