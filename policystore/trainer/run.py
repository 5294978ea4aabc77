"""The training driver: starts the league, learner shards and rollout workers on Ray, measures the rate,
evaluates, checkpoints, and hands the figures to the display and the report.

The driver is off the data path: workers ask the league actor for matches and send trajectories to the learner
shards and results to the league; the league has the learners publish its snapshots (``trainer.league_actor``).
What is where in the run directory: ``trainer.rundir``; the terminal: ``trainer.display``; the files of the
end-of-run report: ``trainer.report``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import ray
from rich.console import Console

import policystore
from policystore import leftovers, remote
from policystore.league.constants import DEFAULT_PLAYER, HISTORICAL, MAIN
from policystore.league.games import get_game
from policystore.memory import MiB
from policystore.trainer import reference, report
from policystore.trainer.config import TrainConfig
from policystore.trainer.display import LiveDisplay, print_summary
from policystore.trainer.evaluate import evaluate
from policystore.trainer.league_actor import LeagueActor
from policystore.trainer.learner import LearnerShard
from policystore.trainer.progress import console as full_width_console
from policystore.trainer.rundir import RunDir, prepare_run_dir
from policystore.workers.modules import SnapshotModules
from policystore.workers.rollout import RolloutWorker, WorkerConfig

ANSWER_S = 600.0  # the longest the driver waits for an actor's answer (a learner's first publish, a checkpoint)
RESCALE_EVERY_S = 20.0  # how often the snapshot budgets follow the measured env steps/s (first: LeagueConfig)


class Trainer:
    def __init__(self, rd: RunDir, config: TrainConfig, resume: bool, console: Console | None = None):
        self.rd, self.config, self.resume = rd, config, resume
        self.console = console or full_width_console()
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
            ray.init(address="local", num_cpus=c.num_cpus, object_store_memory=c.object_store_mib * MiB,
                     include_dashboard=False, log_to_driver=True)
            self.owns_ray = True
        self.store = policystore.connect(policystore.StoreConfig(
            hot_capacity_bytes=c.hot_capacity_mib * MiB, spill_dir=str(self.rd.store)))
        self.league = ray.remote(LeagueActor).options(num_cpus=0).remote(c.league, c.seed)
        if self.resume:
            remote.call(self.league, "load_state", self.rd.read_json(self.rd.league, None), timeout_s=ANSWER_S)
        shard = ray.remote(LearnerShard)
        self.learners = {
            name: shard.options(num_cpus=c.learner_cpus, num_gpus=c.learner_gpus).remote(
                name, str(self.rd.checkpoints), c.ppo, c.hidden, c.seed + i, c.publish_every, self.resume, c.game)
            for i, name in enumerate(remote.call(self.league, "trainable", timeout_s=ANSWER_S))}
        # The league has the learners publish the main agents' first snapshots before any match needs them.
        remote.call(self.league, "serve", self.learners, timeout_s=ANSWER_S)
        devices = self.ask_learners("stats")
        self.console.print("learner shards: " + ", ".join(f"{s['player']} on {s['device']}" for s in devices))
        worker_config = WorkerConfig(c.games_per_match, c.hidden, c.ppo.gamma, c.ppo.gae_lambda, c.weights, game=c.game,
                                     mirror=c.mirror, opening_share=c.opening_share, opening_moves=c.opening_moves)
        worker = ray.remote(RolloutWorker)
        self.workers = [worker.options(num_cpus=c.worker_cpus).remote(
            self.league, self.learners, worker_config, c.seed * 1000 + i) for i in range(c.workers)]
        self.game = get_game(c.game)
        self.modules = SnapshotModules(self.store, lambda: self.game.net(c.hidden))
        self.started = True

    # ---- the run ------------------------------------------------------------------------------------------
    def run(self, minutes: float) -> dict[str, Any]:
        seconds = minutes * 60.0
        start = time.monotonic()
        steps_at_start = self.total_steps()
        runs = [remote.send(w, "run", seconds) for w in self.workers]
        next_eval = next_ckpt = 0.0
        next_budget = RESCALE_EVERY_S
        status: dict[str, Any] = {}
        with LiveDisplay(self.console, seconds) as display:
            while True:
                done, _ = ray.wait(runs, num_returns=len(runs), timeout=1.0)
                elapsed = self.session_elapsed = time.monotonic() - start
                summary = remote.call(self.league, "summary", timeout_s=ANSWER_S)
                steps = self.total_steps(summary) - steps_at_start
                status = {"elapsed_s": elapsed, "steps": steps, "steps_per_s": steps / max(elapsed, 1e-9),
                          "summary": summary}
                if elapsed >= next_budget:  # scale snapshot budgets to the measured rate, follow the lr schedule
                    run_steps = int(status["steps_per_s"] * (self.elapsed_before + seconds))
                    remote.send(self.league, "set_run_steps", run_steps)
                    progress = (self.elapsed_before + elapsed) / (self.elapsed_before + seconds)
                    for learner in self.learners.values():
                        remote.send(learner, "set_progress", progress)
                    next_budget = elapsed + RESCALE_EVERY_S
                if elapsed >= next_eval or len(done) == len(runs):
                    self.evaluate_main(status)
                    next_eval = elapsed + self.config.eval_every_s
                if elapsed >= next_ckpt:
                    self.checkpoint(elapsed)
                    next_ckpt = elapsed + self.config.checkpoint_every_s
                display.update(status, self.curve[-1] if self.curve else None)
                if len(done) == len(runs):
                    break
        worker_stats = remote.get(runs, ANSWER_S, "the rollout workers", "run")
        remote.call(self.league, "settle", timeout_s=ANSWER_S)  # snapshots the last results asked for
        self.checkpoint(time.monotonic() - start)
        return {"status": status, "workers": worker_stats}

    def ask_learners(self, method: str) -> list[Any]:
        """Every learner shard's answer to ``method``, in the order of ``self.learners``."""
        calls = [remote.send(learner, method) for learner in self.learners.values()]
        return remote.get(calls, ANSWER_S, "the learner shards", method)

    def total_steps(self, summary: list[dict[str, Any]] | None = None) -> int:
        summary = summary if summary is not None else remote.call(self.league, "summary", timeout_s=ANSWER_S)
        return sum(r["steps"] for r in summary if r["kind"] != HISTORICAL)

    def evaluate_main(self, status: dict[str, Any]) -> None:
        """Win rates of the first main agent's latest version (read from the store, zero-copy)."""
        net = self.modules.get(DEFAULT_PLAYER, frozen=False)
        results = evaluate(net, self.game, self.config.eval_games, seed=len(self.curve))
        elo = {r["name"]: r["elo"] for r in status["summary"] if r["kind"] == MAIN}
        self.curve.append({"time_s": self.elapsed_before + status["elapsed_s"],
                           "steps": self.total_steps(status["summary"]), "elo": elo,
                           **{f"win_{name}": r["win"] for name, r in results.items()}})

    def checkpoint(self, session_elapsed: float) -> None:
        self.ask_learners("save")
        self.rd.write_json(self.rd.league, remote.call(self.league, "to_dict", timeout_s=ANSWER_S))
        self.rd.write_json(self.rd.curve, self.curve)
        self.rd.write_json(self.rd.state, {"elapsed_s": self.elapsed_before + session_elapsed})

    # ---- the end ------------------------------------------------------------------------------------------
    def finish(self, result: dict[str, Any]) -> dict[str, Any]:
        """Players table, payoff heatmap, learning curve and memory report (printed and under report/)."""
        self.store.flush()
        summary = remote.call(self.league, "summary", timeout_s=ANSWER_S)
        payoff = remote.call(self.league, "payoff_matrix", timeout_s=ANSWER_S)
        memory = report.memory_report(self.store.stats(), self.store.list(), self.config.workers)
        learners = self.ask_learners("stats")
        strength = self.measure_reference(summary)
        final = report.final_record(result["status"], self.curve, memory, result["workers"], learners, strength)
        report.write_report(self.rd.report, summary, *payoff, self.curve, strength)
        self.rd.write_json(self.rd.report / "report.json", final)
        print_summary(self.console, summary, final, self.config.eval_games, self.rd.report)
        return final

    def measure_reference(self, summary: list[dict[str, Any]]) -> dict[str, Any]:
        """The first main agent at a few points of the run by the measure that fits the game (against OpenSpiel's
        MCTS(100), or its exact NashConv), now that training has ended (``trainer.reference``); the nets are the
        store's views."""
        kinds = {r["name"]: r["kind"] for r in summary}
        record = reference.measure(summary, lambda name: self.modules.get(name, frozen=kinds[name] == HISTORICAL),
                                   self.game, self.config.reference_games, self.config.seed)
        self.console.print(report.reference_text(record))
        return record

    def shutdown(self) -> None:
        if self.owns_ray:
            leftovers.shutdown_ray()


def train(run_dir: str | Path, config: TrainConfig | None = None, resume: bool = False,
          minutes: float | None = None, console: Console | None = None) -> dict[str, Any]:
    """Train (or, ``resume``, continue) a league in ``run_dir`` for ``minutes`` (default: the config's)."""
    rd, config = prepare_run_dir(run_dir, config, resume)
    return train_in(rd, config, resume, minutes, console)


def train_in(rd: RunDir, config: TrainConfig, resume: bool, minutes: float | None = None,
             console: Console | None = None) -> dict[str, Any]:
    """``train`` in a run directory already prepared (``rundir.prepare_run_dir``)."""
    minutes = minutes if minutes is not None else config.minutes
    trainer = Trainer(rd, config, resume, console)
    try:
        trainer.start()
        result = trainer.run(minutes)
        return trainer.finish(result)
    except KeyboardInterrupt:
        if trainer.started:
            trainer.checkpoint(trainer.session_elapsed)
            trainer.console.print(f"interrupted: checkpoint saved in {rd.root}; --resume continues the run")
        raise SystemExit(130) from None
    finally:
        trainer.shutdown()
        rd.release()
