"""The ``policystore`` command: look at and maintain a league's snapshots from a shell.

Online it joins a running Ray cluster (``--address`` or ``RAY_ADDRESS``) and talks to the stores through the
public client API; offline (``--dir``) it reads a spill folder or a durable tier's folder through the Ray-free
``policystore.reader``, and a durable tier on object storage (``s3://``, ``gs://``, ``hdfs://``) through
``policystore.durable``, without any cluster. Tables for people, ``--json`` for scripts. This module holds the
commands and their arguments; where the snapshots come from is ``sources.py``, what is printed ``output.py``.

Exit codes: 0 ok, 1 a problem was found (a snapshot failed verification, storage or cluster unreachable),
2 usage or bad input (unknown policy, bad file, missing option).
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import logs
from ..errors import (
    CorruptSnapshotError,
    InvalidPolicyIdError,
    InvalidWeightsError,
    PolicyStoreError,
    SnapshotFolderError,
    UnknownPolicyError,
    UnknownVersionError,
)
from ..format import META_CHECKSUM, META_USER, verify_buffer
from ..ids import check_policy_id, check_version, checked_id
from .output import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
    Output,
    Row,
    Usage,
    UsageError,
    cell,
    node,
    record,
    short_json,
    size,
)
from .sources import ClusterSource, Source, open_source

_BAD_INPUT = (UsageError, InvalidPolicyIdError, InvalidWeightsError, UnknownPolicyError, SnapshotFolderError,
              FileNotFoundError)


# ---- commands ------------------------------------------------------------------------------------------------
def cmd_ls(source: Source, args: argparse.Namespace, out: Output) -> int:
    rows = _rows(source, args.policy) if args.limit is None and args.after is None else _page(source, args)
    out.table(
        rows,
        ["policy", "version", "size", "tiers", "meta", "checksum", "holders"],
        [(r.id.policy_id, str(r.id.version), size(r.nbytes), " ".join(f"{node(w)}:{t}" for w, t in r.tiers.items()),
          short_json(r.meta), r.checksum, ", ".join(node(h) for h in r.holders)) for r in rows],
        title=f"{len(rows)} snapshots in {source.where}",
    )
    return EXIT_OK


def cmd_stats(source: Source, args: argparse.Namespace, out: Output) -> int:
    stats = [record(s) for s in source.stats()]
    keys = [k for k in stats[0] if not isinstance(stats[0][k], (list, tuple, dict))] if stats else []
    out.table(  # one column per node: a store has more figures than a terminal has room for side by side
        stats,
        ["figure", *(node(s.get("node_id") or s.get("source")) for s in stats)],
        [[key, *(cell(key, s[key]) for s in stats)] for key in keys],
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
        [(f"{r.policy_id}@v{r.version}" if r.version else "(unlisted files)", "ok" if r.ok else "FAILED",
          ", ".join(node(c.node) for c in r.copies if c.node), "; ".join(r.problems)) for r in results],
        title=f"verified {len(results)} snapshots in {source.where}",
    )
    return EXIT_OK if all(r.ok for r in results) else EXIT_PROBLEM


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
                f"exported {row.id} to {target} ({size(len(buf))})")
    return EXIT_OK


def cmd_import(source: Source, args: argparse.Namespace, out: Output) -> int:
    extra = _meta_option(args.meta)
    weights, meta = load_weights_file(Path(args.file))
    meta.update(extra)
    sid = _online(source).publish(args.policy, weights, meta, args.durable)
    out.message({"imported": str(args.file), "policy_id": sid.policy_id, "version": sid.version, "meta": meta},
                f"imported {args.file} as {sid}")
    return EXIT_OK


def cmd_rm(source: Source, args: argparse.Namespace, out: Output) -> int:
    if args.version is None and not args.all:
        raise UsageError(f"rm {args.policy} would delete every version: name a VERSION or pass --all")
    online = _online(source)
    sid = _select(online.rows(args.policy), args.policy, args.version).id if args.version is not None else None
    deleted = online.delete(sid, args.policy)
    out.message({"deleted": [str(s) for s in deleted]}, f"deleted {', '.join(map(str, deleted)) or 'nothing'}")
    return EXIT_OK


def cmd_du(source: Source, args: argparse.Namespace, out: Output) -> int:
    usage: dict[str, Usage] = {}
    total = Usage("TOTAL")
    for row in _rows(source, args.policy):
        usage.setdefault(row.id.policy_id, Usage(row.id.policy_id)).add(row)
        total.add(row)
    rows = list(usage.values())
    out.table(
        {"policies": rows, "total": {k: v for k, v in record(total).items() if k != "policy_id"}},
        ["policy", "versions", "size", "in memory (all nodes)", "files"],
        [(u.policy_id, str(u.versions), size(u.nbytes), size(u.hot_bytes), size(u.file_bytes)) for u in [*rows, total]],
        title=f"space used in {source.where}",
    )
    return EXIT_OK


def cmd_gc(source: Source, args: argparse.Namespace, out: Output) -> int:
    if args.keep_last is None:
        raise UsageError("gc needs --keep-last N (N >= 1, so the latest version of every policy stays)")
    if args.keep_last < 1:
        raise UsageError(f"--keep-last must be >= 1, got {args.keep_last}")
    online = None if args.dry_run else _online(source)
    keep, drop = retention(_rows(online or source, args.policy), args.keep_last, args.keep_meta)
    deleted = [str(s) for row in drop for s in online.delete(row.id, row.id.policy_id)] if online else []
    # every delete left a tombstone in the durable tier; fold them (and earlier ones) into per-policy floors
    folded = sum(online.compact_tombstones().values()) if online else 0
    result = {"dry_run": args.dry_run, "kept": [str(r.id) for r in keep], "delete": [str(r.id) for r in drop],
              "deleted": deleted, "freed_nbytes": sum(r.nbytes for r in drop), "tombstones_folded": folded}
    verb = "would delete" if args.dry_run else "deleted"
    out.message(result, f"{verb} {len(drop)} snapshots ({size(result['freed_nbytes'])}), kept {len(keep)}"
                + (f", folded {folded} tombstones" if folded else "")
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
        if META_CHECKSUM in metadata:
            _check_recorded(path)
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


def _check_recorded(path: Path) -> None:
    """A file that records a policystore checksum (an export, a spill file) must still match it, layout and data:
    changed bytes imported as a new snapshot would get a new, valid checksum and the damage could never be seen."""
    import numpy as np

    try:
        verify_buffer(np.fromfile(path, dtype=np.uint8), name=str(path))
    except CorruptSnapshotError as exc:
        raise InvalidWeightsError(f"refusing to import {path}: it no longer matches the checksum recorded in it, "
                                  f"its bytes changed since it was written ({exc})") from None


def _rows(source: Source, policy_id: str | None) -> list[Row]:
    rows = source.rows(policy_id)
    if policy_id is not None and not rows:
        raise UnknownPolicyError(f"no snapshot of {policy_id!r} in {source.where}")
    return rows


def _page(source: Source, args: argparse.Namespace) -> list[Row]:
    """One page of ``ls``: at most ``--limit`` rows after ``--after`` (a cluster's catalog pages the list itself)."""
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, got {args.limit}")
    after = None
    if args.after is not None:
        policy_id, _, version = args.after.rpartition("@")
        if not version.removeprefix("v").isdigit():
            raise UsageError(f"--after takes a snapshot id POLICY@vVERSION (as ls prints), got {args.after!r}")
        after = checked_id(policy_id, int(version.removeprefix("v")))
    if isinstance(source, ClusterSource):
        return source.rows(args.policy, args.limit, after)
    rows = [row for row in _rows(source, args.policy) if after is None or row.id > after]
    return rows[: args.limit]


def _select(rows: list[Row], policy_id: str, version: int | None) -> Row:
    """The row of ``version`` (latest when None) among one policy's rows."""
    if version is None:
        return max(rows, key=lambda r: r.id.version)
    for row in rows:
        if row.id.version == check_version(version):
            return row
    raise UnknownVersionError(f"{policy_id} has no version {version} (it has {[r.id.version for r in rows]})")


def _online(source: Source) -> ClusterSource:
    """The source through which a command changes the league: the cluster, or a stopped league's folder served by a
    private local Ray for this command."""
    return source.writable()


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


# ---- argument parsing ----------------------------------------------------------------------------------------
EPILOG = """\
where the snapshots are read from:
  --address HOST:PORT  a running Ray cluster (or set RAY_ADDRESS); the CLI joins it as a driver, with the
                       cluster's auth token where Ray keeps it (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or
                       ~/.ray/auth_token)
  --dir PATH           offline, no cluster: a node's spill folder, or a durable tier (folder or s3://, gs://,
                       hdfs:// URI with its options, credentials from the environment)

exit codes: 0 ok, 1 a problem was found (verify failed, storage or cluster unreachable), 2 usage or bad input

examples:
  policystore --address 127.0.0.1:6379 ls
  policystore --dir /mnt/league verify --json
  policystore gc --keep-last 5 --keep-meta frozen --dry-run
"""

def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_argument_group("where")
    where.add_argument("--address", default=argparse.SUPPRESS, help="Ray cluster address (default: RAY_ADDRESS)")
    where.add_argument("--dir", default=argparse.SUPPRESS, metavar="PATH",
                       help="offline: a spill folder or a durable tier (path or URI)")
    where.add_argument("--league", default=argparse.SUPPRESS,
                       help="online: the league to look at (default: the cluster's default league)")
    where.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON for scripts")
    where.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="also print policystore's and Ray's informational log lines")
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
    parsers["ls"].add_argument("--limit", type=int, metavar="N", help="at most N snapshots (one page)")
    parsers["ls"].add_argument("--after", metavar="ID", help="only snapshots after ID (POLICY@vVERSION, e.g. the "
                               "last of the previous page), in (policy, version) order")
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
    for name, default in (("address", None), ("dir", None), ("league", None), ("json", False), ("verbose", False)):
        setattr(args, name, getattr(args, name, default))
    if args.verbose:
        logs.verbose()
    out = Output(args.json)
    source = None
    try:
        if getattr(args, "policy", None) is not None:  # every command's POLICY, checked before anything is opened
            check_policy_id(args.policy)
        source = open_source(args)
        return COMMANDS[args.command][0](source, args, out)
    except _BAD_INPUT as exc:
        out.error(str(exc))
        return EXIT_USAGE
    except (PolicyStoreError, OSError, ConnectionError) as exc:
        out.error(str(exc))
        return EXIT_PROBLEM
    finally:
        if source is not None:
            source.close()
