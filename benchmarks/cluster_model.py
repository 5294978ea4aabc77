"""Cluster model: how a new snapshot spreads over N nodes, and what the catalog carries, calibrated on this machine.

A discrete-event simulation of one learner update reaching every node. Transfers share bandwidth as fluids (every
running transfer gets ``min(stream, node_out / uploads at its source, node_in / downloads at its destination)``,
all scaled down together when they would exceed what the whole fabric moves at once); a rate changes only when
a transfer starts or ends, so the simulation jumps from event to event. Four ways to spread it:

  star   every node fetches from the publishing node (what a single source gives)
  tree   the store's way before the pipeline (kept to compare): a node fetches from a node that already
         holds a whole copy, serves fewer than --max-serving copies at that moment and has served fewer than
         --max-served in all (the least served first); a node that finished becomes a source after
         --holder-delay-s (how long until others learn it holds the snapshot); each fetch is the reader's call
         to its store (whose catalog follower already has the entry), a call to the source, the transfer, then
         the checksum beside the copy into the node's own object
  chain  the store's way (``policystore.transfer``): a pipeline in which every node forwards bytes as they
         land, each source serving --fanout nodes (1: a chain); closed form, not simulated: every node's link
         carries --fanout copies at once, the last node's bytes trail the first's by one hop (half an actor
         call) per level, then the checksum beside the own copy
  ray    Ray's own broadcast (``ray.get`` of one object on every node): each node pulls from a node that holds a
         whole copy when it asks (Ray lists a location once the copy there is whole); every node asks at once,
         so the publisher serves them all, with no call, checksum or own copy

Calibration (``--calibrate``, the default) measures on a local ``ray.cluster_utils.Cluster``, in this run: an actor
call between nodes, one object transfer between two nodes (one stream), one node sending to three at once (what a
node sends), three disjoint pairs at once (what the machine moves at once), the checksum and the copy rates, and
the catalog actor's throughput for small calls. Every node of a local cluster shares this machine's cores and
memory, so its "fabric" is the machine; the 300-node figures replace the fabric and the node's NIC by the stated
network and keep the per-call and per-byte costs measured here.

``--testbed RESULTS.json ...`` calibrates on ``benchmarks.fanout_net`` runs instead (an emulated network: one
link's rate and a measured copy over it, the calls between nodes, checksum and copy rates, the catalog's calls)
and puts the model's figures beside each measured fan-out (``testbed`` rows: predicted, measured, error, and the
links-only figure). The testbed's nodes share one machine's cores, so there a way is also bound by CPU: every
byte a node receives (and for the chain forwards) costs measured CPU seconds (the first run's processes' CPU per
byte), paid out of the cores left after every idle node's own use (measured per node): at 16 nodes on 2 cores the
idle nodes alone take most of them. On a real cluster every node has its own cores: the chain's rate is then
capped by what the relay's two threads (receive, send) forward at that CPU per byte.

Rows:
  calibration   the measured costs (seconds per call, bytes/s)
  testbed       (``--testbed``) per run, size and way: predicted_s, measured_s, error (predicted / measured - 1)
  prediction    the model's time until every node holds a new snapshot, per mode, nodes and size, with the
                busiest node's copies served and bytes sent
  fanout        (``--measure``) benchmarks.scale's fan-out rows, run on a local cluster of --nodes afterwards
  league        the league of docs/scaling.md at each of --league-nodes (300 and 1,000): update time per mode,
                bytes out of the busiest node, catalog calls/s and the catalog's headroom (its measured
                throughput / that load), memory per node

    python -m benchmarks.cluster_model --quick
    python -m benchmarks.cluster_model --nodes 8 --sizes-mib 64,256 --measure
    python -m benchmarks.cluster_model --testbed results/fanout_net8/results.json results/fanout_net16/results.json
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from policystore.transfer import FANOUT, WAKE_BYTES

from . import harness
from .harness import MiB

log = logging.getLogger("benchmarks.cluster_model")
MODES = ("star", "tree", "chain", "ray")
GB = 1e9


@dataclass(frozen=True)
class Costs:
    """What one step costs: seconds per call, bytes per second."""

    call_s: float  # an actor call between two nodes, round trip
    catalog_call_s: float  # the catalog actor's time per small call (1 / its throughput)
    stream_bps: float  # one transfer between two nodes
    node_bps: float  # what one node sends (and receives) at once, all its transfers together
    fabric_bps: float  # what the whole cluster moves at once (math.inf: a non-blocking switch)
    checksum_bps: float
    copy_bps: float  # the fetched bytes into this node's own object
    # CPU (measured on the testbed by process accounting; 0: not measured, the links alone decide):
    hop_cpu_s_per_byte: float = 0.0  # the chain: every process's CPU per byte one node receives and forwards
    get_cpu_s_per_byte: float = 0.0  # Ray's broadcast: every process's CPU per byte one node receives
    cores: float = math.inf  # the cores all nodes share (the testbed's machine); inf: every node has its own
    idle_cores_per_node: float = 0.0  # what an idle node uses of those shared cores (its raylet, stores, ...)
    others_cores: float = 0.0  # what other jobs use of them
    relay_cores: float = 2.0  # a node with cores of its own: its relay's receiving and sending threads

    def shared_cores(self, nodes: int) -> float:
        """The shared cores left for moving bytes once every node's idle cost and other jobs are paid."""
        return max(self.cores - self.others_cores - nodes * self.idle_cores_per_node, 0.05)


@dataclass(frozen=True)
class Spread:
    """One snapshot spread to every node: when the last got it, and what the busiest source did."""

    total_s: float
    node_p50_s: float
    max_served: int  # copies the busiest source sent
    max_sent_bytes: float
    rounds: float  # total_s over the time of one lone transfer: about log2(nodes) for a tree


def pipeline(nodes: int, nbytes: float, costs: Costs, fanout: int = FANOUT) -> Spread:
    """A new snapshot streamed from node 0 through a pipeline of ``fanout`` copies per source (1: a chain)."""
    levels = nodes - 1 if fanout == 1 else math.ceil(math.log(nodes * (fanout - 1) + 1, fanout)) - 1
    rate = min(costs.stream_bps, costs.node_bps / fanout, costs.fabric_bps / max(1, nodes - 1))
    if costs.hop_cpu_s_per_byte and math.isinf(costs.cores):  # a node of its own: its relay's threads
        rate = min(rate, costs.relay_cores / (fanout * costs.hop_cpu_s_per_byte))
    # the reader's resolve, the route calls and the connects of every node run at once, before the first byte;
    # then each level adds the time a node takes to pass on what just landed: a one-way message between nodes
    # (half an actor call's round trip: an actor call is two messages plus Ray's own work) and the pipeline's
    # fill, one wake-up's worth of bytes (transfer.WAKE_BYTES) at the stream's rate
    before = 3 * costs.call_s
    hop = costs.call_s / 2 + WAKE_BYTES / rate
    after = max(nbytes / costs.checksum_bps, nbytes / costs.copy_bps)
    moving = nbytes / rate
    if not math.isinf(costs.cores):  # nodes sharing one machine's cores: every hop's CPU comes out of them
        moving = max(moving, (nodes - 1) * nbytes * costs.hop_cpu_s_per_byte / costs.shared_cores(nodes))
    first = before + moving + after
    total = first + (levels - 1) * hop
    return Spread(total, first + (levels - 1) * hop / 2, fanout, fanout * nbytes, total / first)


def spread(mode: str, nodes: int, nbytes: float, costs: Costs, *, max_serving: int = 3, max_served: int = 3,
           holder_delay_s: float = 0.0, seed: int = 0, fanout: int = FANOUT) -> Spread:
    """One new snapshot of ``nbytes`` on node 0 reaching nodes 1..nodes-1 (all ask at once): simulated, or for
    ``chain`` the pipeline's closed form."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; one of {MODES}")
    if mode == "chain":
        return pipeline(nodes, nbytes, costs, fanout)
    rng = random.Random(seed)
    store = mode != "ray"
    # the reader's resolve and the store's serve call (the catalog's entry came with its watch answer), or the get
    before = 2 * costs.call_s if store else costs.call_s
    after = max(nbytes / costs.checksum_bps, nbytes / costs.copy_bps) if store else 0.0  # side by side
    cap, budget = (max_serving, max_served) if mode == "tree" else (math.inf, math.inf)
    holders = {0: 0.0}  # node -> when others may fetch from it
    serving = {0: 0}
    served = {0: 0}
    waiting = list(range(1, nodes))
    rng.shuffle(waiting)
    running: dict[int, list[float]] = {}  # destination -> [source, bytes left]
    done: dict[int, float] = {}
    timers: list[tuple[float, int, str]] = [(before, -1, "ready")]  # (time, node, what)
    t = 0.0

    def rates() -> dict[int, float]:
        up: dict[int, int] = {}
        for src, _ in running.values():
            up[int(src)] = up.get(int(src), 0) + 1
        rate = {dst: min(costs.stream_bps, costs.node_bps / up[int(src)])
                for dst, (src, _) in running.items()}
        total = sum(rate.values())
        if total > costs.fabric_bps:
            rate = {dst: r * costs.fabric_bps / total for dst, r in rate.items()}
        return rate

    def start_fetches() -> None:
        for dst in list(waiting):
            sources = [n for n, at in holders.items() if at <= t and serving[n] < cap and served[n] < budget]
            if not sources:
                return
            src = min(sources, key=lambda n: (served[n], serving[n], rng.random()))
            serving[src] += 1
            served[src] += 1
            waiting.remove(dst)
            running[dst] = [src, nbytes]

    ready = False
    while len(done) < nodes - 1:
        if ready:
            start_fetches()
        rate = rates()
        next_end = min(((left / rate[dst], dst) for dst, (_, left) in running.items()), default=(math.inf, -1))
        next_timer = timers[0][0] - t if timers else math.inf
        step = min(next_end[0], next_timer)
        if step == math.inf:
            raise RuntimeError(f"{mode}: stuck with {len(waiting)} nodes waiting")
        for dst in running:
            running[dst][1] -= rate[dst] * step
        t += step
        if next_timer <= next_end[0]:
            _, node, what = heapq.heappop(timers)
            if what == "ready":
                ready = True
            elif what == "copied":
                done[node] = t
                heapq.heappush(timers, (t + holder_delay_s, node, "holder"))
            elif what == "holder":
                holders[node], serving[node], served[node] = t, 0, 0
            continue
        dst = next_end[1]
        src = int(running.pop(dst)[0])
        serving[src] -= 1
        heapq.heappush(timers, (t + after, dst, "copied"))
    lone = before + nbytes / min(costs.stream_bps, costs.node_bps, costs.fabric_bps) + after
    busiest = max(served.values())
    total = max(done.values())
    if not math.isinf(costs.cores) and mode == "ray":  # nodes sharing one machine's cores
        total = max(total, before + (nodes - 1) * nbytes * costs.get_cpu_s_per_byte / costs.shared_cores(nodes))
    return Spread(total, statistics.median(done.values()), busiest, busiest * nbytes, total / lone)


# ---- the league of docs/scaling.md ---------------------------------------------------------------------------
@dataclass(frozen=True)
class League:
    """The stated assumptions for a league of AlphaStar's size (not measured: docs/scaling.md says why these)."""

    nodes: int = 300
    workers_per_node: int = 32
    players: int = 900
    snapshot_bytes: float = 220e6
    learners: int = 12
    publish_every_s: float = 10.0
    nic_bps: float = 25e9 / 8
    hold_batch_s: float = 0.5  # a store reports the copies it gained or dropped at most once per this


def catalog_load(league: League, costs: Costs) -> dict[str, float]:
    """Catalog calls/s: per new snapshot one publish and one watch answer per node store (which carries the entry a
    fetching store needs: no lookup); holds in one batch per node per ``hold_batch_s`` at most."""
    snapshots_s = league.learners / league.publish_every_s
    per_snapshot = 1 + league.nodes
    holds_s = league.nodes * min(snapshots_s, 1 / league.hold_batch_s)
    calls_s = snapshots_s * per_snapshot + holds_s
    capacity = 1 / costs.catalog_call_s
    return {"snapshots_per_s": snapshots_s, "calls_per_snapshot": per_snapshot + holds_s / snapshots_s,
            "catalog_calls_per_s": calls_s, "catalog_capacity_per_s": capacity, "headroom": capacity / calls_s}


def node_memory_bytes(league: League) -> dict[str, float]:
    """A node keeps one copy of each snapshot its workers use: the learners' latest, and the frozen opponents
    its workers draw (expected distinct draws of ``workers_per_node`` from ``players``)."""
    frozen = league.players * (1 - (1 - 1 / league.players) ** league.workers_per_node)
    return {"store_bytes": (league.learners + frozen) * league.snapshot_bytes,
            "private_copies_bytes": league.workers_per_node * (1 + 1) * league.snapshot_bytes}


# ---- calibration on a local cluster -----------------------------------------------------------------------------
def calibrate(nodes: int, nbytes: int) -> Costs:
    """Measure every cost the model uses on a local cluster of ``nodes`` (at least 4) in this process."""
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from policystore.catalog import CONCURRENCY_GROUPS, CatalogServer
    from policystore.config import StoreConfig
    from policystore.format import pack, verify_buffer

    nodes = max(nodes, 4)
    store_bytes = max(256 * MiB, 4 * nbytes)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": store_bytes,
                                                            "include_dashboard": False})
    try:
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=1, object_store_memory=store_bytes)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
        ids = [n["NodeID"] for n in ray.nodes() if n["Alive"]]

        @ray.remote(num_cpus=0.01)
        class Peer:
            def ping(self) -> None:
                return None

            def put(self, n: int) -> list:
                self.obj = np.ones(n, dtype=np.uint8)
                return [ray.put(self.obj)]

            def get(self, refs: list) -> float:
                start = time.perf_counter()
                ray.get(refs[0])
                return time.perf_counter() - start

        peers = [Peer.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
                 for n in ids]
        ray.get([p.ping.remote() for p in peers])
        far = peers[1]
        call_s = statistics.median(harness.timed(lambda: ray.get(far.ping.remote()), 50, warmup=5))

        def transfer(pairs: Sequence[tuple[int, int]]) -> float:
            """Aggregate bytes/s of the given (source, destination) transfers at once."""
            refs = {s: ray.get(peers[s].put.remote(nbytes)) for s in {s for s, _ in pairs}}
            start = time.perf_counter()
            ray.get([peers[d].get.remote(refs[s]) for s, d in pairs])
            return len(pairs) * nbytes / (time.perf_counter() - start)

        transfer([(0, 1)])  # warm the object managers' connections
        stream = statistics.median(transfer([(0, 1)]) for _ in range(3))
        node = statistics.median(transfer([(0, 1), (0, 2), (0, 3)]) for _ in range(2))
        fabric = statistics.median(transfer([(0, 1), (2, 3), (1, 0)]) for _ in range(2))

        catalog = ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(CatalogServer).options(
            num_cpus=0, max_concurrency=8).remote(":memory:", StoreConfig())
        ray.get(catalog.health.remote())
        total, inflight, pending = 512, 64, []
        start = time.perf_counter()
        for i in range(total):
            pending.append(catalog.update_holders.remote([(("p", 1), f"node-{i % 8}")]))
            if len(pending) >= inflight:
                ray.get(pending.pop(0))
        ray.get(pending)
        catalog_call_s = (time.perf_counter() - start) / total
    finally:
        ray.shutdown()
        cluster.shutdown()
    buf = pack({"w": np.ones(nbytes // 4, dtype=np.float32)}, policy_id="calibration")
    checksum_s = statistics.median(harness.timed(lambda: verify_buffer(buf, name="calibration"), 5))
    out = np.empty_like(buf)
    copy_s = statistics.median(harness.timed(lambda: np.copyto(out, buf), 5))
    return Costs(call_s, catalog_call_s, stream, node, fabric, nbytes / checksum_s, nbytes / copy_s)


def main(argv: list[str] | None = None) -> None:
    parser = harness.make_parser("cluster_model", __doc__)
    parser.add_argument("--nodes", type=int, default=8, help="local cluster to predict (and measure) (%(default)s)")
    parser.add_argument("--sizes-mib", type=harness.int_list, default=[64, 256], help="(%(default)s)")
    parser.add_argument("--max-serving", type=int, default=3,
                        help="tree: copies a source serves at once (%(default)s: it serves every fetcher it takes)")
    parser.add_argument("--max-served", type=int, default=3,
                        help="tree: copies a source serves per snapshot (%(default)s: the old store's share)")
    parser.add_argument("--fanout", type=int, default=FANOUT,
                        help="chain: nodes a source streams to at once (%(default)s: the store's, a chain)")
    parser.add_argument("--league-nodes", type=harness.int_list, default=[300, 1000],
                        help="node counts of the extrapolated league (%(default)s)")
    parser.add_argument("--testbed", type=Path, nargs="+", metavar="RESULTS_JSON",
                        help="calibrate on these benchmarks.fanout_net runs instead of a local cluster")
    parser.add_argument("--holder-delay-s", type=float, default=0.0,
                        help="tree: from a node's copy being whole to others fetching from it (%(default)s)")
    parser.add_argument("--calibrate-mib", type=int, default=64, help="transfer size for calibration")
    parser.add_argument("--measure", action="store_true",
                        help="after predicting, run benchmarks.scale's fan-out on --nodes local nodes")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.sizes_mib, args.calibrate_mib = 4, [4], 4
    harness.setup_logging(args.verbose)
    results = harness.Results("cluster_model", args, {k: str(v) for k, v in vars(args).items() if k != "out"})
    knobs = {"max_serving": args.max_serving, "max_served": args.max_served, "holder_delay_s": args.holder_delay_s,
             "fanout": args.fanout}
    if args.testbed:
        costs = against_testbed(results, args.testbed, knobs)
    else:
        costs = calibrate(args.nodes, args.calibrate_mib * MiB)
        results.emit({"row": "calibration", **asdict(costs)})
    for mib in [] if args.testbed else args.sizes_mib:
        for mode in MODES:
            s = spread(mode, args.nodes, mib * MiB, costs, **knobs)
            results.emit({"row": "prediction", "mode": mode, "nodes": args.nodes, "snapshot_mib": mib,
                          **asdict(s)})
    if args.measure:  # benchmarks.scale's fan-out rows ("fanout"), after the predictions were written
        from . import scale

        scale.fanout(results, argparse.Namespace(nodes=args.nodes, fanout_mib=args.sizes_mib, fanout_rounds=3,
                                                 serves_per_snapshot=0))
    league = League()
    # a cluster's network, and every node its own cores: the CPU per byte stays the testbed's (which also pays the
    # emulated links' veth, bridge and tbf work that a NIC does in hardware: an upper bound)
    network = replace(costs, node_bps=league.nic_bps, fabric_bps=math.inf,
                      stream_bps=max(costs.stream_bps, league.nic_bps), cores=math.inf, others_cores=0.0,
                      idle_cores_per_node=0.0)
    for nodes in args.league_nodes:
        sized = replace(league, nodes=nodes)
        for mode in MODES:
            s = spread(mode, nodes, league.snapshot_bytes, network, **knobs)
            results.emit({"row": "league", "mode": mode, "nodes": nodes, "snapshot_mib": league.snapshot_bytes / MiB,
                          **asdict(s), **catalog_load(sized, costs),
                          "relay_cpu_s": (league.snapshot_bytes * network.hop_cpu_s_per_byte
                                          if mode == "chain" else None),
                          **{k: v / GB for k, v in node_memory_bytes(sized).items()}})
    results.finish(["row", "mode", "nodes", "snapshot_mib", "total_s", "predicted_s", "measured_s", "error",
                    "links_only_s", "shared_cores", "max_served", "max_sent_bytes", "relay_cpu_s",
                    "catalog_calls_per_s", "headroom", "loadavg_1m"])


def against_testbed(results: harness.Results, paths: Sequence[Path], knobs: dict) -> Costs:
    """Costs from ``benchmarks.fanout_net`` runs, and the model's figure beside each fan-out they measured; returns
    the first run's costs (for the league).

    Every run brings its own link (its one-link copy) and calls; the CPU constants come from the first run alone
    and predict the others: the idle node's share of the cores, and each way's CPU per byte a node receives (the
    testbed's processes' CPU during the transfer, less the idle nodes' over that time, over the bytes the
    nodes received). The prediction is for the testbed alone on its machine: a run with other jobs on the same
    cores (``run_others_cores``, measured before it) is slower than predicted by however the scheduler shares."""
    first: Costs | None = None
    cpu: dict[str, float] = {}
    idle = 0.0
    for path in paths:
        rows = json.loads(Path(path).read_text())["rows"]
        cal = next(r for r in rows if r["row"] == "calibration")
        fanouts = [r for r in rows if r["row"] == "fanout"]
        if not cpu and "idle_cores_per_node" in cal:  # the first run with CPU figures calibrates the CPU
            idle = cal["idle_cores_per_node"]
            others = max(cal["others_cores"], 0.0)
            for way, name in (("policystore", "hop_cpu_s_per_byte"), ("ray_get", "get_cpu_s_per_byte")):
                # the testbed's processes' CPU, or on a quiet machine the whole machine's less the other jobs' (it
                # also counts the kernel's network work done outside the testbed's processes), whichever is more
                per_byte = [(max(r["cpu_s"], r["busy_s"] - others * r["total_s"]) - r["nodes"] * idle * r["total_s"])
                            / ((r["nodes"] - 1) * r["snapshot_mib"] * MiB)
                            for r in fanouts if r["way"] == way]
                cpu[name] = max(statistics.median(per_byte), 0.0)
            results.emit({"row": "cpu_calibration", "from": str(path), "idle_cores_per_node": idle, **cpu})
        for row in (r for r in fanouts if r["way"] != "one_link"):
            one = next(r for r in fanouts if r["way"] == "one_link" and r["snapshot_mib"] == row["snapshot_mib"]
                       and r["round"] == row["round"])
            nbytes = row["snapshot_mib"] * MiB
            link = cal["rate_mbit"] * 1e6 / 8
            costs = Costs(call_s=cal["call_s"], catalog_call_s=cal["catalog_call_s"],
                          stream_bps=nbytes / one["total_s"], node_bps=link, fabric_bps=math.inf,
                          checksum_bps=cal["checksum_bps"], copy_bps=cal["copy_bps"], **cpu,
                          **({"cores": cal["cores"], "idle_cores_per_node": idle} if cpu else {}))
            first = first or costs
            mode = "chain" if row["way"] == "policystore" else "ray"
            links_only = spread(mode, row["nodes"], nbytes, replace(costs, cores=math.inf, hop_cpu_s_per_byte=0.0),
                                **knobs).total_s
            predicted = spread(mode, row["nodes"], nbytes, costs, **knobs).total_s
            results.emit({"row": "testbed", "mode": mode, "nodes": row["nodes"], "snapshot_mib": row["snapshot_mib"],
                          "round": row["round"], "predicted_s": predicted, "measured_s": row["total_s"],
                          "error": predicted / row["total_s"] - 1, "links_only_s": links_only,
                          "shared_cores": costs.shared_cores(row["nodes"]) if cpu else None,
                          "run_loadavg_1m": row["loadavg_1m"], "run_others_cores": cal.get("others_cores"),
                          **{f"cal_{k}": v for k, v in asdict(costs).items()}})
    if first is None:
        raise SystemExit("cluster_model: no fan-out rows in " + ", ".join(map(str, paths)))
    return first


if __name__ == "__main__":
    main()
