"""The user-facing handle: ``connect()`` finds (or starts) this node's store and returns a ``PolicyStore``."""

from __future__ import annotations

import os
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

from .catalog import CatalogServer
from .config import CATALOG_NAME, NAMESPACE, StoreConfig, store_name
from .errors import CorruptSnapshotError, PolicyStoreError, SnapshotTooLargeError
from .format import pack
from .ids import SnapshotId, check_policy_id, check_version
from .server import StoreServer
from .snapshot import Snapshot
from .views import build_on_views

_StoreActor = ray.remote(StoreServer)
_CatalogActor = ray.remote(CatalogServer)

# Snapshots are immutable, so a process can reuse the one it already holds: (policy, version) -> Snapshot.
_snapshots: weakref.WeakValueDictionary[SnapshotId, Snapshot] = weakref.WeakValueDictionary()
_clients: dict[str, PolicyStore] = {}
_clients_lock = threading.Lock()

# A store that dies is restarted by Ray and rebuilds from disk; reads retry across that for this long.
RETRY_TIMEOUT_S = 60.0
_RESTARTING = (ray.exceptions.ActorUnavailableError, ray.exceptions.ActorDiedError)
_OBJECT_GONE = (ray.exceptions.OwnerDiedError, ray.exceptions.ObjectLostError, ray.exceptions.ObjectFetchTimedOutError)


@dataclass(frozen=True)
class SnapshotInfo:
    """One row of ``PolicyStore.list()``."""

    id: SnapshotId
    nbytes: int
    tier: str  # on this node: "hot" (shared memory), "disk" (restored on the next get), "remote" (fetched on get)
    on_disk: bool
    file_bytes: int
    compressed: bool
    meta: dict[str, Any]
    created: float
    checksum: str  # the CRC recorded at publish: equal checksums, equal bytes
    holders: tuple[str, ...]  # node ids with a copy, and "durable" once it is in the durable tier
    error: str | None


def connect(config: StoreConfig | None = None, *, node_id: str | None = None) -> PolicyStore:
    """This node's store (``node_id`` for another node's), started if missing.

    Starts a local Ray if none is running, and the cluster catalog if it is missing. The store is a named, detached
    actor pinned to its node, taking no CPU slot; concurrent ``connect()`` calls from many workers find the same
    one (creation is atomic in Ray's GCS). The first ``config`` given in a cluster becomes the cluster's: stores
    started later on any node (by a bare ``connect()`` in a worker) use it. Passing a different one to a running
    store is an error.
    """
    _ensure_ray()
    node_id = node_id or ray.get_runtime_context().get_node_id()
    with _clients_lock:
        client = _clients.get(node_id)
        if client is None:
            client = _clients[node_id] = PolicyStore(node_id, config)
    if config is not None and client.config != config:
        raise PolicyStoreError(
            f"the store on node {node_id} already runs with {client.config}; connect() was given {config}"
        )
    return client


def connect_all(config: StoreConfig | None = None) -> dict[str, PolicyStore]:
    """A store on every alive node (nodes that joined since the last call get theirs now), by node id."""
    _ensure_ray()
    return {n["NodeID"]: connect(config, node_id=n["NodeID"]) for n in ray.nodes() if n["Alive"]}


def _ensure_ray() -> None:
    """Join the cluster RAY_ADDRESS names, else start a local Ray (never a stray cluster left on the machine)."""
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS", "local"))


def _catalog_actor(config: StoreConfig) -> ray.actor.ActorHandle:
    """The cluster catalog: found by name, or created with ``config`` as the cluster's store settings."""
    journal = config.catalog_journal(ray.get_runtime_context().get_session_name())
    return _CatalogActor.options(
        name=CATALOG_NAME,
        namespace=NAMESPACE,
        get_if_exists=True,
        lifetime="detached",
        num_cpus=0,
        max_concurrency=8,
        max_restarts=-1,
        # Beside the driver that started it (the head node, usually), but free to move if that node goes.
        scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True),
    ).remote(journal, config)


def _store_actor(node_id: str, config: StoreConfig | None) -> ray.actor.ActorHandle:
    """The node's store actor: found by name, or created (atomically, in Ray's GCS) with ``config`` (None: the
    cluster's settings, kept by the catalog)."""
    catalog = _catalog_actor(config or StoreConfig())
    if config is None:
        config = ray.get(catalog.store_config.remote())
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

    def __init__(self, node_id: str, config: StoreConfig | None):
        self.node_id = node_id
        self._actor = _store_actor(node_id, config)
        self._catalog = ray.get_actor(CATALOG_NAME, namespace=NAMESPACE)
        self.config: StoreConfig = self._call("store_config")
        self._hot_capacity = int(self._call("stats")["hot_capacity_bytes"])

    def _call(self, method: str, *args: Any, idempotent: bool = True, actor: str = "store") -> Any:
        """Call the store (or the catalog), riding out a restart (Ray restarts it; it rebuilds from disk) for reads.

        Writes are not retried: a publish that may or may not have landed must be visible to the caller.
        """
        deadline = time.monotonic() + RETRY_TIMEOUT_S
        while True:
            try:
                return _call(getattr(self._actor if actor == "store" else self._catalog, method), *args)
            except _RESTARTING as exc:
                if isinstance(exc, ray.exceptions.ActorDiedError):  # stopped for good: find or start its successor
                    self._actor = _store_actor(self.node_id, self.config)
                    self._catalog = ray.get_actor(CATALOG_NAME, namespace=NAMESPACE)
                if not idempotent or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def publish(
        self,
        policy_id: str,
        weights: Mapping[str, torch.Tensor | np.ndarray],
        meta: Mapping[str, Any] | None = None,
        *,
        durable: bool = False,
    ) -> SnapshotId:
        """Store a new version of ``policy_id``; returns its id. Tensors on a GPU are copied to the host once.

        ``durable=True`` returns only once the snapshot is on disk (fsync'd, and in the durable tier if one is
        configured); otherwise it is written in the background and served from memory right away.
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
        """The snapshot (latest version by default) as zero-copy read-only views; restored from disk, or fetched
        from another node, if this node's store does not hold it in memory."""
        check_policy_id(policy_id)
        if version is None:  # ask the catalog: a latest version this process already holds needs nothing more
            version = self.latest_version(policy_id)
        cached = _snapshots.get(SnapshotId(policy_id, check_version(version)))
        if cached is not None:
            return cached
        deadline = time.monotonic() + RETRY_TIMEOUT_S
        while True:
            pid, resolved, (ref,) = self._call("resolve", policy_id, version)
            sid = SnapshotId(pid, resolved)
            snap = _snapshots.get(sid)
            if snap is not None:
                return snap
            try:
                buffer = ray.get(ref)
            except _OBJECT_GONE:  # the store restarted between resolve and get: its old objects died with it
                if time.monotonic() > deadline:
                    raise
                continue
            snap = _snapshots[sid] = Snapshot(sid, buffer, ref)
            return snap

    def load_module(self, policy_id: str, build: Callable[[], nn.Module], version: int | None = None) -> nn.Module:
        """An eval-mode module whose parameters and buffers ARE the snapshot's shared views.

        ``build`` runs on the meta device, so the module costs no parameter memory of its own; writes into it
        raise ReadOnlyWeightsError. Moving it (``.to(device)``, ``.half()``) makes a private copy.
        """
        snap = self.get(policy_id, version)
        module = build_on_views(build, snap._views, str(snap.id))
        module.policystore_snapshot = snap  # the module's provenance, and keeps the snapshot cached
        return module

    def latest_version(self, policy_id: str) -> int:
        """The newest committed version of ``policy_id``, cluster-wide."""
        return int(self._call("lookup", check_policy_id(policy_id), actor="catalog")["version"])

    def list(self, policy_id: str | None = None) -> list[SnapshotInfo]:
        """Every snapshot in the cluster (or of one policy), with where this node holds it."""
        return [
            SnapshotInfo(
                id=SnapshotId(r["policy_id"], r["version"]), nbytes=r["nbytes"], tier=r["tier"], on_disk=r["on_disk"],
                file_bytes=r["file_bytes"], compressed=r["compressed"], meta=r["meta"], created=r["created"],
                checksum=r["checksum"], holders=tuple(r["holders"]), error=r["error"] or None,
            )
            for r in self._call("list", policy_id)
        ]

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def delete(self, policy_id: str, version: int | None = None) -> list[SnapshotId]:
        """Delete one version, or all versions of ``policy_id``, on every node. Views already held stay valid."""
        check_policy_id(policy_id)
        deleted = [SnapshotId(*sid) for sid in self._call("delete", policy_id, version, idempotent=False)]
        for sid in deleted:
            _snapshots.pop(sid, None)
        return deleted

    def verify(self, policy_id: str, version: int | None = None) -> dict[str, Any]:
        """Re-check the checksum recorded at publish on this node's copies and the durable tier's; raise
        CorruptSnapshotError if one fails.

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
    return _kill_named(store_name(node_id))


def shutdown_all() -> None:
    """Stop every node's store and the catalog (files stay on disk)."""
    for node in ray.nodes():
        shutdown(node["NodeID"])
    _kill_named(CATALOG_NAME)


def _kill_named(name: str) -> bool:
    try:
        actor = ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the name is released once the actor is gone
        try:
            ray.get_actor(name, namespace=NAMESPACE)
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
