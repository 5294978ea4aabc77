"""Node memory taken by frozen snapshots: N workers x K snapshots x size, private copies against store views.

  private: every worker builds each opponent module and load_state_dict()s the snapshot into it (RLlib's
           EnvRunners and the old PolicyMap do this): one private copy per worker per snapshot.
  store:   every worker calls store.load_module(): the module's parameters are zero-copy views of the node's
           single shared copy.

Each (mode, workers, size) runs in a fresh Ray session: a store, a learner actor that publishes the snapshots,
and N worker actors (fractional CPUs). The workers first warm up (torch imported, store connected, one forward
pass of a private net of the snapshots' architecture, then dropped: the kernels' workspace that every process
running that net pays once, whatever holds the weights) and the session's memory is measured idle. Then K grows
step by step (1, 8, 32, 128 by default): the learner publishes the new snapshots, every worker loads them and runs a
forward pass with EVERY loaded snapshot (all pages touched), and memory is measured again.

Memory method: PSS summed over every process of the Ray session (driver, GCS, raylet with the object store,
store and catalog actors, learner, workers, idle pool workers; policystore.memory), after store.flush(), gc.collect() in
every process and --settle-s seconds. attributable = PSS(K loaded) - PSS(idle); copies_per_node =
attributable / (K x snapshot bytes). Rows also carry the PSS split (anon = private heaps, shmem = object-store
pages), the private heaps' growth by process (anon_delta_<role>_mib: store_actors = the node's store and the
catalog, learner, workers, driver, ray = Ray's own processes), Ray's count of object-store bytes in use and the
machine's used-memory delta (noisy when other jobs run).

Private points whose copies alone (workers x snapshots x size) exceed --private-budget-gib are skipped and
listed as skipped (the full grid's private corner, 32 x 128 x 16 MiB, would need 64 GiB). The full grid takes
about an hour on 2 cores; --sizes-mib/--workers/--snapshots/--modes run a part of it.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import psutil
import ray
import torch

import policystore
from policystore import memory
from policystore.remote import CATALOG_NAME, NAMESPACE, store_name

from . import harness
from .harness import MiB
from .nets import ARCHS, NetSpec

log = logging.getLogger("benchmarks.memory_scaling")
MODES = ("private", "store")
ROLES = ("store_actors", "learner", "workers", "driver")  # processes whose private memory rows split out
WORKER_BASE_BYTES = 200 * MiB  # PSS of a worker with torch imported (measured ~185 MiB), for the free-memory check


class Worker:
    """A rollout worker holding frozen opponents, each as its own module (Ray actor)."""

    def __init__(self, mode: str, spec: NetSpec):
        self.mode, self.spec = mode, spec
        self.store = policystore.connect()
        self.modules: list[torch.nn.Module] = []
        self.x = spec.example_input(batch=8)
        # Warm-up: the kernels' workspace for this architecture and batch (about 1.5 MiB for the 4 MiB MLP, paid
        # once per process) belongs to the idle baseline. The private net is dropped at once.
        with torch.no_grad():
            spec()(self.x)

    def load(self, policy_ids: list[str]) -> float:
        start = time.perf_counter()
        for pid in policy_ids:
            if self.mode == "store":
                module = self.store.load_module(pid, self.spec)
            else:
                module = self.spec()
                module.load_state_dict(self.store.get(pid))
                module.eval().requires_grad_(False)
            self.modules.append(module)
        return time.perf_counter() - start

    def forward_all(self) -> float:
        """One forward pass with every loaded snapshot: every weight page is touched."""
        start = time.perf_counter()
        with torch.no_grad():
            for module in self.modules:
                module(self.x)
        return time.perf_counter() - start


class Learner:
    """Publishes snapshots of its one net, re-initialised per snapshot (Ray actor)."""

    def __init__(self, spec: NetSpec):
        self.store = policystore.connect()
        self.net = spec()

    def publish(self, start: int, stop: int) -> list[str]:
        ids = []
        for k in range(start, stop):
            torch.manual_seed(k)
            with torch.no_grad():
                for p in self.net.parameters():
                    p.normal_(0.0, 0.05)
            ids.append(policy_id(k))
            self.store.publish(ids[-1], self.net.state_dict(), meta={"k": k})
        return ids


def policy_id(k: int) -> str:
    return f"opponent_{k:04d}"


def measure(store: policystore.PolicyStore, settle_s: float, roles: dict[int, str]) -> dict[str, Any]:
    store.flush()
    harness.collect_garbage(settle_s)
    procs = memory.session_processes()
    split = {"anon": 0, "shmem": 0, "file": 0}
    anon_by_role = dict.fromkeys((*ROLES, "ray"), 0)
    for proc in procs:  # every other process of the session (raylet, GCS, idle workers...) is Ray's own
        parts = harness.pss_breakdown_bytes([proc])
        split = {key: split[key] + parts[key] for key in split}
        anon_by_role[roles.get(proc.pid, "ray")] += parts["anon"]
    return {
        "pss": memory.pss_bytes(procs),
        **split,
        "anon_by_role": anon_by_role,
        "object_store_used": harness.object_store_used_bytes(),
        "system_used": memory.system_used_bytes(),
        "processes": len(procs),
    }


def actor_pid(actor: Any) -> int:
    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))


def store_actors(store: policystore.PolicyStore) -> list[Any]:
    """The node's store actor and the catalog actor: the store's own fixed cost on the node."""
    return [ray.get_actor(name, namespace=NAMESPACE) for name in (store_name(store.node_id), CATALOG_NAME)]


def run_session(
    results: harness.Results, mode: str, workers: int, spec: NetSpec, size_mib: int, ks: list[int], args: Any
) -> None:
    """One fresh Ray session: idle baseline, then K grows through ``ks`` (cumulative loads)."""
    nbytes = spec.nbytes
    per_snapshot = nbytes + 64 * 1024  # header and alignment slack
    hot = int(max(ks) * per_snapshot * 1.05) + 64 * MiB
    with harness.ray_session(hot + 4 * per_snapshot + 256 * MiB) as spill_dir:
        store = policystore.connect(policystore.StoreConfig(hot_capacity_bytes=hot, spill_dir=str(spill_dir)))
        opts = {"num_cpus": args.worker_cpus}
        learner = ray.remote(Learner).options(**opts).remote(spec)
        pool = [ray.remote(Worker).options(**opts).remote(mode, spec) for _ in range(workers)]
        ray.get([a.__ray_ready__.remote() for a in (learner, *pool)])
        roles = {os.getpid(): "driver", actor_pid(learner): "learner"}
        roles.update({actor_pid(actor): "store_actors" for actor in store_actors(store)})
        roles.update({actor_pid(worker): "workers" for worker in pool})
        idle = measure(store, args.settle_s, roles)
        actors_idle = memory.pss_bytes([psutil.Process(pid) for pid, role in roles.items() if role == "store_actors"])
        loaded = 0
        for k in ks:
            new_ids = ray.get(learner.publish.remote(loaded, k))
            load_s = max(ray.get([w.load.remote(new_ids) for w in pool]))
            forward_s = max(ray.get([w.forward_all.remote() for w in pool]))
            loaded = k
            now = measure(store, args.settle_s, roles)
            attributable = now["pss"] - idle["pss"]
            anon_by_role = {f"anon_delta_{role}_mib": (now["anon_by_role"][role] - b) / MiB
                            for role, b in idle["anon_by_role"].items()}
            results.emit(
                {
                    "mode": mode,
                    "arch": spec.arch,
                    "workers": workers,
                    "snapshots": k,
                    "snapshot_mib": size_mib,
                    "snapshot_bytes": nbytes,
                    "loaded_mib": k * nbytes / MiB,
                    "attributable_mib": attributable / MiB,
                    "copies_per_node": attributable / (k * nbytes),
                    "anon_delta_mib": (now["anon"] - idle["anon"]) / MiB,
                    **anon_by_role,
                    "shmem_delta_mib": (now["shmem"] - idle["shmem"]) / MiB,
                    "object_store_used_mib": now["object_store_used"] / MiB,
                    "system_used_delta_mib": (now["system_used"] - idle["system_used"]) / MiB,
                    "idle_pss_mib": idle["pss"] / MiB,
                    "store_actors_idle_pss_mib": actors_idle / MiB,
                    "processes": now["processes"],
                    "load_s": load_s,
                    "forward_s": forward_s,
                    "settle_s": args.settle_s,
                }
            )


def pivot(rows: list[dict[str, Any]], skipped: list[dict[str, Any]]) -> str:
    """copies_per_node as one line per (size, K, mode) and one column per N; "-" marks a skipped point."""
    workers = sorted({r["workers"] for r in rows} | {s["workers"] for s in skipped})
    cell = {(r["snapshot_mib"], r["snapshots"], r["mode"], r["workers"]): r["copies_per_node"] for r in rows}
    keys = sorted({k[:3] for k in cell} | {(s["snapshot_mib"], s["snapshots"], s["mode"]) for s in skipped})
    lines = [
        "copies per node (attributable PSS / (K x size)); columns: workers N",
        "",
        "| size MiB | K | mode | " + " | ".join(f"N={n}" for n in workers) + " |",
        "|---|---|---|" + "---|" * len(workers),
    ]
    for size, k, mode in keys:
        values = ["-" if (v := cell.get((size, k, mode, n))) is None else f"{v:.2f}" for n in workers]
        lines.append(f"| {size} | {k} | {mode} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path) -> None:
    import matplotlib.pyplot as plt

    sizes = sorted({r["snapshot_mib"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4.5), squeeze=False, sharey=True)
    workers = sorted({r["workers"] for r in rows})
    for ax, size in zip(axes[0], sizes, strict=True):
        ax.plot(workers, workers, color="0.8", lw=4, label="N copies")
        ax.axhline(1.0, color="0.6", lw=4, label="1 copy")
        for mode, style in (("private", "--"), ("store", "-")):
            for color, k in enumerate(sorted({r["snapshots"] for r in rows})):
                pts = sorted(
                    (r["workers"], r["copies_per_node"]) for r in rows
                    if r["mode"] == mode and r["snapshot_mib"] == size and r["snapshots"] == k
                )
                if pts:
                    ax.plot(*zip(*pts, strict=True), style, color=f"C{color}", marker="o", label=f"{mode}, K={k}")
        ax.set(xscale="log", yscale="log", xlabel="workers on the node (N)", title=f"{size} MiB snapshots")
        ax.set_xticks(workers, [str(w) for w in workers])
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("copies per node = attributable PSS / (K x size)")
    axes[0][-1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = harness.make_parser("memory_scaling", __doc__)
    parser.add_argument("--workers", type=harness.int_list, default=[1, 2, 4, 8, 16, 32], help="N values (%(default)s)")
    parser.add_argument("--snapshots", type=harness.int_list, default=[1, 8, 32, 128], help="K values (%(default)s)")
    parser.add_argument("--sizes-mib", type=harness.int_list, default=[1, 4, 16], help="snapshot sizes (%(default)s)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of private,store")
    parser.add_argument("--arch", choices=ARCHS, default="mlp", help="policy network shape (%(default)s)")
    parser.add_argument("--private-budget-gib", type=float, default=12.0,
                        help="skip private points whose copies alone exceed this (%(default)s GiB)")
    parser.add_argument("--settle-s", type=float, default=2.0, help="wait after GC before reading memory")
    parser.add_argument("--worker-cpus", type=float, default=0.05, help="CPU share of each worker actor")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes must be a comma-separated subset of {','.join(MODES)}, got {args.modes!r}")
    if args.quick:
        args.workers, args.snapshots, args.sizes_mib, args.settle_s = [1], [2], [1], 0.3
    harness.setup_logging(args.verbose)
    ks = sorted(args.snapshots)
    results = harness.Results("memory_scaling", args, {k: v for k, v in vars(args).items() if k != "out"})
    budget = args.private_budget_gib * 2**30
    sessions = [(s, n, m) for s in args.sizes_mib for n in sorted(args.workers) for m in modes]
    with harness.progress() as bar:
        task = bar.add_task("memory_scaling", total=len(sessions))
        for size_mib, workers, mode in sessions:
            bar.update(task, description=f"{mode} N={workers} {size_mib} MiB")
            spec = NetSpec.for_bytes(args.arch, size_mib * MiB)
            fits = ks if mode == "store" else [k for k in ks if workers * k * spec.nbytes <= budget]
            for k in ks[len(fits):]:
                results.skip(
                    {"mode": mode, "workers": workers, "snapshots": k, "snapshot_mib": size_mib},
                    f"private copies would take {workers * k * spec.nbytes / 2**30:.1f} GiB "
                    f"> --private-budget-gib {args.private_budget_gib}",
                )
            copies = workers * max(fits) if mode == "private" else max(fits)
            need = copies * spec.nbytes + workers * WORKER_BASE_BYTES if fits else 0
            free = psutil.virtual_memory().available
            if fits and need > free - 2 * 2**30:
                for k in fits:
                    results.skip({"mode": mode, "workers": workers, "snapshots": k, "snapshot_mib": size_mib},
                                 f"needs {need / 2**30:.1f} GiB, only {free / 2**30:.1f} GiB free")
                fits = []
            if fits:
                run_session(results, mode, workers, spec, size_mib, fits, args)
            bar.advance(task)
    results.finish(
        ["mode", "workers", "snapshots", "snapshot_mib", "attributable_mib", "copies_per_node", "anon_delta_mib",
         *(f"anon_delta_{role}_mib" for role in (*ROLES, "ray")), "shmem_delta_mib", "object_store_used_mib",
         "system_used_delta_mib", "loadavg_1m"],
        plot,
        notes=[pivot(results.rows, results.skipped),
               "attributable = session PSS with K snapshots loaded minus the same session idle; "
               f"settle {args.settle_s} s after gc.collect() in every process. '-': skipped (see above)."],
    )


if __name__ == "__main__":
    main()
