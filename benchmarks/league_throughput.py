"""League training throughput: env steps/s with training included, store views against private copies.

Each point runs the real trainer (league actor, PPO learner shards, rollout workers, node store) on a fresh
local Ray for --seconds and counts the env steps (moves of both sides) of the matches whose trajectories
reached the learners, over the whole run (startup excluded, final evaluation included). Mode
``store``: workers play every policy as zero-copy views into the node store; ``private``: every worker copies
each policy it plays into a module of its own (the RLlib EnvRunner way). A second kind of point times one
batched forward pass on both kinds of module, called directly and the way workers call it (``act``).

Prints one JSON object per measured point on stdout; writes results.json, throughput.png and results.md
to --out.

    python -m benchmarks.league_throughput                  # 60 s per point, 1 and 2 workers, 2 repeats
    python -m benchmarks.league_throughput --quick          # 15 s per point, 1 worker (smoke test)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import ray
import torch
from rich.console import Console

import policystore
from policystore.memory import session_pss_bytes
from trainer.config import TrainConfig
from trainer.connect4 import COLS, NUM_PLANES, ROWS
from trainer.model import PolicyNet, act
from trainer.report import memory_report, pyplot
from trainer.run import Trainer, prepare_run_dir

MiB = 2**20


def machine() -> dict[str, Any]:
    return {"date": date.today().isoformat(), "cpus": os.cpu_count(),
            "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "load_1m": round(os.getloadavg()[0], 2)}


def training_point(mode: str, workers: int, seconds: float, root: Path) -> dict[str, Any]:
    """One training run; throughput over the whole run, memory at its end (workers still alive)."""
    config = TrainConfig(minutes=seconds / 60, workers=workers, weights=mode, num_cpus=2, eval_games=50,
                         eval_every_s=1e9, checkpoint_every_s=1e9)
    rd, config = prepare_run_dir(root / f"{mode}-{workers}w", config, resume=False)
    trainer = Trainer(rd, config, resume=False, console=Console(file=io.StringIO()))
    try:
        load_before = os.getloadavg()[0]
        trainer.start()
        result = trainer.run(config.minutes)
        status = result["status"]
        learners = ray.get([learner.stats.remote() for learner in trainer.learners.values()])
        infos = trainer.store.list()
        memory = memory_report(trainer.store.stats(), infos, workers)
        frozen = [i.nbytes for i in infos if i.meta.get("frozen")]
        pss = session_pss_bytes()
    finally:
        trainer.shutdown()
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
        "private_copies_mib": round(memory["private_copies_mib"], 2),
        "load_1m_before": round(load_before, 2), **machine(),
    }


def forward_points(modes: list[str], batch: int, hidden: int, rounds: int, calls: int = 20) -> list[dict[str, Any]]:
    """Time one batched forward pass on a module over store views (``store``) or a private copy, called
    directly (``module``: every op goes through the views' write guard) or the way workers call it (``act``).

    The four variants take turns in every round, so load from other processes hits them alike; each row is the
    median over the rounds of the mean over ``calls`` calls.
    """
    torch.set_num_threads(1)
    store = policystore.connect()
    net = PolicyNet(hidden)
    store.publish("bench_forward", net.state_dict())
    modules = {"store": store.load_module("bench_forward", lambda: PolicyNet(hidden)), "private": net.eval()}
    planes = np.random.default_rng(0).random((batch, NUM_PLANES, ROWS, COLS)).astype(np.float32)
    legal = np.ones((batch, COLS), dtype=bool)
    x = torch.from_numpy(planes)
    variants = [(mode, path) for path in ("module", "act") for mode in modes]
    calls_of = {(mode, "module"): (lambda m=modules[mode]: m(x)) for mode in modes} | {
        (mode, "act"): (lambda m=modules[mode]: act(m, planes, legal)) for mode in modes}
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
             "forward_us": round(float(np.median(times[(mode, path)])) * 1e6, 1), **machine()}
            for mode, path in variants]


def grouped(rows: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["mode"], r["workers"]), []).append(r)
    return groups


def write_results(rows: list[dict[str, Any]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    train = [r for r in rows if r["bench"] == "league_training"]
    fwd = [r for r in rows if r["bench"] == "forward"]
    lines: list[str] = []
    if train:
        lines = ["| mode | workers | runs | env steps/s (median) | min..max | learner samples/s | frozen snapshots "
                 "| worker PSS MiB | store hot MiB | private copies MiB | load (1 min) |",
                 "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|"]
        for (mode, w), group in grouped(train).items():
            med = {k: float(np.median([r[k] for r in group])) for k in (
                "env_steps_per_s", "learner_samples_per_s", "frozen_snapshots", "worker_pss_mib", "store_hot_mib",
                "private_copies_mib")}
            rates = [r["env_steps_per_s"] for r in group]
            loads = ", ".join(str(r["load_1m"]) for r in group)
            lines.append(f"| {mode} | {w} | {len(group)} | {med['env_steps_per_s']:,.0f} | {min(rates):,.0f}.."
                         f"{max(rates):,.0f} | {med['learner_samples_per_s']:,.0f} | {med['frozen_snapshots']:.0f} "
                         f"| {med['worker_pss_mib']:.1f} | {med['store_hot_mib']:.2f} "
                         f"| {med['private_copies_mib']:.2f} | {loads} |")
    if fwd:
        lines += [""] if lines else []
        lines += ["| forward pass | called via | batch | hidden | µs |", "|---|---|---:|---:|---:|"]
        lines += [f"| {r['mode']} | {r['path']} | {r['batch']} | {r['hidden']} | {r['forward_us']} |" for r in fwd]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    if train:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(6, 4))
        modes = sorted({r["mode"] for r in train}, reverse=True)
        counts = sorted({r["workers"] for r in train})
        width = 0.8 / len(modes)
        for i, mode in enumerate(modes):
            groups = grouped(train)
            values = [float(np.median([r["env_steps_per_s"] for r in groups.get((mode, w), [])] or [0]))
                      for w in counts]
            ax.bar(np.arange(len(counts)) + i * width, values, width, label=mode)
        ax.axhline(5000, color="grey", ls=":", lw=1, label="target 5,000/s")
        ax.set_xticks(np.arange(len(counts)) + width * (len(modes) - 1) / 2, [f"{w} worker(s)" for w in counts])
        ax.set_ylabel("env steps/s, training included (median)")
        ax.set_title(f"League training throughput ({train[0]['cpus']} CPUs)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=120)
        plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.league_throughput", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="15 s per point, 1 worker (CI smoke test)")
    p.add_argument("--seconds", type=float, default=None, help="training seconds per point (default 60)")
    p.add_argument("--workers", default=None, help="comma-separated worker counts (default 1,2)")
    p.add_argument("--modes", default="store,private", help="comma-separated: store, private")
    p.add_argument("--repeats", type=int, default=None,
                   help="runs per point, modes alternating order (default 2, --quick 1); tables show the median")
    p.add_argument("--points", default="training,forward", help="comma-separated: training, forward (default both)")
    p.add_argument("--out", default="results/league_throughput", help="results folder")
    args = p.parse_args(argv)
    seconds = args.seconds or (15.0 if args.quick else 60.0)
    workers = [int(w) for w in (args.workers or ("1" if args.quick else "1,2")).split(",")]
    modes = args.modes.split(",")
    for mode in modes:
        if mode not in ("store", "private"):
            p.error(f"unknown mode {mode!r}; choose store or private")
    points = args.points.split(",")
    if not set(points) <= {"training", "forward"}:
        p.error(f"--points takes training and/or forward, got {args.points!r}")
    repeats = args.repeats or (1 if args.quick else 2)
    rows = []
    with tempfile.TemporaryDirectory(prefix="league_throughput-") as tmp:
        # Other load on the machine drifts over minutes: alternate the order of the modes between repeats.
        for repeat in range(repeats if "training" in points else 0):
            for w in workers:
                for mode in modes if repeat % 2 == 0 else modes[::-1]:
                    row = training_point(mode, w, seconds, Path(tmp) / f"r{repeat}") | {"repeat": repeat}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    if "forward" in points:
        ray.init(address="local", num_cpus=2, object_store_memory=256 * MiB, include_dashboard=False)
        try:
            for row in forward_points(modes, batch=256, hidden=TrainConfig().hidden, rounds=10 if args.quick else 50):
                print(json.dumps(row), flush=True)
                rows.append(row)
        finally:
            ray.shutdown()
    write_results(rows, Path(args.out))
    print(f"wrote {args.out}/results.json, results.md" + (", throughput.png" if "training" in points else ""),
          flush=True)


if __name__ == "__main__":
    main()
