"""Fan-out on an emulated network: a new snapshot published on the head, read by one reader on every other node,
on a ``benchmarks.netbed`` cluster whose links (not this machine's cores) set the pace.

Per snapshot size and round, in one run, one row per way:
  one_link    one copy over one link: a reader on node 1 ``ray.get``s an object put on the head (the floor of
              any fan-out: size / link rate, plus Ray's own cost); ``floor_s`` is size / rate alone
  ray_get     Ray's broadcast: ``ray.get`` of one ``ray.put`` object by a reader on every other node at once
  policystore the store: published on the head, then ``get`` by a reader on every other node at once; every
              node ends with its own copy, checked (``verified``: every node's ``verify`` found its hot copy good)
Columns: total_s (until every node has it), node_p50_s / node_max_s, x_one_link (total_s over the one_link row
of the same size and round), x_ray_get (over the ray_get row), sent_mib_max / recv_mib_max (the busiest node's
bytes on its link during that way's transfer, from the namespace's eth0 counters: TCP retransmissions count) and,
in ``bytes`` rows, every node's sent and received MiB; for the store also what each node's relay sent
(``relay_sent_mib``, the payload alone) and how often its fetch left a source for another (``resumed``).
CPU: ``cpu_s`` is what the testbed's processes (every node's) used during that way's transfer, ``busy_s`` what the
whole machine did; the calibration row has the idle testbed's cores per node and the other jobs' cores, which the
cluster model needs to tell a link-bound figure from a figure of N nodes sharing this machine's cores.

Needs root with CAP_NET_ADMIN (see ``benchmarks.netbed``); --quick: 3 nodes, 4 MiB, 200 Mbit/s, one round, the idle
testbed's CPU over 1 s (5 s otherwise).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray

from . import harness
from .harness import MiB
from .netbed import Testbed, cpu_seconds, machine_busy_seconds, unavailable
from .probe import probe_on

log = logging.getLogger("benchmarks.fanout_net")
WAYS = ("one_link", "ray_get", "policystore")


def main(argv: list[str] | None = None) -> None:
    parser = harness.make_parser("fanout_net", __doc__)
    parser.add_argument("--nodes", type=int, default=8, help="Ray nodes, one per namespace (%(default)s)")
    parser.add_argument("--rate-mbit", type=float, default=500, help="every link, both ways (%(default)s)")
    parser.add_argument("--sizes-mib", type=harness.int_list, default=[64, 256], help="(%(default)s)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per size (%(default)s)")
    parser.add_argument("--tag", default=None, help="the testbed's name tag (default: random)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.sizes_mib, args.rate_mbit, args.rounds = 3, [4], 200, 1
    harness.setup_logging(args.verbose)
    if args.inside:
        return drive(args)
    reason = unavailable()
    if reason:
        sys.exit(f"fanout_net: {reason}")
    results = harness.Results("fanout_net", args, {k: str(v) for k, v in vars(args).items() if k != "out"})
    store_mib = max(256, 4 * max(args.sizes_mib))
    extra = {"tag": args.tag} if args.tag else {}
    with Testbed(args.nodes, args.rate_mbit, object_store_mib=store_mib, num_cpus=1, **extra) as bed:
        log.info("testbed %s: %d nodes at %s Mbit/s up, load %s", bed.tag, args.nodes, args.rate_mbit,
                 harness.load_average())
        inner = [sys.executable, "-m", "benchmarks.fanout_net", "--inside", "--out", str(bed.temp_dir / "inner"),
                 "--nodes", str(args.nodes), "--rate-mbit", str(args.rate_mbit),
                 "--sizes-mib", ",".join(map(str, args.sizes_mib)), "--rounds", str(args.rounds),
                 *(["--quick"] if args.quick else [])]
        for row in bed.drive(inner, env_extra={"NETBED_NAMESPACES": ",".join(bed.namespaces)}):
            results.emit(row)
    results.finish(["way", "nodes", "rate_mbit", "snapshot_mib", "round", "total_s", "floor_s", "x_one_link",
                    "x_ray_get", "sent_mib_max", "recv_mib_max", "verified", "loadavg_1m"])


# ---- the driver, inside the head's namespace ----------------------------------------------------------------
def drive(args) -> None:
    import policystore
    from policystore.config import StoreConfig
    from policystore.remote import NAMESPACE, store_name

    results = harness.Results("fanout_net", args, {})
    ray.init(address=os.environ["NETBED_ADDRESS"], logging_level=logging.WARNING, log_to_driver=False)
    spill = Path(os.environ["NETBED_TEMP_DIR"]) / "spill"
    try:
        stores = policystore.connect_all(StoreConfig(spill_dir=str(spill)))
        head = ray.get_runtime_context().get_node_id()
        others = [n for n in stores if n != head]

        relays = [ray.get_actor(store_name(n), namespace=NAMESPACE) for n in [head, *others]]

        def relayed() -> list[tuple[int, int]]:
            """Per node: the bytes its relay sent, the sources its fetches left for another."""
            return ray.get([r.__ray_call__.remote(lambda self: (self.state.relay.sent_bytes, self.state.relay.resumed))
                            for r in relays])

        source, readers = probe_on(head), [probe_on(n) for n in others]
        probes = [source, *readers]
        ray.get([p.node.remote() for p in probes])
        warm = ray.get(source.publish.remote("fanout_warmup", MiB, 0))  # untimed: leases, handles between stores
        ray.get([r.fetch.remote("fanout_warmup", warm) for r in readers])
        ray.get([r.get.remote(ray.get(source.put.remote(MiB, 0))) for r in readers])
        namespaces = os.environ["NETBED_NAMESPACES"].split(",")
        results.emit({"row": "calibration", "nodes": len(stores), "rate_mbit": args.rate_mbit,
                      **calibrate(readers[0], max(args.sizes_mib) * MiB),
                      **idle_cpu(namespaces, for_s=1.0 if args.quick else 5.0)})
        for mib in args.sizes_mib:
            nbytes = mib * MiB
            floor = nbytes * 8 / (args.rate_mbit * 1e6)
            for round_ in range(args.rounds):
                rows: dict[str, dict[str, Any]] = {}
                for way in WAYS:
                    settle(probes)
                    before = ray.get([p.link_bytes.remote() for p in probes])
                    relayed_before = relayed()
                    verified = None
                    if way == "policystore":
                        version = ray.get(source.publish.remote(f"fanout_{mib}", nbytes, round_))
                        cpu_before = cpu_seconds(namespaces), machine_busy_seconds()
                        start = time.perf_counter()
                        per_node = ray.get([r.fetch.remote(f"fanout_{mib}", version) for r in readers])
                        total = time.perf_counter() - start
                        cpu_after = cpu_seconds(namespaces), machine_busy_seconds()
                        verified = all(ray.get([r.verify.remote(f"fanout_{mib}", version) for r in readers]))
                    else:
                        refs = ray.get(source.put.remote(nbytes, round_))
                        cpu_before = cpu_seconds(namespaces), machine_busy_seconds()
                        start = time.perf_counter()
                        takers = readers[:1] if way == "one_link" else readers
                        per_node = ray.get([r.get.remote(refs) for r in takers])
                        total = time.perf_counter() - start
                        cpu_after = cpu_seconds(namespaces), machine_busy_seconds()
                        del refs
                        ray.get(source.drop.remote())
                    after = ray.get([p.link_bytes.remote() for p in probes])
                    sent = [(a[0] - b[0]) / MiB for a, b in zip(after, before, strict=True)]
                    recv = [(a[1] - b[1]) / MiB for a, b in zip(after, before, strict=True)]
                    rows[way] = {"row": "fanout", "way": way, "nodes": len(stores), "rate_mbit": args.rate_mbit,
                                 "snapshot_mib": mib, "round": round_, "total_s": total, "floor_s": floor,
                                 "node_p50_s": statistics.median(per_node), "node_max_s": max(per_node),
                                 "sent_mib_max": max(sent), "recv_mib_max": max(recv), "verified": verified,
                                 "cpu_s": cpu_after[0] - cpu_before[0], "busy_s": cpu_after[1] - cpu_before[1]}
                    # the relays' own count (no retransmissions) and how often a fetch left its source
                    relays_now = relayed()
                    relay_mib = [round((a[0] - b[0]) / MiB, 1) for a, b in zip(relays_now, relayed_before, strict=True)]
                    resumed = [a[1] - b[1] for a, b in zip(relays_now, relayed_before, strict=True)]
                    results.emit({"row": "bytes", "way": way, "snapshot_mib": mib, "round": round_,
                                  "sent_mib": [round(s, 1) for s in sent], "recv_mib": [round(r, 1) for r in recv],
                                  **({"relay_sent_mib": relay_mib, "resumed": resumed} if way == "policystore"
                                     else {})})
                    if way == "policystore":
                        stores[head].delete(f"fanout_{mib}", version)  # its memory and disk back for the next round
                for row in rows.values():
                    row["x_one_link"] = row["total_s"] / rows["one_link"]["total_s"]
                    row["x_ray_get"] = row["total_s"] / rows["ray_get"]["total_s"]
                    results.emit(row)
    finally:
        policystore.close()  # its followers end before Ray does
        ray.shutdown()
        shutil.rmtree(spill, ignore_errors=True)


def settle(probes: list, quiet_bytes: int = 256 << 10, within_s: float = 120.0) -> None:
    """Wait until no link moves more than ``quiet_bytes`` in half a second: Ray's object manager goes on pushing
    chunks it sent again (a loaded machine's retransmissions, re-pulls) after its ``get``s returned, and those
    must not share the links with, or be counted for, the next way."""
    last = ray.get([p.link_bytes.remote() for p in probes])
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = ray.get([p.link_bytes.remote() for p in probes])
        if all(n[0] - b[0] < quiet_bytes and n[1] - b[1] < quiet_bytes for n, b in zip(now, last, strict=True)):
            return
        last = now
    log.warning("the links did not settle within %.0f s", within_s)


def idle_cpu(namespaces: list[str], for_s: float = 5.0) -> dict[str, float]:
    """What the idle testbed costs the machine's cores: its processes' CPU per node and second, and the rest of the
    machine's (``others_cores``: other jobs), measured over ``for_s`` with nothing moving."""
    cpu, busy, start = cpu_seconds(namespaces), machine_busy_seconds(), time.perf_counter()
    time.sleep(for_s)
    wall = time.perf_counter() - start
    testbed = (cpu_seconds(namespaces) - cpu) / wall
    return {"idle_cores_per_node": testbed / len(namespaces), "others_cores": (machine_busy_seconds() - busy) / wall
            - testbed, "cores": os.cpu_count()}


def calibrate(far, nbytes: int) -> dict[str, float]:
    """What the cluster model needs besides the link (``benchmarks.cluster_model --testbed``): an actor call to
    another node, the checksum and copy rates here, the catalog's time per small call with 32 in flight."""
    from policystore.format import pack, verify_buffer
    from policystore.remote import CATALOG_NAME, NAMESPACE

    call_s = statistics.median(harness.timed(lambda: ray.get(far.ping.remote()), 20, warmup=3))
    buf = pack({"w": np.ones(nbytes // 4, dtype=np.float32)}, policy_id="calibration")
    checksum_s = statistics.median(harness.timed(lambda: verify_buffer(buf, name="calibration"), 3))
    out = np.empty_like(buf)
    copy_s = statistics.median(harness.timed(lambda: np.copyto(out, buf), 3))
    catalog = ray.get_actor(CATALOG_NAME, namespace=NAMESPACE)
    total, pending = 256, []
    start = time.perf_counter()
    for _ in range(total):
        pending.append(catalog.lookup.remote("fanout_warmup"))
        if len(pending) >= 32:
            ray.get(pending.pop(0))
    ray.get(pending)
    catalog_call_s = (time.perf_counter() - start) / total
    return {"call_s": call_s, "checksum_bps": buf.nbytes / checksum_s, "copy_bps": buf.nbytes / copy_s,
            "catalog_call_s": catalog_call_s}


if __name__ == "__main__":
    main()
