"""Where the ``policystore`` command reads snapshots from: a running cluster (through the public client API), a
spill or durable folder (through the Ray-free ``policystore.reader``), or a durable tier on object storage
(``policystore.durable``). Each source answers in the typed records of ``output.py``."""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..config import StoreConfig
from ..durable import MARKER_SUFFIX
from ..errors import PolicyStoreError
from ..format import Expected
from ..ids import SnapshotId
from ..wire import DURABLE, StoreStats
from .output import CopyCheck, FolderStats, Row, UsageError, Verified, record

LOCAL_OBJECT_STORE_BYTES = 256 * 2**20  # a private Ray for one offline change: snapshots it serves stay on disk
COMPACT_TIMEOUT_S = 120.0  # folding a policy's tombstones lists and deletes one object per deleted version
RUN_LOCK = ".lock"  # held (flock) by a trainer in its run folder, the parent of the run's store


class Source:
    """Where the snapshots are read from: a running cluster, a spill folder or a durable tier (offline, figures
    from its rows alone)."""

    where: str
    online = False

    def rows(self, policy_id: str | None = None) -> list[Row]:
        raise NotImplementedError

    def verify(self, rows: list[Row], policy_id: str | None, version: int | None) -> list[Verified]:
        """One result per row, plus one for damage found outside them."""
        raise NotImplementedError

    def buffer(self, row: Row) -> np.ndarray:  # the snapshot's raw safetensors bytes
        raise NotImplementedError

    def close(self) -> None:
        """Let go of what the source holds (a cluster connection, a private local Ray)."""

    def writable(self) -> ClusterSource:
        """A source through which the league can be changed (its catalog numbers and deletes versions)."""
        raise UsageError(f"{self.where} cannot be changed offline")

    def stats(self) -> list[StoreStats | FolderStats]:
        rows = self.rows()
        return [FolderStats(self.where, len({r.id.policy_id for r in rows}), len(rows), sum(r.nbytes for r in rows),
                            sum(r.file_bytes for r in rows))]


class ClusterSource(Source):
    """A running cluster: every node store that exists (none is started on nodes without one)."""

    online = True

    def __init__(self, address: str | None, league: str | None = None):
        import ray

        from .. import client
        from ..remote import catalog_name, running, store_name
        from .join import prepare

        if not ray.is_initialized():
            prepare(address)
            ray.init(address=address, logging_level="error", log_to_driver=False, configure_logging=False)
            self._shutdown: Callable[[], None] | None = ray.shutdown
        else:
            self._shutdown = None
        try:
            league = league or client.job_league()
        except PolicyStoreError:
            self.close()
            raise
        self.where = f"league {league!r} on cluster {address or ray.get_runtime_context().gcs_address}"
        if running(catalog_name(league)) is None:
            self.close()
            raise PolicyStoreError(f"no policystore catalog runs for {self.where}: a job that calls "
                                   "policystore.connect() starts one (another league: --league NAME)") from None
        alive = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        serving = [n for n in alive if running(store_name(n, league)) is not None]
        here = ray.get_runtime_context().get_node_id()
        self.stores = {n: client.connect(node_id=n, league=league) for n in serving or [here]}
        self.local = self.stores.get(here) or next(iter(self.stores.values()))

    def close(self) -> None:
        if self._shutdown is not None:
            self._shutdown()

    def writable(self) -> ClusterSource:
        return self

    def rows(self, policy_id: str | None = None, limit: int | None = None,
             after: SnapshotId | None = None) -> list[Row]:
        merged: dict[SnapshotId, Row] = {}
        for node, store in self.stores.items():
            for info in store.list(policy_id, limit=limit, after=after):
                row = merged.setdefault(info.id, Row(SnapshotId(*info.id), info.summary, tuple(info.holders)))
                row.tiers[node] = info.tier
                row.file_bytes += info.file_bytes
                row.error = row.error or info.error
        return sorted(merged.values(), key=lambda r: r.id)

    def verify(self, rows: list[Row], policy_id: str | None, version: int | None) -> list[Verified]:
        return [Verified(*row.id, self._check(row)) for row in rows]

    def _check(self, row: Row) -> list[CopyCheck]:
        """Each node holding a copy checks its own copies (and the durable one) against the catalog's record."""
        nodes = [n for n, tier in row.tiers.items() if tier in ("hot", "disk")]
        if not nodes:  # only remote copies: check the durable one through this node's store, if there is one
            nodes = [self.local.node_id] if DURABLE in row.holders else []
        checks = []
        for node in nodes:
            try:
                report = record(self.stores[node].verify(*row.id))
            except PolicyStoreError as exc:  # clients that raise on a failed check instead of reporting it
                report = {"problems": [str(exc)]}
            checks.append(CopyCheck(node, list(report.pop("problems")), report))
        return checks or [CopyCheck(None, [f"{row.id}: no copy left to check (holders {row.holders})"])]

    def buffer(self, row: Row) -> np.ndarray:
        return self.local.get(*row.id).buffer

    def stats(self) -> list[StoreStats | FolderStats]:
        return [store.stats() for store in self.stores.values()]

    def publish(self, policy_id: str, weights: Mapping[str, Any], meta: dict[str, Any], durable: bool) -> SnapshotId:
        return SnapshotId(*self.local.publish(policy_id, weights, meta, durable=durable))

    def delete(self, sid: SnapshotId | None, policy_id: str) -> list[SnapshotId]:
        return [SnapshotId(*s) for s in self.local.delete(policy_id, sid.version if sid else None)]

    def compact_tombstones(self) -> dict[str, int]:
        """Fold the durable tier's tombstones into one floor per policy (the catalog's job, since only it knows
        what is still live): the objects removed per policy; nothing without a durable tier."""
        from ..remote import call, catalog_name, find

        return call(find(catalog_name(self.local.league)), "compact_tombstones", timeout_s=COMPACT_TIMEOUT_S)


class LocalSource(ClusterSource):
    """A stopped league's folder (a spill folder with its catalog database, or a durable tier), served for one
    command by a private local Ray with one store on it: a change goes through the same catalog and store code as
    on a cluster (versions deleted for good, tombstones in the durable tier), then everything stops."""

    def __init__(self, config: StoreConfig, where: str, scratch: str | None = None):
        import ray

        from .. import client

        if ray.is_initialized():
            raise UsageError(f"{where}: changing a stopped league's folder starts a private Ray, and this process "
                             "already runs one")
        self._scratch = scratch
        ray.init(address="local", num_cpus=1, object_store_memory=LOCAL_OBJECT_STORE_BYTES, include_dashboard=False,
                 logging_level="error", log_to_driver=False, configure_logging=False)
        self._shutdown = ray.shutdown
        try:
            self.local = client.connect(config)
        except BaseException:
            self.close()
            raise
        self.stores = {ray.get_runtime_context().get_node_id(): self.local}
        self.where = where

    def close(self) -> None:
        from .. import client

        try:
            if hasattr(self, "local"):
                self.local.flush()
                client.shutdown_all()
        finally:
            super().close()
            if self._scratch:
                shutil.rmtree(self._scratch, ignore_errors=True)


def _not_in_use(folder: Path) -> None:
    """Refuse a folder a running trainer holds (its run folder's lock): a second store on it would race the first."""
    lock = folder.parent / RUN_LOCK
    if not lock.exists():
        return
    with open(lock) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"a trainer runs in {folder.parent}: change its league through its cluster (--address), "
                             "or stop it first") from None


class DurableSource(Source):
    """A durable tier (folder of commit markers or object-storage URI), read without a cluster."""

    def __init__(self, uri: str):
        from ..durable import DurableTier

        self.tier = DurableTier.open(uri)
        self.uri = uri
        self.where = f"durable tier {uri}"
        self._local: LocalSource | None = None

    def writable(self) -> ClusterSource:
        if self._local is None:
            scratch = tempfile.mkdtemp(prefix="policystore-offline-")
            self._local = LocalSource(StoreConfig(durable_uri=self.uri, spill_dir=scratch), self.where, scratch)
        return self._local

    def close(self) -> None:
        if self._local is not None:
            self._local.close()

    def rows(self, policy_id: str | None = None) -> list[Row]:
        return [Row(sid, s, (DURABLE,), {DURABLE: DURABLE}, s.nbytes)
                for sid, s in self.tier.list_committed() if policy_id is None or sid.policy_id == policy_id]

    def verify(self, rows: list[Row], policy_id: str | None, version: int | None) -> list[Verified]:
        return [Verified(*row.id, [CopyCheck(DURABLE, _problems(lambda row=row: self.buffer(row)))]) for row in rows]

    def buffer(self, row: Row) -> np.ndarray:
        return self.tier.read(row.id, Expected(*row.id, row.checksum))


class FolderSource(Source):
    """A spill folder or a durable tier's folder, read through the store's Ray-free reader."""

    def __init__(self, path: str):
        from ..reader import open_folder

        self.reader = open_folder(path)
        self.path = Path(path)
        self.where = f"folder {path}"
        self._local: LocalSource | None = None

    def writable(self) -> ClusterSource:
        if self._local is None:
            _not_in_use(self.path)
            if any(self.path.glob(f"*/*{MARKER_SUFFIX}")):  # a durable tier's folder: its markers say what is committed
                scratch = tempfile.mkdtemp(prefix="policystore-offline-")
                config = StoreConfig(durable_uri=str(self.path.resolve()), spill_dir=scratch)
            else:
                scratch, config = None, StoreConfig(spill_dir=str(self.path.resolve()))
            self._local = LocalSource(config, self.where, scratch)
        return self._local

    def close(self) -> None:
        self.reader.close()
        if self._local is not None:
            self._local.close()

    def rows(self, policy_id: str | None = None) -> list[Row]:
        return [Row(info.id, info.summary, ("folder",), {"folder": "file"}, info.file_bytes)
                for info in self.reader.list(policy_id)]

    def verify(self, rows: list[Row], policy_id: str | None, version: int | None) -> list[Verified]:
        """One pass of the reader over the folder; its problems (each naming its snapshot) go to their rows."""
        problems = self.reader.verify(policy_id, version)
        results = [Verified(*row.id, [CopyCheck("folder", [p for p in problems if p.startswith(f"{row.id}:")])])
                   for row in rows]
        listed = tuple(f"{row.id}:" for row in rows)
        others = [p for p in problems if not p.startswith(listed)]
        if others:  # files too damaged to be listed at all
            results.append(Verified(policy_id, version, [], others))
        return results

    def buffer(self, row: Row) -> np.ndarray:
        return self.reader.get(*row.id).buffer


def _problems(check: Callable[[], object]) -> list[str]:
    try:
        check()
    except PolicyStoreError as exc:
        return [str(exc)]
    return []


def open_source(args: argparse.Namespace) -> Source:
    """``--dir`` (offline) or the cluster at ``--address``/``RAY_ADDRESS`` (online)."""
    if args.dir:
        if "://" in args.dir and not args.dir.startswith("file://"):
            return DurableSource(args.dir)
        path = Path(args.dir.removeprefix("file://"))
        if not path.is_dir():
            raise UsageError(f"--dir {args.dir}: no such folder")
        if (path / "config.json").is_file() and (path / "store").is_dir():  # a trainer's run folder: its store
            path = path / "store"
        return FolderSource(str(path))
    from .join import check_address

    if args.address:
        return ClusterSource(check_address(args.address), args.league)
    if os.environ.get("RAY_ADDRESS"):
        return ClusterSource(check_address(os.environ["RAY_ADDRESS"], "RAY_ADDRESS"), args.league)
    import ray

    if ray.is_initialized():
        return ClusterSource(None, args.league)
    from ray._private.services import find_bootstrap_address  # what `ray status` reads: the last `ray start`

    started = find_bootstrap_address(None)
    if not started:
        raise UsageError("say where the snapshots are: --address (or RAY_ADDRESS) for a cluster, --dir offline (and "
                         "no cluster that `ray start` started runs on this machine)")
    return ClusterSource(check_address(started, "the cluster `ray start` started on this machine,"), args.league)
