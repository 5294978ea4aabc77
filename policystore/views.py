"""Zero-copy torch views of a snapshot buffer, guarded against writes (modules are built on them in modules.py).

Two layers keep shared weights unchanged. The OS one (``protect.py``): a reader's snapshot pages are mapped
read-only, so a write by any route kills the writing process and never reaches another one. In front of it, for a
friendly error on the common routes, every tensor handed out is a ``SharedTensor``, a ``torch.Tensor`` subclass
whose ``__torch_function__`` refuses in-place ops (``add_``, ``copy_``, ``__setitem__``, ``out=``, ``inplace=True``
functionals, optimizer ``_foreach_*_`` steps, ``load_state_dict`` into it, an embedding lookup with ``max_norm``,
training-mode norms...) with ReadOnlyWeightsError. Results that alias the shared memory (``.data``, ``.t()``,
``.view()``, slices, ``.detach()``) stay guarded; anything computed from the weights comes back as a plain tensor.

``fast_reads()`` turns the torch-level guard off for a block of read-only forward passes (the dispatch costs a few
microseconds per op); the OS protection still holds there.

Rebinding is apart from writing: ``.data = x``, ``set_``, ``t_``, ``resize_`` and the like change no byte but what a
tensor object points at, and torch's module conversions (``half()``, ``to(dtype)``, ``to_empty()``) and
``vector_to_parameters`` assign ``.data``. Two things keep that from reaching anyone else: every module built on a
snapshot gets tensor objects of its own (``modules.build_on_views`` makes them from the buffer and its header, never
from views someone holds), and a shared tensor refuses each rebinding route with ReadOnlyWeightsError in Python methods
of its class, which ``fast_reads()`` does not turn off. ``share_memory_()`` is a no-op: the tensor already lives in
shared memory, and torch's own would move the whole snapshot buffer, under every view of it in the process, to a
private writable copy.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import warnings
import weakref
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from .errors import ReadOnlyWeightsError
from .format import Header

_INPLACE_DUNDERS = frozenset(
    f"__i{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor",
                            "lshift", "rshift")
) | {"__setitem__", "__set__"}
_HARMLESS_INPLACE = frozenset({"requires_grad_", "retain_grad"})
# Functionals that write into an argument depending on another one: name -> (argument written, trigger)
_RENORM = {"embedding": "weight", "embedding_bag": "weight"}  # renormalise the looked-up rows when max_norm is set


def _func_name(func: Callable) -> str:
    return getattr(func, "__name__", "") or getattr(getattr(func, "__func__", None), "__name__", "")


@dataclass(frozen=True)
class _Kind:
    in_place: bool  # writes into its first argument
    inplace_flag: int | None  # position of an ``inplace`` parameter (F.relu(x, inplace=True), F.dropout, ...)
    renorm_weight: int | None  # position of the weight an embedding lookup renormalises when max_norm is given
    max_norm: int | None


_KINDS: dict[Callable, _Kind] = {}


def _kind(func: Callable) -> _Kind:
    """How ``func`` can write into its arguments (torch's naming convention plus keyword flags; cached per func)."""
    kind = _KINDS.get(func)
    if kind is None:
        name = _func_name(func)
        in_place = name in _INPLACE_DUNDERS or (
            name.endswith("_") and not name.endswith("__") and name not in _HARMLESS_INPLACE
        )
        params = _parameter_names(func)
        renorm = _RENORM.get(name)
        kind = _KINDS[func] = _Kind(
            in_place,
            params.index("inplace") if "inplace" in params else None,
            params.index(renorm) if renorm in params else None,
            params.index("max_norm") if renorm in params and "max_norm" in params else None,
        )
    return kind


def _parameter_names(func: Callable) -> list[str]:
    try:
        return list(inspect.signature(func).parameters)
    except (TypeError, ValueError):  # builtins without a signature
        return []


def _arg(args: tuple, kwargs: dict, position: int | None, name: str) -> Any:
    if position is None:
        return None
    return args[position] if len(args) > position else kwargs.get(name)


def _any_shared(value: Any) -> SharedTensor | None:
    if isinstance(value, SharedTensor):
        return value
    if isinstance(value, (list, tuple)):
        return next((v for v in value if isinstance(v, SharedTensor)), None)
    return None


def _written_shared(func: Callable, args: tuple, kwargs: dict) -> SharedTensor | None:
    """The shared tensor ``func`` would write into, if any."""
    kind = _kind(func)
    written = []  # what func writes into: its first argument, a renormalised weight, running statistics, out=
    if kind.in_place or _arg(args, kwargs, kind.inplace_flag, "inplace") is True:
        written.append(args[0] if args else next(iter(kwargs.values()), None))  # torch.nn.init.* pass it by keyword
    if kind.renorm_weight is not None and _arg(args, kwargs, kind.max_norm, "max_norm") is not None:
        written.append(_arg(args, kwargs, kind.renorm_weight, "weight"))
    if _func_name(func) in ("batch_norm", "instance_norm") and _norm_is_training(args, kwargs):
        # functional norms update their running statistics in place while training
        written += [kwargs.get("running_mean"), kwargs.get("running_var"), *args[1:3]]
    if "out" in kwargs:
        written.append(kwargs["out"])
    return next((t for t in map(_any_shared, written) if t is not None), None)


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

    # Slots, not instance attributes: a view is made per tensor per snapshot a process opens, and an instance
    # __dict__ would cost each one a few hundred bytes of private memory.
    __slots__ = ("snapshot", "_span")
    snapshot: str  # the snapshot's id, for error messages
    _span: tuple[int, int]  # address range of the snapshot buffer, to spot results that alias it

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
            if source is None:
                return result
            if func is torch.Tensor.detach and type(source) is SharedParameter:
                return _detached_parameter(result, source)
            return _guard_aliases(result, source)

    def __reduce_ex__(self, protocol: int) -> tuple:
        """Pickled (``torch.save``, Ray, multiprocessing) as a plain tensor (or Parameter) of its own values: the
        guard and the sharing belong to this node's memory, and the rest of the snapshot buffer under the view
        stays out of the file. So ``torch.save(dict(snapshot))`` writes each tensor's bytes once, whatever their
        dtypes, and ``torch.load(..., weights_only=True)`` reads it back."""
        return self._private_copy().__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict) -> torch.Tensor:
        """A private, writable copy, so that ``copy.deepcopy`` of a module built on views gives a module of its
        own (the usual way to start training from a frozen snapshot)."""
        memo[id(self)] = copy = self._private_copy()
        return copy

    @property
    def data(self) -> torch.Tensor:
        """The tensor without autograd history: a view of the same shared memory (guarded, outside ``fast_reads``)."""
        return torch._C.TensorBase.data.__get__(self)

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        """Refused (but for ``t.data = t``, what ``module.to()`` does when nothing changes): see ``_refuse_rebind``."""
        if value is not self:
            _refuse_rebind(self, ".data = ... (what module.half(), .to(dtype), .to_empty() and "
                                 "vector_to_parameters do)")

    def share_memory_(self) -> SharedTensor:
        """Nothing to do: the tensor is in the node's shared memory already. (torch's own would copy the snapshot
        buffer to a new shared-memory file and move every view of it in this process over to that copy.)"""
        return self

    def _private_copy(self) -> torch.Tensor:
        """A plain tensor with a copy of the values; a Parameter stays a Parameter."""
        with torch._C.DisableTorchFunctionSubclass():
            copy = self.clone()
        if isinstance(self, nn.Parameter):
            copy = nn.Parameter(copy, requires_grad=self.requires_grad)
        return copy


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


# In-place ops that change what a tensor object is (its storage, shape, strides) rather than its bytes
_REBINDS = ("set_", "t_", "transpose_", "swapdims_", "swapaxes_", "as_strided_", "squeeze_", "unsqueeze_", "resize_",
            "resize_as_")


def _refuse_rebind(tensor: SharedTensor, what: str) -> None:
    raise ReadOnlyWeightsError(
        f"{what} would rebind a tensor of shared snapshot {tensor.snapshot} (its storage, shape or dtype), which "
        "other views and modules of that snapshot in this process may hold; refused inside fast_reads() too. Take a "
        "private copy first (tensor.clone(), or copy.deepcopy(module) for a module) and change that."
    )


def _rebind_refusal(name: str) -> Callable[..., None]:
    """A SharedTensor method for the rebinding op ``name``: a Python method of the class, so it refuses whether the
    torch-level guard is on or not (and ``set_`` never reaches ``__torch_function__`` at all)."""

    def refuse(self: SharedTensor, *args: Any, **kwargs: Any) -> None:
        _refuse_rebind(self, f"{name}()")

    refuse.__name__ = refuse.__qualname__ = name
    return refuse


for _name in _REBINDS:
    setattr(SharedTensor, _name, _rebind_refusal(_name))


class SharedParameter(SharedTensor):
    """A shared view as a module parameter: ``isinstance(p, nn.Parameter)`` holds (torch checks ``_is_param``),
    without an instance attribute, so a Parameter costs a process no more than the view under it."""

    __slots__ = ()
    _is_param = True


def _detached_parameter(result: torch.Tensor, source: SharedParameter) -> SharedParameter:
    """``detach()`` of a shared Parameter: of its class, as ``nn.Parameter(p)`` requires (parametrizations such as
    ``weight_norm`` make one), yet not a parameter itself (``state_dict()`` values are plain tensors)."""
    detached = _as_shared(result, source.snapshot, source._span, SharedParameter)
    detached._is_param = False
    return detached


def _as_shared(tensor: torch.Tensor, snapshot: str, span: tuple[int, int], cls: type = SharedTensor) -> SharedTensor:
    """``tensor``'s memory as a ``cls``: an alias that is not an autograd view of it (``as_subclass`` makes one, and
    every guarded ``_base`` was then a view of its own base without end: torch.compile recursed on it), unless it
    carries autograd history to keep."""
    if tensor.requires_grad:
        shared = tensor.as_subclass(cls)
    else:
        shared = torch.Tensor._make_subclass(cls, tensor, False)
    shared.snapshot = snapshot
    shared._span = span
    return shared


@contextlib.contextmanager
def fast_reads() -> Iterator[None]:
    """Run read-only forward passes over shared weights without the torch-level write guard.

    Inside the block, ``SharedTensor`` dispatch is off: ops run at plain-tensor speed and results are plain
    tensors. Safe because a reader's snapshot pages are write-protected by the OS: a write in the block does not
    raise ReadOnlyWeightsError but kills the process (SIGSEGV, with a traceback) instead of changing shared
    weights; rebinding a shared tensor (``.data =``, ``set_``, ``t_``, ``module.half()``...) still raises it.
    Thread-local; blocks nest.
    """
    with torch._C.DisableTorchFunctionSubclass():
        yield


def tensor_views(
    buf: np.ndarray, header: Header, snapshot: str, parameters: Collection[str] = ()
) -> dict[str, SharedTensor]:
    """One guarded view per tensor, all over ``buf`` (no bytes are copied); those named in ``parameters`` are
    SharedParameters.

    Each view is one ``as_strided`` of a typed view of the data section (one per dtype): the cheapest way torch
    offers to make a view, which matters because a reader makes them for every snapshot it opens and every module
    it builds.
    """
    base = _frombuffer(buf)
    span = (base.data_ptr(), base.data_ptr() + base.numel())
    data = base[header.data_offset :]
    typed: dict[torch.dtype, torch.Tensor] = {}
    views: dict[str, SharedTensor] = {}
    for name, entry in header.tensors.items():
        dtype = entry.dtype
        if entry.end == entry.start:
            plain = torch.empty(entry.shape, dtype=dtype)
        else:
            whole = typed.get(dtype)
            if whole is None:
                size = dtype.itemsize
                whole = typed[dtype] = data[: len(data) // size * size].view(dtype)
            plain = whole.as_strided(entry.shape, _contiguous_strides(entry.shape),
                                     whole.storage_offset() + entry.start // dtype.itemsize)
        views[name] = _as_shared(plain, snapshot, span, SharedParameter if name in parameters else SharedTensor)
    return views


_frombuffer_warned = False


def _frombuffer(buf: np.ndarray) -> torch.Tensor:
    """``buf`` as a uint8 tensor. A read-only buffer is the point: torch's warning about it (given once per
    process) is noise here, so the first call hides it."""
    global _frombuffer_warned
    if _frombuffer_warned:
        return torch.frombuffer(memoryview(buf).cast("B"), dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)
        base = torch.frombuffer(memoryview(buf).cast("B"), dtype=torch.uint8)
    _frombuffer_warned = True
    return base


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))


_REFUSE_HOOK_KEY = "policystore.refuse_load_into_views"  # torch's own hook keys are ints: no clash


def guard_module(module: nn.Module) -> None:
    """Make ``load_state_dict`` into ``module`` refuse to write into its shared tensors (``assign=True`` still
    rebinds). What ``register_load_state_dict_pre_hook`` would store, in a tenth of the memory and time."""
    module._load_state_dict_pre_hooks[_REFUSE_HOOK_KEY] = _RefuseLoad(module)


class _RefuseLoad:
    """A ``load_state_dict`` pre-hook: loading would copy_ into the shared views, so refuse up front with the
    snapshot's name. ``assign=True`` only rebinds the module's attributes to new tensors, which leaves shared
    memory alone.

    What ``register_load_state_dict_pre_hook`` would store, in a tenth of the memory: the module is found through
    a weak reference, and a copy of the module (deepcopy, pickle) gets a hook that looks at the copy.
    """

    __slots__ = ("module_ref",)

    def __init__(self, module: nn.Module):
        self.module_ref = weakref.ref(module)

    def __reduce__(self) -> tuple:
        return _RefuseLoad, (self.module_ref(),)

    def __call__(self, state_dict, prefix, local_metadata, *args) -> None:
        module = self.module_ref()
        if module is None or local_metadata.get("assign_to_params_buffers"):
            return
        own = [t for t in (*module._parameters.values(), *module._buffers.values()) if isinstance(t, SharedTensor)]
        if own:
            raise ReadOnlyWeightsError(
                f"load_state_dict() into {type(module).__name__} would overwrite shared snapshot {own[0].snapshot}, "
                "which every process on this node maps. Load into a private module instead (copy.deepcopy(module) "
                "makes one), or pass assign=True to rebind the module to new tensors."
            )
