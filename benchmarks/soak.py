"""Soak benchmark: does anything grow with publish/delete churn? Memory of the actors, objects in the durable tier.

One local Ray node, one store with a durable tier in a local folder. For --minutes, the driver publishes small
snapshots of --policies policies (one in --durable-every durable, the rest non-durable) and keeps the newest
--keep versions of each, deleting older ones alternately through the store (``PolicyStore.delete``) and through
the catalog actor (as any driver can). An operation is one publish or one delete.

Rows: one ``sample`` every --sample-ops operations (operations so far, seconds, the PSS of the catalog actor's and
of the store actor's process in MiB, the durable tier's commit markers, data objects and tombstones, the spill
folder's files), then one ``growth`` row: the least-squares slope per 1,000 operations of each, over the samples
after the first quarter of the run (start-up and warm caches excluded). Before each sample the catalog folds the
durable tier's tombstones into one floor per policy (``compact_tombstones``; --no-compact: never, and the tier
keeps one tombstone per deleted version, about 500 per 1,000 operations). Live snapshots stay constant
(--policies x --keep), so a flat run has slopes near 0.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psutil
import ray

from . import harness
from .harness import MiB


def _pid_of(actor: Any) -> int:
    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60)


def _durable_counts(root: Path) -> dict[str, int]:
    counts = {"durable_markers": 0, "durable_data": 0, "durable_tombstones": 0, "durable_floors": 0}
    for path in root.rglob("*"):
        if path.name.endswith(".commit.json"):
            counts["durable_markers"] += 1
        elif path.name.endswith(".deleted.json"):
            counts["durable_tombstones"] += 1
        elif path.name.endswith(".floor"):
            counts["durable_floors"] += 1
        elif path.name.endswith(".safetensors"):
            counts["durable_data"] += 1
    return counts


def _slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (0 with fewer than two points)."""
    if len(xs) < 2:
        return 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


GROWING = ("catalog_pss_mib", "store_pss_mib", "durable_markers", "durable_data", "durable_tombstones", "spill_files")


def churn(args: Any, spill: Path, results: harness.Results) -> list[dict[str, Any]]:
    import torch

    import policystore
    from policystore.remote import CATALOG_NAME, NAMESPACE, store_name

    durable = spill / "durable"
    store = policystore.connect(policystore.StoreConfig(spill_dir=str(spill / "spill"), durable_uri=str(durable)))
    node_id = store.stats().node_id
    catalog = ray.get_actor(CATALOG_NAME, namespace=NAMESPACE)
    pids = {"catalog": _pid_of(catalog), "store": _pid_of(ray.get_actor(store_name(node_id), namespace=NAMESPACE))}
    numel = args.tensor_kib * 1024 // 4
    live: dict[str, list[int]] = {f"soak_{i}": [] for i in range(args.policies)}
    ops = deletes = 0
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    until = started + args.minutes * 60
    while time.monotonic() < until:
        for policy_id, versions in live.items():
            sid = store.publish(policy_id, {"w": torch.randn(numel)}, durable=ops % args.durable_every == 0)
            versions.append(sid.version)
            ops += 1
            while len(versions) > args.keep:
                version = versions.pop(0)
                if deletes % 2:
                    ray.get(catalog.delete.remote(policy_id, version), timeout=120)
                else:
                    store.delete(policy_id, version)
                deletes += 1
                ops += 1
            if ops // args.sample_ops > len(rows):
                if not args.no_compact:  # the catalog folds the tombstones below what is live into a floor
                    ray.get(catalog.compact_tombstones.remote(), timeout=120)
                rows.append(results.emit(_sample(ops, time.monotonic() - started, pids, durable, spill / "spill")))
    return rows


def _sample(ops: int, seconds: float, pids: dict[str, int], durable: Path, spill: Path) -> dict[str, Any]:
    pss = {f"{name}_pss_mib": psutil.Process(pid).memory_full_info().pss / MiB for name, pid in pids.items()}
    files = sum(1 for p in spill.rglob("*") if p.is_file())
    return {"row": "sample", "ops": ops, "seconds": round(seconds, 1), **pss, **_durable_counts(durable),
            "spill_files": files}


def growth(rows: list[dict[str, Any]]) -> dict[str, Any]:
    kept = rows[len(rows) // 4:]
    xs = [r["ops"] / 1000 for r in kept]
    return {"row": "growth", "ops": rows[-1]["ops"] if rows else 0, "samples": len(kept),
            **{f"{key}_per_1000_ops": _slope(xs, [r[key] for r in kept]) for key in GROWING}}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    samples = [r for r in rows if r["row"] == "sample"]
    fig, (mem, objects) = plt.subplots(1, 2, figsize=(11, 4))
    for key in ("catalog_pss_mib", "store_pss_mib"):
        mem.plot([r["ops"] for r in samples], [r[key] for r in samples], label=key)
    mem.set(xlabel="operations", ylabel="PSS (MiB)", title="actor memory under churn")
    mem.legend()
    for key in ("durable_markers", "durable_data", "durable_tombstones", "spill_files"):
        objects.plot([r["ops"] for r in samples], [r[key] for r in samples], label=key)
    objects.set(xlabel="operations", ylabel="objects", title="durable tier and spill folder")
    objects.legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> None:
    parser = harness.make_parser("soak", __doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the churn runs")
    parser.add_argument("--policies", type=int, default=4)
    parser.add_argument("--keep", type=int, default=8, help="versions kept per policy; older ones are deleted")
    parser.add_argument("--durable-every", type=int, default=5, help="one publish in this many is durable")
    parser.add_argument("--tensor-kib", type=int, default=64, help="snapshot size")
    parser.add_argument("--sample-ops", type=int, default=1000, help="operations between two samples")
    parser.add_argument("--no-compact", action="store_true",
                        help="never fold the durable tier's tombstones (CatalogServer.compact_tombstones)")
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes, args.sample_ops = 0.3, 50
    harness.setup_logging(args.verbose)
    results = harness.Results("soak", args, {k: v for k, v in vars(args).items() if k != "out"})
    with harness.ray_session(256 * MiB, num_cpus=2) as spill:
        rows = churn(args, spill, results)
        summary = results.emit(growth(rows))
    results.finish(["row", "ops", "seconds", "catalog_pss_mib", "store_pss_mib", "durable_markers", "durable_data",
                    "durable_tombstones", "spill_files"], plot=plot, notes=[
        "growth per 1,000 operations: " + ", ".join(f"{k} {summary[f'{k}_per_1000_ops']:+.3f}" for k in GROWING)])


if __name__ == "__main__":
    main()
