"""The write guard on a snapshot's views and on modules built on them (no Ray needed: the guard lives in the
tensors)."""

import contextlib
import copy
import pickle
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from on_views import build_on, make_net, shared_views
from torch import nn

from policystore import format as fmt
from policystore.errors import ReadOnlyWeightsError
from policystore.views import SharedParameter, SharedTensor, fast_reads, tensor_views


@pytest.fixture
def shared():
    torch.manual_seed(0)
    source = make_net().eval()
    buf = fmt.pack(source.state_dict(), policy_id="p")
    buf.flags.writeable = False  # as ray.get hands it out
    fmt.verify_buffer(buf, name="p")
    module = build_on(make_net, buf)
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


def test_deepcopy_gives_a_private_trainable_module_and_leaves_the_views_alone(shared):
    source, module, buf = shared
    before = bytes(buf)
    x = torch.randn(4, 8)
    copy_ = copy.deepcopy(module)
    assert all(type(p) is nn.Parameter for p in copy_.parameters())
    assert all(type(b) is torch.Tensor for b in copy_.buffers())
    assert torch.equal(copy_(x), source(x))
    copy_.load_state_dict(make_net().state_dict())  # the copy's own refusal hook looks at the copy
    copy_.train().requires_grad_(True)
    optimizer = torch.optim.SGD(copy_.parameters(), lr=0.5)
    copy_(x).sum().backward()
    optimizer.step()
    assert bytes(buf) == before and torch.equal(module(x), source(x))
    with pytest.raises(ReadOnlyWeightsError, match="p@v1"):  # and the original still refuses
        module.load_state_dict(make_net().state_dict())


def test_views_save_and_pickle_as_plain_copies_of_their_own_values(tmp_path):
    source = nn.Sequential(nn.Linear(256, 256), nn.BatchNorm1d(256)).eval()  # float32 and an int64 in one buffer
    views, buf = shared_views(source)
    torch.save(views, tmp_path / "opponent.pt")  # refused before: one storage seen as two dtypes
    back = torch.load(tmp_path / "opponent.pt", weights_only=True)
    assert {k: type(v) for k, v in back.items()} == dict.fromkeys(views, torch.Tensor)
    assert all(torch.equal(back[k], v) for k, v in source.state_dict().items())
    torch.save(source.state_dict(), tmp_path / "private.pt")  # each tensor's bytes once, not the whole buffer each
    assert (tmp_path / "opponent.pt").stat().st_size <= 1.1 * (tmp_path / "private.pt").stat().st_size
    module = build_on(lambda: nn.Sequential(nn.Linear(256, 256), nn.BatchNorm1d(256)), buf)
    param = pickle.loads(pickle.dumps(module[0].weight))
    assert type(param) is nn.Parameter and torch.equal(param, source[0].weight)
    param.data.add_(1)  # a private copy
    assert torch.equal(module[0].weight, source[0].weight)


def test_module_parameters_are_parameters_apart_from_the_views(shared):
    _, module, _ = shared
    weight = module[0].weight
    assert isinstance(weight, nn.Parameter) and isinstance(weight, SharedTensor)
    assert weight.is_leaf and weight.grad_fn is None
    state = module.state_dict(keep_vars=False)
    assert not isinstance(state["0.weight"], nn.Parameter) and isinstance(state["0.weight"], SharedTensor)
    module.requires_grad_(True)  # flips the Parameters' flag: the views under them stay as they were
    assert weight.requires_grad and not state["0.weight"].requires_grad


INFERENCE_WRITES = {
    "Embedding(max_norm) forward": lambda w: nn.Embedding.from_pretrained(w, max_norm=1.0)(torch.tensor([0, 3])),
    "F.embedding max_norm": lambda w: F.embedding(torch.tensor([1]), w, max_norm=0.5),
    "F.embedding max_norm positional": lambda w: F.embedding(torch.tensor([1]), w, None, 0.5),
    "F.embedding_bag max_norm": lambda w: F.embedding_bag(torch.tensor([1, 2]), w, torch.tensor([0]), max_norm=0.5),
    "embedding_renorm_": lambda w: torch.embedding_renorm_(w, torch.tensor([1]), 0.5, 2.0),
    "F.relu inplace": lambda w: F.relu(w, inplace=True),
    "F.relu inplace positional": lambda w: F.relu(w, True),
    "F.leaky_relu inplace": lambda w: F.leaky_relu(w, 0.1, True),
    "F.elu inplace": lambda w: F.elu(w, inplace=True),
    "F.hardtanh inplace": lambda w: F.hardtanh(w, inplace=True),
    "F.threshold inplace": lambda w: F.threshold(w, 0.1, 0.0, True),
    "F.silu inplace": lambda w: F.silu(w, inplace=True),
    "F.dropout inplace": lambda w: F.dropout(w, 0.5, True, True),
    "F.relu_": lambda w: F.relu_(w),
}


@pytest.mark.parametrize("write", INFERENCE_WRITES.values(), ids=INFERENCE_WRITES.keys())
def test_ordinary_inference_that_would_write_is_refused(write):
    views, buf = shared_views(nn.Embedding(16, 4))
    before = bytes(buf)
    with pytest.raises(ReadOnlyWeightsError, match="p@v1"):
        write(views["weight"])
    assert bytes(buf) == before


def test_out_of_place_functionals_and_plain_embedding_lookups_still_work():
    views, buf = shared_views(nn.Embedding(16, 4))
    w = views["weight"]
    assert torch.equal(F.relu(w), torch.relu(w.clone()))
    assert torch.equal(F.embedding(torch.tensor([2]), w), w[2:3])
    module = build_on(lambda: nn.Embedding(16, 4), buf, "p@v1")
    assert torch.equal(module(torch.tensor([5])), w[5:6])


def test_fast_reads_computes_the_same_without_the_guard(shared):
    source, module, _ = shared
    x = torch.randn(4, 8)
    with torch.no_grad(), fast_reads():
        fast = module(x)
        assert type(module[0].weight * 1) is torch.Tensor
    assert torch.equal(fast, module(x)) and torch.equal(fast, source(x))
    with pytest.raises(ReadOnlyWeightsError):  # the guard is back after the block
        module[0].weight.add_(1)


def test_importing_views_installs_no_warning_filter_and_views_warn_nothing():
    code = "import warnings, policystore.views; print([str(f[1] and f[1].pattern) for f in warnings.filters])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "not writable" not in out.stdout, out.stdout + out.stderr
    buf = fmt.pack({"w": torch.randn(4)}, policy_id="p")
    buf.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensor_views(buf, fmt.parse_header(buf, name="p"), "p@v1")


def total(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# Ways to rebind what a module's tensors are (storage, shape, dtype) without writing a byte of shared memory
REBINDS = {
    "set_": lambda m: m[0].weight.set_(torch.zeros(16, 8)),
    "parametrizations.orthogonal": lambda m: torch.nn.utils.parametrizations.orthogonal(m[0]),
    ".data =": lambda m: setattr(m[0].weight, "data", torch.zeros(16, 8)),
    "buffer .data =": lambda m: setattr(m[2].running_mean, "data", torch.ones(16)),
    "t_": lambda m: m[3].weight.t_(),
    "transpose_": lambda m: m[3].weight.transpose_(0, 1),
    "swapdims_": lambda m: m[3].weight.swapdims_(0, 1),
    "as_strided_": lambda m: m[0].weight.as_strided_((16, 8), (1, 16)),
    "unsqueeze_": lambda m: m[0].bias.unsqueeze_(0),
    "squeeze_": lambda m: m[2].num_batches_tracked.squeeze_(),
    "resize_": lambda m: m[0].weight.resize_(4, 4),
    "resize_as_": lambda m: m[0].weight.resize_as_(torch.zeros(4, 4)),
    "module.half()": lambda m: m.half(),
    "module.to(dtype)": lambda m: m.to(torch.float64),
    "to_empty": lambda m: m.to_empty(device="cpu"),
    "vector_to_parameters": lambda m: torch.nn.utils.vector_to_parameters(torch.zeros(total(m)), m.parameters()),
}


@pytest.mark.parametrize("fast", [False, True], ids=["guarded", "fast_reads"])
@pytest.mark.parametrize("rebind", REBINDS.values(), ids=REBINDS.keys())
def test_rebinding_a_modules_tensors_is_refused_and_changes_no_other_module(shared, rebind, fast):
    source, module, buf = shared
    other = build_on(make_net, buf)
    x = torch.randn(5, 8)
    with pytest.raises(ReadOnlyWeightsError, match="p@v1"), fast_reads() if fast else contextlib.nullcontext():
        rebind(module)
    later = build_on(make_net, buf)
    for m in (module, other, later):
        assert torch.equal(m(x), source(x))
        assert all(type(t) in (SharedTensor, SharedParameter) for t in m.state_dict(keep_vars=True).values())


def test_share_memory_is_a_no_op_and_a_write_after_it_still_meets_the_guard(shared):
    """torch's share_memory_ would move the snapshot buffer under every view in the process to a private, writable
    shared-memory copy, out of reach of the OS protection."""
    source, module, buf = shared
    lo, hi = buf.ctypes.data, buf.ctypes.data + buf.nbytes
    for fast in (False, True):
        with fast_reads() if fast else contextlib.nullcontext():
            assert module.share_memory() is module and module[0].weight.share_memory_() is module[0].weight
        assert all(lo <= t.data_ptr() < hi for t in module.state_dict().values())
    with pytest.raises(ReadOnlyWeightsError, match="p@v1"):
        module[0].weight.add_(1)
    assert module.to("cpu") is module and module.float() is module  # conversions that change nothing still work


def test_modules_on_one_snapshot_own_their_tensor_objects(shared):
    """Even a rebinding that gets past every guard (torch's unbound C method) changes only the module it is done to:
    other modules and the views of the snapshot keep their own objects, and later modules are made afresh."""
    source, module, buf = shared
    views = tensor_views(buf, fmt.parse_header(buf, name="p"), "p@v1")
    other = build_on(make_net, buf)
    assert all(a is not b for a, b in zip(module.parameters(), other.parameters(), strict=True))
    assert all(a is not b for a, b in zip(module.buffers(), other.buffers(), strict=True))
    with fast_reads():
        torch.Tensor.set_(module[0].weight, torch.zeros(16, 8))
        torch.Tensor.t_(module[3].weight)
    x = torch.randn(5, 8)
    assert not torch.equal(module[0].weight, source[0].weight)
    for m in (other, build_on(make_net, buf)):
        assert torch.equal(m(x), source(x))
    assert torch.equal(views["0.weight"], source[0].weight)


VIEW_REBINDS = {
    "set_": lambda v: v.set_(torch.zeros(3)),
    ".data =": lambda v: setattr(v, "data", torch.zeros(16, 8)),
    "t_": lambda v: v.t_(),
    "resize_": lambda v: v.resize_(2),
}


@pytest.mark.parametrize("rebind", VIEW_REBINDS.values(), ids=VIEW_REBINDS.keys())
def test_views_of_a_snapshot_refuse_rebinding_inside_fast_reads_too(rebind):
    """A process's Snapshot hands the same view objects to every caller of get()."""
    source = make_net().eval()
    views, _ = shared_views(source)
    with fast_reads(), pytest.raises(ReadOnlyWeightsError, match="p@v1"):
        rebind(views["0.weight"])
    assert torch.equal(views["0.weight"], source[0].weight) and views["0.weight"].shape == (16, 8)
