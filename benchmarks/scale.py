"""Scale: how far one catalog actor and store-to-store fetches carry, measured at growing league sizes.

ops rows (per catalog size N, in policies of --versions-per-policy versions):
  op         publish (non-durable: one call, one transaction), reserve_commit (durable: two calls, synced),
             lookup_latest, lookup_version, list_policy (one policy's versions), list_all (every snapshot),
             hold (a node records its copy: ``update_holders`` with one change), watch (a long poll answered with
             one new commit)
  mode       inproc: CatalogServer driven in this process (the catalog's own cost, no Ray);
             actor: through the catalog actor as client.py creates it (Ray's call cost included)
  p50_ms / p99_ms   one call at a time; ops_per_s with ``inflight`` calls in flight: --inflight for the actor's
             publish, lookups and hold, else 1 (back to back)
state rows (per N): db_mib (the database on disk, WAL checkpointed), open_s (CatalogServer opening the database,
  integrity check included: the catalog's own part of a restart), actor_restart_s (SIGKILL of the actor to its
  first answered lookup, Ray's restart included), actor_pss_mib (PSS of the catalog actor's process)
fanout rows (one per size in --fanout-mib and round): a new snapshot published on the head node of a
  ray.cluster_utils.Cluster of --nodes nodes, then fetched by a reader on every other node at once:
  mode policystore (each node's store fetches it from a holder, then serves its node) or ray_get (raw ray.get of
  one ray.put object by an actor per node: Ray's own transfer, the floor), both in the same run; total_s (until
  every node has it), node_p50_s / node_max_s, aggregate_gbps (bytes delivered to all nodes / total_s);
  policystore rows also: served_max (the most copies of this snapshot any one node's store served: a tree keeps
  it at FANOUT or below), x_ray_get (total_s over the ray_get row of the same size and round).
catalog_calls rows (one per policystore fan-out round): calls the catalog actor received from the publish until
  every store had told it its new copy (``CatalogServer.health().calls``), window_s seconds: calls_<method>
  (publish, lookup, update_holders, watch, ...); calls_per_snapshot: all but watch, which the stores' followers
  send on a timer whether or not anything is published (watch_per_node_s: those per node and second).

--quick: N = 1000 only, fewer samples, 3 nodes and 4 MiB for the fan-out.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import ray

from policystore.catalog import CONCURRENCY_GROUPS, CatalogServer
from policystore.config import StoreConfig
from policystore.remote import CATALOG_NAME, NAMESPACE, store_name
from policystore.transfer import FANOUT
from policystore.wire import Summary

from . import harness
from .harness import MiB
from .probe import probe_on

log = logging.getLogger("benchmarks.scale")
OPS = ("publish", "reserve_commit", "lookup_latest", "lookup_version", "list_policy", "list_all", "hold", "watch")


def summary(i: int) -> Summary:
    """What a store sends for one snapshot: small meta, as a league's bookkeeping (step, elo) would be."""
    return Summary(4 * MiB, f"crc32c:{i & 0xFFFFFFFF:08x}", {"step": i, "elo": 1200.0 + i % 400}, time.time(), False)


def fill(catalog: CatalogServer, n: int, per_policy: int) -> list[str]:
    """N committed snapshots in policies of ``per_policy`` versions; returns the policy ids."""
    policies = [f"player_{i:05d}" for i in range(max(1, n // per_policy))]
    for i in range(n):
        catalog.publish(policies[i % len(policies)], "node-0", summary(i))
    return policies


def op_calls(call: Callable[..., Any], policies: list[str], state: dict[str, Any]) -> dict[str, Callable[[int], Any]]:
    """The call of each measured op, given its sample number; ``call(method, *args)`` runs it in-process or on the
    actor. ``watch`` answers the commit that ``before_watch`` made (untimed)."""
    def reserve_commit(i: int) -> Any:
        pid = policies[i % len(policies)]
        return call("commit", pid, call("reserve", pid, "node-1"), "node-1", summary(i))

    def watch(i: int) -> Any:
        answer = call("watch", state["seq"], 5.0, state["epoch"])
        state["seq"] = answer.seq
        return answer

    return {
        "publish": lambda i: call("publish", policies[i % len(policies)], "node-1", summary(i)),
        "reserve_commit": reserve_commit,
        "lookup_latest": lambda i: call("lookup", policies[i % len(policies)]),
        "lookup_version": lambda i: call("lookup", policies[i % len(policies)], 1 + i % 10),
        "list_policy": lambda i: call("list", policies[i % len(policies)]),
        "list_all": lambda i: call("list"),
        "hold": lambda i: call("update_holders", [((policies[i % len(policies)], 1 + i % 10), f"node-{2 + i % 8}")]),
        "watch": watch,
    }


def samples_for(op: str, n: int, repeats: int) -> int:
    return max(3, min(repeats, 20_000 // max(1, n // 100))) if op == "list_all" else repeats


def one_at_a_time(call: Callable[..., Any], op: str, count: int, policies: list[str], state: dict) -> list[float]:
    """Durations of ``count`` calls of ``op``, one at a time."""
    calls = op_calls(call, policies, state)
    if op == "watch":
        state["seq"] = call("health").seq
    times = []
    for i in range(count):
        if op == "watch":
            call("publish", policies[0], "node-1", summary(i))
        start = time.perf_counter()
        calls[op](i)
        times.append(time.perf_counter() - start)
    return times


def measure_inproc(results: harness.Results, catalog: CatalogServer, n: int, policies: list[str], args) -> None:
    health = catalog.health()
    state = {"seq": health.seq, "epoch": health.epoch}
    for op in OPS:
        count = samples_for(op, n, args.repeats)
        times = one_at_a_time(lambda method, *a: getattr(catalog, method)(*a), op, count, policies, state)
        stats = harness.percentiles(times)
        results.emit({"row": "ops", "mode": "inproc", "snapshots": n, "op": op, "samples": count,
                      "p50_ms": stats["p50"], "p99_ms": stats["p99"], "ops_per_s": 1e3 / stats["mean"], "inflight": 1})


def measure_actor(results: harness.Results, actor, n: int, policies: list[str], args) -> None:
    first = ray.get(actor.health.remote())
    state = {"seq": first.seq, "epoch": first.epoch}
    for op in OPS:
        count = samples_for(op, n, args.actor_repeats)
        times = one_at_a_time(lambda method, *a: ray.get(getattr(actor, method).remote(*a)), op, count, policies,
                              state)
        stats = harness.percentiles(times)
        row = {"row": "ops", "mode": "actor", "snapshots": n, "op": op, "samples": count,
               "p50_ms": stats["p50"], "p99_ms": stats["p99"], "ops_per_s": 1e3 / stats["mean"], "inflight": 1}
        if op in ("publish", "lookup_latest", "lookup_version", "hold"):
            pipelined = {
                "publish": lambda i: actor.publish.remote(policies[i % len(policies)], "node-1", summary(i)),
                "lookup_latest": lambda i: actor.lookup.remote(policies[i % len(policies)]),
                "lookup_version": lambda i: actor.lookup.remote(policies[i % len(policies)], 1 + i % 10),
                "hold": lambda i: actor.update_holders.remote([((policies[i % len(policies)], 1),
                                                                 f"node-{2 + i % 8}")]),
            }[op]
            total = args.inflight * 8
            start = time.perf_counter()
            pending = []
            for i in range(total):
                pending.append(pipelined(i))
                if len(pending) >= args.inflight:
                    ray.get(pending.pop(0))
            ray.get(pending)
            row["ops_per_s"] = total / (time.perf_counter() - start)
            row["inflight"] = args.inflight
        results.emit(row)
    state_after = ray.get(actor.health.remote())
    log.info("actor catalog now holds %d snapshots", state_after.snapshots)


def actor_pid(actor) -> int:
    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))


def restart_actor(actor) -> float:
    """SIGKILL the actor's process; seconds until a lookup is answered again (Ray restarts it, it reopens)."""
    os.kill(actor_pid(actor), signal.SIGKILL)
    start = time.perf_counter()
    while True:
        try:
            ray.get(actor.health.remote(), timeout=60)
            return time.perf_counter() - start
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.ActorDiedError, ray.exceptions.GetTimeoutError):
            if time.perf_counter() - start > 300:
                raise
            time.sleep(0.05)


def run_size(results: harness.Results, n: int, args, workdir: Path) -> None:
    db = workdir / f"catalog-{n}" / "catalog.sqlite3"
    catalog = CatalogServer(str(db), StoreConfig())
    start = time.perf_counter()
    policies = fill(catalog, n, args.versions_per_policy)
    log.info("%d snapshots in %.1f s", n, time.perf_counter() - start)
    measure_inproc(results, catalog, n, policies, args)
    catalog._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    catalog.close()
    db_bytes = db.stat().st_size
    start = time.perf_counter()
    CatalogServer(str(db), StoreConfig()).close()
    open_s = time.perf_counter() - start
    actor = ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(CatalogServer).options(
        num_cpus=0, max_concurrency=8, max_restarts=-1
    ).remote(str(db), StoreConfig())
    ray.get(actor.health.remote())
    measure_actor(results, actor, n, policies, args)
    pss = psutil.Process(actor_pid(actor)).memory_full_info().pss
    restart_s = restart_actor(actor)
    results.emit({"row": "state", "snapshots": ray.get(actor.health.remote()).snapshots, "db_mib": db_bytes / MiB,
                  "open_s": open_s, "actor_restart_s": restart_s, "actor_pss_mib": pss / MiB})
    ray.kill(actor, no_restart=True)


# ---- fan-out ---------------------------------------------------------------------------------------------------
def fanout(results: harness.Results, args) -> None:
    from ray.cluster_utils import Cluster

    import policystore

    store_bytes = max(256 * MiB, 4 * max(args.fanout_mib) * MiB)
    session = None
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": store_bytes,
                                                            "include_dashboard": False})
    try:
        for _ in range(args.nodes - 1):
            cluster.add_node(num_cpus=1, object_store_memory=store_bytes)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
        session = ray.get_runtime_context().get_session_name()
        stores = policystore.connect_all(StoreConfig())  # spill folders per node, under <tmp>/policystore-spill/<s>
        catalog = ray.get_actor(CATALOG_NAME, namespace=NAMESPACE)
        nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        if args.serves_per_snapshot:  # e.g. the node count: every store fetches from the publisher (a star)
            ray.get([ray.get_actor(store_name(n), namespace=NAMESPACE).__ray_call__.remote(
                lambda self, limit=args.serves_per_snapshot: setattr(self.state.relay, "fanout", limit))
                for n in nodes])
        head = cluster.head_node.node_id

        source, readers = probe_on(head), [probe_on(n) for n in nodes if n != head]
        ray.get([r.node.remote() for r in [source, *readers]])
        # untimed warm-up of both paths (worker leases, actor handles between stores), so that round 0 measures
        # the transfer, not the cluster's first calls
        ray.get([r.fetch.remote("fanout_warmup", ray.get(source.publish.remote("fanout_warmup", MiB, 0)))
                 for r in readers])
        ray.get([r.get.remote(ray.get(source.put.remote(MiB, 0))) for r in readers])
        for mib in args.fanout_mib:
            nbytes = mib * MiB
            for round_ in range(args.fanout_rounds):
                rows = {}
                for mode in ("policystore", "ray_get"):
                    row = {"row": "fanout", "mode": mode, "nodes": len(nodes), "round": round_, "snapshot_mib": mib}
                    if mode == "policystore":
                        row["serves_per_snapshot"] = args.serves_per_snapshot or FANOUT
                    if mode == "policystore":
                        served = [s.stats().served for s in stores.values()]
                        calls = ray.get(catalog.health.remote()).calls
                        window = time.perf_counter()
                        version = ray.get(source.publish.remote(f"fanout_{mib}", nbytes, round_))
                        start = time.perf_counter()
                        per_node = ray.get([r.fetch.remote(f"fanout_{mib}", version) for r in readers])
                        total = time.perf_counter() - start
                        for store in stores.values():
                            store.flush()  # its spills done and holder changes sent
                        row["served_max"] = max(s.stats().served - b for s, b in zip(stores.values(), served,
                                                                                     strict=True))
                        after = ray.get(catalog.health.remote()).calls
                        window = time.perf_counter() - window
                        counts = {m: n - calls.get(m, 0) for m, n in after.items() if n > calls.get(m, 0)}
                        results.emit({"row": "catalog_calls", "nodes": len(nodes), "snapshot_mib": mib,
                                      "round": round_, "window_s": window,
                                      "calls_per_snapshot": sum(n for m, n in counts.items() if m != "watch"),
                                      "watch_per_node_s": counts.get("watch", 0) / len(nodes) / window,
                                      **{f"calls_{m}": n for m, n in sorted(counts.items())}})
                    else:
                        refs = ray.get(source.put.remote(nbytes, round_))
                        start = time.perf_counter()
                        per_node = ray.get([r.get.remote(refs) for r in readers])
                        total = time.perf_counter() - start
                    rows[mode] = {**row, "total_s": total, "node_p50_s": statistics.median(per_node),
                                  "node_max_s": max(per_node), "aggregate_gbps": nbytes * len(readers) / total / 1e9}
                rows["policystore"]["x_ray_get"] = rows["policystore"]["total_s"] / rows["ray_get"]["total_s"]
                for row in rows.values():
                    results.emit(row)
    finally:
        policystore.close()  # its followers end before Ray does
        ray.shutdown()
        cluster.shutdown()
        if session:
            shutil.rmtree(StoreConfig.default_root(session), ignore_errors=True)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, style, marker in (("inproc", "-", "o"), ("actor", "--", "s")):
        for color, op in enumerate(OPS):
            pts = sorted((r["snapshots"], r["p50_ms"]) for r in rows
                         if r.get("row") == "ops" and r["mode"] == mode and r["op"] == op)
            if pts:
                ax.plot(*zip(*pts, strict=True), style, marker=marker, color=f"C{color}", label=f"{op} ({mode})")
    ax.set(xscale="log", yscale="log", xlabel="snapshots in the catalog", ylabel="p50 per call (ms)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = harness.make_parser("scale", __doc__)
    parser.add_argument("--sizes", type=harness.int_list, default=[1000, 10_000, 100_000],
                        help="catalog sizes in snapshots (%(default)s)")
    parser.add_argument("--versions-per-policy", type=int, default=100, help="(%(default)s)")
    parser.add_argument("--repeats", type=int, default=2000, help="in-process calls per op (%(default)s)")
    parser.add_argument("--actor-repeats", type=int, default=300, help="actor calls per op, one at a time")
    parser.add_argument("--inflight", type=int, default=64, help="actor calls in flight for ops_per_s")
    parser.add_argument("--nodes", type=int, default=8, help="fan-out cluster nodes, head included (%(default)s)")
    parser.add_argument("--fanout-mib", type=harness.int_list, default=[64, 256],
                        help="fan-out snapshot sizes, comma-separated (%(default)s)")
    parser.add_argument("--fanout-rounds", type=int, default=3, help="(%(default)s)")
    parser.add_argument("--serves-per-snapshot", type=int, default=0,
                        help="copies of one snapshot each store serves before it points at the nodes it served "
                             "(default: the store's own, FANOUT; the node count makes a star)")
    parser.add_argument("--skip-fanout", action="store_true", help="catalog rows only")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats, args.actor_repeats, args.inflight = [1000], 200, 30, 16
        args.nodes, args.fanout_mib, args.fanout_rounds = 3, [4], 1
    harness.setup_logging(args.verbose)
    results = harness.Results("scale", args, {k: str(v) for k, v in vars(args).items() if k != "out"})
    workdir = Path(tempfile.mkdtemp(prefix="policystore-scale-"))
    try:
        with harness.ray_session(256 * MiB, num_cpus=2):
            for n in args.sizes:
                run_size(results, n, args, workdir)
        if not args.skip_fanout:
            fanout(results, args)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    notes = [f"params: {json.dumps(results.params)}"]
    results.finish(["row", "mode", "snapshots", "op", "p50_ms", "p99_ms", "ops_per_s", "inflight", "db_mib", "open_s",
                    "actor_restart_s", "actor_pss_mib", "nodes", "snapshot_mib", "total_s", "node_max_s",
                    "aggregate_gbps", "served_max", "x_ray_get", "calls_per_snapshot", "watch_per_node_s",
                    "loadavg_1m"], plot, notes)


if __name__ == "__main__":
    main()
