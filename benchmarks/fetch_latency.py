"""How long a rollout worker waits for a usable module, against Ray's weight broadcast, side by side in one run.

Ray's way (the yardstick, ``ray_broadcast``): the learner ``ray.put``s a numpy state dict and hands the ref to the
worker (a broadcast); the worker times ``ray.get`` of that ref (never got before) plus ``load_state_dict`` into a
module it built once. The store's cases, timed in the same worker, round by round (one sample of each case per
round, in an order that rotates, so that no case gets a quieter machine than another):

  played_update         a policy the worker already plays got a new version: the learner published it and the
                        store's push of it reached the worker (waited for, untimed); timed: ``load_module(pid)``
  first_open            a version hot on the node, of a policy this worker never opened (a different policy every
                        round); timed: ``load_module(pid)``
  latest_after_publish  the worker publishes a new version of a policy (untimed) and at once, its push still in
                        flight, times ``load_module(pid)`` of latest, which must be that version (read your writes)
  noop_actor_call       floor: an actor call that does nothing (a path with one round trip pays at least this)
  noop_hosted_call      the same call to an actor hosted as the store and the catalog are (``hosting.py``: an async
                        actor whose method runs on a pool thread): what one call to the store pays at least
  ray_get_borrowed_ref  floor: ``ray.get`` of a ref the worker already holds, of another actor's object

Goals (the run states each one's ratio and whether it is met, in its rows and its table's notes):
played_update at most 0.5x Ray's way at every size; first_open at most 1 ms at 1 MiB and at most 1.0x Ray's way
from 16 MiB; latest_after_publish at most 1.2x first_open. Each size runs in a fresh Ray session. Latencies on a
shared machine are noisy: every row carries the 1-minute load average; compare ratios from one run only.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

import policystore
from policystore import hosting

from . import harness
from .harness import MiB
from .nets import ARCHS, NetSpec, random_weights

log = logging.getLogger("benchmarks.fetch_latency")
STORE_CASES = ("played_update", "first_open", "latest_after_publish")
CASES = (*STORE_CASES, "ray_broadcast", "noop_actor_call", "noop_hosted_call", "ray_get_borrowed_ref")
PLAYED, OWN = "played", "own"


def first_policy(i: int) -> str:
    return f"first-{i}"


class Owner:
    """Another process that owns an object and answers calls that do nothing (Ray actor): the floors."""

    def noop(self) -> None:
        return None

    def put(self, nbytes: int) -> list[ray.ObjectRef]:
        self.ref = ray.put(np.ones(nbytes, dtype=np.uint8))
        return [self.ref]  # inside a list: the caller borrows the ref instead of receiving the bytes


class Reader:
    """A rollout worker that loads modules and times it (Ray actor)."""

    def __init__(self, spec: NetSpec):
        self.spec = spec
        self.store = policystore.connect()
        self.private = spec()  # Ray's way loads into a module built once
        self.own_weights = random_weights(spec, 7)
        self.held: list[Any] = []  # the modules of the last round: what a worker plays until the next
        self.own_version = 0  # its last own publish: deleted after the next (only the versions in play stay hot)

    def wait_pushed(self, policy_id: str, version: int, timeout_s: float = 60.0) -> bool:
        """Wait until the store's push of ``version`` has reached this process (where a played update starts)."""
        return harness.wait_pushed(self.store, policy_id, version, timeout_s)

    def open(self, policy_id: str) -> int:
        """Play ``policy_id`` (untimed): from now on its new versions are pushed to this process."""
        self.held.append(self.store.load_module(policy_id, self.spec))
        return self.held[-1].policystore_snapshot.id.version

    def floors(self, owner: Any, hosted: Any, repeats: int, nbytes: int) -> dict[str, list[float]]:
        (ref,) = ray.get(owner.put.remote(nbytes))
        return {
            "noop_actor_call": harness.timed(lambda: ray.get(owner.noop.remote()), repeats),
            "noop_hosted_call": harness.timed(lambda: ray.get(hosted.noop.remote()), repeats),
            "ray_get_borrowed_ref": harness.timed(lambda: ray.get(ref), repeats),
        }

    def round(self, i: int, played: int, broadcast: list[ray.ObjectRef]) -> dict[str, float]:
        """One sample of each case; ``played``: the version of the played policy the learner just published;
        ``broadcast``: Ray's way's ref, never got here before."""
        if not self.wait_pushed(PLAYED, played):
            log.warning("the push of %s@v%d did not reach the worker: played_update includes a round trip", PLAYED,
                        played)
        self.held.clear()

        def ray_broadcast() -> object:
            arrays = ray.get(broadcast[0])
            self.private.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()})
            return self.private

        def played_update() -> object:
            module = self.store.load_module(PLAYED, self.spec)
            assert module.policystore_snapshot.id.version == played
            return module

        def first_open() -> object:
            return self.store.load_module(first_policy(i), self.spec)

        def latest_after_publish() -> tuple[float, object]:
            sid = self.store.publish(OWN, self.own_weights, meta={"round": i})  # untimed
            start = harness.clock()
            module = self.store.load_module(OWN, self.spec)
            elapsed = harness.clock() - start
            assert module.policystore_snapshot.id.version >= sid.version
            if self.own_version:
                self.store.delete(OWN, self.own_version)  # untimed
            self.own_version = sid.version
            return elapsed, module

        cases = {"ray_broadcast": ray_broadcast, "played_update": played_update, "first_open": first_open}
        order = [*cases, "latest_after_publish"]
        shift = i % len(order)
        out = {}
        for case in order[shift:] + order[:shift]:
            if case == "latest_after_publish":
                out[case], module = latest_after_publish()
            else:
                start = harness.clock()
                module = cases[case]()
                out[case] = harness.clock() - start
            self.held.append(module)
        self.held.remove(self.private)
        return out


def goals(p50: dict[str, float], size_mib: int) -> dict[str, tuple[float, float, str]]:
    """Per store case: (its ratio, the goal's bound, what the ratio is of), as the goals are stated above."""
    ray_ms = p50["ray_broadcast"]
    out = {"played_update": (p50["played_update"] / ray_ms, 0.5, "x Ray's way")}
    if size_mib <= 1:  # an absolute bound at 1 MiB: "ratio" is the p50 itself
        out["first_open"] = (p50["first_open"], 1.0, "ms")
    else:
        out["first_open"] = (p50["first_open"] / ray_ms, 1.0, "x Ray's way")
    out["latest_after_publish"] = (p50["latest_after_publish"] / p50["first_open"], 1.2, "x first_open")
    return out


def run_size(results: harness.Results, size_mib: int, args: Any) -> list[str]:
    """Measure one size; returns the lines that state each goal."""
    spec = NetSpec.for_bytes(args.arch, size_mib * MiB)
    nbytes = spec.nbytes
    repeats = max(args.min_repeats, min(args.repeats, int(args.bytes_per_case_gib * 2**30 // nbytes)))
    hot_capacity = (repeats + 8) * nbytes + 16 * MiB  # every first_open policy stays hot
    with harness.ray_session(2 * hot_capacity + 8 * nbytes + 256 * MiB) as spill_dir:
        store = policystore.connect(
            policystore.StoreConfig(hot_capacity_bytes=hot_capacity, spill_dir=str(spill_dir), compress=False)
        )
        weights = random_weights(spec, 0)
        arrays = {k: v.numpy() for k, v in weights.items()}
        for i in range(repeats + 1):
            store.publish(first_policy(i), weights)
        played = store.publish(PLAYED, weights)
        reader = ray.remote(Reader).options(num_cpus=0.1).remote(spec)
        ray.get(reader.open.remote(PLAYED))
        owner = ray.remote(Owner).options(num_cpus=0.1).remote()
        hosted = hosting.actor_class(Owner, {None: 1}).options(num_cpus=0.1).remote()
        timings: dict[str, list[float]] = ray.get(reader.floors.remote(owner, hosted, repeats, nbytes))
        ray.kill(owner)
        ray.kill(hosted)
        for case in (*STORE_CASES, "ray_broadcast"):
            timings[case] = []
        for i in range(repeats + 1):
            old = played
            played = store.publish(PLAYED, weights, meta={"round": i})
            broadcast = ray.put(arrays)
            sample = ray.get(reader.round.remote(i, played.version, [broadcast]))
            del broadcast
            store.delete(*old)  # untimed: only the versions in play stay hot
            if i:  # the first round warms every path up
                for case, elapsed in sample.items():
                    timings[case].append(elapsed)
        p50 = {case: harness.percentiles(timings[case])["p50"] for case in CASES}
        met = goals(p50, size_mib)
        lines = []
        for case in CASES:
            p = harness.percentiles(timings[case])
            ratio, bound, of = met.get(case, (None, None, ""))
            row = results.emit({
                "case": case, "arch": args.arch, "snapshot_mib": size_mib, "snapshot_bytes": nbytes,
                "samples": len(timings[case]), "p50_ms": p["p50"], "p99_ms": p["p99"], "min_ms": p["min"],
                "mean_ms": p["mean"], "x_ray": p["p50"] / p50["ray_broadcast"],
                "goal": f"<= {bound} {of}" if bound is not None else None,
                "goal_ratio": ratio, "goal_met": None if bound is None else ratio <= bound,
            })
            if bound is not None:
                lines.append(f"{size_mib} MiB {case}: {ratio:.2f} {of} (goal <= {bound}): "
                             f"{'met' if ratio <= bound else 'MISSED'}; p50 {p['p50']:.3f} ms, Ray's way "
                             f"{p50['ray_broadcast']:.3f} ms, load {row['loadavg_1m']}")
        for line in lines:
            log.info("%s", line)
        return lines


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    for case in CASES:
        pts = sorted((r["snapshot_mib"], r["p50_ms"], r["p99_ms"]) for r in rows if r["case"] == case)
        if pts:
            sizes, p50, p99 = zip(*pts, strict=True)
            line = ax.plot(sizes, p50, marker="o", label=f"{case} p50")[0]
            ax.plot(sizes, p99, ls=":", color=line.get_color(), alpha=0.6)
    ax.set(xscale="log", yscale="log", xlabel="snapshot size (MiB)", ylabel="time to a usable module (ms); dotted: p99")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = harness.make_parser("fetch_latency", __doc__)
    parser.add_argument("--sizes-mib", type=harness.int_list, default=[1, 16], help="snapshot sizes (%(default)s)")
    parser.add_argument("--arch", choices=ARCHS, default="mlp", help="policy network shape (%(default)s)")
    parser.add_argument("--repeats", type=int, default=60, help="rounds (samples per case) for small snapshots")
    parser.add_argument("--min-repeats", type=int, default=5, help="rounds at least, however big")
    parser.add_argument("--bytes-per-case-gib", type=float, default=0.5,
                        help="cap rounds so that one case moves about this much data (every round publishes)")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes_mib, args.repeats, args.min_repeats = [1], 5, 3
    harness.setup_logging(args.verbose)
    results = harness.Results("fetch_latency", args, {k: v for k, v in vars(args).items() if k != "out"})
    notes = []
    with harness.progress() as bar:
        task = bar.add_task("fetch_latency", total=len(args.sizes_mib))
        for size in args.sizes_mib:
            bar.update(task, description=f"{size} MiB")
            notes += run_size(results, size, args)
            bar.advance(task)
    results.finish(["case", "snapshot_mib", "samples", "p50_ms", "p99_ms", "min_ms", "x_ray", "goal", "goal_ratio",
                    "goal_met", "loadavg_1m"], plot, notes=["Goals:", *(f"- {n}" for n in notes)])


if __name__ == "__main__":
    main()
