"""Modules built on a snapshot's views (policystore.modules): the skeleton cache, shapes checked by name, what a
build callable may return (no Ray needed)."""

import pytest
import torch
from on_views import build_on, make_net, shared_views
from torch import nn

from policystore import format as fmt
from policystore.errors import InvalidWeightsError, ShapeMismatchError
from policystore.views import SharedTensor


def test_wrong_shapes_name_the_snapshot_and_the_tensors():
    buf = fmt.pack(make_net().state_dict(), policy_id="p")

    def other():
        return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.BatchNorm1d(32), nn.Linear(32, 3))

    with pytest.raises(ShapeMismatchError, match=r"p@v2.*0\.weight"):
        build_on(other, buf, "p@v2")
    with pytest.raises(ShapeMismatchError, match="missing from snapshot"):
        build_on(lambda: nn.Sequential(make_net(), nn.Linear(3, 1)), buf, "p@v2")


class Counted:
    """A build callable that counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self) -> nn.Module:
        self.calls += 1
        return make_net()


def test_the_skeleton_is_built_once_per_build_callable_and_clones_share_no_state():
    _, buf = shared_views(make_net().eval())
    build = Counted()
    a = build_on(build, buf, "p@v1")
    b = build_on(build, buf, "p@v1")
    assert build.calls == 1
    assert a is not b and a[0] is not b[0] and a[0]._parameters is not b[0]._parameters
    lo, hi = buf.ctypes.data, buf.ctypes.data + buf.nbytes
    for module in (a, b):
        assert not module.training and all(not m.training for m in module.modules())
        for name, tensor in module.state_dict().items():
            assert isinstance(tensor, SharedTensor) and lo <= tensor.data_ptr() < hi, name
    a.train()
    a[0].extra = nn.Linear(1, 1)
    a[0].register_forward_hook(lambda *args: None)
    a[1] = nn.Tanh()
    assert not b.training and "extra" not in b[0]._modules and not b[0]._forward_hooks
    assert isinstance(b[1], nn.ReLU)
    x = torch.randn(3, 8)
    assert torch.equal(b(x), build_on(make_net, buf, "p@v1")(x))


def test_a_build_method_is_cached_too_and_a_changed_architecture_is_rebuilt():
    class Factory:
        hidden = 16
        calls = 0

        def build(self) -> nn.Module:
            self.calls += 1
            return nn.Sequential(nn.Linear(8, self.hidden), nn.ReLU(), nn.Linear(self.hidden, 3))

    factory = Factory()
    _, small_buf = shared_views(factory.build())
    build_on(factory.build, small_buf, "p@v1")
    build_on(factory.build, small_buf, "p@v1")
    assert factory.calls == 2  # one for the source weights, one skeleton
    factory.hidden = 32
    _, big_buf = shared_views(factory.build(), "p@v2")
    module = build_on(factory.build, big_buf, "p@v2")
    assert module[0].out_features == 32


def test_recurrent_modules_run_on_views():
    torch.manual_seed(0)
    source = nn.LSTM(4, 8, batch_first=True).eval()
    _, buf = shared_views(source)
    x = torch.randn(2, 5, 4)
    for _ in range(2):  # built, then cloned from the skeleton
        module = build_on(lambda: nn.LSTM(4, 8, batch_first=True), buf, "p@v1")
        assert torch.equal(module(x)[0], source(x)[0])


def test_a_build_that_is_not_a_module_is_refused():
    _, buf = shared_views(make_net())
    with pytest.raises(InvalidWeightsError, match="must return a torch.nn.Module.*dict"):
        build_on(lambda: {"w": torch.zeros(1)}, buf, "p@v1")


def test_non_persistent_buffers_are_named():
    class WithTable(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)
            self.register_buffer("table", torch.arange(4.0), persistent=False)

    _, buf = shared_views(WithTable())
    with pytest.raises(ShapeMismatchError, match="non-persistent buffers.*table"):
        build_on(WithTable, buf, "p@v1")


def test_an_unhashable_build_object_is_cached_by_identity():
    from dataclasses import dataclass

    @dataclass  # eq=True without frozen: instances are unhashable, like many spec objects
    class Spec:
        hidden: int
        calls: int = 0

        def build(self) -> nn.Module:
            self.calls += 1
            return nn.Linear(4, self.hidden)

    spec = Spec(8)
    _, buf = shared_views(nn.Linear(4, 8))
    for _ in range(3):
        build_on(spec.build, buf, "p@v1")
    assert spec.calls == 1


def test_a_build_returning_an_existing_module_leaves_it_untouched():
    mine = make_net().train()
    weight = mine[0].weight
    _, buf = shared_views(make_net())
    module = build_on(lambda: mine, buf, "p@v1")
    assert mine.training and mine[0].weight is weight and not module.training
    assert isinstance(module[0].weight, SharedTensor)
