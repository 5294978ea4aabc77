"""Soak benchmark: does anything grow with publish/delete churn? Memory of the actors, objects in the durable tier.

One local Ray node, one store with a durable tier in a local folder. For --minutes, the driver publishes small
snapshots of --policies policies (one in --durable-every durable, the rest non-durable) and keeps the newest
--keep versions of each, deleting older ones alternately through the store (``PolicyStore.delete``) and through
the catalog actor (as any driver can). An operation is one publish or one delete.

Rows: one ``sample`` every --sample-ops operations and at the end (operations so far, seconds, the USS and PSS of
the catalog actor's and of the store actor's process in MiB, the objects their Python heaps hold, the durable
tier's commit markers, data objects and tombstones, the spill folder's files), then one ``growth`` row: the
least-squares slope per 1,000 operations of each, over the samples after the first quarter of the run (start-up
and warm caches excluded). USS is what the process alone holds; PSS adds its share of the library pages every
process of the same install maps, which moves when other processes on the machine start or end. Before each
sample the catalog folds the durable tier's tombstones into one floor per policy (``compact_tombstones``;
--no-compact: never, and the tier keeps one tombstone per deleted version, about 500 per 1,000 operations). Live
snapshots stay constant (--policies x --keep), so a flat run has slopes near 0.
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


def _heap(actor: Any) -> dict[str, float]:
    """What the actor's Python heap holds: objects the collector tracks, and (with --trace) the bytes tracemalloc
    sees allocated by Python code. Flat while PSS grows: the growth is native (Ray's core worker, the allocator)."""

    def probe(self: Any) -> dict[str, float]:
        import gc
        import tracemalloc

        gc.collect()
        out = {"gc_objects": float(len(gc.get_objects()))}
        if tracemalloc.is_tracing():
            out["traced_mib"] = tracemalloc.get_traced_memory()[0] / 2**20
        return out

    return ray.get(actor.__ray_call__.remote(probe), timeout=120)


def _trace(actor: Any, action: str) -> list[dict[str, Any]]:
    """tracemalloc in the actor: ``start``, ``base`` (keep a snapshot) or ``diff`` (the ten allocation sites, by
    traceback (callers first, the allocating line last), whose live bytes changed most since the base snapshot)."""

    def run(self: Any) -> list[dict[str, Any]]:
        import gc
        import tracemalloc

        if action == "start":
            tracemalloc.start(6)
            return []
        gc.collect()
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        if action == "base":
            self._soak_trace_base = snap
            return []
        return [{"where": " > ".join(f"{'/'.join(f.filename.split('/')[-2:])}:{f.lineno}" for f in stat.traceback),
                 "kib": round(stat.size_diff / 1024, 1), "blocks": stat.count_diff}
                for stat in snap.compare_to(self._soak_trace_base, "traceback")[:10]]

    return ray.get(actor.__ray_call__.remote(run), timeout=300)


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


GROWING = ("catalog_uss_mib", "store_uss_mib", "catalog_pss_mib", "store_pss_mib", "catalog_gc_objects",
           "store_gc_objects", "durable_markers", "durable_data", "durable_tombstones", "spill_files")
TRACED = ("catalog_traced_mib", "store_traced_mib")  # with --trace


def churn(args: Any, spill: Path, results: harness.Results) -> list[dict[str, Any]]:
    import torch

    import policystore
    from policystore.remote import CATALOG_NAME, NAMESPACE, store_name

    durable = spill / "durable"
    store = policystore.connect(policystore.StoreConfig(spill_dir=str(spill / "spill"), durable_uri=str(durable)))
    node_id = store.stats().node_id
    actors = {"catalog": ray.get_actor(CATALOG_NAME, namespace=NAMESPACE),
              "store": ray.get_actor(store_name(node_id), namespace=NAMESPACE)}
    catalog = actors["catalog"]
    pids = {name: _pid_of(actor) for name, actor in actors.items()}
    if args.trace:
        for actor in actors.values():
            _trace(actor, "start")
    based = False
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
                rows.append(results.emit(_sample(ops, time.monotonic() - started, actors, pids, durable,
                                                 spill / "spill")))
                if args.trace and not based and time.monotonic() - started >= args.minutes * 15:
                    for actor in actors.values():  # after the first quarter, as the growth row's slopes
                        _trace(actor, "base")
                    based = True
    if not rows or rows[-1]["ops"] < ops:  # the end of the run is a sample too (a short run may have no other)
        if not args.no_compact:
            ray.get(catalog.compact_tombstones.remote(), timeout=120)
        rows.append(results.emit(_sample(ops, time.monotonic() - started, actors, pids, durable, spill / "spill")))
    if based:
        for name, actor in actors.items():
            for site in _trace(actor, "diff"):
                results.emit({"row": "trace", "actor": name, **site})
    return rows


def _sample(ops: int, seconds: float, actors: dict[str, Any], pids: dict[str, int], durable: Path,
            spill: Path) -> dict[str, Any]:
    heap = {f"{name}_{key}": value for name, actor in actors.items() for key, value in _heap(actor).items()}
    full = {name: psutil.Process(pid).memory_full_info() for name, pid in pids.items()}
    # USS: pages only this process maps. PSS also holds its share of the library pages every process of the same
    # install maps (torch, Ray): that share moves when other processes on the machine start or end.
    pss = {f"{name}_{kind}_mib": getattr(info, kind) / MiB for name, info in full.items() for kind in ("pss", "uss")}
    files = sum(1 for p in spill.rglob("*") if p.is_file())
    return {"row": "sample", "ops": ops, "seconds": round(seconds, 1), **pss, **heap, **_durable_counts(durable),
            "spill_files": files}


def growth(rows: list[dict[str, Any]]) -> dict[str, Any]:
    kept = rows[len(rows) // 4:]
    xs = [r["ops"] / 1000 for r in kept]
    return {"row": "growth", "ops": rows[-1]["ops"] if rows else 0, "samples": len(kept),
            **{f"{key}_per_1000_ops": _slope(xs, [r[key] for r in kept]) for key in (*GROWING, *TRACED)
               if kept and key in kept[0]}}


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
    parser.add_argument("--trace", action="store_true",
                        help="run tracemalloc in both actors: their Python heap in every sample, and at the end the "
                        "ten allocation sites of each that grew most after the first quarter (slows the churn, and "
                        "tracemalloc's own tables count in PSS)")
    parser.add_argument("--no-compact", action="store_true",
                        help="never fold the durable tier's tombstones (CatalogServer.compact_tombstones)")
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes, args.sample_ops = 0.1, 20
    harness.setup_logging(args.verbose)
    results = harness.Results("soak", args, {k: v for k, v in vars(args).items() if k != "out"})
    with harness.ray_session(256 * MiB, num_cpus=2) as spill:
        rows = churn(args, spill, results)
        summary = results.emit(growth(rows))
    results.finish(["row", "ops", "seconds", "catalog_uss_mib", "store_uss_mib", "catalog_pss_mib", "store_pss_mib",
                    "catalog_gc_objects",
                    "store_gc_objects", "durable_markers", "durable_data", "durable_tombstones", "spill_files"],
                   plot=plot, notes=["growth per 1,000 operations: " + ", ".join(
                       f"{k} {summary[f'{k}_per_1000_ops']:+.3f}" for k in (*GROWING, *TRACED)
                       if f"{k}_per_1000_ops" in summary)])


if __name__ == "__main__":
    main()
