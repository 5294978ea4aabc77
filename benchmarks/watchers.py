"""Many followers on one node store and one catalog: do they all get each new version by push, how soon, and
how many threads do the store and catalog processes need for them?

One Ray session, one node store, up to R reader processes (tiny actors, ``num_cpus=0.001``; started 8 at a
time while more than 4 GiB of memory is left, so ``readers`` says how many the machine held) that have each opened
the policy once (so they follow it), and N simulated stores following the catalog: coroutines of one async actor that
do what a store's catalog follower does (wait on the catalog's doorbell, then ask ``watch`` for the news). Per
round the driver publishes a new version of the policy; every reader waits for it in its push state, and every
catalog watcher waits for its commit.

Rows, one per round: ``readers``, ``by_push`` (readers to which the new version came with its ref: their get
is one ``ray.get``, no store call), ``by_round_trip`` (the others: their get asks the store), ``all_readers_s``
(publish until the last reader had the version in its push), ``catalog_watchers``, ``catalog_by_ring`` (watchers
woken by the doorbell rather than a timeout), ``all_catalog_watchers_s``, and the thread counts (psutil
``num_threads``) of the store and the catalog (each hosts its doorbell: followers wait there as coroutines), with
the same counts measured before any follower started (``*_idle``), and where the two cores went from the publish
until every follower had answered: ``cpu_s_store``, ``cpu_s_catalog``, ``cpu_s_readers`` (all reader processes),
``cpu_s_others`` (the rest of the machine: Ray's own processes, this driver) and ``cpu_s_machine`` (all of it).
A reader is not supposed to import torch (it reads no tensor), so the machine holds more of them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import numpy as np
import psutil
import ray

import policystore
from policystore.remote import NAMESPACE, catalog_name, store_name

from . import harness
from .harness import MiB

log = logging.getLogger("benchmarks.watchers")
POLICY = "followed"
WAIT_S = 60.0
MEMORY_MARGIN = 4 * 1024 * MiB  # free memory left when the benchmark stops adding readers
# How often a reader looks at its push state: the arrival times are this coarse, and hundreds of readers looking
# every few milliseconds would take the two cores from the followers they time.
POLL_S = 0.05


class Reader:
    """A rollout worker's process: follows its node store, and reports how it got each new version."""

    def open(self) -> int:
        return policystore.connect().get(POLICY).id.version

    def wait_version(self, version: int) -> tuple[float, bool]:
        """(when the push first named ``version``, whether its ref came with it: then the get is one ``ray.get``
        of a held ref, else a store round trip). No tensor is read, so the process never imports torch."""
        store = policystore.connect()
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            state = store.push_state()
            if state.latest.get(POLICY, 0) >= version:
                return time.time(), (POLICY, version) in state.hot
            time.sleep(POLL_S)
        return time.time(), False


class CatalogWatchers:
    """N stores' catalog followers, simulated as coroutines of one async actor (each as a store does it)."""

    def __init__(self, league: str):
        self.catalog = ray.get_actor(catalog_name(league), namespace=NAMESPACE)

    async def follow_until(self, count: int, pid: str, version: int) -> list[tuple[float, bool]]:
        """Each of ``count`` watchers follows from the catalog's current event until it sees ``pid@version``
        committed: (when, whether a ring rather than a timeout woke it)."""
        start = await self.catalog.watch.remote(0, 0)
        start = await self.catalog.watch.remote(start.seq, 0, start.epoch)  # no reset: from the current event

        async def one() -> tuple[float, bool]:
            since = start.seq
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                ring, _ = await self.catalog.bell_after_beats.remote(since, start.epoch, 0.5)
                events = await self.catalog.watch.remote(since, 0, start.epoch)
                woken, since = ring.seq > since, events.seq
                if any(e.id == (pid, version) for e in events.committed):
                    return time.time(), woken
            return time.time(), False

        return list(await asyncio.gather(*(one() for _ in range(count))))


def pid_of(actor: Any) -> int:
    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))


def threads(pids: dict[str, int]) -> dict[str, int]:
    return {f"{name}_threads": psutil.Process(pid).num_threads() for name, pid in pids.items()}


def cpu_seconds(pids: dict[str, list[int]]) -> dict[str, float]:
    """CPU time (user + system) so far of each role's processes, and of the whole machine (``machine``)."""
    def of(pid: int) -> float:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            return 0.0
        return times.user + times.system

    total = psutil.cpu_times()
    return {**{role: sum(map(of, group)) for role, group in pids.items()},
            "machine": total.user + total.system + total.nice + total.irq + total.softirq}


def run(results: harness.Results, readers: int, catalog_watchers: int, rounds: int) -> None:
    with harness.ray_session(256 * MiB) as spill_dir:
        store = policystore.connect(policystore.StoreConfig(spill_dir=str(spill_dir)))
        store.publish(POLICY, {"w": np.zeros(1024, dtype=np.float32)})
        league = store.league
        store_actor = ray.get_actor(store_name(store.node_id, league), namespace=NAMESPACE)
        catalog = ray.get_actor(catalog_name(league), namespace=NAMESPACE)
        pids = {"store": pid_of(store_actor), "catalog": pid_of(catalog)}
        idle = {f"{k}_idle": v for k, v in threads(pids).items()}
        actors: list[Any] = []
        while len(actors) < readers:  # as many as the machine holds: never into Ray's memory monitor (other jobs')
            if psutil.virtual_memory().available < MEMORY_MARGIN:
                log.warning("stopping at %d readers: less than %d MiB of memory left", len(actors),
                            MEMORY_MARGIN // MiB)
                break
            batch = [ray.remote(Reader).options(num_cpus=0.001).remote() for _ in range(min(8, readers - len(actors)))]
            ray.get([a.open.remote() for a in batch], timeout=600)  # each follows the policy from now on
            actors += batch
        readers = len(actors)
        roles = {"store": [pids["store"]], "catalog": [pids["catalog"]],
                 "readers": [pid_of(a) for a in actors]}
        watchers = ray.remote(CatalogWatchers).options(num_cpus=0.001, max_concurrency=catalog_watchers + 8
                                                       ).remote(league)
        ray.get(watchers.__ray_ready__.remote())
        for version in range(2, rounds + 2):
            waits = [a.wait_version.remote(version) for a in actors]
            followed = watchers.follow_until.remote(catalog_watchers, POLICY, version)
            time.sleep(1.0)  # every follower is waiting before the publish
            counts = threads(pids)
            cpu_before = cpu_seconds(roles)
            published = time.time()
            assert store.publish(POLICY, {"w": np.full(1024, version, dtype=np.float32)}
                                 ).version == version
            answers = ray.get(waits, timeout=WAIT_S * 2)
            catalog_seen = ray.get(followed, timeout=WAIT_S * 2)
            cpu = {role: spent - cpu_before[role] for role, spent in cpu_seconds(roles).items()}
            cpu["others"] = cpu["machine"] - sum(v for role, v in cpu.items() if role != "machine")
            by_push = sum(push for _, push in answers)
            results.emit({
                "round": version - 1,
                "readers": readers,
                "by_push": by_push,
                "by_round_trip": readers - by_push,
                "all_readers_s": max(seen for seen, _ in answers) - published,
                "catalog_watchers": catalog_watchers,
                "catalog_by_ring": sum(ring for _, ring in catalog_seen),
                "all_catalog_watchers_s": max(seen for seen, _ in catalog_seen) - published,
                **counts,
                **idle,
                **{f"cpu_s_{role}": round(spent, 2) for role, spent in cpu.items()},
            })


def plot(rows: list[dict[str, Any]], path) -> None:
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4))
    rounds = [r["round"] for r in rows]
    left.bar(rounds, [r["by_push"] for r in rows], label="by push", color="tab:green")
    left.bar(rounds, [r["by_round_trip"] for r in rows], bottom=[r["by_push"] for r in rows],
             label="by round trip", color="tab:red")
    left.set_xlabel("round")
    left.set_ylabel("readers")
    left.set_title(f"{rows[0]['readers']} readers: how each new version came")
    left.legend()
    names = ["store", "catalog"]
    right.bar([n.replace("_", "\n") for n in names], [rows[-1][f"{n}_threads_idle"] for n in names],
              width=0.4, align="edge", label="no followers", color="tab:gray")
    right.bar([n.replace("_", "\n") for n in names], [rows[-1][f"{n}_threads"] for n in names],
              width=-0.4, align="edge", label=f"{rows[-1]['readers']} readers, {rows[-1]['catalog_watchers']} stores",
              color="tab:blue")
    right.set_ylabel("threads")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = harness.make_parser("watchers", __doc__)
    parser.add_argument("--readers", type=int, default=128, help="reader processes on the node (%(default)s)")
    parser.add_argument("--catalog-watchers", type=int, default=64, help="simulated stores (%(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="versions published (%(default)s)")
    args = parser.parse_args(argv)
    if args.quick:
        args.readers, args.catalog_watchers, args.rounds = 4, 16, 1
    harness.setup_logging(args.verbose)
    results = harness.Results("watchers", args, {k: v for k, v in vars(args).items() if k != "out"})
    run(results, args.readers, args.catalog_watchers, args.rounds)
    results.finish(
        ["round", "readers", "by_push", "by_round_trip", "all_readers_s", "catalog_watchers", "catalog_by_ring",
         "all_catalog_watchers_s", "store_threads", "store_threads_idle", "catalog_threads", "catalog_threads_idle",
         "loadavg_1m"],
        plot,
    )


if __name__ == "__main__":
    main()
