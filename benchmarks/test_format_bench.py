"""pytest-benchmark microbenchmarks of the snapshot format: pack, header parse, checksum, view creation, module
build (a cached skeleton, cloned per call), a forward pass guarded versus in ``fast_reads()``, and the OS write
protection's open/release cycle.

Not part of the default test run (pytest's testpaths is tests/). Run them with
    python -m pytest -n 0 benchmarks/test_format_bench.py --benchmark-enable   # -n 0: no timing under xdist
Without --benchmark-enable (the project default) each runs once, as a quick correctness pass.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.nets import NetSpec, random_weights
from policystore import protect
from policystore.format import checksum_of, iter_data, pack, parse_header, verify_buffer
from policystore.memory import MiB
from policystore.modules import build_on_views
from policystore.views import fast_reads, tensor_views

SIZES = [1, 16]


@pytest.fixture(scope="module", params=SIZES, ids=[f"{s}MiB" for s in SIZES])
def case(request):
    spec = NetSpec.for_bytes("mlp", request.param * MiB)
    weights = random_weights(spec, 0)
    buf = pack(weights, policy_id="bench")
    return spec, weights, buf, parse_header(buf, name="bench")


def test_pack(benchmark, case):
    spec, weights, buf, _ = case
    out = benchmark(pack, weights, policy_id="bench")
    assert len(out) == len(buf)


def test_parse_header(benchmark, case):
    _, weights, buf, _ = case
    header = benchmark(parse_header, buf, name="bench")
    assert set(header.tensors) == set(weights)


def test_checksum(benchmark, case):
    _, _, buf, header = case
    assert benchmark(lambda: checksum_of(header, iter_data(header, buf))) == header.checksum


def test_verify_buffer(benchmark, case):
    _, _, buf, header = case
    assert benchmark(verify_buffer, buf, name="bench").checksum == header.checksum


def test_tensor_views(benchmark, case):
    _, weights, buf, header = case
    views = benchmark(tensor_views, buf, header, "bench")
    name = next(iter(weights))
    assert torch.equal(views[name], weights[name])


def test_build_on_views(benchmark, case):
    spec, _, buf, header = case
    module = benchmark(build_on_views, spec, buf, header, "bench")
    with torch.no_grad():
        assert module(spec.example_input()).shape == (1, 16)


@pytest.fixture(scope="module")
def shared_module(case):
    """A module on guarded views of a read-only buffer, as a reader holds it."""
    spec, _, buf, header = case
    buf = buf.copy()
    buf.flags.writeable = False
    return build_on_views(spec, buf, header, "bench"), spec.example_input()


def _forward(module, x):
    with torch.no_grad():
        return module(x)


def _forward_fast(module, x):
    with torch.no_grad(), fast_reads():
        return module(x)


def test_forward_guarded(benchmark, shared_module):
    """A forward pass over guarded views: every op goes through SharedTensor's __torch_function__."""
    module, x = shared_module
    assert type(benchmark(_forward, module, x)) is torch.Tensor


def test_forward_fast_reads(benchmark, shared_module):
    """The same forward in fast_reads(): plain-tensor dispatch (writes are stopped by the OS protection)."""
    module, x = shared_module
    out = benchmark(_forward_fast, module, x)
    assert torch.equal(out, _forward(module, x))


def padded(nbytes: int):
    """A snapshot-sized buffer between two pages of padding, laid out as the object store lays out shareable()."""
    whole = np.ones(2 * protect.PAD_BYTES + nbytes, dtype=np.uint8)  # written: every page is mapped
    return whole[: protect.PAD_BYTES], whole[protect.PAD_BYTES : -protect.PAD_BYTES], whole[-protect.PAD_BYTES :]


def test_protect_open_release(benchmark, case):
    """What the OS write protection costs a reader per snapshot: mprotect on open, and again when the last view goes."""
    _, _, buf, _ = case
    obj = padded(len(buf))

    def cycle() -> int:
        arr = protect.open_shared(obj)
        n = protect.protected_ranges()
        del arr
        return n

    assert benchmark(cycle) == 1
    assert protect.protected_ranges() == 0
