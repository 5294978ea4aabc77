"""The training driver: starts the league, learner shards and rollout workers on Ray, shows live progress,
serves the league's snapshot requests, checkpoints, and writes the end-of-run report.

Run directory::

    config.json       the TrainConfig
    league.json       players, payoff matrix, Elo, step budgets (League.to_dict)
    curve.json        live evaluations: env steps, win rates against random / win-block, Elo of the mains
    state.json        elapsed training seconds (summed over resumed sessions)
    checkpoints/      learner weights + Adam state (safetensors), initial weights for resets
    store/            the node store's spill tier: every published snapshot
    report/           players.md, payoff.png, curve.png, report.json
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import ray
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

import policystore
from trainer import report
from trainer.config import TrainConfig
from trainer.evaluate import evaluate
from trainer.games import get_game
from trainer.league import MAIN, League
from trainer.learner import LearnerShard
from workers.modules import SnapshotModules
from workers.rollout import RolloutWorker, WorkerConfig


class RunDir:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.config = self.root / "config.json"
        self.league = self.root / "league.json"
        self.curve = self.root / "curve.json"
        self.state = self.root / "state.json"
        self.checkpoints = self.root / "checkpoints"
        self.store = self.root / "store"
        self.report = self.root / "report"

    def write_json(self, path: Path, data: Any) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)

    def read_json(self, path: Path, default: Any) -> Any:
        return json.loads(path.read_text()) if path.exists() else default


def prepare_run_dir(run_dir: str | Path, config: TrainConfig | None, resume: bool) -> tuple[RunDir, TrainConfig]:
    """A fresh run directory (refusing to overwrite one) or, with ``resume``, the saved config."""
    rd = RunDir(run_dir)
    if resume:
        if not rd.config.exists():
            raise FileNotFoundError(f"cannot resume: {rd.root} has no config.json (start a run there first)")
        return rd, TrainConfig.load(rd.config)
    if rd.config.exists():
        raise FileExistsError(f"{rd.root} already holds a run; pass --resume to continue it or pick another --run-dir")
    rd.root.mkdir(parents=True, exist_ok=True)
    config = config or TrainConfig()
    config.save(rd.config)
    return rd, config


def serve_snapshot_requests(league: ray.actor.ActorHandle, learners: dict[str, ray.actor.ActorHandle]) -> int:
    """Have learners publish the snapshots the league asked for, then add them to the league."""
    requests = ray.get(league.pop_requests.remote())
    for request in requests:
        learner = learners[request.player]
        ray.get(learner.snapshot.remote(request.name))
        if request.reset:
            learner.reset.remote()  # runs after the snapshot: calls to one actor keep their order
        ray.get(league.add_snapshot.remote(request))
    return len(requests)


class Trainer:
    def __init__(self, rd: RunDir, config: TrainConfig, resume: bool, console: Console | None = None):
        self.rd, self.config, self.resume = rd, config, resume
        self.console = console or Console()
        self.curve: list[dict[str, Any]] = rd.read_json(rd.curve, [])
        self.elapsed_before = float(rd.read_json(rd.state, {}).get("elapsed_s", 0.0))
        self.owns_ray = False
        self.session_elapsed = 0.0
        self.started = False

    # ---- setup --------------------------------------------------------------------------------------------
    def start(self) -> None:
        c = self.config
        if not ray.is_initialized():
            # address="local": a fresh local Ray, never the last cluster `ray start` left on this machine.
            ray.init(address="local", num_cpus=c.num_cpus, object_store_memory=c.object_store_mib * 2**20,
                     include_dashboard=False, log_to_driver=True)
            self.owns_ray = True
        self.store = policystore.connect(policystore.StoreConfig(
            hot_capacity_bytes=c.hot_capacity_mib * 2**20, spill_dir=str(self.rd.store)))
        self.league = ray.remote(num_cpus=0)(League).remote(c.league, c.seed)
        if self.resume:
            ray.get(self.league.load_state.remote(self.rd.read_json(self.rd.league, None)))
        shard = ray.remote(LearnerShard)
        self.learners = {
            name: shard.options(num_cpus=c.learner_cpus, num_gpus=c.learner_gpus).remote(
                name, str(self.rd.checkpoints), c.ppo, c.hidden, c.seed + i, c.publish_every, self.resume, c.game)
            for i, name in enumerate(ray.get(self.league.trainable.remote()))}
        ray.get([learner.stats.remote() for learner in self.learners.values()])  # constructed and published
        self.serve_requests()  # the main agents' first snapshots, before any match needs them
        worker_config = WorkerConfig(c.games_per_match, c.hidden, c.ppo.gamma, c.ppo.gae_lambda, c.weights, game=c.game)
        worker = ray.remote(RolloutWorker)
        self.workers = [worker.options(num_cpus=c.worker_cpus).remote(
            self.league, self.learners, worker_config, c.seed * 1000 + i) for i in range(c.workers)]
        self.game = get_game(c.game)
        self.modules = SnapshotModules(self.store, lambda: self.game.net(c.hidden))
        self.started = True

    def serve_requests(self) -> int:
        return serve_snapshot_requests(self.league, self.learners)

    # ---- the run ------------------------------------------------------------------------------------------
    def run(self, minutes: float) -> dict[str, Any]:
        seconds = minutes * 60.0
        start = time.monotonic()
        steps_at_start = self.total_steps()
        runs = [w.run.remote(seconds) for w in self.workers]
        progress = Progress(TextColumn("[bold]training"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                            TimeElapsedColumn(), TimeRemainingColumn(), console=self.console)
        task = progress.add_task("train", total=seconds)
        next_eval = next_ckpt = 0.0
        next_budget = 20.0
        status: dict[str, Any] = {}
        with Live(Group(progress), console=self.console, refresh_per_second=2) as live:
            while True:
                done, _ = ray.wait(runs, num_returns=len(runs), timeout=1.0)
                elapsed = self.session_elapsed = time.monotonic() - start
                self.serve_requests()
                summary = ray.get(self.league.summary.remote())
                steps = self.total_steps(summary) - steps_at_start
                status = {"elapsed_s": elapsed, "steps": steps, "steps_per_s": steps / max(elapsed, 1e-9),
                          "summary": summary}
                if elapsed >= next_budget:  # scale snapshot budgets to the measured rate
                    self.league.set_run_steps.remote(int(status["steps_per_s"] * (self.elapsed_before + seconds)))
                    next_budget = elapsed + 20.0
                if elapsed >= next_eval or len(done) == len(runs):
                    self.evaluate_main(status)
                    next_eval = elapsed + self.config.eval_every_s
                if elapsed >= next_ckpt:
                    self.checkpoint(elapsed)
                    next_ckpt = elapsed + self.config.checkpoint_every_s
                progress.update(task, completed=min(elapsed, seconds))
                live.update(Group(progress, self.status_table(status)))
                if len(done) == len(runs):
                    break
        worker_stats = ray.get(runs)
        self.serve_requests()
        self.checkpoint(time.monotonic() - start)
        return {"status": status, "workers": worker_stats}

    def total_steps(self, summary: list[dict[str, Any]] | None = None) -> int:
        summary = summary if summary is not None else ray.get(self.league.summary.remote())
        return sum(r["steps"] for r in summary if r["kind"] != "historical")

    def evaluate_main(self, status: dict[str, Any]) -> None:
        """Win rates of the first main agent's latest version (read from the store, zero-copy)."""
        net = self.modules.get("main_0", frozen=False)
        results = evaluate(net, self.game, self.config.eval_games, seed=len(self.curve))
        elo = {r["name"]: r["elo"] for r in status["summary"] if r["kind"] == MAIN}
        self.curve.append({"time_s": self.elapsed_before + status["elapsed_s"],
                           "steps": self.total_steps(status["summary"]), "elo": elo,
                           **{f"win_{name}": r["win"] for name, r in results.items()}})

    def status_table(self, status: dict[str, Any]) -> Table:
        table = Table(show_header=False, box=None, padding=(0, 2))
        summary = status["summary"]
        snapshots = sum(r["kind"] == "historical" for r in summary)
        table.add_row("env steps", f"{status['steps']:,}  ({status['steps_per_s']:,.0f}/s)")
        table.add_row("league", f"{len(summary) - snapshots} learning, {snapshots} frozen snapshots")
        table.add_row("Elo (mains)", "  ".join(f"{r['name']} {r['elo']:.0f}" for r in summary if r["kind"] == MAIN))
        if self.curve:
            last = self.curve[-1]
            table.add_row("main_0 wins", f"{report.win_rates_text(last)}   (at {last['steps']:,} steps)")
        return table

    def checkpoint(self, session_elapsed: float) -> None:
        ray.get([learner.save.remote() for learner in self.learners.values()])
        self.rd.write_json(self.rd.league, ray.get(self.league.to_dict.remote()))
        self.rd.write_json(self.rd.curve, self.curve)
        self.rd.write_json(self.rd.state, {"elapsed_s": self.elapsed_before + session_elapsed})

    # ---- the end ------------------------------------------------------------------------------------------
    def finish(self, result: dict[str, Any]) -> dict[str, Any]:
        """Players table, payoff heatmap, learning curve and memory report (printed and under report/)."""
        self.store.flush()
        self.rd.report.mkdir(exist_ok=True)
        summary = ray.get(self.league.summary.remote())
        players, matrix = ray.get(self.league.payoff_matrix.remote())
        report.payoff_heatmap(players, matrix, self.rd.report / "payoff.png")
        report.learning_curve(self.curve, self.rd.report / "curve.png")
        (self.rd.report / "players.md").write_text(report.players_markdown(summary))
        memory = report.memory_report(self.store.stats(), self.store.list(), self.config.workers)
        status = result["status"]
        final = {"env_steps": status["steps"], "env_steps_per_s": status["steps_per_s"],
                 "elapsed_s": status["elapsed_s"], "main_0": self.curve[-1] if self.curve else None,
                 "memory": memory, "workers": result["workers"],
                 "learners": ray.get([learner.stats.remote() for learner in self.learners.values()])}
        self.rd.write_json(self.rd.report / "report.json", final)
        self.console.print(report.players_table(summary))
        if self.curve:
            last = self.curve[-1]
            self.console.print(f"main_0 (greedy, {2 * self.config.eval_games} games per opponent, both seats): "
                               f"wins {report.win_rates_text(last)}")
        self.console.print(
            f"env steps this session: {status['steps']:,} in {status['elapsed_s']:.0f} s "
            f"({status['steps_per_s']:,.0f} steps/s)")
        self.console.print(
            f"store memory: {memory['store_hot_mib']:.2f} MiB of shared memory on this node hold the league's "
            f"{memory['league_policies']} policies ({memory['frozen_snapshots']} frozen snapshots; "
            f"{memory['league_policy_mib']:.2f} MiB); private copies in every worker would cost "
            f"{memory['workers']} x {memory['league_policy_mib']:.2f} = {memory['private_copies_mib']:.2f} MiB")
        self.console.print(f"report: {self.rd.report}/ (players.md, payoff.png, curve.png, report.json)")
        return final

    def shutdown(self) -> None:
        if self.owns_ray:
            ray.shutdown()


def train(run_dir: str | Path, config: TrainConfig | None = None, resume: bool = False,
          minutes: float | None = None, console: Console | None = None) -> dict[str, Any]:
    """Train (or, ``resume``, continue) a league in ``run_dir`` for ``minutes`` (default: the config's)."""
    rd, config = prepare_run_dir(run_dir, config, resume)
    trainer = Trainer(rd, config, resume, console)
    try:
        trainer.start()
        result = trainer.run(minutes if minutes is not None else config.minutes)
        return trainer.finish(result)
    except KeyboardInterrupt:
        if trainer.started:
            trainer.checkpoint(trainer.session_elapsed)
            trainer.console.print(f"interrupted: checkpoint saved in {rd.root}; --resume continues the run")
        raise SystemExit(130) from None
    finally:
        trainer.shutdown()
