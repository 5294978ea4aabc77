"""policystore: one copy per node of every frozen league snapshot, shared zero-copy by all rollout workers.

    store = policystore.connect()
    store.publish("main_0", model.state_dict(), meta={"step": 1000})
    opponent = store.load_module("main_0", build=lambda: MyNet())
"""

from .client import PolicyStore, SnapshotInfo, connect, connect_all
from .config import StoreConfig
from .errors import (
    CorruptSnapshotError,
    DiskFullError,
    InvalidPolicyIdError,
    InvalidWeightsError,
    PolicyStoreError,
    ReadOnlyWeightsError,
    ShapeMismatchError,
    SnapshotLostError,
    SnapshotTooLargeError,
    UnknownPolicyError,
    UnknownVersionError,
)
from .ids import SnapshotId
from .snapshot import Snapshot
from .views import SharedTensor

__all__ = [
    "CorruptSnapshotError",
    "DiskFullError",
    "InvalidPolicyIdError",
    "InvalidWeightsError",
    "PolicyStore",
    "PolicyStoreError",
    "ReadOnlyWeightsError",
    "ShapeMismatchError",
    "SharedTensor",
    "Snapshot",
    "SnapshotId",
    "SnapshotInfo",
    "SnapshotLostError",
    "SnapshotTooLargeError",
    "StoreConfig",
    "UnknownPolicyError",
    "UnknownVersionError",
    "connect",
    "connect_all",
]
