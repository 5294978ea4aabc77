"""What one rollout worker's private memory pays per frozen opponent: store views against private copies.

One worker actor, one learner actor, one node store, in a fresh Ray session per mode. The worker first runs a
forward pass of a private net of the snapshots' architecture and drops it (the kernels' workspace belongs to its
baseline), then reads its private heap. The learner publishes K snapshots; the worker reads its heap again (what
the push of K snapshots it has not read costs it), loads them all and reads it once more, then loads K more and
reads it a last time. Between the two load steps the first load's one-time costs (the read path's imports, the
module skeleton) drop out.

  store:    every load is ``store.load_module``: parameters are views of the node's one shared copy
  private:  every load builds the module and ``load_state_dict``s the snapshot into it (RLlib's way)

The store mode's rows also carry the store's fixed cost on the node, measured from outside at idle (PSS, before
any publish): ``store_side_pss_mib`` (every process the store adds on a node: the policystore actors there but the
catalog, ``store_side_processes`` of them), ``empty_actor_pss_mib`` (an empty Ray actor started beside them: what
any actor costs) and ``store_side_x_empty_actor`` (goal: at most 1.5), plus ``catalog_pss_mib`` (one per cluster).

Private heap = ``Anonymous`` in the worker's /proc/self/smaps_rollup, after ``gc.collect()`` and glibc's
``malloc_trim(0)`` (freed heap given back, so the figure is what the worker holds). Rows, per mode and size:
``pushed_kib_per_snapshot`` (K pushed, none read), ``first_load_kib`` (the first K loads, per load, one-time
costs included), ``kib_per_module`` (the second K loads, per load: the steady cost of one more opponent) and
``kib_per_module_beyond_weights`` (the same minus the snapshot's own bytes: what a module costs besides its
weights; for views those are shared, so it is the whole of it).

The league case (``--league HOT,READERS,K``): HOT snapshots hot on the node, READERS worker processes that each
open K of them (different ones), as a league's rollout workers play a few opponents out of many. Rows (mode
``league``): ``bytes_per_unopened_snapshot`` (a reader's private heap growth once the HOT snapshots were pushed,
before it opened any, per snapshot: what a snapshot it never plays costs it), ``opened_kib`` (its growth once it
opened its K, per opened snapshot), ``store_kib_per_snapshot`` (the store's private heap growth per hot snapshot,
before the readers opened any: its own records plus its bookkeeping of what readers borrow) and
``copies_per_node`` (the session's PSS growth over the HOT snapshots' bytes). The HOT snapshots are published in
two halves with a reading after each: ``marginal_bytes_per_unopened_snapshot`` and
``store_marginal_kib_per_snapshot`` are the growth over the second half only, per snapshot, which leaves out
what a process pays once whatever the league's size (its first few thousand Ray calls warm its allocator and
caches up: on this machine a caller's heap grew by 130 to 350 bytes per call over its first 4,000 calls to an
actor, and by under 30 per call after 10,000).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import time
from typing import Any

import psutil
import ray

import policystore

from . import harness, memory_scaling
from .harness import MiB
from .memory_scaling import MODES, Learner, policy_id
from .nets import ARCHS, NetSpec

log = logging.getLogger("benchmarks.worker_memory")
KiB = 1024


class Worker(memory_scaling.Worker):
    """memory_scaling's rollout worker (same warm-up, same two ways to load), reporting its private heap."""

    def private_heap_bytes(self) -> int:
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/smaps_rollup") as f:
            return next(int(line.split()[1]) * KiB for line in f if line.startswith("Anonymous:"))

    def load_and_measure(self, policy_ids: list[str]) -> int:
        self.load(policy_ids)
        return self.private_heap_bytes()

    def wait_known(self, policy_ids: list[str], timeout_s: float = 600.0) -> bool:
        """Wait (here: one call, however long the publishes take) until the push has named every one of
        ``policy_ids`` to this process."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            latest = self.store.push_state().latest
            if all(pid in latest for pid in policy_ids):
                return True
            time.sleep(0.2)
        return False


def anonymous_bytes(pid: int) -> int:
    """Private heap of another process on this machine (``Anonymous`` in its smaps_rollup)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) * KiB for line in f if line.startswith("Anonymous:"))


def fixed_cost(node_id: str) -> dict[str, float]:
    """The store's processes on ``node_id`` (every policystore actor there but the catalog) and the catalog, by PSS
    from outside, against an empty Ray actor started now (see the module's docstring)."""
    from policystore.memory import pss_bytes
    from policystore.remote import NAMESPACE, catalog_name

    class Empty:  # defined in here, Ray ships it by value: its process imports nothing but Ray's own
        def where(self) -> tuple[int, str]:
            import os

            import ray
            return os.getpid(), ray.get_runtime_context().get_node_id()

    empty = ray.remote(Empty).options(num_cpus=0).remote()
    empty_pid, _ = ray.get(empty.where.remote())
    store_side, catalogs = [], []
    for name in (a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE):
        actor = ray.get_actor(name, namespace=NAMESPACE)
        pid, node = ray.get(actor.__ray_call__.remote(Empty.where))
        if name.partition("@")[0] == catalog_name():
            catalogs.append(pid)
        elif node == node_id:
            store_side.append(pid)
    harness.collect_garbage(1.0)
    store_pss = pss_bytes(psutil.Process(pid) for pid in store_side)
    empty_pss = pss_bytes([psutil.Process(empty_pid)])
    ray.kill(empty)
    return {"store_side_pss_mib": store_pss / MiB, "store_side_processes": len(store_side),
            "empty_actor_pss_mib": empty_pss / MiB, "store_side_x_empty_actor": store_pss / empty_pss,
            "catalog_pss_mib": pss_bytes(psutil.Process(pid) for pid in catalogs) / MiB}


def push_and_measure(learner: Any, workers: list, store: policystore.PolicyStore, start: int, stop: int,
                     settle_s: float) -> list[int]:
    """Publish snapshots ``start..stop``, wait until every reader was told of them, and read each reader's heap."""
    ids = ray.get(learner.publish.remote(start, stop))
    store.flush()
    if not all(ray.get([w.wait_known.remote(ids) for w in workers])):
        log.warning("not every reader heard of every snapshot in time: the figures include that")
    harness.collect_garbage(settle_s)
    return ray.get([w.private_heap_bytes.remote() for w in workers])


def run_league(results: harness.Results, spec: NetSpec, size_mib: int, hot: int, readers: int, k: int,
               args: Any) -> list[str]:
    """HOT snapshots hot on the node, READERS processes that each open K of them; returns the goals' lines."""
    from policystore.memory import pss_bytes, session_processes
    from policystore.remote import NAMESPACE, store_name

    capacity = int(hot * (spec.nbytes + 64 * KiB) * 1.1) + 64 * MiB
    with harness.ray_session(capacity + 256 * MiB) as spill_dir:
        store = policystore.connect(policystore.StoreConfig(hot_capacity_bytes=capacity, spill_dir=str(spill_dir)))
        actor = ray.get_actor(store_name(store.node_id, store.league), namespace=NAMESPACE)
        store_pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
        learner = ray.remote(Learner).options(num_cpus=0.01).remote(spec)
        workers = [ray.remote(Worker).options(num_cpus=0.01).remote("store", spec) for _ in range(readers)]
        harness.collect_garbage(args.settle_s)
        idle = ray.get([w.private_heap_bytes.remote() for w in workers])
        store_idle = anonymous_bytes(store_pid)
        session_idle = pss_bytes(session_processes())
        half = hot // 2
        half_pushed = push_and_measure(learner, workers, store, 0, half, args.settle_s)
        store_half = anonymous_bytes(store_pid)
        pushed = push_and_measure(learner, workers, store, half, hot, args.settle_s)
        store_pushed = anonymous_bytes(store_pid)
        opened = ray.get([w.load_and_measure.remote([policy_id((i * k + j) % hot) for j in range(k)])
                          for i, w in enumerate(workers)])
        harness.collect_garbage(args.settle_s)
        session_after = pss_bytes(session_processes())
        store_after = anonymous_bytes(store_pid)
        row = results.emit({
            "mode": "league",
            "arch": spec.arch,
            "snapshot_mib": size_mib,
            "snapshot_bytes": spec.nbytes,
            "snapshots": hot,
            "readers": readers,
            "opened": k,
            "bytes_per_unopened_snapshot": sum(p - i for p, i in zip(pushed, idle, strict=True)) / readers / hot,
            "marginal_bytes_per_unopened_snapshot": (sum(pushed) - sum(half_pushed)) / readers / (hot - half),
            "opened_kib": sum(o - p for o, p in zip(opened, pushed, strict=True)) / readers / k / KiB,
            "store_kib_per_snapshot": (store_pushed - store_idle) / hot / KiB,
            "store_marginal_kib_per_snapshot": (store_pushed - store_half) / (hot - half) / KiB,
            "store_heap_after_open_mib": (store_after - store_idle) / MiB,
            "copies_per_node": (session_after - session_idle) / (hot * spec.nbytes),
            "settle_s": args.settle_s,
        })
    where = f"{hot} hot x {size_mib} MiB, {readers} readers opening {k} each, load {row['loadavg_1m']}"
    return [goal_line("bytes per never-opened hot snapshot", row["bytes_per_unopened_snapshot"], KiB, where),
            goal_line("copies per node", row["copies_per_node"], 1.10, where)]


def goal_line(what: str, value: float, bound: float, where: str) -> str:
    return f"{what}: {value:.4g} (goal <= {bound:g}): {'met' if value <= bound else 'MISSED'}; {where}"


def run_mode(results: harness.Results, mode: str, spec: NetSpec, size_mib: int, k: int, args: Any) -> list[str]:
    """One mode at one size; returns the goals' lines (the store's fixed cost, in the store mode)."""
    hot = int(2 * k * (spec.nbytes + 64 * KiB) * 1.1) + 64 * MiB
    with harness.ray_session(hot + 256 * MiB) as spill_dir:
        store = policystore.connect(policystore.StoreConfig(hot_capacity_bytes=hot, spill_dir=str(spill_dir)))
        learner = ray.remote(Learner).options(num_cpus=0.1).remote(spec)
        worker = ray.remote(Worker).options(num_cpus=0.1).remote(mode, spec)
        fixed = fixed_cost(store.node_id) if mode == "store" else {}
        idle = ray.get(worker.private_heap_bytes.remote())
        first = ray.get(learner.publish.remote(0, k))
        store.flush()
        harness.collect_garbage(args.settle_s)  # the pushes reach the worker meanwhile
        pushed = ray.get(worker.private_heap_bytes.remote())
        after_first = ray.get(worker.load_and_measure.remote(first))
        second = ray.get(learner.publish.remote(k, 2 * k))
        store.flush()
        harness.collect_garbage(args.settle_s)
        before_second = ray.get(worker.private_heap_bytes.remote())
        after_second = ray.get(worker.load_and_measure.remote(second))
        per_module = (after_second - before_second) / k
        row = results.emit({
            "mode": mode,
            "arch": spec.arch,
            "snapshot_mib": size_mib,
            "snapshot_bytes": spec.nbytes,
            "snapshots": k,
            "pushed_kib_per_snapshot": (pushed - idle) / k / KiB,
            "first_load_kib": (after_first - pushed) / k / KiB,
            "kib_per_module": per_module / KiB,
            "kib_per_module_beyond_weights": (per_module - (spec.nbytes if mode == "private" else 0)) / KiB,
            "heap_idle_mib": idle / MiB,
            "settle_s": args.settle_s,
            **fixed,
        })
    if not fixed:
        return []
    where = (f"{fixed['store_side_processes']} process(es), {fixed['store_side_pss_mib']:.1f} MiB against "
             f"{fixed['empty_actor_pss_mib']:.1f} MiB; load {row['loadavg_1m']}")
    return [goal_line("the store's processes on a node, in empty Ray actors (PSS)", fixed["store_side_x_empty_actor"],
                      1.5, where)]


def plot(rows: list[dict[str, Any]], path) -> None:
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["mode"] != "league"]  # the league case has its own figures (table only)
    if not rows:
        return

    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [f"{r['mode']}\n{r['snapshot_mib']} MiB" for r in rows]
    ax.bar(labels, [r["kib_per_module_beyond_weights"] for r in rows], color="tab:blue")
    ax.axhline(16, color="tab:red", linestyle="--", label="goal: 16 KiB")
    ax.set_ylabel("private KiB per loaded module, beyond its weights")
    ax.set_title("What one more frozen opponent costs a worker")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = harness.make_parser("worker_memory", __doc__)
    parser.add_argument("--sizes-mib", type=harness.int_list, default=[1, 4], help="snapshot sizes (%(default)s)")
    parser.add_argument("--snapshots", type=int, default=32, help="K: snapshots per step (%(default)s)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of private,store")
    parser.add_argument("--arch", choices=ARCHS, default="mlp", help="policy network shape (%(default)s)")
    parser.add_argument("--settle-s", type=float, default=2.0, help="wait after GC for the pushes to arrive")
    parser.add_argument("--league", type=harness.int_list, default=None, metavar="HOT,READERS,K",
                        help="also the league case: HOT hot snapshots, READERS readers opening K each")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if (not modes and args.league is None) or set(modes) - set(MODES):
        parser.error(f"--modes must be a comma-separated subset of {','.join(MODES)}, got {args.modes!r}")
    if args.league is not None and (len(args.league) != 3 or min(args.league) < 1):
        parser.error(f"--league takes HOT,READERS,K (three positive ints), got {args.league}")
    if args.quick:
        args.sizes_mib, args.snapshots, args.settle_s = [1], 4, 0.5
        args.league = [16, 2, 2] if args.league is not None else None
    harness.setup_logging(args.verbose)
    results = harness.Results("worker_memory", args, {k: v for k, v in vars(args).items() if k != "out"})
    points = [(size, mode) for size in args.sizes_mib for mode in modes]
    notes: list[str] = []
    with harness.progress() as bar:
        task = bar.add_task("worker_memory", total=len(points))
        for size_mib, mode in points:
            bar.update(task, description=f"{mode} {size_mib} MiB")
            notes += run_mode(results, mode, NetSpec.for_bytes(args.arch, size_mib * MiB), size_mib, args.snapshots,
                              args)
            bar.advance(task)
    if args.league is not None:
        size_mib = args.sizes_mib[0]
        notes += run_league(results, NetSpec.for_bytes(args.arch, size_mib * MiB), size_mib, *args.league, args)
    for line in notes:
        log.info("%s", line)
    results.finish(
        ["mode", "snapshot_mib", "snapshots", "pushed_kib_per_snapshot", "first_load_kib", "kib_per_module",
         "kib_per_module_beyond_weights", "heap_idle_mib", "store_side_x_empty_actor", "loadavg_1m"],
        plot, notes=["Goals:", *(f"- {n}" for n in notes)],
    )


if __name__ == "__main__":
    main()
