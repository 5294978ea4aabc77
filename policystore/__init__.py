"""policystore: one copy per node of every frozen league snapshot, shared zero-copy by all rollout workers.

    store = policystore.connect()
    store.publish("main_0", model.state_dict(), meta={"step": 1000})
    opponent = store.load_module("main_0", build=lambda: MyNet())

Imports are lazy: the store and catalog actors import this package to hold bytes and names, and must not pay for
torch (or anything else they do not use). ``policystore.connect`` and friends load their modules on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import errors, logs
from .config import StoreConfig
from .errors import PolicyStoreError
from .ids import SnapshotId
from .wire import SnapshotInfo, StoreStats, VerifyReport

__version__ = "0.1.0"

logs.apply()  # POLICYSTORE_LOG_LEVEL, in drivers and in every Ray worker that imports the package

if TYPE_CHECKING:  # explicit re-exports (`X as X`) for type checkers; the names resolve lazily below
    from .client import PolicyStore as PolicyStore
    from .client import connect as connect
    from .client import connect_all as connect_all
    from .reader import FileInfo as FileInfo
    from .reader import FolderReader as FolderReader
    from .reader import open_folder as open_folder
    from .session import clear_cache as clear_cache
    from .session import close as close
    from .snapshot import Snapshot as Snapshot
    from .views import SharedTensor as SharedTensor
    from .views import fast_reads as fast_reads

# every error class, by its own name: what a user catches is whatever errors.py defines
_ERRORS = {name: cls for name, cls in vars(errors).items()
           if isinstance(cls, type) and issubclass(cls, PolicyStoreError)}
globals().update(_ERRORS)

_LAZY = {name: module for module, names in {
    "client": ("PolicyStore", "connect", "connect_all"),
    "session": ("clear_cache", "close"),
    "snapshot": ("Snapshot",),
    "views": ("SharedTensor", "fast_reads"),
    "reader": ("open_folder", "FolderReader", "FileInfo"),
}.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        return getattr(importlib.import_module(f".{module}", __name__), name)
    try:  # submodules as attributes (policystore.format, policystore.client, ...) without importing them all
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module 'policystore' has no attribute {name!r}") from None


# the public names, from the three places that declare them (tests/policystore/test_public.py checks that the
# TYPE_CHECKING imports above say what _LAZY says, and that every name here resolves)
__all__ = sorted([cls.__name__ for cls in (SnapshotId, SnapshotInfo, StoreConfig, StoreStats, VerifyReport)]
                 + [*_LAZY, *_ERRORS])
