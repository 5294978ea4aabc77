"""Version <-> file name, both ways, for every accepted version; and the largest versions through a store restart
(real Ray, real files: the spill scan, the durable tier, ``open_folder``)."""

import functools
import os
import signal

import pytest
import ray
import torch
from helpers import RESTARTING, eventually
from hypothesis import given
from hypothesis import strategies as st

import policystore
from policystore.catalog import MAX_REPORTED_VERSION
from policystore.durable import DurableTier, data_version, marker_version
from policystore.errors import InvalidPolicyIdError
from policystore.filenames import parse_name, policy_folder, policy_of, split_name, version_name, version_of
from policystore.format import pack, parse_header
from policystore.ids import MAX_VERSION, SnapshotId
from policystore.remote import NAMESPACE, store_name
from policystore.spill import file_name, parse_file_name


@given(st.integers(1, MAX_VERSION), st.sampled_from(["", ".safetensors", ".safetensors.lz4", ".commit.json"]))
def test_every_version_has_one_name_and_comes_back_from_it(version, suffix):
    name = version_name(version, suffix)
    assert parse_name(name, suffix) == version
    assert version_of(name.removesuffix(suffix)) == version
    assert parse_name("0" + name, suffix) is None  # a second name for the same version is never accepted


@pytest.mark.parametrize("version", [1, 9_999_999_999, 10_000_000_000, MAX_VERSION])
def test_every_tier_names_and_parses_through_the_one_helper(version):
    for compressed in (False, True):
        assert parse_file_name(file_name(version, compressed)) == (version, compressed)
    assert marker_version(version_name(version, ".commit.json")) == version
    data = version_name(version, ".0123abcd.safetensors")
    assert data_version(data) == version and split_name(data) == (version, ".0123abcd.safetensors")


@pytest.mark.parametrize("name", ["", "1.safetensors", "0000000000.safetensors", f"{MAX_VERSION + 1}.safetensors",
                                  "00000000001.safetensors", "+000000001.safetensors", "٠٠٠٠٠٠٠٠٠١.safetensors",
                                  "0000000001.safetensors.gz", "0000000001"])
def test_names_that_are_not_a_version_are_refused(name):
    assert parse_file_name(name) is None


@pytest.mark.parametrize("bad", ["..", "../x", "a/b", "/abs", "", ".hidden", "x" * 129, "sp ace"])
def test_no_tier_joins_a_path_outside_its_root(bad, tmp_path):
    """The one traversal check: every tier's path goes through ``policy_folder``, whatever its caller checked."""
    with pytest.raises(InvalidPolicyIdError):
        policy_folder(bad)
    assert policy_of(bad) is None
    with pytest.raises(InvalidPolicyIdError):
        DurableTier.open(f"file://{tmp_path}").deleted(SnapshotId(bad, 1))
    assert policy_of("main_0") == policy_folder("main_0") == "main_0"


def _store_pid(store) -> int:
    actor = ray.get_actor(store_name(store.stats().node_id), namespace=NAMESPACE)
    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))


def test_the_largest_versions_survive_a_store_restart(make_store, tmp_path):
    """A durable marker just below the largest version a catalog hands out is adopted; the next publishes get the
    versions after it up to that largest one, land on disk with 19-digit names, and a killed store finds them again
    on its disk (not only in the durable tier); a publish past it is refused, never acknowledged."""
    uri = tmp_path / "durable"
    top = MAX_REPORTED_VERSION  # the largest version a catalog hands out or adopts (its counters fit in sqlite)
    first = top - 2
    buf = pack({"w": torch.arange(5.0)}, policy_id="big", meta={"step": 0})
    DurableTier.open(str(uri)).write(SnapshotId("big", first), buf, parse_header(buf, name="big"))
    store = make_store(durable_uri=str(uri))  # a new catalog database: adopts the marker
    weights = {v: {"w": torch.full((1000,), float(v % 1000))} for v in (first + 1, top)}
    assert store.publish("big", weights[first + 1]) == ("big", first + 1)
    assert store.publish("big", weights[top]) == ("big", top)
    store.flush()
    names = sorted(p.name for p in (tmp_path / "spill" / "big").iterdir())
    assert [parse_file_name(n)[0] for n in names] == [first + 1, top] and len(names[-1].partition(".")[0]) == 19
    os.kill(_store_pid(store), signal.SIGKILL)  # Ray restarts it; it rebuilds from its disk scan
    policystore.clear_cache()
    rows = eventually(lambda: [r for r in store.list("big") if r.on_disk], "the restarted store's disk scan",
                      ignore=RESTARTING)
    assert [r.id.version for r in rows] == [first + 1, top]
    for v in (first + 1, top):
        got = eventually(functools.partial(store.get, "big", v), f"big@v{v}", ignore=RESTARTING)
        assert torch.equal(got["w"], weights[v]["w"])
    assert store.latest_version("big") == top
    with pytest.raises(InvalidPolicyIdError, match="used every version"):  # never a version no store could report
        store.publish("big", weights[top])
    with policystore.open_folder(tmp_path / "spill") as folder:
        assert [i.id.version for i in folder.list("big")] == [first + 1, top]
    eventually(lambda: DurableTier.open(str(uri)).committed_ids() >= {SnapshotId("big", v) for v in (first, top)},
               "the uploads", ignore=RESTARTING)
    with policystore.open_folder(uri) as folder:
        assert {i.id.version for i in folder.list("big")} >= {first, top}
