"""Two trials of a store-backed league job under Ray Tune at once, each in a league of its own, then restored.

The Nim league of ``rllib_nim_league.py`` (a frozen copy of ``main`` joins every iteration here) as a
``tune.Tuner`` grid of two seeds, running side by side, with a checkpoint every iteration. The config names no
league, so each trial's Algorithm gets its own (named after the trial's folder): the two trials freeze copies
under the same module ids (``main_v1``, ``main_v2``, ...) without touching each other. Afterwards each trial's last
checkpoint is restored with ``Algorithm.from_checkpoint`` (a new Algorithm, so again a league of its own) and
trains on with the checkpoint's frozen copies.

    python -m examples.rllib_tune_league --iters 3
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ray import tune
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.utils import force_list

from examples.rllib_nim_league import build_config
from examples.rllib_nim_league import parse_args as nim_args
from policystore.rllib import frozen_modules, league_name

log = logging.getLogger("tune_league")


class ReportLeague(RLlibCallback):
    """Puts the trial's league name and frozen modules into every result (Tune keeps them per trial)."""

    def on_train_result(self, *, algorithm: Any, result: dict, **kwargs: Any) -> None:
        result["policystore"] = {
            "league": league_name(algorithm),
            "frozen": {mid: str(sid) for mid, sid in sorted(frozen_modules(algorithm).items())},
        }


def tune_config(args: argparse.Namespace) -> PPOConfig:
    """The Nim league (a copy joins every iteration), half a CPU per trial's driver so two trials fit on 2 CPUs."""
    config = build_config(nim_args(["--env-runners", "1", "--hidden", str(args.hidden), "--batch", str(args.batch),
                                    "--max-frozen", "2", "--win-rate-threshold", "-1"]))
    config.callbacks(callbacks_class=[*force_list(config.callbacks_class), ReportLeague])
    config.learners(num_cpus_per_learner=0.5).resources(num_cpus_for_main_process=0.5)  # the Learner is local
    return config.debugging(seed=tune.grid_search(list(args.seeds)))


def run_trials(args: argparse.Namespace, config: PPOConfig | None = None) -> tune.ResultGrid:
    """Both trials at once, a checkpoint every iteration, in the running Ray session."""
    tuner = tune.Tuner(
        "PPO",
        param_space=config or tune_config(args),
        run_config=tune.RunConfig(
            storage_path=str(Path(args.storage).resolve()),
            stop={"training_iteration": args.iters},
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1, checkpoint_at_end=True),
            verbose=0,
        ),
    )
    return tuner.fit()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--iters", type=int, default=3, help="training iterations per trial")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="one trial per seed")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch", type=int, default=400, help="train batch size (env steps)")
    parser.add_argument("--storage", default="tune_league_results", help="Tune's storage folder")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    import ray

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="warning")
    try:
        results = run_trials(args)
        for result in results:
            league = result.metrics["policystore"]
            log.info("trial %s: league %s, frozen %s", result.path, league["league"], league["frozen"])
            algorithm = Algorithm.from_checkpoint(result.checkpoint.path)  # a new Algorithm: a league of its own
            try:
                log.info("  restored into league %s, frozen %s", league_name(algorithm), frozen_modules(algorithm))
                after = algorithm.train()
                log.info("  one more iteration: %d env steps", after["env_runners"]["num_env_steps_sampled"])
            finally:
                algorithm.stop()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
