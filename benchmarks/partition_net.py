"""Partitions on an emulated network (``benchmarks.netbed``): a node's link, the head's link (the catalog's node)
and a learner's link mid-publish go down and come back, while readers play and a learner publishes.

Nodes: 0 the head (catalog, driver), 1 the learner, 2 and 3 readers. Scenarios, one ``scenario`` row each:
  node     node 2's link down --cut-s: its reader keeps reading the snapshot it holds; on node 2 a call that needs
           the catalog (a ``get`` of the latest version once the view is older than ``max_staleness_s``, a
           ``list``) fails within its deadline with a PolicyStoreError; the learner keeps publishing; after the
           link returns node 2 reads the newest acknowledged version
  head     the head's link down --cut-s: readers on nodes 2 and 3 keep reading what they hold; the learner's
           publish fails within its deadline with a PolicyStoreError; after, publishes go on
  learner  the learner's link down 10 s in the middle of a 64 MiB publish: the publish commits or fails with a
           PolicyStoreError; a retry after the link returns commits
Every scenario then checks, with every link up: every acknowledged version is listed and readable on every reader
node, no version number was handed out twice, and no listed version lacks a copy. Columns: reads_ok/reads_failed
(the readers' loop during the cut), fail_s (the slowest failing call, against deadline_s), caught_up_s (from the
link's return until the cut node read the newest version), acked, listed, lost, reused, ok.

Ray itself marks a node dead after its health checks fail for about 15 s by default (the raylet then exits and its
store's copies with it), which ends any partition longer than that: the testbed raises Ray's health-check
threshold to outlast --cut-s (``RAY_health_check_failure_threshold``), and a cluster that must ride out longer
partitions must do the same. Needs root with CAP_NET_ADMIN; --quick: 5 s cuts.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray

from . import harness
from .harness import MiB
from .netbed import Testbed, unavailable

log = logging.getLogger("benchmarks.partition_net")
CALL_TIMEOUT_S = 5.0
SCENARIOS = ("node", "head", "learner")


def main(argv: list[str] | None = None) -> None:
    parser = harness.make_parser("partition_net", __doc__)
    parser.add_argument("--cut-s", type=float, default=30.0, help="how long a link stays down (%(default)s)")
    parser.add_argument("--rate-mbit", type=float, default=500, help="every link, both ways (%(default)s)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="(%(default)s)")
    parser.add_argument("--tag", default=None, help="the testbed's name tag (default: random)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.cut_s = 5.0
    harness.setup_logging(args.verbose)
    if args.inside:
        return drive(args)
    reason = unavailable()
    if reason:
        sys.exit(f"partition_net: {reason}")
    results = harness.Results("partition_net", args, {k: str(v) for k, v in vars(args).items() if k != "out"})
    # Ray declares a silent node dead after health_check_failure_threshold checks of period_ms: outlast the cut
    checks = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": str(int(args.cut_s * 4) + 30)}
    extra = {"tag": args.tag} if args.tag else {}
    with Testbed(4, args.rate_mbit, object_store_mib=512, extra_env=checks, **extra) as bed:
        inner = [sys.executable, "-m", "benchmarks.partition_net", "--inside", "--out", str(bed.temp_dir / "inner"),
                 "--cut-s", str(args.cut_s), "--scenarios", args.scenarios]
        for row in bed.drive(inner, env_extra={"NETBED_NAMESPACES": ",".join(bed.namespaces)}):
            results.emit(row)
    results.finish(["scenario", "cut_s", "reads_ok", "reads_failed", "fail_s", "deadline_s", "errors", "caught_up_s",
                    "acked", "listed", "lost", "reused", "ok", "loadavg_1m"])


def link(node: int, up: bool) -> None:
    ns = os.environ["NETBED_NAMESPACES"].split(",")[node]
    subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "up" if up else "down"], check=True)


# ---- the driver, inside the head's namespace ----------------------------------------------------------------
def drive(args) -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import policystore
    from policystore.config import StoreConfig

    results = harness.Results("partition_net", args, {})
    ray.init(address=os.environ["NETBED_ADDRESS"], logging_level=logging.WARNING, log_to_driver=False)
    config = StoreConfig(spill_dir=str(Path(os.environ["NETBED_TEMP_DIR"]) / "spill"), call_timeout_s=CALL_TIMEOUT_S,
                         max_staleness_s=1.0)
    try:
        policystore.connect_all(config)
        # node i is the one in namespace i (address .i+1): the links to cut are those namespaces'
        alive = [n for n in ray.nodes() if n["Alive"]]
        order = [n["NodeID"] for n in sorted(alive, key=lambda n: int(n["NodeManagerAddress"].rsplit(".", 1)[1]))]
        on = [Player.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False),
                             max_concurrency=4).remote(config)  # a reader plays while another call probes
              for n in order]
        ray.get([p.ready.remote() for p in on])
        acked: list[int] = []
        for scenario in args.scenarios.split(","):
            row = {"row": "scenario", "scenario": scenario, "cut_s": args.cut_s, "deadline_s": CALL_TIMEOUT_S}
            row.update(SCENARIO[scenario](on, acked, args.cut_s))
            row.update(settle(on, acked))
            row["ok"] = bool(row["reads_failed"] == 0 and row["lost"] == 0 and row["reused"] == 0
                             and row["fail_s"] <= CALL_TIMEOUT_S * 2 + 2 and not row.get("unclear"))
            results.emit(row)
    finally:
        ray.shutdown()


def cut_node(on: list, acked: list[int], cut_s: float) -> dict[str, Any]:
    acked.append(ray.get(on[1].publish.remote(1)))
    held = acked[-1]
    ray.get([on[2].get.remote(held), on[3].get.remote(held)])
    plays = on[2].play.remote(held, cut_s + 2)
    probes = on[2].probe_catalog.remote(delay_s=2.0)
    learner = on[1].publish_every.remote(1.0, cut_s, 1)
    time.sleep(0.5)
    link(2, False)
    time.sleep(cut_s)
    link(2, True)
    acked.extend(v for v in ray.get(learner) if isinstance(v, int))
    caught = ray.get(on[2].catch_up.remote(acked[-1], 60.0))
    return {**ray.get(plays), **ray.get(probes), "caught_up_s": caught}


def cut_head(on: list, acked: list[int], cut_s: float) -> dict[str, Any]:
    acked.append(ray.get(on[1].publish.remote(1)))
    held = acked[-1]
    ray.get([on[2].get.remote(held), on[3].get.remote(held)])
    plays = [on[2].play.remote(held, cut_s + 2), on[3].play.remote(held, cut_s + 2)]
    tries = on[1].publish_every.remote(2.0, cut_s, 1)
    time.sleep(0.5)
    link(0, False)
    time.sleep(cut_s)
    link(0, True)
    outcomes = ray.get(tries)
    acked.extend(v for v in outcomes if isinstance(v, int))
    failed = [v for v in outcomes if not isinstance(v, int)]
    a, b = ray.get(plays)
    acked.append(ray.get(on[1].publish.remote(1)))  # publishes go on
    return {"reads_ok": a["reads_ok"] + b["reads_ok"], "reads_failed": a["reads_failed"] + b["reads_failed"],
            "fail_s": max((f[1] for f in failed), default=0.0), "errors": sorted({f[0] for f in failed}),
            "unclear": [f for f in failed if not f[2]], "caught_up_s": None}


def cut_learner(on: list, acked: list[int], cut_s: float) -> dict[str, Any]:
    big = on[1].publish_timed.remote(64)
    time.sleep(0.3)
    link(1, False)
    time.sleep(min(cut_s, 10.0))
    link(1, True)
    outcome = ray.get(big)
    retry = ray.get(on[1].publish.remote(64))
    if isinstance(outcome[0], int):
        acked.append(outcome[0])
    acked.append(retry)
    return {"reads_ok": 0, "reads_failed": 0, "fail_s": 0.0 if isinstance(outcome[0], int) else outcome[1],
            "errors": [] if isinstance(outcome[0], int) else [outcome[0]],
            "unclear": [] if isinstance(outcome[0], int) or outcome[2] else [outcome], "caught_up_s": None,
            "first_publish": "committed" if isinstance(outcome[0], int) else "failed clearly"}


SCENARIO = {"node": cut_node, "head": cut_head, "learner": cut_learner}


def settle(on: list, acked: list[int]) -> dict[str, Any]:
    """With every link up: every acknowledged version listed and readable on the reader nodes; none reused."""
    listed = ray.get(on[0].versions.remote())
    readable = ray.get([p.readable.remote(acked) for p in on[2:]])
    return {"acked": len(acked), "listed": len(listed), "reused": len(acked) - len(set(acked)),
            "lost": len(set(acked) - set(listed)) + sum(len(r) for r in readable)}


@ray.remote(num_cpus=0.01)
class Player:
    """One process on one node, using its node's store as a learner or a reader would."""

    def __init__(self, config) -> None:
        import policystore

        self.store = policystore.connect(config)

    def ready(self) -> bool:
        return True

    def publish(self, mib: int) -> int:
        weights = {"w": np.full(mib * MiB // 4, 1.0, dtype=np.float32)}
        return self.store.publish("league", weights).version

    def publish_timed(self, mib: int) -> tuple:
        """(version, seconds) or (error class, seconds, whether it is a PolicyStoreError)."""
        from policystore import PolicyStoreError

        start = time.monotonic()
        try:
            return self.publish(mib), time.monotonic() - start
        except Exception as exc:
            return type(exc).__name__, time.monotonic() - start, isinstance(exc, PolicyStoreError)

    def publish_every(self, interval_s: float, for_s: float, mib: int) -> list:
        out, end = [], time.monotonic() + for_s
        while time.monotonic() < end:
            result = self.publish_timed(mib)
            out.append(result[0] if isinstance(result[0], int) else result)
            time.sleep(interval_s)
        return out

    def get(self, version: int) -> int:
        return self.store.get("league", version).id.version

    def play(self, version: int, for_s: float) -> dict[str, int]:
        """Read the held snapshot every 0.1 s, as a rollout worker playing it would."""
        ok = failed = 0
        end = time.monotonic() + for_s
        while time.monotonic() < end:
            try:
                snap = self.store.get("league", version)
                ok += int(float(snap["w"][0]) == 1.0)
            except Exception:
                failed += 1
            time.sleep(0.1)
        return {"reads_ok": ok, "reads_failed": failed}

    def probe_catalog(self, delay_s: float) -> dict[str, Any]:
        """After ``delay_s`` (the view then older than max_staleness_s): calls that need the catalog."""
        from policystore import PolicyStoreError

        time.sleep(delay_s)
        errors, slowest, unclear = [], 0.0, []
        for call in (lambda: self.store.get("league"), lambda: self.store.list("league")):
            start = time.monotonic()
            try:
                call()
                unclear.append("answered although cut off")
            except Exception as exc:
                errors.append(type(exc).__name__)
                if not isinstance(exc, PolicyStoreError):
                    unclear.append(f"{type(exc).__name__}: {exc}")
            slowest = max(slowest, time.monotonic() - start)
        return {"fail_s": slowest, "errors": errors, "unclear": unclear}

    def catch_up(self, version: int, within_s: float) -> float | None:
        start = time.monotonic()
        while time.monotonic() - start < within_s:
            try:
                if self.store.get("league").id.version >= version:
                    return time.monotonic() - start
            except Exception:
                pass
            time.sleep(0.2)
        return None

    def versions(self) -> list[int]:
        return [row.id.version for row in self.store.list("league")]

    def readable(self, versions: list[int]) -> list[int]:
        """The versions this node cannot read (should be none)."""
        bad = []
        for v in versions:
            try:
                assert self.store.get("league", v).id.version == v
            except Exception:
                bad.append(v)
        return bad


if __name__ == "__main__":
    main()
