"""Disk tier: restore bandwidth against a raw read of the same file, lz4 on and off, and how well weights compress.

ratio rows: lz4 compression ratio (compressed / raw bytes) of a packed snapshot for three kinds of weights:
  random   PyTorch's default initialisation
  trained  the same net after --train-steps SGD steps (what a league snapshot looks like)
  pruned   trained, then the 80% smallest-magnitude weights of each tensor set to zero (compressible)
and whether the store chose to keep the file compressed (it stores raw when lz4 saves < 10%).

restore rows (per size, kind random or pruned, lz4 off/on, page cache cold/warm):
  restore_gbps   snapshot bytes / time for a worker's store.get() of an evicted snapshot (actor round trip,
                 file read, lz4, checksum, ray.put, ray.get, header parse); the hot tier holds one snapshot and
                 two are read in turn, and each sample first waits (untimed) for the previous eviction's push to
                 reach the worker, so every get is a restore (store_restores counts them)
  tier_gbps      snapshot bytes / time of what the store does per restore, in this process:
                 DiskTier.restore(..., put=ray.put) (read, lz4, checksums, the copy into the object store)
  raw_read_gbps  file bytes / time to read the same file into a preallocated buffer
  ratio          restore_gbps / raw_read_gbps; tier_ratio: the same for tier_gbps
  goal_met       ratio >= 0.8 (the goal, warm and cold)
The three take turns sample by sample (store.get, raw read, tier restore), so none gets a quieter machine.
Cold reads drop the file from the page cache first (posix_fadvise DONTNEED; no root needed).
--quick runs lz4 on only (random weights are still stored raw: they do not compress).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import lz4.frame
import numpy as np
import ray
import torch

import policystore
from policystore.format import Expected, pack
from policystore.snapfile import SpillFile
from policystore.spill import DiskTier

from . import harness
from .harness import MiB
from .nets import NetSpec, random_weights, trained_weights

_READ_CHUNK = 16 * MiB
GOAL_RATIO = 0.8  # a restore at least this fraction of a raw read of the file, warm and cold


def pruned(weights: dict[str, torch.Tensor], fraction: float = 0.8) -> dict[str, torch.Tensor]:
    """Magnitude pruning: the smallest ``fraction`` of each tensor's entries set to zero."""
    out = {}
    for name, value in weights.items():
        flat = value.abs().flatten()
        keep = value.clone()
        if flat.numel() > 1:
            keep[value.abs() < flat.kthvalue(int(fraction * flat.numel()) + 1).values] = 0
        out[name] = keep
    return out


def drop_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def raw_read(path: Path) -> float:
    """Seconds to read the whole file into a preallocated buffer, as the tier reads raw files."""
    buf = np.empty(path.stat().st_size, dtype=np.uint8)
    view = memoryview(buf)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        got = 0
        while got < len(buf):
            got += f.readinto(view[got : got + _READ_CHUNK]) or len(buf)
    return time.perf_counter() - start


class Reader:
    """Times store.get() of evicted snapshots, dropping their files from the page cache first if asked."""

    def __init__(self) -> None:
        self.store = policystore.connect()

    def restore(self, policy_id: str, path: str, cold: bool, evicted: bool) -> float:
        """Seconds for one ``store.get`` of ``policy_id``; ``evicted``: first wait (untimed) until its eviction's
        push has reached this process, so that the get is a real restore."""
        if evicted:
            harness.wait_not_pushed(self.store, policy_id)
        if cold:
            drop_page_cache(Path(path))
        start = time.perf_counter()
        snap = self.store.get(policy_id)
        elapsed = time.perf_counter() - start
        del snap
        return elapsed


def ratio_rows(results: harness.Results, args: Any) -> None:
    spec = NetSpec.for_bytes("mlp", args.ratio_mib * MiB)
    trained = trained_weights(spec, args.train_steps)
    for kind, weights in (("random", random_weights(spec, 0)), ("trained", trained), ("pruned", pruned(trained))):
        buf = pack(weights, policy_id=kind)
        compressed = len(lz4.frame.compress(memoryview(buf)))
        results.emit({"row": "ratio", "kind": kind, "snapshot_mib": args.ratio_mib, "snapshot_bytes": len(buf),
                      "train_steps": args.train_steps if kind != "random" else 0,
                      "lz4_ratio": compressed / len(buf), "stored_compressed": compressed < 0.9 * len(buf)})


def restore_rows(results: harness.Results, size_mib: int, compress: bool, args: Any) -> None:
    """One Ray session: two random and two pruned snapshots, a hot tier that holds one of them."""
    spec = NetSpec.for_bytes("mlp", size_mib * MiB)
    nbytes = spec.nbytes
    with harness.ray_session(4 * nbytes + 256 * MiB) as spill_dir:
        store = policystore.connect(policystore.StoreConfig(
            hot_capacity_bytes=int(nbytes * 1.5), spill_dir=str(spill_dir), compress=compress
        ))
        pairs = {kind: [f"{kind}-{i}" for i in range(2)] for kind in ("random", "pruned")}
        for kind, ids in pairs.items():
            for seed, pid in enumerate(ids):
                weights = random_weights(spec, seed)
                store.publish(pid, pruned(weights) if kind == "pruned" else weights)
        store.flush()
        infos = {i.id.policy_id: i for i in store.list()}
        tier = DiskTier(spill_dir, compress=compress)
        reader = ray.remote(Reader).options(num_cpus=0.1).remote()
        repeats = max(3, min(args.repeats, int(args.bytes_per_case_gib * 2**30 // nbytes)))
        last = None  # the snapshot the reader got last: the one hot now (its get evicted the one read before)
        for kind, ids in pairs.items():
            files = [SpillFile(tier.path_for(infos[p].id, infos[p].compressed), infos[p].compressed,
                               infos[p].file_bytes) for p in ids]
            for cache in ("cold", "warm"):
                cold = cache == "cold"
                before = store.stats().restores
                restore_s, raw_s, tier_s = [], [], []
                for i in range(repeats + 1):  # the three take turns, so that each sees the same machine state
                    file, info = files[i % 2], infos[ids[i % 2]]
                    # every get but a repeat of the last one restores its snapshot (the last get evicted it): the
                    # reader first waits for that eviction's push, or it would read the ref it still holds, and
                    # leave the other snapshot hot for the next get's wait (seen on a loaded machine)
                    evicted = ids[i % 2] != last
                    restore_s.append(ray.get(reader.restore.remote(ids[i % 2], str(file.path), cold, evicted)))
                    last = ids[i % 2]
                    if cold:
                        drop_page_cache(file.path)
                    raw_s.append(raw_read(file.path))
                    if cold:
                        drop_page_cache(file.path)
                    start = time.perf_counter()
                    ref = tier.restore(file, str(info.id), expect=Expected(*info.id, info.checksum), put=ray.put)
                    tier_s.append(time.perf_counter() - start)
                    del ref
                restore_s, raw_s, tier_s = restore_s[1:], raw_s[1:], tier_s[1:]
                restores = store.stats().restores - before  # repeats, +1 if the first get restored too
                restore = harness.percentiles(restore_s, 1.0)["p50"]
                raw = harness.percentiles(raw_s, 1.0)["p50"]
                tier_read = harness.percentiles(tier_s, 1.0)["p50"]
                file_bytes = files[0].file_bytes
                results.emit({
                    "row": "restore", "kind": kind, "snapshot_mib": size_mib, "snapshot_bytes": nbytes,
                    "lz4": compress, "stored_compressed": files[0].compressed, "file_bytes": file_bytes,
                    "cache": cache, "samples": repeats, "store_restores": restores,
                    "restore_p50_ms": restore * 1e3, "restore_gbps": nbytes / restore / 1e9,
                    "tier_read_p50_ms": tier_read * 1e3, "tier_gbps": nbytes / tier_read / 1e9,
                    "raw_read_p50_ms": raw * 1e3, "raw_read_gbps": file_bytes / raw / 1e9,
                    "ratio": (nbytes / restore) / (file_bytes / raw),
                    "tier_ratio": (nbytes / tier_read) / (file_bytes / raw),
                    "goal_met": (nbytes / restore) / (file_bytes / raw) >= GOAL_RATIO,
                })


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["row"] == "restore"]
    labels = [f"{r['snapshot_mib']}M {r['kind']}\nlz4 {'on' if r['lz4'] else 'off'} {r['cache']}" for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows)), 4.5))
    for offset, key, label in ((-0.27, "raw_read_gbps", "raw read of the file"), (0.0, "tier_gbps", "DiskTier.read"),
                               (0.27, "restore_gbps", "store.get restore")):
        ax.bar(x + offset, [r[key] for r in rows], width=0.27, label=label)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("GB/s (restore: snapshot bytes; raw: file bytes)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = harness.make_parser("spill_restore", __doc__)
    parser.add_argument("--sizes-mib", type=harness.int_list, default=[64, 256], help="snapshot sizes (%(default)s)")
    parser.add_argument("--ratio-mib", type=int, default=4, help="net size for the compression-ratio rows")
    parser.add_argument("--train-steps", type=int, default=300, help="SGD steps for the 'trained' weights")
    parser.add_argument("--repeats", type=int, default=10, help="samples per point (fewer for big snapshots)")
    parser.add_argument("--bytes-per-case-gib", type=float, default=4.0, help="cap samples by data moved")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes_mib, args.ratio_mib, args.train_steps, args.repeats = [4], 1, 5, 3
    harness.setup_logging(args.verbose)
    results = harness.Results("spill_restore", args, {k: v for k, v in vars(args).items() if k != "out"})
    points = [(s, c) for s in args.sizes_mib for c in ((True,) if args.quick else (False, True))]
    with harness.progress() as bar:
        task = bar.add_task("spill_restore", total=len(points) + 1)
        ratio_rows(results, args)
        bar.advance(task)
        for size, compress in points:
            bar.update(task, description=f"{size} MiB lz4={'on' if compress else 'off'}")
            restore_rows(results, size, compress, args)
            bar.advance(task)
    results.finish(
        ["row", "kind", "snapshot_mib", "lz4", "stored_compressed", "lz4_ratio", "cache", "restore_gbps",
         "tier_gbps", "raw_read_gbps", "ratio", "tier_ratio", "goal_met", "loadavg_1m"],
        plot,
    )


if __name__ == "__main__":
    main()
