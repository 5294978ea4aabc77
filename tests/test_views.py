"""The write guard and modules built on shared views (no Ray needed: the guard lives in the tensors)."""

import pytest
import torch
from torch import nn

from policystore import format as fmt
from policystore.errors import ReadOnlyWeightsError, ShapeMismatchError
from policystore.views import SharedTensor, build_on_views, tensor_views


def make_net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.BatchNorm1d(16), nn.Linear(16, 3))


@pytest.fixture
def shared():
    torch.manual_seed(0)
    source = make_net().eval()
    buf = fmt.pack(source.state_dict(), policy_id="p")
    buf.flags.writeable = False  # as ray.get hands it out
    module = build_on_views(make_net, tensor_views(buf, fmt.verify_buffer(buf, name="p"), "p@v1"), "p@v1")
    return source, module, buf


def test_module_computes_like_the_source_and_owns_no_weights(shared):
    source, module, buf = shared
    x = torch.randn(5, 8)
    assert torch.equal(module(x), source(x))
    assert not module.training
    lo, hi = buf.ctypes.data, buf.ctypes.data + buf.nbytes
    for name, tensor in module.state_dict().items():
        assert isinstance(tensor, SharedTensor), name
        assert lo <= tensor.data_ptr() < hi, f"{name} is not a view of the snapshot buffer"
    assert all(not p.requires_grad for p in module.parameters())


WRITES = {
    "add_": lambda p, m: p.add_(1),
    "copy_": lambda p, m: p.copy_(torch.zeros_like(p)),
    "setitem": lambda p, m: p.__setitem__(0, 1.0),
    "iadd": lambda p, m: p.__iadd__(1),
    ".data.mul_": lambda p, m: p.data.mul_(2),
    ".detach().zero_": lambda p, m: p.detach().zero_(),
    ".t().fill_": lambda p, m: p.t().fill_(0),
    "view slice": lambda p, m: p.view(-1)[:3].fill_(0),
    "out=": lambda p, m: torch.add(p, 1, out=p),
    "nn.init": lambda p, m: nn.init.kaiming_uniform_(p),
    "foreach": lambda p, m: torch._foreach_add_([p], 1.0),
    "relu_": lambda p, m: torch.relu_(p),
    "load_state_dict": lambda p, m: m.load_state_dict(make_net().state_dict()),
    "submodule load_state_dict": lambda p, m: m[0].load_state_dict(make_net()[0].state_dict()),
}


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_writes_into_shared_weights_raise_and_change_nothing(shared, write):
    _, module, buf = shared
    before = bytes(buf)
    param = module[0].weight
    with pytest.raises(ReadOnlyWeightsError, match="p@v1"):
        write(param, module)
    assert bytes(buf) == before


@pytest.mark.parametrize("opt", [torch.optim.SGD, torch.optim.Adam])
def test_optimizer_steps_are_refused(shared, opt):
    _, module, buf = shared
    before = bytes(buf)
    linear = module[0]
    for p in linear.parameters():
        p.requires_grad_(True)
    linear(torch.randn(4, 8)).sum().backward()
    with pytest.raises(ReadOnlyWeightsError):
        opt(linear.parameters(), lr=0.1).step()
    assert bytes(buf) == before


def test_training_mode_batchnorm_cannot_update_running_stats(shared):
    _, module, buf = shared
    before = bytes(buf)
    with pytest.raises(ReadOnlyWeightsError):
        module.train()(torch.randn(4, 8))
    assert bytes(buf) == before


def test_functional_batch_norm_in_training_mode_is_refused(shared):
    _, module, buf = shared
    bn = module[2]
    before = bytes(buf)
    with pytest.raises(ReadOnlyWeightsError):
        torch.nn.functional.batch_norm(torch.randn(4, 16), bn.running_mean, bn.running_var, training=True)
    assert bytes(buf) == before


def test_numpy_view_stays_read_only(shared):
    _, module, _ = shared
    with pytest.raises(ValueError, match="read-only"):
        module[0].weight.numpy()[0, 0] = 1.0


def test_reads_give_plain_private_tensors(shared):
    _, module, _ = shared
    w = module[0].weight
    assert type(w * 2) is torch.Tensor
    clone = w.clone()
    assert type(clone) is torch.Tensor
    clone.add_(1)  # a private copy is writable
    assert type(module(torch.randn(2, 8))) is torch.Tensor


def test_assign_rebinds_without_touching_shared_memory(shared):
    _, module, buf = shared
    before = bytes(buf)
    fresh = make_net().state_dict()
    module.load_state_dict(fresh, assign=True)
    assert torch.equal(module[0].weight, fresh["0.weight"])
    assert bytes(buf) == before


def test_wrong_shapes_name_the_snapshot_and_the_tensors():
    buf = fmt.pack(make_net().state_dict(), policy_id="p")
    views = tensor_views(buf, fmt.parse_header(buf, name="p"), "p@v2")

    def other():
        return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.BatchNorm1d(32), nn.Linear(32, 3))

    with pytest.raises(ShapeMismatchError, match=r"p@v2.*0\.weight"):
        build_on_views(other, views, "p@v2")
    with pytest.raises(ShapeMismatchError, match="missing from snapshot"):
        build_on_views(lambda: nn.Sequential(make_net(), nn.Linear(3, 1)), views, "p@v2")
