"""Time for a learner process to publish a snapshot, against a memcpy of the same bytes.

Timed inside a learner actor, per snapshot size (p50/p99 over --repeats, fewer for big snapshots):
  memcpy_ms         np.copyto of the packed buffer's bytes between two preallocated arrays (the yardstick)
  pack_ms           policystore.format.pack(state_dict): the copy into one buffer plus the CRC-32C
  publish_ms        store.publish(policy, state_dict): pack straight into this process's staging file in /dev/shm
                    (reused from publish to publish), one call to the store actor (the file's name crosses, not
                    the bytes), the store's one copy into the object store and one catalog call; the disk write
                    happens in the background
  durable_ms        store.publish(..., durable=True): also written, checksummed and fsync'd before returning
  publish_x_memcpy  publish_ms / memcpy_ms
  goal, goal_met    the goal for a non-durable publish: at most 3 ms at 1 MiB (and below), at most 3x a
                    memcpy above; each size's row states it and whether it is met (also in the table's notes)
  noop_call_ms      floor: ray.get of an actor call that does nothing (a publish makes two: store, catalog)
Between samples (untimed) the learner waits for background spills and deletes the version it published, so
every sample starts from the same state.

--streaming-copies starts the learner process with GLIBC_TUNABLES set so that glibc's memcpy bypasses the cache
for every copy of 1 MiB or more (by default only above a size derived from the last-level cache: on a machine that
reports a huge L3, pack's tensor-by-tensor copies stay cached while the yardstick's single copy streams). The
yardstick runs in the same process, with the same setting.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import ray

import policystore
from policystore.format import pack

from . import harness
from .fetch_latency import Owner
from .harness import MiB
from .nets import ARCHS, NetSpec, random_weights

STREAMING_COPIES = "GLIBC_TUNABLES=glibc.cpu.x86_non_temporal_threshold=0x100000"


def memcpy_times(nbytes: int, repeats: int) -> list[float]:
    """The yardstick: copying ``nbytes`` between two preallocated (already faulted-in) arrays."""
    src, dst = np.ones(nbytes, dtype=np.uint8), np.zeros(nbytes, dtype=np.uint8)
    return harness.timed(lambda: np.copyto(dst, src), repeats)


class Learner:
    """Publishes its net's weights and times it (Ray actor)."""

    def __init__(self) -> None:
        self.store = policystore.connect()

    def run(self, spec: NetSpec, repeats: int) -> dict[str, list[float]]:
        weights = random_weights(spec, 0)
        owner = ray.remote(Owner).options(num_cpus=0.1).remote()
        out: dict[str, list[float]] = {
            "noop_call": harness.timed(lambda: ray.get(owner.noop.remote()), repeats),
            "memcpy": memcpy_times(len(pack(weights, policy_id="learner")), repeats),
            "pack": harness.timed(lambda: pack(weights, policy_id="learner"), repeats),
        }
        for case, durable in (("publish", False), ("durable", True)):
            samples = []
            for i in range(repeats + 1):
                self.store.flush()
                start = time.perf_counter()
                sid = self.store.publish("learner", weights, meta={"sample": i}, durable=durable)
                elapsed = time.perf_counter() - start
                self.store.flush()
                self.store.delete(*sid)
                if i:  # the first publish of a size also warms the object store's pages
                    samples.append(elapsed)
            out[case] = samples
        return out


def goal_of(size_mib: int, publish_ms: float, x_memcpy: float) -> tuple[str, float, float]:
    """The goal for a publish of ``size_mib``: (what it says, the figure it bounds, the bound)."""
    if size_mib <= 1:
        return "<= 3 ms", publish_ms, 3.0
    return "<= 3x a memcpy", x_memcpy, 3.0


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    rows = sorted(rows, key=lambda r: r["snapshot_mib"])
    sizes = [r["snapshot_mib"] for r in rows]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.5))
    for key in ("memcpy_ms", "pack_ms", "publish_ms", "durable_ms"):
        ax.plot(sizes, [r[key] for r in rows], marker="o", label=key.removesuffix("_ms"))
    ax.set(xscale="log", yscale="log", xlabel="snapshot size (MiB)", ylabel="p50 time (ms)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    bx.plot(sizes, [r["publish_x_memcpy"] for r in rows], marker="o", label="non-durable publish")
    bx.plot(sizes, [r["durable_x_memcpy"] for r in rows], marker="o", label="durable publish")
    bx.axhline(3, color="0.6", lw=3, alpha=0.5, label="target 3x")
    bx.set(xscale="log", yscale="log", xlabel="snapshot size (MiB)", ylabel="time / memcpy time")
    bx.legend(fontsize=8)
    bx.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = harness.make_parser("publish", __doc__)
    parser.add_argument("--sizes-mib", type=harness.int_list, default=[1, 16, 256, 1024],
                        help="snapshot sizes (%(default)s)")
    parser.add_argument("--arch", choices=ARCHS, default="mlp", help="policy network shape (%(default)s)")
    parser.add_argument("--repeats", type=int, default=30, help="samples per case for small snapshots")
    parser.add_argument("--bytes-per-case-gib", type=float, default=6.0, help="cap samples by data moved")
    parser.add_argument("--streaming-copies", action="store_true",
                        help=f"start the learner with {STREAMING_COPIES} (see above)")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes_mib, args.repeats = [1], 5
    harness.setup_logging(args.verbose)
    results = harness.Results("publish", args, {k: v for k, v in vars(args).items() if k != "out"})
    biggest = NetSpec.for_bytes(args.arch, max(args.sizes_mib) * MiB).nbytes
    notes = ["Goals:"]
    with harness.ray_session(4 * biggest + 256 * MiB) as spill_dir, harness.progress() as bar:
        policystore.connect(policystore.StoreConfig(hot_capacity_bytes=2 * biggest + 16 * MiB,
                                                    spill_dir=str(spill_dir)))
        env = {"env_vars": dict([STREAMING_COPIES.split("=", 1)])} if args.streaming_copies else None
        learner = ray.remote(Learner).options(num_cpus=0.1, runtime_env=env).remote()
        task = bar.add_task("publish", total=len(args.sizes_mib))
        for size in args.sizes_mib:
            bar.update(task, description=f"{size} MiB")
            spec = NetSpec.for_bytes(args.arch, size * MiB)
            repeats = max(3, min(args.repeats, int(args.bytes_per_case_gib * 2**30 // spec.nbytes)))
            timings = ray.get(learner.run.remote(spec, repeats))
            p = {case: harness.percentiles(samples) for case, samples in timings.items()}
            goal, value, bound = goal_of(size, p["publish"]["p50"], p["publish"]["p50"] / p["memcpy"]["p50"])
            row = results.emit({
                "arch": args.arch, "snapshot_mib": size, "snapshot_bytes": spec.nbytes, "samples": repeats,
                "streaming_copies": args.streaming_copies,
                **{f"{case}_ms": p[case]["p50"] for case in timings},
                **{f"{case}_p99_ms": p[case]["p99"] for case in timings},
                "memcpy_gbps": spec.nbytes / p["memcpy"]["p50"] / 1e6,
                "publish_x_memcpy": p["publish"]["p50"] / p["memcpy"]["p50"],
                "durable_x_memcpy": p["durable"]["p50"] / p["memcpy"]["p50"],
                "pack_x_memcpy": p["pack"]["p50"] / p["memcpy"]["p50"],
                "goal": goal, "goal_met": value <= bound,
            })
            notes.append(f"- {size} MiB publish: {value:.2f} ({goal}): {'met' if value <= bound else 'MISSED'}; "
                         f"load {row['loadavg_1m']}")
            bar.advance(task)
    results.finish(
        ["snapshot_mib", "samples", "noop_call_ms", "memcpy_ms", "pack_ms", "publish_ms", "durable_ms",
         "pack_x_memcpy", "publish_x_memcpy", "durable_x_memcpy", "goal", "goal_met", "loadavg_1m"],
        plot, notes=["\n".join(notes)],
    )


if __name__ == "__main__":
    main()
