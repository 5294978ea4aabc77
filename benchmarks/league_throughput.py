"""League training throughput: env steps/s with training included, store views against private copies.

Each training point runs the real trainer (league actor, PPO learner shards, rollout workers, node store) on a
fresh local Ray for --seconds and counts the env steps (moves of both sides) of the matches whose trajectories
reached the learners, over the whole run (startup excluded, final evaluation included). Mode ``store``: workers
play every policy as zero-copy views into the node store; ``private``: every worker copies each policy it plays
into a module of its own (the RLlib EnvRunner way). A forward point times one batched forward pass on both kinds
of module, called directly (``module``: every op goes through the views' write guard) and the way workers call
it (``act``: the read-only fast path).

One JSON row per measured point on stdout; results.json, table.md (every row, then the medians over repeats)
and plot.png in --out.

    python -m benchmarks.league_throughput                  # 60 s per point, 1 and 2 workers, 2 repeats
    python -m benchmarks.league_throughput --quick          # 15 s per point, 1 worker (smoke test)
"""

from __future__ import annotations

import io
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from rich.console import Console

import policystore
from policystore.league.connect4 import COLS, NUM_PLANES, ROWS
from policystore.league.constants import is_frozen
from policystore.league.model import PolicyNet, act
from policystore.memory import MiB, session_pss_bytes
from policystore.trainer.config import TrainConfig
from policystore.trainer.report import memory_report
from policystore.trainer.run import Trainer
from policystore.trainer.rundir import prepare_run_dir
from policystore.workers.modules import MODES, PRIVATE, STORE

from . import harness

POINTS = ("training", "forward")
TRAINING_COLUMNS = ["env_steps_per_s", "learner_samples_per_s", "frozen_snapshots", "worker_pss_mib",
                    "store_hot_mib", "private_copies_mib"]


def training_point(mode: str, workers: int, seconds: float, root: Path) -> dict[str, Any]:
    """One training run; throughput over the whole run, memory at its end (workers still alive)."""
    config = TrainConfig(minutes=seconds / 60, workers=workers, weights=mode, num_cpus=2, eval_games=50,
                         eval_every_s=1e9, checkpoint_every_s=1e9)
    rd, config = prepare_run_dir(root / f"{mode}-{workers}w", config, resume=False)
    with harness.ray_session(config.object_store_mib * MiB, num_cpus=config.num_cpus):
        trainer = Trainer(rd, config, resume=False, console=Console(file=io.StringIO()))
        load_before = harness.load_average()
        trainer.start()
        result = trainer.run(config.minutes)
        status = result["status"]
        learners = ray.get([learner.stats.remote() for learner in trainer.learners.values()])
        infos = trainer.store.list()
        memory = memory_report(trainer.store.stats(), infos, workers)
        frozen = [i.nbytes for i in infos if is_frozen(i.meta)]
        pss = session_pss_bytes()
    samples = sum(s["samples"] for s in learners)
    return {
        "bench": "league_training", "mode": mode, "workers": workers,
        "games_per_match": config.games_per_match, "hidden": config.hidden,
        "seconds": round(status["elapsed_s"], 1), "env_steps": status["steps"],
        "env_steps_per_s": round(status["steps_per_s"], 1), "learner_samples": samples,
        "learner_samples_per_s": round(samples / status["elapsed_s"], 1),
        "learner_updates": sum(s["updates"] for s in learners),
        "frozen_snapshots": len(frozen), "snapshot_kib": round(np.mean(frozen) / 1024, 1) if frozen else 0,
        "worker_pss_mib": round(float(np.mean([w["pss_mib"] for w in result["workers"]])), 1),
        "session_pss_mib": round(pss / MiB, 1), "store_hot_mib": round(memory["store_hot_mib"], 2),
        "private_copies_mib": round(memory["private_copies_mib"], 2), "load_1m_before": load_before,
    }


def _worker_act(net: torch.nn.Module, planes: np.ndarray, legal: np.ndarray) -> tuple:
    """``act`` as a rollout worker calls it (``workers.play.net_policy``): inside ``fast_reads()``."""
    with policystore.fast_reads():
        return act(net, planes, legal)


def forward_points(modes: list[str], batch: int, hidden: int, rounds: int, calls: int = 20) -> list[dict[str, Any]]:
    """Time one batched forward pass on a module over store views (``store``) or a private copy, called
    directly (``module``: every op goes through the views' write guard) or the way workers call it (``act``).

    The four variants take turns in every round, so load from other processes hits them alike; each row is the
    median over the rounds of the mean over ``calls`` calls.
    """
    torch.set_num_threads(1)
    with harness.ray_session(256 * MiB, num_cpus=2) as spill:
        store = policystore.connect(policystore.StoreConfig(spill_dir=str(spill)))
        net = PolicyNet(hidden)
        store.publish("bench_forward", net.state_dict())
        modules = {STORE: store.load_module("bench_forward", lambda: PolicyNet(hidden)), PRIVATE: net.eval()}
        planes = np.random.default_rng(0).random((batch, NUM_PLANES, ROWS, COLS)).astype(np.float32)
        legal = np.ones((batch, COLS), dtype=bool)
        x = torch.from_numpy(planes)
        variants = [(mode, path) for path in ("module", "act") for mode in modes]
        calls_of = {(mode, "module"): (lambda m=modules[mode]: m(x)) for mode in modes} | {
            (mode, "act"): (lambda m=modules[mode]: _worker_act(m, planes, legal)) for mode in modes}
        times: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
        with torch.inference_mode():
            for r in range(rounds + 2):  # two warm-up rounds
                for variant in variants if r % 2 == 0 else variants[::-1]:
                    start = time.perf_counter()
                    for _ in range(calls):
                        calls_of[variant]()
                    if r >= 2:
                        times[variant].append((time.perf_counter() - start) / calls)
    return [{"bench": "forward", "mode": mode, "path": path, "batch": batch, "hidden": hidden, "rounds": rounds,
             "forward_us": round(float(np.median(times[(mode, path)])) * 1e6, 1)}
            for mode, path in variants]


def grouped(rows: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Training rows by (mode, workers): the repeats of one point."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        if r["bench"] == "league_training":
            groups.setdefault((r["mode"], r["workers"]), []).append(r)
    return groups


def medians_table(rows: list[dict[str, Any]]) -> str:
    """Per training point, the medians over its repeats (and the spread of the rate): the figures to quote."""
    lines = ["Medians over repeats:", "", "| mode | workers | runs | env steps/s | min..max | learner samples/s "
             "| frozen snapshots | worker PSS MiB | store hot MiB | private copies MiB | load (1 min) |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    for (mode, workers), group in grouped(rows).items():
        med = {k: float(np.median([r[k] for r in group])) for k in TRAINING_COLUMNS}
        rates = [r["env_steps_per_s"] for r in group]
        lines.append(f"| {mode} | {workers} | {len(group)} | {med['env_steps_per_s']:,.0f} | {min(rates):,.0f}.."
                     f"{max(rates):,.0f} | {med['learner_samples_per_s']:,.0f} | {med['frozen_snapshots']:.0f} "
                     f"| {med['worker_pss_mib']:.1f} | {med['store_hot_mib']:.2f} | {med['private_copies_mib']:.2f} "
                     f"| {', '.join(str(r['loadavg_1m']) for r in group)} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Median env steps/s per mode and worker count; forward-pass times when no training point ran."""
    import matplotlib.pyplot as plt

    groups = grouped(rows)
    fig, ax = plt.subplots(figsize=(6, 4))
    if groups:
        modes = sorted({mode for mode, _ in groups}, reverse=True)
        counts = sorted({workers for _, workers in groups})
        width = 0.8 / len(modes)
        for i, mode in enumerate(modes):
            values = [float(np.median([r["env_steps_per_s"] for r in groups.get((mode, w), [])] or [0]))
                      for w in counts]
            ax.bar(np.arange(len(counts)) + i * width, values, width, label=mode)
        ax.set_xticks(np.arange(len(counts)) + width * (len(modes) - 1) / 2, [f"{w} worker(s)" for w in counts])
        ax.set_ylabel("env steps/s, training included (median)")
        ax.set_title("League training throughput")
        ax.legend()
    else:
        fwd = [r for r in rows if r["bench"] == "forward"]
        ax.bar([f"{r['mode']}\n{r['path']}" for r in fwd], [r["forward_us"] for r in fwd])
        ax.set_ylabel(f"one forward pass, batch {fwd[0]['batch']} (µs)")
        ax.set_title("Forward pass: guarded views, fast path, private copy")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def choices(text: str, allowed: tuple[str, ...], flag: str, parser) -> list[str]:
    values = text.split(",")
    bad = [v for v in values if v not in allowed]
    if bad:
        parser.error(f"{flag} takes a comma-separated subset of {', '.join(allowed)}; got {', '.join(bad)}")
    return values


def main(argv: list[str] | None = None) -> None:
    parser = harness.make_parser("league_throughput", __doc__)
    parser.add_argument("--seconds", type=float, default=None, help="training seconds per point (default 60, "
                        "--quick 15)")
    parser.add_argument("--workers", type=harness.int_list, default=None,
                        help="comma-separated worker counts (default 1,2; --quick 1)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: store, private (default both)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="runs per point, modes alternating order (default 2, --quick 1); medians in table.md")
    parser.add_argument("--points", default=",".join(POINTS), help="comma-separated: training, forward (default both)")
    args = parser.parse_args(argv)
    modes = choices(args.modes, MODES, "--modes", parser)
    points = choices(args.points, POINTS, "--points", parser)
    seconds = args.seconds or (15.0 if args.quick else 60.0)
    workers = args.workers or ([1] if args.quick else [1, 2])
    repeats = args.repeats or (1 if args.quick else 2)
    harness.setup_logging(args.verbose)
    results = harness.Results("league_throughput", args, {"seconds": seconds, "workers": workers, "modes": modes,
                                                          "repeats": repeats, "points": points})
    with tempfile.TemporaryDirectory(prefix="league_throughput-") as tmp:
        # Other load on the machine drifts over minutes: alternate the order of the modes between repeats.
        for repeat in range(repeats if "training" in points else 0):
            for w in workers:
                for mode in modes if repeat % 2 == 0 else modes[::-1]:
                    results.emit(training_point(mode, w, seconds, Path(tmp) / f"r{repeat}") | {"repeat": repeat})
    if "forward" in points:
        for row in forward_points(modes, batch=256, hidden=TrainConfig().hidden, rounds=10 if args.quick else 50):
            results.emit(row)
    results.finish(["bench", "mode", "workers", "path", "repeat", *TRAINING_COLUMNS, "forward_us", "loadavg_1m"],
                   plot, notes=[medians_table(results.rows)] if grouped(results.rows) else [])


if __name__ == "__main__":
    main()
