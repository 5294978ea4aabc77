"""A league in miniature: publish K frozen snapshots, let N worker processes play with them, weigh node memory.

    python -m policystore.demo --workers 4 --snapshots 16 --size-mib 4

Each worker loads every snapshot through the node store (zero-copy views) and runs forward passes with all of
them, as a rollout worker facing a league of frozen opponents would. Memory is PSS summed over every process of
the Ray session; "private copies" is what the same workers would hold if each loaded its own copy (RLlib's way).
"""

from __future__ import annotations

import argparse
import logging
import tempfile

import ray
import torch
from rich.console import Console
from rich.progress import track
from rich.table import Table
from torch import nn

import policystore
from policystore import leftovers, remote
from policystore.memory import MiB, session_pss_bytes

WAIT_S = 600.0  # the longest the demo waits for its workers (their start, loading the league, playing)

def opponent_net(size_mib: float) -> nn.Module:
    """An MLP policy of about ``size_mib`` MiB of float32 weights."""
    hidden = max(16, int((size_mib * MiB / 4) ** 0.5) - 36)  # hidden^2 + 71 hidden floats
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 7))


@ray.remote(num_cpus=0.25)
class RolloutWorker:
    def __init__(self, size_mib: float):
        torch.set_num_threads(1)
        self.size_mib = size_mib
        self.store = policystore.connect()
        self.opponents: list[nn.Module] = []

    def load_league(self, policy_ids: list[str]) -> int:
        self.opponents = [self.store.load_module(p, lambda: opponent_net(self.size_mib)) for p in policy_ids]
        return len(self.opponents)

    def play(self, steps: int) -> float:
        """Forward passes against every opponent (every weight page gets read)."""
        obs = torch.randn(32, 64)
        with torch.no_grad():
            return float(sum(m(obs).argmax(-1).float().mean() for _ in range(steps) for m in self.opponents))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4, help="rollout worker processes (default: 4)")
    parser.add_argument("--snapshots", type=int, default=16, help="frozen league snapshots (default: 16)")
    parser.add_argument("--size-mib", type=float, default=4.0, help="size of each snapshot in MiB (default: 4)")
    parser.add_argument("--steps", type=int, default=20, help="forward passes per opponent per worker (default: 20)")
    args = parser.parse_args(argv)
    console = Console()

    # address="local": a fresh local Ray, never a cluster that `ray start` left running on this machine.
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    spill = tempfile.TemporaryDirectory(prefix="policystore-demo-")  # removed at the end: the demo keeps nothing
    store = policystore.connect(policystore.StoreConfig(spill_dir=spill.name))
    workers = [RolloutWorker.remote(args.size_mib) for _ in range(args.workers)]
    remote.get([remote.send(w, "__ray_ready__") for w in workers], WAIT_S, "the rollout workers", "__ray_ready__")
    idle = session_pss_bytes()

    league = [f"league_{i}" for i in range(args.snapshots)]
    torch.manual_seed(0)
    for pid in track(league, description="publishing snapshots", console=console):
        store.publish(pid, opponent_net(args.size_mib).state_dict(), meta={"elo": 1000})
    snapshot_bytes = sum(info.nbytes for info in store.list())
    published = session_pss_bytes()

    with console.status(f"{args.workers} workers load {args.snapshots} opponents and play"):
        loading = [remote.send(w, "load_league", league) for w in workers]
        remote.get(loading, WAIT_S, "the rollout workers", "load_league")
        remote.get([remote.send(w, "play", args.steps) for w in workers], WAIT_S, "the rollout workers", "play")
    playing = session_pss_bytes()

    size = snapshot_bytes / len(league) / MiB
    table = Table(title=f"{args.workers} workers x {args.snapshots} snapshots x {size:.1f} MiB, PSS of the Ray session")
    table.add_column("what")
    table.add_column("MiB", justify="right")
    table.add_column("copies of the league", justify="right")
    one_copy = snapshot_bytes
    rows = [
        ("publishing the league (store's copy + publish transients)", published - idle),
        ("workers loading and playing, on top", playing - published),
        ("node memory for the league, in all", playing - idle),
        ("private copies would cost (workers x league)", args.workers * one_copy),
    ]
    for what, nbytes in rows:
        table.add_row(what, f"{nbytes / MiB:.1f}", f"{nbytes / one_copy:.2f}")
    console.print(table)
    console.print("store:", {k: getattr(store.stats(), k) for k in ("hot_bytes", "hot_snapshots", "hits")})
    store.shutdown()
    leftovers.shutdown_ray()
    spill.cleanup()


if __name__ == "__main__":
    main()
