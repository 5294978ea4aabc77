"""The user-facing handle: ``connect()`` finds (or starts) this node's store and returns a ``PolicyStore``."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from torch import nn

from .config import StoreConfig
from .errors import CorruptSnapshotError, PolicyStoreError, SnapshotTooLargeError
from .format import pack
from .ids import SnapshotId, check_policy_id, check_version
from .server import StoreServer
from .snapshot import Snapshot
from .views import build_on_views

NAMESPACE = "policystore"
_StoreActor = ray.remote(StoreServer)

# Snapshots are immutable, so a process can reuse the one it already holds: (policy, version) -> Snapshot.
_snapshots: weakref.WeakValueDictionary[SnapshotId, Snapshot] = weakref.WeakValueDictionary()
_clients: dict[str, PolicyStore] = {}
_clients_lock = threading.Lock()


@dataclass(frozen=True)
class SnapshotInfo:
    """One row of ``PolicyStore.list()``."""

    id: SnapshotId
    nbytes: int
    tier: str  # "hot": in shared memory; "disk": spilled, restored on the next get
    on_disk: bool
    file_bytes: int
    compressed: bool
    meta: dict[str, Any]
    created: float
    error: str | None


def store_name(node_id: str) -> str:
    return f"policystore-{node_id}"


def connect(config: StoreConfig | None = None, *, node_id: str | None = None) -> PolicyStore:
    """This node's store (``node_id`` for another node's), started if missing.

    Starts a local Ray if none is running. The store is a named, detached actor pinned to its node, taking no CPU
    slot; concurrent ``connect()`` calls from many workers find the same one (creation is atomic in Ray's GCS).
    ``config`` applies when the store is created; passing a different one to a running store is an error.
    """
    if not ray.is_initialized():
        ray.init()
    node_id = node_id or ray.get_runtime_context().get_node_id()
    with _clients_lock:
        client = _clients.get(node_id)
        if client is None:
            client = _clients[node_id] = PolicyStore(node_id, config or StoreConfig())
    if config is not None and client.config != config:
        raise PolicyStoreError(
            f"the store on node {node_id} already runs with {client.config}; connect() was given {config}"
        )
    return client


def _store_actor(node_id: str, config: StoreConfig) -> ray.actor.ActorHandle:
    """The node's store actor: found by name, or created (atomically, in Ray's GCS) with ``config``."""
    return _StoreActor.options(
        name=store_name(node_id),
        namespace=NAMESPACE,
        get_if_exists=True,
        lifetime="detached",
        num_cpus=0,
        max_concurrency=config.max_concurrency,
        max_restarts=-1,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(config, node_id)


class PolicyStore:
    """Handle on one node's store. Thread-safe; get one per process with ``connect()``."""

    def __init__(self, node_id: str, config: StoreConfig):
        self.node_id = node_id
        self._actor = _store_actor(node_id, config)
        self.config: StoreConfig = self._call("store_config")
        self._hot_capacity = int(self._call("stats")["hot_capacity_bytes"])

    def _call(self, method: str, *args: Any, idempotent: bool = True) -> Any:
        """Call the store; if it was stopped for good, find or start the node's current store and retry reads.

        Writes are not retried: a publish that may or may not have landed must be visible to the caller.
        """
        try:
            return _call(getattr(self._actor, method), *args)
        except ray.exceptions.ActorDiedError:
            self._actor = _store_actor(self.node_id, self.config)
            if not idempotent:
                raise
            return _call(getattr(self._actor, method), *args)

    def publish(
        self,
        policy_id: str,
        weights: Mapping[str, torch.Tensor | np.ndarray],
        meta: Mapping[str, Any] | None = None,
        *,
        durable: bool = False,
    ) -> SnapshotId:
        """Store a new version of ``policy_id``; returns its id. Tensors on a GPU are copied to the host once.

        ``durable=True`` returns only once the snapshot is on disk (fsync'd); otherwise it is written in the
        background and the store serves it from memory right away.
        """
        check_policy_id(policy_id)
        buf = pack(weights, policy_id=policy_id, meta=meta)
        if len(buf) > self._hot_capacity:
            raise SnapshotTooLargeError(
                f"snapshot of {policy_id!r} is {len(buf)} bytes, larger than the whole hot tier "
                f"(hot_capacity_bytes={self._hot_capacity})"
            )
        return SnapshotId(*self._call("publish", policy_id, buf, durable, idempotent=False))

    def get(self, policy_id: str, version: int | None = None) -> Snapshot:
        """The snapshot (latest version by default) as zero-copy read-only views; restored from disk if evicted."""
        check_policy_id(policy_id)
        if version is not None:
            check_version(version)
            cached = _snapshots.get(SnapshotId(policy_id, version))
            if cached is not None:
                return cached
        pid, resolved, (ref,) = self._call("resolve", policy_id, version)
        sid = SnapshotId(pid, resolved)
        snap = _snapshots.get(sid)
        if snap is None:
            snap = Snapshot(sid, ray.get(ref), ref)
            _snapshots[sid] = snap
        return snap

    def load_module(
        self, policy_id: str, build: Callable[[], nn.Module], version: int | None = None
    ) -> nn.Module:
        """An eval-mode module whose parameters and buffers ARE the snapshot's shared views.

        ``build`` runs on the meta device, so the module costs no parameter memory of its own; writes into it
        raise ReadOnlyWeightsError. Moving it (``.to(device)``, ``.half()``) makes a private copy.
        """
        snap = self.get(policy_id, version)
        module = build_on_views(build, snap._views, str(snap.id))
        module.policystore_snapshot = snap  # the module's provenance, and keeps the snapshot cached
        return module

    def latest_version(self, policy_id: str) -> int:
        return int(self._call("latest_version", policy_id))

    def list(self, policy_id: str | None = None) -> list[SnapshotInfo]:
        rows = self._call("list", policy_id)
        return [
            SnapshotInfo(SnapshotId(r.pop("policy_id"), r.pop("version")), **r) for r in rows
        ]

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def delete(self, policy_id: str, version: int | None = None) -> list[SnapshotId]:
        """Delete one version, or all versions of ``policy_id``. Views already held stay valid."""
        deleted = [SnapshotId(*sid) for sid in self._call("delete", policy_id, version, idempotent=False)]
        for sid in deleted:
            _snapshots.pop(sid, None)
        return deleted

    def verify(self, policy_id: str, version: int | None = None) -> dict[str, Any]:
        """Re-check the checksum recorded at publish on every copy; raise CorruptSnapshotError if one fails.

        Catches what the write guard cannot (raw writes through ``untyped_storage()``/``data_ptr()``). A corrupt
        shared-memory copy is dropped so the next get serves the verified disk copy.
        """
        report = self._call("verify", policy_id, version)
        if report["problems"]:
            raise CorruptSnapshotError("; ".join(report["problems"]))
        return report

    def flush(self) -> None:
        """Wait until every snapshot published so far is on disk."""
        self._call("flush")

    def shutdown(self) -> None:
        """Stop this node's store; see ``policystore.client.shutdown``."""
        shutdown(self.node_id)


def shutdown(node_id: str | None = None) -> bool:
    """Stop a node's store, whoever started it (what is on disk stays); the next ``connect()`` starts a new one.

    For tests and reconfiguration: views other processes hold stay valid, but their handles go stale.
    Returns whether a store was running.
    """
    node_id = node_id or ray.get_runtime_context().get_node_id()
    with _clients_lock:
        _clients.pop(node_id, None)
    _snapshots.clear()
    try:
        actor = ray.get_actor(store_name(node_id), namespace=NAMESPACE)
    except ValueError:
        return False
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the name is released once the actor is gone
        try:
            ray.get_actor(store_name(node_id), namespace=NAMESPACE)
        except ValueError:
            break
        time.sleep(0.05)
    return True


def _call(method: Any, *args: Any) -> Any:
    """Run a store method and re-raise the store's own errors as themselves, without Ray's wrapping."""
    try:
        return ray.get(method.remote(*args))
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, PolicyStoreError):
            raise exc.cause.with_traceback(None) from None
        raise
