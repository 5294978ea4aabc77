"""Partitions on an emulated network (``benchmarks.netbed``): a node's link, the head's link (the catalog's node)
and a learner's link mid-publish go down for --cut-s and come back, while readers play and a learner publishes.

Nodes: 0 the head (catalog, driver), 1 the learner, 2 and 3 readers. Scenarios, one ``scenario`` row each:
  node     node 2's link down: its reader keeps reading the snapshot it holds; on node 2 the calls that need the
           catalog or another node (a ``get`` of the latest version once the view is older than
           ``max_staleness_s``, a ``list``, a ``get`` of the version the learner published during the cut) fail
           within their deadline with a PolicyStoreError; the learner keeps publishing; after the link returns,
           node 2 reads the newest acknowledged version (caught_up_s)
  head     the head's link down (the catalog unreachable): readers on nodes 2 and 3 keep reading what they hold;
           node 3's catalog calls and the learner's publishes fail within their deadline with a PolicyStoreError;
           after, publishes go on and node 3 reads the newest (caught_up_s)
  learner  the learner's link down while it publishes back to back (2 MiB each, and one 64 MiB publish started
           just before the cut): the publish in flight at the cut and every one during it commits or fails with
           a PolicyStoreError within its deadline; retries after the link returns commit
Every scenario then checks, with every link up: every acknowledged version is listed, every listed version is
readable whole (its content the one published) on every reader node, and no version number was handed out twice.

The counts that must be zero: reads_failed (the readers' loop during the cut), hung (calls that took longer than
twice their deadline plus 2 s), unclear (a failure that is no PolicyStoreError, or a call that answered although
cut off), lost (acknowledged, not listed), half_visible (listed, yet not readable whole and intact on every reader
node within 30 s of the links' return), reused (a version number acknowledged twice), not_caught_up. Besides:
reads_ok, failed_calls and errors (the cut-off calls, which must fail), fail_s (the slowest of them, against
deadline_s), resumed_s (from the link's return until the learner's first publish committed again), acked, listed,
settle_retried (listed versions whose first read after the cut failed with a deadline and a later one succeeded: a
connection that sent during a cut resumes at its next TCP retransmission, seconds after the link's return).

Ray itself marks a node dead after its health checks fail for about 15 s by default (the raylet then exits and its
store's copies with it), which ends any partition longer than that: the testbed raises Ray's health-check
threshold to outlast --cut-s (``RAY_health_check_failure_threshold``), and a cluster that must ride out longer
partitions must do the same. Needs root with CAP_NET_ADMIN; --quick: 8 s cuts (the probes, 1.5 s into a cut,
end within their 5 s deadline).
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
HANG_S = 2 * CALL_TIMEOUT_S + 2  # a cut-off call slower than this counts as hung
# After a cut, a connection that sent during it resumes at its next TCP retransmission, seconds after the link's
# return: a settling read that fails with a deadline is asked again this long before it counts as half visible.
SETTLE_S = 30.0
SCENARIOS = ("node", "head", "learner")
MUST_BE_ZERO = ("reads_failed", "hung", "unclear", "lost", "half_visible", "reused", "not_caught_up")


def main(argv: list[str] | None = None) -> None:
    parser = harness.make_parser("partition_net", __doc__)
    parser.add_argument("--cut-s", type=float, default=30.0, help="how long a link stays down (%(default)s)")
    parser.add_argument("--rate-mbit", type=float, default=500, help="every link, both ways (%(default)s)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="(%(default)s)")
    parser.add_argument("--tag", default=None, help="the testbed's name tag (default: random)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.cut_s = 8.0
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
    out = results.finish(["scenario", "cut_s", *MUST_BE_ZERO, "reads_ok", "failed_calls", "errors", "fail_s",
                          "deadline_s", "caught_up_s", "resumed_s", "acked", "listed", "settle_retried", "ok",
                          "loadavg_1m"],
                         notes=[f"Must be zero: {', '.join(MUST_BE_ZERO)}."])
    print((out / "table.md").read_text(), file=sys.stderr)


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
            calls = SCENARIO[scenario](on, acked, args.cut_s)
            row.update(judge(calls))
            row.update(settle(on, acked))
            row["ok"] = all(row[k] == 0 for k in MUST_BE_ZERO) and row["failed_calls"] > 0
            results.emit(row)
    finally:
        policystore.close()  # its followers end before Ray does
        ray.shutdown()


def judge(out: dict[str, Any]) -> dict[str, Any]:
    """The scenario's reads and cut-off calls counted: ``out`` holds reads_ok/reads_failed, ``calls`` (each
    (error class or None, seconds, whether the error is a PolicyStoreError)) and caught_up_s (None: never)."""
    calls = out.pop("calls")
    failed = [c for c in calls if c[0] is not None and c[2]]
    return {**out, "failed_calls": len(failed), "errors": sorted({c[0] for c in calls if c[0] is not None}),
            "fail_s": round(max((c[1] for c in failed), default=0.0), 2),
            "hung": sum(c[1] > HANG_S for c in calls), "unclear": sum(not c[2] for c in calls),
            "not_caught_up": int("caught_up_s" in out and out["caught_up_s"] is None)}


def ask(player, method: str, *args, within_s: float = 120.0):
    """A call to a player after a cut: the driver's own connection to a node that was cut off may have been reset
    (Ray's ``ActorUnavailableError``, temporary): ask again until ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return ray.get(getattr(player, method).remote(*args))
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def begin(player, method: str, *args) -> tuple:
    """Start ``method`` on ``player`` in a thread of its own and return at once: a call in flight across a cut
    may lose its reply with the driver's connection, so its outcome is collected afterwards (``outcome``)."""
    name = f"{method}-{time.monotonic_ns()}"
    ray.get(player.begin.remote(name, method, *args))
    return player, name


def outcome(job: tuple):
    player, name = job
    return ask(player, "outcome", name)


def cut_node(on: list, acked: list[int], cut_s: float) -> dict[str, Any]:
    acked.append(ask(on[1], "publish", 1))
    held = acked[-1]
    ray.get([on[2].get.remote(held), on[3].get.remote(held)])
    plays = begin(on[2], "play", held, cut_s + 2)
    learner = begin(on[1], "publish_every", 1.0, cut_s, 1)
    # 1.5 s into the cut (the view then older than max_staleness_s): what needs the catalog, and a version published
    # after the cut began, which only other nodes hold
    probes = begin(on[2], "probe", 2.0, held + 3)
    time.sleep(0.5)
    link(2, False)
    time.sleep(cut_s)
    link(2, True)
    healed = time.monotonic()
    acked.extend(v[0] for v in outcome(learner) if v[0] is not None)
    caught = ask(on[2], "catch_up", acked[-1], 60.0)
    return {**outcome(plays), "calls": during(outcome(probes), healed), "caught_up_s": caught}


def cut_head(on: list, acked: list[int], cut_s: float) -> dict[str, Any]:
    acked.append(ask(on[1], "publish", 1))
    held = acked[-1]
    ray.get([on[2].get.remote(held), on[3].get.remote(held)])
    plays = [begin(on[2], "play", held, cut_s + 2), begin(on[3], "play", held, cut_s + 2)]
    tries = begin(on[1], "publish_every", 2.0, cut_s, 1)
    probes = begin(on[3], "probe", 2.0, held + 1000)  # a version no one announced
    time.sleep(0.5)
    link(0, False)
    time.sleep(cut_s)
    link(0, True)
    healed = time.monotonic()
    published = outcome(tries)
    acked.extend(v[0] for v in published if v[0] is not None)
    a, b = map(outcome, plays)
    version, resumed_s = ask(on[1], "publish_again", 1, 60.0)  # publishes go on
    acked.append(version)
    caught = ask(on[3], "catch_up", acked[-1], 60.0)
    return {"reads_ok": a["reads_ok"] + b["reads_ok"], "reads_failed": a["reads_failed"] + b["reads_failed"],
            "calls": [c[1:] for c in published] + during(outcome(probes), healed), "caught_up_s": caught,
            "resumed_s": resumed_s}


def cut_learner(on: list, acked: list[int], cut_s: float) -> dict[str, Any]:
    big = begin(on[1], "publish_timed", 64)
    loop = begin(on[1], "publish_every", 0.0, cut_s + 1.0, 2)  # back to back: one is in flight when the link goes
    time.sleep(0.3)
    link(1, False)
    time.sleep(cut_s)
    link(1, True)
    published = [outcome(big), *outcome(loop)]
    acked.extend(v[0] for v in published if v[0] is not None)
    version, resumed_s = ask(on[1], "publish_again", 2, 60.0)  # after the link returns, a retry commits
    acked.append(version)
    # every publish, the one in flight at the cut among them: committed, or failed clearly within its deadline
    return {"reads_ok": 0, "reads_failed": 0, "calls": [c[1:] for c in published],
            "committed": sum(c[0] is not None for c in published), "resumed_s": resumed_s}


def during(probes: list[tuple], healed: float) -> list[tuple]:
    """The probes that started during the cut, as (error, seconds, clear), less those answered after the link
    returned (on a loaded machine a short --quick cut may end while one waits: its answer then says nothing about
    the cut, where its failure still does)."""
    return [p[:3] for p in probes if p[3] - p[1] < healed and (p[3] < healed or " answered: " not in p[0])]


SCENARIO = {"node": cut_node, "head": cut_head, "learner": cut_learner}


def settle(on: list, acked: list[int]) -> dict[str, Any]:
    """With every link up: every acknowledged version listed, every listed one readable whole on the reader nodes
    within SETTLE_S (a read that first failed with a deadline or an unreachable actor and then succeeded counts in
    ``settle_retried``), no version acknowledged twice."""
    listed = ask(on[0], "versions")
    bad, retried = {}, {}
    for p in on[2:]:
        node_bad, node_retried = ask(p, "unreadable", listed, SETTLE_S)
        bad.update(node_bad)
        retried.update(node_retried)
    return {"acked": len(acked), "listed": len(listed), "reused": len(acked) - len(set(acked)),
            "lost": len(set(acked) - set(listed)), "half_visible": len(bad), "unreadable": bad,
            "settle_retried": len(retried), "retried": retried}


@ray.remote(num_cpus=0.01)
class Player:
    """One process on one node, using its node's store as a learner or a reader would."""

    def __init__(self, config) -> None:
        import policystore

        self.store = policystore.connect(config)
        self.jobs: dict[str, tuple] = {}  # begin/outcome
        self.fill = 0.0  # every publish's weights hold one value, also in its meta: a read checks it is whole

    def ready(self) -> bool:
        return True

    def begin(self, name: str, method: str, *args) -> None:
        """Run ``method`` in a thread; ``outcome(name)`` returns what it returned."""
        import threading

        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = getattr(self, method)(*args)
            except BaseException as exc:
                box["error"] = exc

        thread = threading.Thread(target=run, daemon=True)
        self.jobs[name] = (thread, box)
        thread.start()

    def outcome(self, name: str) -> Any:
        thread, box = self.jobs[name]  # kept: a reply lost on a reset connection is asked for again
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def publish(self, mib: int) -> int:
        fill = self.fill = self.fill + 1.0  # a local: another thread's publish may move self.fill meanwhile
        weights = {"w": np.full(mib * MiB // 4, fill, dtype=np.float32)}
        return self.store.publish("league", weights, meta={"fill": fill}).version

    def publish_timed(self, mib: int) -> tuple:
        """(version or None, error class or None, seconds, whether it committed or failed with a PolicyStoreError)."""
        from policystore import PolicyStoreError

        start = time.monotonic()
        try:
            return self.publish(mib), None, time.monotonic() - start, True
        except Exception as exc:
            return None, type(exc).__name__, time.monotonic() - start, isinstance(exc, PolicyStoreError)

    def publish_every(self, interval_s: float, for_s: float, mib: int) -> list:
        out, end = [], time.monotonic() + for_s
        while time.monotonic() < end:
            out.append(self.publish_timed(mib))
            time.sleep(interval_s)
        return out

    def publish_again(self, mib: int, within_s: float) -> tuple[int, float]:
        """Once a link is back: publish until one commits (the store may still be finding the catalog again);
        (its version, seconds until it committed)."""
        start = time.monotonic()
        while True:
            version, error, _, _ = self.publish_timed(mib)
            if version is not None or time.monotonic() - start > within_s:
                break
            time.sleep(0.5)
        if version is None:
            raise RuntimeError(f"no publish committed within {within_s:.0f} s of the link's return: {error}")
        return version, time.monotonic() - start

    def get(self, version: int) -> int:
        return self.store.get("league", version).id.version

    def play(self, version: int, for_s: float) -> dict[str, int]:
        """Read the held snapshot every 0.1 s, as a rollout worker playing it would."""
        ok = failed = 0
        end = time.monotonic() + for_s
        while time.monotonic() < end:
            try:
                ok += int(self._whole(self.store.get("league", version)))
            except Exception:
                failed += 1
            time.sleep(0.1)
        return {"reads_ok": ok, "reads_failed": failed}

    @staticmethod
    def _whole(snap) -> bool:
        w, fill = snap["w"], snap.meta["fill"]
        return bool(float(w[0]) == fill and float(w[-1]) == fill and float(w[w.numel() // 2]) == fill)

    def probe(self, delay_s: float, version: int) -> list[tuple]:
        """After ``delay_s``, at once: the calls that need the catalog or another node, each (error class,
        seconds, clear, when it ended); one that answered says so in place of the error, and is not clear."""
        from concurrent.futures import ThreadPoolExecutor

        from policystore import PolicyStoreError

        def timed(name: str, call) -> tuple:
            start = time.monotonic()
            try:
                got = call()
                return f"{name} answered: {got!r:.80}", time.monotonic() - start, False, time.monotonic()
            except Exception as exc:
                return (type(exc).__name__, time.monotonic() - start, isinstance(exc, PolicyStoreError),
                        time.monotonic())

        time.sleep(delay_s)
        calls = {"get latest": lambda: self.store.get("league"), "list": lambda: self.store.list("league"),
                 f"get v{version}": lambda: self.store.get("league", version)}
        with ThreadPoolExecutor(len(calls)) as pool:
            return list(pool.map(lambda item: timed(*item), calls.items()))

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

    def unreadable(self, versions: list[int], within_s: float) -> tuple[dict[int, str], dict[int, str]]:
        """The versions this node cannot read whole and intact (should be none), and why; and those whose read
        failed with an error that may pass (a deadline, an actor not reachable yet) and succeeded when asked again
        within ``within_s`` (the error, and how long until it was read)."""
        from policystore import DeadlineExceededError, StoreUnavailableError

        bad, retried = {}, {}
        end = time.monotonic() + within_s
        for v in versions:
            first, start = None, time.monotonic()
            while True:
                try:
                    snap = self.store.get("league", v)
                    if snap.id.version != v or not self._whole(snap):
                        bad[v] = f"read {snap.id}, content {snap.meta}"
                    elif first is not None:
                        retried[v] = f"{first}; read after {time.monotonic() - start:.1f} s"
                    break
                except (DeadlineExceededError, StoreUnavailableError) as exc:
                    first = first or f"{type(exc).__name__}: {exc}"[:300]
                    if time.monotonic() > end:
                        bad[v] = first
                        break
                    time.sleep(0.5)
                except Exception as exc:
                    bad[v] = f"{type(exc).__name__}: {exc}"[:300]
                    break
        return bad, retried

if __name__ == "__main__":
    main()
