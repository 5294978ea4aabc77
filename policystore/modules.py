"""Modules built on a snapshot: ``build_on_views`` gives an eval-mode ``nn.Module`` whose parameters and buffers
are guarded views (``views.py``) of the snapshot's buffer, with no parameter memory of its own.

``build()`` runs once per callable on the meta device; later modules clone that skeleton (microseconds), and each
gets tensor objects of its own, so what is done to one module's Parameters leaves every other module and view of
the snapshot alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from .errors import InvalidWeightsError, ShapeMismatchError
from .format import Header
from .views import guard_module, tensor_views


@dataclass
class _Skeleton:
    """A module built once on the meta device per ``build`` callable, and where each state entry goes in it."""

    module: nn.Module
    modules: list[nn.Module]  # every distinct submodule, root first
    containers: list[list[str]]  # per submodule: its attributes holding dicts, lists or sets (copied per clone)
    own_setattr: list[bool]  # per submodule: its class overrides __setattr__ (e.g. RNNs track their weights)
    slots: dict[str, tuple[int, str, bool]] | None  # state key -> (index in modules, attribute, is a parameter);
    # None when the module's state_dict does not list its parameters and buffers by path (custom state_dict)
    parameters: frozenset[str]  # the state keys that are parameters (when slots says)
    expected: dict[str, tuple[tuple[int, ...], torch.dtype]]


# build callable (or a bound method's object), by identity: unhashable builders (dataclass specs) are cached too
# -> {function or None: skeleton}
_SKELETONS = WeakIdKeyDictionary()


def _skeleton(build: Callable[[], nn.Module], *, fresh: bool = False) -> _Skeleton:
    owner, key = (build.__self__, build.__func__) if inspect.ismethod(build) else (build, None)
    try:
        per_owner = _SKELETONS.setdefault(owner, {})
    except TypeError:  # not weak-referenceable: build every time
        per_owner = {}
    skeleton = None if fresh else per_owner.get(key)
    if skeleton is None:
        skeleton = per_owner[key] = _make_skeleton(build)
    return skeleton


def _make_skeleton(build: Callable[[], nn.Module]) -> _Skeleton:
    with torch.device("meta"):
        module = build()
    if not isinstance(module, nn.Module):
        raise InvalidWeightsError(f"build() must return a torch.nn.Module, got {type(module).__name__}")
    modules = list(module.modules())
    index = {id(m): i for i, m in enumerate(modules)}
    slots: dict[str, tuple[int, str, bool]] = {}
    stray = []
    for prefix, sub in module.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        for attr in sub._parameters:
            if sub._parameters[attr] is not None:
                slots[dot + attr] = (index[id(sub)], attr, True)
        for attr in sub._buffers:
            if sub._buffers[attr] is None:
                continue
            if attr in sub._non_persistent_buffers_set:
                stray.append(f"{dot}{attr}")
            else:
                slots[dot + attr] = (index[id(sub)], attr, False)
    if stray:
        raise ShapeMismatchError(
            f"{type(module).__name__} has non-persistent buffers {sorted(set(stray))}: they are not in a snapshot and "
            "would stay on the meta device without data; register them with persistent=True, or create them in "
            "forward()"
        )
    state = module.state_dict(keep_vars=True)
    expected = {k: (tuple(t.shape), t.dtype) for k, t in state.items()}
    by_path = {k: slots[k] for k in state} if state.keys() == slots.keys() else None
    containers = [[k for k, v in vars(sub).items() if isinstance(v, (dict, list, set))] for sub in modules]
    own_setattr = [type(sub).__setattr__ is not nn.Module.__setattr__ for sub in modules]
    parameters = frozenset(k for k, (_, _, is_param) in by_path.items() if is_param) if by_path else frozenset()
    return _Skeleton(module, modules, containers, own_setattr, by_path, parameters, expected)


def _clone(skeleton: _Skeleton) -> list[nn.Module]:
    """New module objects in eval mode sharing no mutable state with the skeleton or other clones (shallow copies
    of each submodule's attributes, with fresh dicts, lists and sets); tensors are assigned afterwards."""
    clones = []
    for sub, containers in zip(skeleton.modules, skeleton.containers, strict=True):
        new = object.__new__(type(sub))
        state = sub.__dict__.copy()
        for key in containers:
            state[key] = state[key].copy()
        state["training"] = False  # eval mode, without touching what build() returned
        object.__setattr__(new, "__dict__", state)
        clones.append(new)
    by_id = {id(sub): new for sub, new in zip(skeleton.modules, clones, strict=True)}
    for new in clones:
        for name, child in new._modules.items():
            if child is not None:
                new._modules[name] = by_id[id(child)]
    return clones


def build_on_views(build: Callable[[], nn.Module], buf: np.ndarray, header: Header, snapshot: str) -> nn.Module:
    """An eval-mode module whose parameters and buffers are shared views of the snapshot in ``buf``
    (requires_grad=False).

    ``build()`` runs once per callable, on the meta device (no parameter memory): later calls with the same
    callable clone that skeleton, which costs microseconds, so pass the same ``build`` each time and let it return
    the same architecture. The module's tensors are objects of its own, made from ``buf`` and ``header``: what is
    done to one module's Parameters (``requires_grad_``, a rebinding route past the guard) leaves every other module
    and view of the snapshot alone. A snapshot that does not fit raises ShapeMismatchError naming the tensors.
    """
    skeleton = _skeleton(build)
    problems = _misfit(skeleton, header)
    if problems:  # the callable may build something else by now: judge by a fresh build
        skeleton = _skeleton(build, fresh=True)
        problems = _misfit(skeleton, header)
    if problems:
        raise ShapeMismatchError(
            f"snapshot {snapshot} does not fit {type(skeleton.module).__name__}: " + " | ".join(problems)
        )
    views = tensor_views(buf, header, snapshot, skeleton.parameters)
    clones = _clone(skeleton)
    if skeleton.slots is None:  # a module with its own state_dict layout: let torch place the tensors
        clones[0].load_state_dict(views, strict=True, assign=True)
        for param in clones[0].parameters():
            param.requires_grad_(False)
    else:
        for key, (i, attr, is_param) in skeleton.slots.items():
            tensor = views[key]
            if skeleton.own_setattr[i]:
                setattr(clones[i], attr, tensor)
            else:
                (clones[i]._parameters if is_param else clones[i]._buffers)[attr] = tensor
    for sub in clones:  # on each clone (a hook registered on the skeleton would be handed the skeleton)
        if sub._parameters or sub._buffers:
            guard_module(sub)
    return clones[0]


def _misfit(skeleton: _Skeleton, header: Header) -> list[str]:
    """What keeps the snapshot ``header`` describes from fitting the skeleton (nothing, usually: checked fast)."""
    expected = skeleton.expected
    have = {k: (e.shape, e.dtype) for k, e in header.tensors.items()}
    if have == expected:
        return []
    problems = []
    missing = sorted(set(expected) - set(have))
    unexpected = sorted(set(have) - set(expected))
    wrong = [
        f"{k}: module {expected[k][0]} {expected[k][1]}, snapshot {have[k][0]} {have[k][1]}"
        for k in sorted(set(expected) & set(have))
        if have[k] != expected[k]
    ]
    if missing:
        problems.append(f"missing from snapshot: {missing}")
    if unexpected:
        problems.append(f"not in module: {unexpected}")
    if wrong:
        problems.append("shape/dtype mismatch: " + "; ".join(wrong))
    return problems
