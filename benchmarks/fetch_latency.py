"""Time until a worker has a usable module, by snapshot size: store paths against the usual baselines.

Cases, timed inside a worker actor (p50/p99 over --repeats, fewer for big snapshots):
  hot_get / hot_module      latest version, hot in the node's store, no Snapshot of it held by this process
                            (nothing keeps one between samples): "latest" comes from what the store pushed to
                            the process, the snapshot from one ray.get of the ref pushed with it, then views
                            (+ the module build); store_round_trips counts the gets of the three hot cases
                            that asked the store
  hot_get_version           the same for an explicit version (the three hot cases take turns, sample by
                            sample, so that none gets a quieter machine than another)
  cache_get / cache_module  repeated get of a version this process already holds (client cache hit)
  restore_module            snapshot evicted to the disk tier: the store restores it (read, checksum, ray.put);
                            the hot tier holds one snapshot and two are read in turn, and each sample waits
                            (untimed) for the previous eviction's push, so that every get is a restore
                            (store_restores counts them)
  ray_get_load_state_dict   baseline (RLlib's weight sync): ray.get of a ray.put numpy state dict, then
                            load_state_dict into an already built private module
  torch_load                baseline: torch.load(weights_only=True) of a .pt file (page cache warm), then
                            load_state_dict into an already built private module
  noop_actor_call           floor: ray.get of a call to an actor method that does nothing (any design that
                            asks an actor per read pays at least this)
  ray_get_borrowed_ref      floor: ray.get of a ref to an object of the snapshot's size that another actor
                            owns and this process already holds (what a pushed read pays at least)

Each size runs in a fresh Ray session. Latencies on a shared 2-core machine are noisy: every row carries the
load average.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

import policystore

from . import harness
from .harness import MiB
from .nets import ARCHS, NetSpec, random_weights

log = logging.getLogger("benchmarks.fetch_latency")
CASES = (
    "hot_get", "hot_get_version", "hot_module", "cache_get", "cache_module", "restore_module",
    "ray_get_load_state_dict", "torch_load", "noop_actor_call", "ray_get_borrowed_ref",
)


class Owner:
    """Another process that owns an object and answers calls that do nothing (Ray actor): the floors."""

    def noop(self) -> None:
        return None

    def put(self, nbytes: int) -> list[ray.ObjectRef]:
        self.ref = ray.put(np.ones(nbytes, dtype=np.uint8))
        return [self.ref]  # inside a list: the caller borrows the ref instead of receiving the bytes


class Reader:
    """A rollout worker that fetches snapshots and times it (Ray actor)."""

    def __init__(self, spec: NetSpec):
        self.spec = spec
        self.store = policystore.connect()

    def wait_pushed(self, policy_id: str, version: int, timeout_s: float = 60.0) -> bool:
        """Wait until the store's push has reached this process (the state every later read starts from)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.store.push_state()
            if state.fresh and state.latest.get(policy_id) == version and (policy_id, version) in state.hot:
                return True
            time.sleep(0.02)
        return False

    def floors(self, owner: Any, repeats: int, nbytes: int) -> dict[str, list[float]]:
        (ref,) = ray.get(owner.put.remote(nbytes))
        return {
            "noop_actor_call": harness.timed(lambda: ray.get(owner.noop.remote()), repeats),
            "ray_get_borrowed_ref": harness.timed(lambda: ray.get(ref), repeats),
        }

    def hot(self, policy_id: str, version: int, repeats: int) -> tuple[dict[str, list[float]], int]:
        """Samples of the three hot cases, interleaved (one of each per round, so that every case sees the same
        machine state), and how many of all those gets reached the store (none, when the push is fresh)."""
        reads = {
            "hot_get": lambda: self.store.get(policy_id),
            "hot_get_version": lambda: self.store.get(policy_id, version),
            "hot_module": lambda: self.store.load_module(policy_id, self.spec),
        }
        samples: dict[str, list[float]] = {case: [] for case in reads}
        stats = self.store.stats()
        asked = stats.hits + stats.misses
        for i in range(repeats + 1):
            for case, read in reads.items():
                start = time.perf_counter()
                got = read()
                elapsed = time.perf_counter() - start
                del got  # nothing else holds it: the next get misses the client cache again
                if i:
                    samples[case].append(elapsed)
        stats = self.store.stats()
        return samples, stats.hits + stats.misses - asked

    def cached(self, policy_id: str, repeats: int, module: bool) -> list[float]:
        held = self.store.get(policy_id)
        version = held.id.version
        if module:
            return harness.timed(lambda: self.store.load_module(policy_id, self.spec, version), repeats)
        return harness.timed(lambda: self.store.get(policy_id, version), repeats)

    def restore(self, policy_ids: list[str], repeats: int) -> list[float]:
        """Alternate between snapshots that cannot be hot together: every get restores from disk."""
        out = []
        for i in range(repeats + 1):
            policy_id = policy_ids[i % len(policy_ids)]
            if i:  # the first get may find it hot; every later one must restore
                harness.wait_not_pushed(self.store, policy_id)
            start = time.perf_counter()
            module = self.store.load_module(policy_id, self.spec)
            elapsed = time.perf_counter() - start
            del module
            gc.collect()
            if i:
                out.append(elapsed)
        return out

    def ray_get_load_state_dict(self, refs: list[ray.ObjectRef], repeats: int) -> list[float]:
        private = self.spec()

        def once() -> None:
            arrays = ray.get(refs[0])
            private.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()})

        return harness.timed(once, repeats)

    def torch_load(self, path: str, repeats: int) -> list[float]:
        private = self.spec()
        return harness.timed(lambda: private.load_state_dict(torch.load(path, weights_only=True)), repeats)


def run_size(results: harness.Results, size_mib: int, args: Any) -> None:
    spec = NetSpec.for_bytes(args.arch, size_mib * MiB)
    nbytes = spec.nbytes
    repeats = max(args.min_repeats, min(args.repeats, int(args.bytes_per_case_gib * 2**30 // nbytes)))
    hot_capacity = int(nbytes * 1.5)  # one snapshot hot at a time
    with harness.ray_session(4 * nbytes + 256 * MiB) as spill_dir:
        store = policystore.connect(
            policystore.StoreConfig(hot_capacity_bytes=hot_capacity, spill_dir=str(spill_dir), compress=False)
        )
        weights = random_weights(spec, 0)
        ref = ray.put({k: v.numpy() for k, v in weights.items()})
        pt_path = Path(spill_dir) / "baseline.pt"
        torch.save(weights, pt_path)
        del weights
        reader = ray.remote(Reader).options(num_cpus=0.1).remote(spec)
        timings: dict[str, list[float]] = {
            "ray_get_load_state_dict": ray.get(reader.ray_get_load_state_dict.remote([ref], repeats)),
            "torch_load": ray.get(reader.torch_load.remote(str(pt_path), repeats)),
        }
        del ref
        os.unlink(pt_path)
        owner = ray.remote(Owner).options(num_cpus=0.1).remote()
        timings.update(ray.get(reader.floors.remote(owner, repeats, nbytes)))
        ray.kill(owner)
        for pid in ("a", "b"):
            store.publish(pid, random_weights(spec, ord(pid)))
        store.flush()
        timings["restore_module"] = ray.get(reader.restore.remote(["a", "b"], repeats))
        latest = store.latest_version("b")
        store.get("b")  # hot again (the restore case left it on disk) ...
        if not ray.get(reader.wait_pushed.remote("b", latest)):  # ... and pushed to the reader
            log.warning("the push did not reach the reader: hot cases include round trips")
        hot, hot_round_trips = ray.get(reader.hot.remote("b", latest, args.repeats))
        timings.update(hot)
        for case, module in (("cache_get", False), ("cache_module", True)):
            timings[case] = ray.get(reader.cached.remote("b", args.repeats, module))
        stats = store.stats()
        for case in CASES:
            samples = timings[case]
            p = harness.percentiles(samples)
            results.emit(
                {
                    "case": case,
                    "arch": args.arch,
                    "snapshot_mib": size_mib,
                    "snapshot_bytes": nbytes,
                    "samples": len(samples),
                    "p50_ms": p["p50"],
                    "p99_ms": p["p99"],
                    "min_ms": p["min"],
                    "mean_ms": p["mean"],
                    "p50_us": p["p50"] * 1e3,
                    "store_restores": stats.restores,
                    "store_round_trips": hot_round_trips if case in hot else None,
                }
            )


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    for case in CASES:
        pts = sorted((r["snapshot_mib"], r["p50_ms"], r["p99_ms"]) for r in rows if r["case"] == case)
        if pts:
            sizes, p50, p99 = zip(*pts, strict=True)
            line = ax.plot(sizes, p50, marker="o", label=f"{case} p50")[0]
            ax.plot(sizes, p99, ls=":", color=line.get_color(), alpha=0.6)
    ax.axhline(1.0, color="0.6", lw=3, alpha=0.5, label="hot target 1 ms")
    ax.axhline(0.05, color="0.8", lw=3, alpha=0.5, label="cache target 50 us")
    ax.set(xscale="log", yscale="log", xlabel="snapshot size (MiB)", ylabel="time to usable (ms); dotted: p99")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = harness.make_parser("fetch_latency", __doc__)
    parser.add_argument("--sizes-mib", type=harness.int_list, default=[1, 4, 16, 64, 256, 1024],
                        help="snapshot sizes (%(default)s)")
    parser.add_argument("--arch", choices=ARCHS, default="mlp", help="policy network shape (%(default)s)")
    parser.add_argument("--repeats", type=int, default=100, help="samples per case for small snapshots")
    parser.add_argument("--min-repeats", type=int, default=5, help="samples per case at least, however big")
    parser.add_argument("--bytes-per-case-gib", type=float, default=8.0,
                        help="cap samples so that one case moves about this much data")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes_mib, args.repeats, args.min_repeats = [1], 5, 3
    harness.setup_logging(args.verbose)
    results = harness.Results("fetch_latency", args, {k: v for k, v in vars(args).items() if k != "out"})
    with harness.progress() as bar:
        task = bar.add_task("fetch_latency", total=len(args.sizes_mib))
        for size in args.sizes_mib:
            bar.update(task, description=f"{size} MiB")
            run_size(results, size, args)
            bar.advance(task)
    results.finish(["case", "snapshot_mib", "samples", "p50_ms", "p99_ms", "min_ms", "loadavg_1m"], plot)


if __name__ == "__main__":
    main()
