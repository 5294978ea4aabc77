"""The user handle on a real local Ray: connect, round trips, the process cache, and every bad argument refused
by name before the store is asked."""

from collections.abc import Mapping

import pytest
import torch
from sample_weights import mixed_weights, net, same_bits
from torch import nn

import policystore
from policystore import StoreConfig
from policystore.errors import (
    InvalidPolicyIdError,
    InvalidWeightsError,
    PolicyStoreError,
    ReadOnlyWeightsError,
    UnknownPolicyError,
    UnknownVersionError,
)
from policystore.memory import MiB


def test_every_dtype_round_trips_bitwise_through_the_store(make_store):
    store = make_store()
    weights = mixed_weights()
    sid = store.publish("mixed", weights, meta={"step": 3, "tag": "x"})
    assert sid == policystore.SnapshotId("mixed", 1)
    snap = store.get("mixed")
    assert snap.id == sid and snap.meta == {"step": 3, "tag": "x"} and snap.nbytes > 0
    for name, tensor in weights.items():
        assert same_bits(snap[name], tensor), name
    assert [store.publish("mixed", weights).version for _ in range(2)] == [2, 3]
    assert store.get("mixed").id.version == 3
    assert store.get("mixed", version=1) is snap  # process-local cache of immutable snapshots


def test_write_guard_through_the_store(make_store):
    store = make_store()
    store.publish("main_0", net().state_dict())
    module = store.load_module("main_0", net)
    with pytest.raises(ReadOnlyWeightsError, match="main_0@v1"):
        module[0].weight.add_(1.0)
    with pytest.raises(ReadOnlyWeightsError, match="main_0@v1"):
        module.load_state_dict(net().state_dict())
    with pytest.raises(ReadOnlyWeightsError):
        store.get("main_0")["0.bias"].zero_()
    assert store.verify("main_0").hot is True


BAD_IDS = ["../x", "", "/", "a/b", "..", ".hidden", "x" * 200, 3, None, "sp ace"]


@pytest.mark.parametrize("bad", BAD_IDS, ids=[repr(b)[:12] for b in BAD_IDS])
def test_bad_policy_ids_are_refused_everywhere(make_store, bad):
    store = make_store()
    for call in (lambda: store.publish(bad, {"w": torch.zeros(1)}), lambda: store.get(bad), lambda: store.delete(bad)):
        with pytest.raises(InvalidPolicyIdError, match="policy id"):
            call()
    assert store.list() == []


def test_unknown_policy_and_version_and_bad_versions(make_store):
    store = make_store()
    store.publish("main_0", net().state_dict())
    with pytest.raises(UnknownPolicyError, match="unknown policy 'main_1'.*main_0"):
        store.get("main_1")
    with pytest.raises(UnknownVersionError, match="no version 5.*latest 1"):
        store.get("main_0", version=5)
    for bad in (0, -1, "2", True, 1.0):
        with pytest.raises(InvalidPolicyIdError, match="version"):
            store.get("main_0", version=bad)
    with pytest.raises(UnknownPolicyError):
        store.delete("nobody")


def test_list_pages_through_the_store_and_refuses_bad_cursors(make_store):
    store = make_store()
    for pid in ("b", "a", "b", "c", "a", "b"):
        store.publish(pid, net().state_dict())
    store.delete("b", version=2)
    everything = store.list()
    assert [tuple(i.id) for i in everything] == [("a", 1), ("a", 2), ("b", 1), ("b", 3), ("c", 1)]
    pages, after = [], None
    while page := store.list(limit=2, after=after):
        pages.append([tuple(i.id) for i in page])
        after = page[-1].id
    assert pages == [[("a", 1), ("a", 2)], [("b", 1), ("b", 3)], [("c", 1)]]
    assert [i.id.version for i in store.list("b", limit=5, after=("b", 1))] == [3]
    assert store.list("b", after=("b", 2)) == store.list("b")[1:]  # a deleted version is a valid cursor
    for limit, after in ((0, None), (False, None), ("3", None), (None, "b@v1"), (None, ("b", -1))):
        with pytest.raises(policystore.PolicyStoreError):
            store.list(limit=limit, after=after)


def test_connect_with_a_different_config_is_an_error(make_store):
    store = make_store(hot_capacity_bytes=5 * MiB)
    with pytest.raises(PolicyStoreError, match="already runs with"):
        policystore.connect(StoreConfig(hot_capacity_bytes=6 * MiB, spill_dir=store.config.spill_dir))


class _RepeatingMapping(Mapping):
    """A custom Mapping whose items() repeat a name (a dict cannot)."""

    def __init__(self, tensor: torch.Tensor):
        self._tensor = tensor

    def __getitem__(self, key):
        return self._tensor

    def __len__(self):
        return 2

    def __iter__(self):
        return iter(["w", "w"])


def test_out_of_range_versions_and_repeated_names_are_bad_input(make_store):
    store = make_store()
    store.publish("p", {"w": torch.ones(4)})
    for bad in (2**63, 2**64, -1, True):
        for call in (store.get, store.delete, store.verify, store.load_module):
            args = ("p", net) if call == store.load_module else ("p",)
            with pytest.raises(InvalidPolicyIdError, match="version must be an int"):
                call(*args, version=bad)
    with pytest.raises(InvalidWeightsError, match="'w' twice"):
        store.publish("p", _RepeatingMapping(torch.zeros(2)))
    assert [i.id.version for i in store.list("p")] == [1]
    assert store.verify("p").hot is True


def test_connect_with_an_unusable_spill_dir_names_the_folder(make_store, tmp_path):
    make_store()
    policystore.client.shutdown_all()
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("x")
    with pytest.raises(PolicyStoreError, match=f"could not start.*{not_a_folder}"):
        policystore.connect(StoreConfig(spill_dir=str(not_a_folder)))
    policystore.client.shutdown_all()
    store = make_store()  # a usable folder works again at once
    assert store.publish("p", {"w": torch.ones(1)}).version == 1


def test_compile_and_weight_norm_work_on_store_built_modules(make_store):
    store = make_store()
    source = net()
    store.publish("p", source.state_dict())
    x = torch.randn(3, 64)
    expected = source(x)

    compiled = torch.compile(store.load_module("p", net), backend="eager")  # dynamo traces the guarded weights
    assert torch.allclose(compiled(x), expected)

    def write(weight):
        weight.add_(1)

    with pytest.raises(ReadOnlyWeightsError):  # the guard holds inside compiled code too
        torch.compile(write, backend="eager")(store.load_module("p", net)[0].weight)

    normed = store.load_module("p", net)
    nn.utils.parametrizations.weight_norm(normed[0])  # nn.Parameter(shared Parameter): a guarded alias
    assert torch.allclose(normed(x), expected, atol=1e-5)
    with pytest.raises(ReadOnlyWeightsError):
        normed[0].parametrizations.weight.original1.add_(1)
    assert not isinstance(store.load_module("p", net).state_dict()["0.weight"], nn.Parameter)
    assert torch.equal(store.load_module("p", net)[0].weight, source[0].weight)  # every other module unchanged
    assert store.verify("p").hot is True
