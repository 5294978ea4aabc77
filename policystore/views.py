"""Zero-copy torch views of a snapshot buffer, guarded against writes, and modules built on them.

torch ignores numpy's read-only flag: a view of a plasma buffer can be written, and the write reaches every
process on the node (../shared/design-notes.md). So every tensor handed out is a ``SharedTensor``, a
``torch.Tensor`` subclass whose ``__torch_function__`` refuses in-place ops (``add_``, ``copy_``, ``__setitem__``,
``out=``, optimizer ``_foreach_*_`` steps, ``load_state_dict`` into it...) with ReadOnlyWeightsError. Results that
alias the shared memory (``.data``, ``.t()``, ``.view()``, slices, ``.detach()``) stay guarded; anything computed
from the weights comes back as a plain tensor.

What cannot be guarded (document, and ``PolicyStore.verify`` detects it): writes through ``untyped_storage()``,
``data_ptr()`` with ctypes, or C extensions that take the raw pointer.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from .errors import ReadOnlyWeightsError, ShapeMismatchError
from .format import Header

_INPLACE_DUNDERS = frozenset(
    f"__i{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor",
                            "lshift", "rshift")
) | {"__setitem__", "__set__"}
_HARMLESS_INPLACE = frozenset({"requires_grad_", "share_memory_", "retain_grad"})

warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)


def _func_name(func: Callable) -> str:
    return getattr(func, "__name__", "") or getattr(getattr(func, "__func__", None), "__name__", "")


_IN_PLACE: dict[Callable, bool] = {}


def _is_in_place(func: Callable) -> bool:
    """torch's naming convention: ``op_`` and ``__iop__`` write into their first argument (cached per func)."""
    known = _IN_PLACE.get(func)
    if known is None:
        name = _func_name(func)
        known = name in _INPLACE_DUNDERS or (
            name.endswith("_") and not name.endswith("__") and name not in _HARMLESS_INPLACE
        )
        _IN_PLACE[func] = known
    return known


def _any_shared(value: Any) -> SharedTensor | None:
    if isinstance(value, SharedTensor):
        return value
    if isinstance(value, (list, tuple)):
        return next((v for v in value if isinstance(v, SharedTensor)), None)
    return None


def _written_shared(func: Callable, args: tuple, kwargs: dict) -> SharedTensor | None:
    """The shared tensor ``func`` would write into, if any."""
    if _is_in_place(func):
        # the target is the first argument; torch.nn.init.* pass it by keyword
        target = _any_shared(args[0] if args else next(iter(kwargs.values()), None))
        if target is not None:
            return target
    if _func_name(func) in ("batch_norm", "instance_norm") and _norm_is_training(args, kwargs):
        # functional norms update their running statistics in place while training
        stats = [kwargs.get(k) for k in ("running_mean", "running_var")] + list(args[1:3])
        target = next((t for t in stats if isinstance(t, SharedTensor)), None)
        if target is not None:
            return target
    return _any_shared(kwargs.get("out")) if "out" in kwargs else None


def _norm_is_training(args: tuple, kwargs: dict) -> bool:
    flag = kwargs.get("training", kwargs.get("use_input_stats"))
    if flag is None and len(args) > 5:
        flag = args[5]
    return bool(flag)


class SharedTensor(torch.Tensor):
    """A read-only view into a snapshot in the node's shared memory.

    Behaves like a plain tensor for every read; in-place writes raise ReadOnlyWeightsError naming the snapshot.
    Use ``.clone()`` for a private, writable copy.
    """

    snapshot: str = "?"
    _span: tuple[int, int] = (0, 0)  # address range of the snapshot buffer, to spot results that alias it

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = _written_shared(func, args, kwargs)
        if target is not None:
            raise ReadOnlyWeightsError(
                f"{_func_name(func)}() would write into shared snapshot {target.snapshot}, which every process on "
                "this node maps; the store's weights are read-only. Take a private copy first (tensor.clone(), "
                "or a normally built module + load_state_dict(snapshot)) if you need to change them."
            )
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*args, **kwargs)
            source = _any_shared(args[0]) if args else None
            if source is None:
                source = next((s for s in map(_any_shared, (*args, *kwargs.values())) if s is not None), None)
            return result if source is None else _guard_aliases(result, source)


def _guard_aliases(result: Any, source: SharedTensor) -> Any:
    """Keep the guard on results that alias the snapshot's memory; hand back plain tensors otherwise.

    Runs with torch-function dispatch disabled.
    """
    if type(result) is torch.Tensor:
        lo, hi = source._span
        if lo <= result.data_ptr() < hi:
            return _as_shared(result, source.snapshot, source._span)
        return result
    if isinstance(result, (tuple, list)):
        return type(result)(_guard_aliases(r, source) for r in result)
    if isinstance(result, np.ndarray):
        result.flags.writeable = False  # Tensor.numpy() of a shared tensor: keep numpy's own guard on
    return result


def _as_shared(tensor: torch.Tensor, snapshot: str, span: tuple[int, int]) -> SharedTensor:
    shared = tensor.as_subclass(SharedTensor)
    shared.snapshot = snapshot
    shared._span = span
    return shared


def tensor_views(buf: np.ndarray, header: Header, snapshot: str) -> dict[str, SharedTensor]:
    """One guarded view per tensor, all over ``buf`` (no bytes are copied)."""
    base = torch.frombuffer(memoryview(buf).cast("B"), dtype=torch.uint8)
    span = (base.data_ptr(), base.data_ptr() + base.numel())
    views: dict[str, SharedTensor] = {}
    for name, entry in header.tensors.items():
        if entry.end == entry.start:
            plain = torch.empty(entry.shape, dtype=entry.dtype)
        else:
            raw = base[header.data_offset + entry.start : header.data_offset + entry.end]
            plain = raw.view(entry.dtype).view(entry.shape)
        views[name] = _as_shared(plain, snapshot, span)
    return views


def build_on_views(build: Callable[[], nn.Module], views: dict[str, SharedTensor], snapshot: str) -> nn.Module:
    """Build ``build()`` on the meta device (no parameter memory) and make the shared views its state.

    The module is in eval mode with requires_grad=False; its parameters and buffers ARE the views.
    """
    with torch.device("meta"):
        module = build()
    if not isinstance(module, nn.Module):
        raise TypeError(f"build() must return a torch.nn.Module, got {type(module).__name__}")
    expected = module.state_dict(keep_vars=True)
    missing = sorted(set(expected) - set(views))
    unexpected = sorted(set(views) - set(expected))
    wrong = [
        f"{k}: module {tuple(expected[k].shape)} {expected[k].dtype}, snapshot {tuple(views[k].shape)} {views[k].dtype}"
        for k in sorted(set(expected) & set(views))
        if expected[k].shape != views[k].shape or expected[k].dtype != views[k].dtype
    ]
    if missing or unexpected or wrong:
        problems = []
        if missing:
            problems.append(f"missing from snapshot: {missing}")
        if unexpected:
            problems.append(f"not in module: {unexpected}")
        if wrong:
            problems.append("shape/dtype mismatch: " + "; ".join(wrong))
        raise ShapeMismatchError(f"snapshot {snapshot} does not fit {type(module).__name__}: " + " | ".join(problems))
    module.load_state_dict(views, strict=True, assign=True)
    for param in module.parameters():
        param.requires_grad_(False)
    for sub in module.modules():
        sub.register_load_state_dict_pre_hook(_refuse_load_into_views)
    return module.eval()


def _refuse_load_into_views(module: nn.Module, state_dict, prefix, local_metadata, *args) -> None:
    """load_state_dict would copy_ into the shared views; refuse up front with the snapshot's name.

    ``assign=True`` only rebinds the module's attributes to new tensors, which leaves shared memory alone.
    """
    if local_metadata.get("assign_to_params_buffers"):
        return
    own = [t for t in (*module._parameters.values(), *module._buffers.values()) if isinstance(t, SharedTensor)]
    if own:
        raise ReadOnlyWeightsError(
            f"load_state_dict() into {type(module).__name__} would overwrite shared snapshot {own[0].snapshot}, "
            "which every process on this node maps. Load into a privately built module instead, or pass "
            "assign=True to rebind the module to new tensors."
        )
