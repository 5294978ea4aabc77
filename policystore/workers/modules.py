"""Policies for a rollout worker, taken from the node's store.

In ``store`` mode a module's parameters ARE the node store's shared read-only views (``store.load_module``):
a frozen opponent costs the worker no private copy, however many workers play it. ``private`` mode copies
every snapshot into a module of the worker's own, the way RLlib EnvRunners do; it exists only so the
benchmark can compare the two paths.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from torch import nn

import policystore
from policystore.errors import SnapshotLostError, UnknownVersionError

STORE, PRIVATE = "store", "private"
MODES = (STORE, PRIVATE)


class SnapshotModules:
    def __init__(self, store: policystore.PolicyStore, build: Callable[[], nn.Module], mode: str = STORE,
                 capacity: int = 16):
        if mode not in MODES:
            raise ValueError(f"unknown weights mode {mode!r}; choose one of {MODES}")
        self.store, self.build, self.mode, self.capacity = store, build, mode, capacity
        self._modules: OrderedDict[tuple[str, int], nn.Module] = OrderedDict()
        self._frozen: dict[str, int] = {}  # frozen snapshots never change: skip the store round trip

    def get(self, policy_id: str, frozen: bool, version: int | None = None) -> nn.Module:
        """The latest version of ``policy_id`` (a frozen snapshot's only version), or ``version`` when the caller
        knows the newest one (a learner's answer): a module held for it costs no store call, where asking the
        store for "latest" costs a round trip per call. A ``version`` deleted since is replaced by the latest."""
        if version is not None and (policy_id, version) not in self._modules:
            try:
                return self._keep((policy_id, version), self._load(policy_id, version))
            except (UnknownVersionError, SnapshotLostError):
                version = None
        if version is None and frozen:
            version = self._frozen.get(policy_id)
        if version is None:
            snap = self.store.get(policy_id)
            version = snap.id.version
            if frozen:
                self._frozen[policy_id] = version
        key = (policy_id, version)
        module = self._modules.get(key)
        return self._keep(key, self._load(policy_id, version) if module is None else module)

    def _keep(self, key: tuple[str, int], module: nn.Module) -> nn.Module:
        """``module`` as the most recently used, the least recently used beyond ``capacity`` dropped."""
        self._modules[key] = module
        self._modules.move_to_end(key)
        while len(self._modules) > self.capacity:
            self._modules.popitem(last=False)
        return module

    def _load(self, policy_id: str, version: int) -> nn.Module:
        if self.mode == STORE:
            return self.store.load_module(policy_id, self.build, version=version)
        module = self.build()
        module.load_state_dict(dict(self.store.get(policy_id, version=version)))
        return module.eval()

    def items(self) -> list[tuple[tuple[str, int], nn.Module]]:
        return list(self._modules.items())

    def __len__(self) -> int:
        return len(self._modules)
