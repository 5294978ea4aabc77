"""The ``policystore`` command: look at and maintain a league's snapshots from a shell.

Online it joins a running Ray cluster (``--address`` or ``RAY_ADDRESS``) and talks to the stores through the
public client API; offline (``--dir``) it reads a spill folder or a durable tier's folder through the Ray-free
``policystore.reader``, and a durable tier on object storage (``s3://``, ``gs://``, ``hdfs://``) through
``policystore.durable``, without any cluster. Tables for people, ``--json`` for scripts.

Exit codes: 0 ok, 1 a problem was found (a snapshot failed verification, storage or cluster unreachable),
2 usage or bad input (unknown policy, bad file, missing option).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .errors import (
    InvalidPolicyIdError,
    InvalidWeightsError,
    PolicyStoreError,
    SnapshotFolderError,
    StoreUnavailableError,
    UnknownPolicyError,
    UnknownVersionError,
)
from .format import META_USER, Expected
from .ids import SnapshotId, check_policy_id, check_version
from .wire import DURABLE

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2
REACH_TIMEOUT_S = 3.0  # a cluster address that takes longer to accept a connection is as good as down


class UsageError(PolicyStoreError, ValueError):
    """A command line that cannot be carried out as given (missing option, offline where a cluster is needed)."""


_BAD_INPUT = (UsageError, InvalidPolicyIdError, InvalidWeightsError, UnknownPolicyError, SnapshotFolderError,
              FileNotFoundError)


@dataclass
class Row:
    """One snapshot as the CLI shows it, whatever the source."""

    id: SnapshotId
    nbytes: int
    checksum: str
    meta: dict[str, Any]
    created: float
    holders: tuple[str, ...] = ()
    tiers: dict[str, str] = field(default_factory=dict)  # where -> tier ("hot", "disk", "remote", "durable", "file")
    file_bytes: int = 0  # bytes of files holding it (spill files on every node, or the file/object offline)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"policy_id": self.id.policy_id, "version": self.id.version,
                **{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "id"}}


class Source(Protocol):
    """Where the snapshots are read from: a running cluster, a spill folder or a durable tier."""

    where: str
    online: bool

    def rows(self, policy_id: str | None = None) -> list[Row]: ...

    def verify(self, rows: list[Row], policy_id: str | None, version: int | None) -> list[dict[str, Any]]:
        """One result per row (see ``_result``), plus one for damage found outside them."""
        ...

    def buffer(self, row: Row) -> np.ndarray: ...  # the snapshot's raw safetensors bytes

    def stats(self) -> list[dict[str, Any]]: ...


# ---- sources -------------------------------------------------------------------------------------------------
class ClusterSource:
    """A running cluster: every node store that exists (none is started on nodes without one)."""

    online = True

    def __init__(self, address: str | None, league: str | None = None):
        import ray

        from . import client
        from .config import NAMESPACE, catalog_name, store_name

        if not ray.is_initialized():
            check_reachable(address)
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
        if not _actor_exists(catalog_name(league), NAMESPACE):
            self.close()
            raise PolicyStoreError(f"no policystore catalog runs for {self.where}") from None
        alive = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        running = [n for n in alive if _actor_exists(store_name(n, league), NAMESPACE)]
        here = ray.get_runtime_context().get_node_id()
        self.stores = {n: client.connect(node_id=n, league=league) for n in running or [here]}
        self.local = self.stores.get(here) or next(iter(self.stores.values()))

    def close(self) -> None:
        if self._shutdown is not None:
            self._shutdown()

    def rows(self, policy_id: str | None = None) -> list[Row]:
        merged: dict[SnapshotId, Row] = {}
        for node, store in self.stores.items():
            for info in store.list(policy_id):
                row = merged.setdefault(info.id, Row(SnapshotId(*info.id), info.nbytes, info.checksum, info.meta,
                                                     info.created, tuple(info.holders)))
                row.tiers[node] = info.tier
                row.file_bytes += info.file_bytes
                row.error = row.error or info.error
        return sorted(merged.values(), key=lambda r: r.id)

    def verify(self, rows: list[Row], policy_id: str | None, version: int | None) -> list[dict[str, Any]]:
        return [_result(row, self._check(row)) for row in rows]

    def _check(self, row: Row) -> list[dict[str, Any]]:
        """Each node holding a copy checks its own copies (and the durable one) against the catalog's record."""
        nodes = [n for n, tier in row.tiers.items() if tier in ("hot", "disk")]
        if not nodes:  # only remote copies: check the durable one through this node's store, if there is one
            nodes = [self.local.node_id] if DURABLE in row.holders else []
        reports = []
        for node in nodes:
            try:
                report = _record(self.stores[node].verify(*row.id))
            except PolicyStoreError as exc:  # clients that raise on a failed check instead of reporting it
                report = {"problems": [str(exc)]}
            reports.append({"node": node, **report, "problems": list(report.get("problems", []))})
        if not reports:
            reports.append({"node": None, "problems": [f"{row.id}: no copy left to check (holders {row.holders})"]})
        return reports

    def buffer(self, row: Row) -> np.ndarray:
        return self.local.get(*row.id).buffer

    def stats(self) -> list[dict[str, Any]]:
        return [_record(store.stats()) for store in self.stores.values()]

    def publish(self, policy_id: str, weights: Mapping[str, Any], meta: dict[str, Any], durable: bool) -> SnapshotId:
        return SnapshotId(*self.local.publish(policy_id, weights, meta, durable=durable))

    def delete(self, sid: SnapshotId | None, policy_id: str) -> list[SnapshotId]:
        return [SnapshotId(*s) for s in self.local.delete(policy_id, sid.version if sid else None)]


class DurableSource:
    """A durable tier (folder of commit markers or object-storage URI), read without a cluster."""

    online = False

    def __init__(self, uri: str):
        from .durable import DurableTier

        self.tier = DurableTier.open(uri)
        self.where = f"durable tier {uri}"

    def rows(self, policy_id: str | None = None) -> list[Row]:
        return [
            Row(sid, s["nbytes"], s["checksum"], s["meta"], s["created"], (DURABLE,), {DURABLE: DURABLE}, s["nbytes"])
            for sid, s in self.tier.list_committed()
            if policy_id is None or sid.policy_id == policy_id
        ]

    def verify(self, rows: list[Row], policy_id: str | None, version: int | None) -> list[dict[str, Any]]:
        return [_result(row, [_checked(DURABLE, lambda row=row: self.buffer(row))]) for row in rows]

    def buffer(self, row: Row) -> np.ndarray:
        return self.tier.read(row.id, Expected(*row.id, row.checksum))

    def stats(self) -> list[dict[str, Any]]:
        return [_folder_stats(self.where, self.rows())]


class FolderSource:
    """A spill folder or a durable tier's folder, read through the store's Ray-free reader."""

    online = False

    def __init__(self, path: str):
        from .reader import open_folder

        self.reader = open_folder(path)
        self.where = f"folder {path}"

    def rows(self, policy_id: str | None = None) -> list[Row]:
        return [
            Row(info.id, info.nbytes, info.checksum, info.meta, info.created, ("folder",), {"folder": "file"},
                info.file_bytes)
            for info in self.reader.list(policy_id)
        ]

    def verify(self, rows: list[Row], policy_id: str | None, version: int | None) -> list[dict[str, Any]]:
        """One pass of the reader over the folder; its problems (each naming its snapshot) go to their rows."""
        problems = self.reader.verify(policy_id, version)
        results = []
        for row in rows:
            mine = [p for p in problems if p.startswith(f"{row.id}:")]
            results.append(_result(row, [{"node": "folder", "ok": not mine, "problems": mine}]))
        listed = {f"{row.id}:" for row in rows}
        others = [p for p in problems if not any(p.startswith(prefix) for prefix in listed)]
        if others:  # files too damaged to be listed at all
            results.append({"policy_id": policy_id, "version": version, "ok": False, "copies": [],
                            "problems": others})
        return results

    def buffer(self, row: Row) -> np.ndarray:
        return self.reader.get(*row.id).buffer

    def stats(self) -> list[dict[str, Any]]:
        return [_folder_stats(self.where, self.rows())]


def _result(row: Row, copies: list[dict[str, Any]]) -> dict[str, Any]:
    problems = [p for copy in copies for p in copy["problems"]]
    return {"policy_id": row.id.policy_id, "version": row.id.version, "ok": not problems, "copies": copies,
            "problems": problems}


def _checked(where: str, check: Callable[[], object]) -> dict[str, Any]:
    try:
        check()
    except PolicyStoreError as exc:
        return {"node": where, "ok": False, "problems": [str(exc)]}
    return {"node": where, "ok": True, "problems": []}


def _folder_stats(where: str, rows: list[Row]) -> dict[str, Any]:
    return {"source": where, "policies": len({r.id.policy_id for r in rows}), "snapshots": len(rows),
            "nbytes": sum(r.nbytes for r in rows), "file_bytes": sum(r.file_bytes for r in rows)}


def check_reachable(address: str | None, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Fail in seconds when nothing listens at a ``host:port`` cluster address: ``ray.init`` would retry for
    minutes. ("auto", "local" and ``ray://`` addresses are left to Ray.)"""
    import socket

    if not address or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise UsageError(f"--address {address}: expected HOST:PORT (the head node's GCS address)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise StoreUnavailableError(
            f"no Ray cluster answers at {address} ({exc.strerror or exc}): start one (ray start --head) or give the "
            "head node's address (ray status prints it)"
        ) from None


def _actor_exists(name: str, namespace: str) -> bool:
    import ray

    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    return True


def _record(value: Any) -> dict[str, Any]:
    """A wire record (dataclass) or a plain dict, as a JSON-ready dict."""
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    return json.loads(json.dumps(dict(value), default=str))


def open_source(args: argparse.Namespace) -> Source:
    """``--dir`` (offline) or the cluster at ``--address``/``RAY_ADDRESS`` (online)."""
    if args.dir:
        if "://" in args.dir and not args.dir.startswith("file://"):
            return DurableSource(args.dir)
        path = args.dir.removeprefix("file://")
        if not Path(path).is_dir():
            raise UsageError(f"--dir {args.dir}: no such folder")
        return FolderSource(path)
    address = args.address or os.environ.get("RAY_ADDRESS")
    if not address:
        import ray

        if not ray.is_initialized():
            raise UsageError("say where the snapshots are: --address (or RAY_ADDRESS) for a cluster, --dir offline")
    return ClusterSource(address, args.league)


# ---- commands ------------------------------------------------------------------------------------------------
def cmd_ls(source: Source, args: argparse.Namespace, out: Output) -> int:
    rows = _rows(source, args.policy)
    out.table(
        [r.to_json() for r in rows],
        ["policy", "version", "size", "tiers", "meta", "checksum", "holders"],
        [(r.id.policy_id, str(r.id.version), _size(r.nbytes), _tiers(r.tiers), _short_json(r.meta), r.checksum,
          ", ".join(_node(h) for h in r.holders)) for r in rows],
        title=f"{len(rows)} snapshots in {source.where}",
    )
    return EXIT_OK


def cmd_stats(source: Source, args: argparse.Namespace, out: Output) -> int:
    stats = source.stats()
    keys = [k for k in stats[0] if not isinstance(stats[0][k], (list, dict))] if stats else []
    out.table(  # one column per node: a store has more figures than a terminal has room for side by side
        stats,
        ["figure", *(_node(s.get("node_id") or s.get("source")) for s in stats)],
        [[key, *(_cell(key, s[key]) for s in stats)] for key in keys],
        title=f"stats of {source.where}",
    )
    return EXIT_OK


def cmd_verify(source: Source, args: argparse.Namespace, out: Output) -> int:
    rows = _rows(source, args.policy)
    if args.version is not None:
        rows = [_select(rows, args.policy, args.version)]
    results = source.verify(rows, args.policy, args.version)
    out.table(
        results,
        ["snapshot", "ok", "checked", "problems"],
        [(f"{r['policy_id']}@v{r['version']}" if r["version"] else "(unlisted files)", "ok" if r["ok"] else "FAILED",
          ", ".join(_node(c["node"]) for c in r["copies"] if c["node"]), "; ".join(r["problems"])) for r in results],
        title=f"verified {len(results)} snapshots in {source.where}",
    )
    return EXIT_OK if all(r["ok"] for r in results) else EXIT_PROBLEM


def cmd_export(source: Source, args: argparse.Namespace, out: Output) -> int:
    row = _select(_rows(source, args.policy), args.policy, args.version)
    target = Path(args.output or f"{row.id.policy_id}-v{row.id.version}.safetensors")
    if target.exists() and not args.force:
        raise UsageError(f"{target} exists; pass --force to overwrite it")
    buf = source.buffer(row)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(memoryview(buf).cast("B"))
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    out.message({"exported": str(row.id), "file": str(target), "nbytes": len(buf), "checksum": row.checksum},
                f"exported {row.id} to {target} ({_size(len(buf))})")
    return EXIT_OK


def cmd_import(source: Source, args: argparse.Namespace, out: Output) -> int:
    online = _online(source, "import")
    check_policy_id(args.policy)
    extra = _meta_option(args.meta)
    weights, meta = load_weights_file(Path(args.file))
    meta.update(extra)
    sid = online.publish(args.policy, weights, meta, args.durable)
    out.message({"imported": str(args.file), "policy_id": sid.policy_id, "version": sid.version, "meta": meta},
                f"imported {args.file} as {sid}")
    return EXIT_OK


def cmd_rm(source: Source, args: argparse.Namespace, out: Output) -> int:
    online = _online(source, "rm")
    if args.version is None and not args.all:
        raise UsageError(f"rm {args.policy} would delete every version: name a VERSION or pass --all")
    sid = _select(online.rows(args.policy), args.policy, args.version).id if args.version is not None else None
    deleted = online.delete(sid, check_policy_id(args.policy))
    out.message({"deleted": [str(s) for s in deleted]}, f"deleted {', '.join(map(str, deleted)) or 'nothing'}")
    return EXIT_OK


def cmd_du(source: Source, args: argparse.Namespace, out: Output) -> int:
    usage: dict[str, dict[str, Any]] = {}
    for row in _rows(source, args.policy):
        u = usage.setdefault(row.id.policy_id, {"policy_id": row.id.policy_id, "versions": 0, "nbytes": 0,
                                                "file_bytes": 0, "hot_bytes": 0})
        u["versions"] += 1
        u["nbytes"] += row.nbytes
        u["file_bytes"] += row.file_bytes
        u["hot_bytes"] += row.nbytes * sum(t == "hot" for t in row.tiers.values())
    rows = list(usage.values())
    total = {k: sum(u[k] for u in rows) for k in ("versions", "nbytes", "file_bytes", "hot_bytes")}
    out.table(
        {"policies": rows, "total": total},
        ["policy", "versions", "size", "in memory (all nodes)", "files"],
        [(u["policy_id"], str(u["versions"]), _size(u["nbytes"]), _size(u["hot_bytes"]), _size(u["file_bytes"]))
         for u in [*rows, {"policy_id": "TOTAL", **total}]],
        title=f"space used in {source.where}",
    )
    return EXIT_OK


def cmd_gc(source: Source, args: argparse.Namespace, out: Output) -> int:
    if args.keep_last is None:
        raise UsageError("gc needs --keep-last N (N >= 1, so the latest version of every policy stays)")
    if args.keep_last < 1:
        raise UsageError(f"--keep-last must be >= 1, got {args.keep_last}")
    online = None if args.dry_run else _online(source, "gc without --dry-run")
    keep, drop = retention(_rows(source, args.policy), args.keep_last, args.keep_meta)
    deleted = [str(s) for row in drop for s in online.delete(row.id, row.id.policy_id)] if online else []
    result = {"dry_run": args.dry_run, "kept": [str(r.id) for r in keep], "delete": [str(r.id) for r in drop],
              "deleted": deleted, "freed_nbytes": sum(r.nbytes for r in drop)}
    verb = "would delete" if args.dry_run else "deleted"
    out.message(result, f"{verb} {len(drop)} snapshots ({_size(result['freed_nbytes'])}), kept {len(keep)}"
                + "".join(f"\n  {verb} {r.id}" for r in drop))
    return EXIT_OK


def retention(rows: Sequence[Row], keep_last: int, keep_meta: Sequence[str]) -> tuple[list[Row], list[Row]]:
    """Split rows into (keep, drop): per policy the newest ``keep_last`` versions stay, and so does every
    snapshot whose meta has a true value under one of ``keep_meta`` (e.g. ``frozen``)."""
    by_policy: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_policy[row.id.policy_id].append(row)
    keep, drop = [], []
    for versions in by_policy.values():
        versions.sort(key=lambda r: r.id.version, reverse=True)
        for rank, row in enumerate(versions):
            (keep if rank < keep_last or any(row.meta.get(k) for k in keep_meta) else drop).append(row)
    return sorted(keep, key=lambda r: r.id), sorted(drop, key=lambda r: r.id)


def _meta_option(text: str | None) -> dict[str, Any]:
    """``--meta``: a JSON object (None: no option given)."""
    if text is None:
        return {}
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--meta is not JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise UsageError(f"--meta must be a JSON object such as '{{\"frozen\": true}}', got {type(meta).__name__}: "
                         f"{text[:80]}")
    return meta


def load_weights_file(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tensors, meta) from a ``.safetensors`` file (its policystore meta kept) or a ``torch.save``d state dict,
    which is loaded with ``weights_only=True`` (no arbitrary code runs)."""
    import torch

    if path.is_dir():
        raise UsageError(f"{path} is a folder: import takes one weights file (.safetensors or torch.save)")
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) == 9 and head[8:9] == b"{":  # 8-byte header length, then the JSON header
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                weights = {name: f.get_tensor(name) for name in f.keys()}
                metadata = f.metadata() or {}
        except (SafetensorError, OSError, ValueError) as exc:
            raise InvalidWeightsError(f"{path}: not a readable safetensors file ({exc})") from None
        try:
            meta = json.loads(metadata.get(META_USER, "{}"))
        except json.JSONDecodeError:
            meta = {}
        return weights, meta if isinstance(meta, dict) else {}
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # weights_only refuses pickled code; torch raises several types
        raise InvalidWeightsError(f"{path}: not a safetensors file nor a weights-only torch.save file ({exc})") \
            from None
    if not isinstance(loaded, Mapping) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise InvalidWeightsError(f"{path}: expected a state dict (names to tensors), got {type(loaded).__name__}")
    return dict(loaded), {}


# ---- helpers -------------------------------------------------------------------------------------------------
def _rows(source: Source, policy_id: str | None) -> list[Row]:
    if policy_id is not None:
        check_policy_id(policy_id)
    rows = source.rows(policy_id)
    if policy_id is not None and not rows:
        raise UnknownPolicyError(f"no snapshot of {policy_id!r} in {source.where}")
    return rows


def _select(rows: list[Row], policy_id: str, version: int | None) -> Row:
    """The row of ``version`` (latest when None) among one policy's rows."""
    if version is None:
        return max(rows, key=lambda r: r.id.version)
    for row in rows:
        if row.id.version == check_version(version):
            return row
    raise UnknownVersionError(f"{policy_id} has no version {version} (it has {[r.id.version for r in rows]})")


def _online(source: Source, what: str) -> ClusterSource:
    if not source.online:
        raise UsageError(f"{what} changes the league through its catalog: run it against a cluster (--address)")
    return source  # type: ignore[return-value]


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _node(node: str | None) -> str:
    return node[:8] if node and len(node) > 16 else str(node)


def _tiers(tiers: dict[str, str]) -> str:
    return " ".join(f"{_node(where)}:{tier}" for where, tier in tiers.items())


def _short_json(value: Any, width: int = 48) -> str:
    text = json.dumps(value, separators=(",", ":"), default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def _cell(key: str, value: Any) -> str:
    if isinstance(value, int) and key.endswith("bytes"):
        return _size(value)
    return _node(value) if key == "node_id" else str(value)


class Output:
    """Tables with rich for people; the same data as JSON on stdout with ``--json``."""

    def __init__(self, as_json: bool):
        self.as_json = as_json

    def table(self, data: Any, columns: Sequence[str], cells: Sequence[Sequence[str]], *, title: str) -> None:
        if self.as_json:
            return self._json(data)
        from rich.table import Table

        table = Table(title=title, title_justify="left")
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in cells:
            table.add_row(*row)
        self._console().print(table)

    def message(self, data: Any, text: str) -> None:
        if self.as_json:
            return self._json(data)
        self._console().print(text, highlight=False)

    def error(self, text: str) -> None:
        if self.as_json:
            print(json.dumps({"error": text}), file=sys.stdout)
        print(f"policystore: error: {text}", file=sys.stderr)

    @staticmethod
    def _json(data: Any) -> None:
        print(json.dumps(data, indent=2, default=str))

    @staticmethod
    def _console():
        from rich.console import Console

        return Console(width=None if sys.stdout.isatty() else 200, soft_wrap=False)


# ---- argument parsing ----------------------------------------------------------------------------------------
EPILOG = """\
where the snapshots are read from:
  --address HOST:PORT  a running Ray cluster (or set RAY_ADDRESS); the CLI joins it as a driver
  --dir PATH           offline, no cluster: a node's spill folder, or a durable tier (folder or s3://, gs://,
                       hdfs:// URI with its options, credentials from the environment)

exit codes: 0 ok, 1 a problem was found (verify failed, storage or cluster unreachable), 2 usage or bad input

examples:
  policystore --address 127.0.0.1:6379 ls
  policystore --dir /mnt/league verify --json
  policystore gc --keep-last 5 --keep-meta frozen --dry-run
"""

COMMANDS: dict[str, tuple[Callable[..., int], str, str]] = {
    "ls": (cmd_ls, "list snapshots: versions, sizes, tier on each node, meta, checksums, holders",
           "policystore ls main_0 --json"),
    "stats": (cmd_stats, "per-node figures: memory and disk use, hits, misses, evictions, restores",
              "policystore stats"),
    "verify": (cmd_verify, "re-check every copy against the checksum recorded at publish (exit 1 on a failure)",
               "policystore verify main_0 3"),
    "export": (cmd_export, "write one snapshot to a standalone .safetensors file (safetensors.torch.load_file "
                           "reads it; meta kept in __metadata__)",
               "policystore export main_0 3 -o main_0-v3.safetensors"),
    "import": (cmd_import, "publish a .safetensors file or a torch.save'd state dict (loaded with "
                           "weights_only=True) as the next version of a policy",
               "policystore import weights.pt main_0 --meta '{\"frozen\": true}'"),
    "rm": (cmd_rm, "delete one version (or --all versions) of a policy on every node",
           "policystore rm main_0 3"),
    "du": (cmd_du, "space used per policy: bytes, bytes in shared memory on all nodes, bytes of files",
           "policystore du"),
    "gc": (cmd_gc, "delete old versions by a retention rule: keep the newest N per policy and every snapshot "
                   "whose meta marks it (e.g. frozen)",
           "policystore gc --keep-last 3 --keep-meta frozen --dry-run"),
}


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_argument_group("where")
    where.add_argument("--address", default=argparse.SUPPRESS, help="Ray cluster address (default: RAY_ADDRESS)")
    where.add_argument("--dir", default=argparse.SUPPRESS, metavar="PATH",
                       help="offline: a spill folder or a durable tier (path or URI)")
    where.add_argument("--league", default=argparse.SUPPRESS,
                       help="online: the league to look at (default: the cluster's default league)")
    where.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON for scripts")
    parser = argparse.ArgumentParser(
        prog="policystore", description="Inspect and maintain a league's policy snapshots, online or offline.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter, parents=[common],
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parsers = {}
    for name, (_, summary, example) in COMMANDS.items():
        parsers[name] = commands.add_parser(
            name, help=summary, description=f"{summary}.", epilog=f"example:\n  {example}", parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    for name in ("ls", "verify", "du", "gc"):
        parsers[name].add_argument("policy", nargs="?", help="only this policy")
    parsers["verify"].add_argument("version", nargs="?", type=int, help="only this version (needs POLICY)")
    for name in ("export", "rm"):
        parsers[name].add_argument("policy")
        parsers[name].add_argument("version", nargs="?", type=int, help="default: the latest" if name == "export"
                                   else "the version to delete")
    parsers["export"].add_argument("-o", "--output", help="file to write (default: POLICY-vVERSION.safetensors)")
    parsers["export"].add_argument("--force", action="store_true", help="overwrite an existing file")
    parsers["import"].add_argument("file", help="a .safetensors file or a torch.save'd state dict")
    parsers["import"].add_argument("policy", help="policy id to publish it under (as its next version)")
    parsers["import"].add_argument("--meta", help="JSON object merged into the file's own meta")
    parsers["import"].add_argument("--durable", action="store_true", help="return only once it is on disk")
    parsers["rm"].add_argument("--all", action="store_true", help="delete every version of POLICY")
    parsers["gc"].add_argument("--keep-last", type=int, metavar="N", help="newest versions to keep per policy")
    parsers["gc"].add_argument("--keep-meta", action="append", default=[], metavar="KEY",
                               help="also keep snapshots whose meta[KEY] is true (repeatable), e.g. frozen")
    parsers["gc"].add_argument("--dry-run", action="store_true", help="say what would be deleted, delete nothing")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (``python -m policystore`` and the console script exit with it)."""
    args = build_parser().parse_args(argv)
    for name, default in (("address", None), ("dir", None), ("league", None), ("json", False)):
        setattr(args, name, getattr(args, name, default))
    out = Output(args.json)
    source = None
    try:
        source = open_source(args)
        return COMMANDS[args.command][0](source, args, out)
    except _BAD_INPUT as exc:
        out.error(str(exc))
        return EXIT_USAGE
    except (PolicyStoreError, OSError, ConnectionError) as exc:
        out.error(str(exc))
        return EXIT_PROBLEM
    finally:
        if isinstance(source, ClusterSource):
            source.close()
