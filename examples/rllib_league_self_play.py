"""RLlib's league-based self-play example, with the frozen league members in the node's PolicyStore.

Port of ``rllib/examples/multi_agent/self_play_league_based_with_open_spiel.py`` and its
``SelfPlayLeagueBasedCallback`` (Ray 2.60, new API stack). The league is the same: ``main`` plus frozen copies
of it, main exploiters and league exploiters, matched by a mapping function that changes with every addition.
What changes (marked ``# policystore:`` below):

- the config goes through ``with_policystore(config)``;
- a frozen copy is made with ``add_frozen(algorithm, new_id, from_id, ...)`` instead of
  ``algorithm.add_module(...)`` + ``algorithm.set_state(...)``; it lives once per node, as read-only views in
  every EnvRunner, and stays off the Learner;
- matchmaking goes with it (``new_agent_to_module_mapping_fn``), so an EnvRunner that Ray restarts plays the
  current league instead of its start-up config.

Frozen copies that keep training (exploiters, 30% of the time) are trainable modules and use RLlib's
``add_module`` as before. RLlib's example needs open_spiel (``pip install open_spiel``) for ``markov_soccer``;
without it this port plays RLlib's built-in TicTacToe and says so.

    python -m examples.rllib_league_self_play --iters 20
"""

from __future__ import annotations

import argparse
import functools
import logging
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import ray
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.examples.rl_modules.classes.random_rlm import RandomRLModule
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS
from ray.tune.registry import register_env
from rich.logging import RichHandler
from rich.progress import Progress

from policystore.rllib import add_frozen, frozen_modules, set_matchmaking, with_policystore

log = logging.getLogger("league")


def make_env(name: str):
    """``(env name, the two agent ids)``: open_spiel's game as in RLlib's example, else RLlib's TicTacToe."""
    try:
        import pyspiel
        from ray.rllib.env.wrappers.open_spiel import OpenSpielEnv
    except ImportError:
        from ray.rllib.examples.envs.classes.multi_agent.tic_tac_toe import TicTacToe

        log.warning("open_spiel is not installed: playing RLlib's built-in TicTacToe instead of %s", name)
        register_env("league_env", lambda _: TicTacToe())
        return "league_env", ("player1", "player2")
    register_env("league_env", lambda _: OpenSpielEnv(pyspiel.load_game(name)))
    return "league_env", (0, 1)


class SelfPlayLeagueBasedCallback(RLlibCallback):
    """RLlib's league callback; frozen copies go to the store (policystore.rllib.add_frozen)."""

    def __init__(self, win_rate_threshold: float, agents: tuple):
        super().__init__()
        self.agents = agents
        self.main_policies = {"main", "main_0"}
        self.main_exploiters = {"main_exploiter_0", "main_exploiter_1"}
        self.league_exploiters = {"league_exploiter_0", "league_exploiter_1"}
        self.trainable_policies = {"main"}
        self.non_trainable_policies = {"main_0", "league_exploiter_0", "main_exploiter_0"}
        self.win_rate_threshold = win_rate_threshold
        self.win_rates = {}
        self._matching_stats = defaultdict(int)

    def on_episode_end(self, *, episode, env_runner, metrics_logger, **kwargs) -> None:
        to_train = env_runner.config.policies_to_train
        num_learning = sum(episode.module_for(a) in to_train for a in self.agents)
        assert num_learning > 0, f"{[episode.module_for(a) for a in self.agents]} vs {to_train}"
        if num_learning == 1:  # win rates only against non-trained opponents
            for aid, rewards in episode.get_rewards().items():
                metrics_logger.log_value(f"win_rate_{episode.module_for(aid)}", rewards[-1] == 1.0, window=100)

    def on_train_result(self, *, algorithm, result, **kwargs) -> None:
        league_changed = False
        for key in [k for k in result[ENV_RUNNER_RESULTS] if k.startswith("win_rate_")]:
            module_id = key[len("win_rate_"):]
            self.win_rates[module_id] = result[ENV_RUNNER_RESULTS][key]
            if module_id in self.non_trainable_policies:
                continue
            if self.win_rates[module_id] <= self.win_rate_threshold:
                continue
            league_changed = True
            is_main = re.match("^main(_\\d+)?$", module_id)
            if is_main and len(self.trainable_policies) == 1:
                # First time main beats random: main_0 becomes a frozen copy of main, and one main exploiter
                # and one league exploiter start training from main's weights.
                self.trainable_policies |= {"league_exploiter_1", "main_exploiter_1"}
                self._copy_trainable(algorithm, "main", ["league_exploiter_1", "main_exploiter_1"])
                add_frozen(algorithm, "main_0", "main", **self._matchmaking())  # policystore: was set_state
                log.info("iter %d: %s wins %.2f -> exploiters join", algorithm.iteration, module_id,
                         self.win_rates[module_id])
                continue
            keep_training = False if is_main else bool(np.random.choice([True, False], p=[0.3, 0.7]))
            new_mod_id = self._new_id(module_id)
            (self.trainable_policies if keep_training else self.non_trainable_policies).add(new_mod_id)
            log.info("iter %d: %s wins %.2f -> adding %s (%s)", algorithm.iteration, module_id,
                     self.win_rates[module_id], new_mod_id, "trainable" if keep_training else "frozen")
            if keep_training:  # a trainable copy belongs on the Learner: RLlib's own path, as in the original
                algorithm.add_module(
                    module_id=new_mod_id,
                    module_spec=RLModuleSpec.from_module(algorithm.get_module(module_id)),
                    **self._matchmaking(),
                )
                self._copy_trainable(algorithm, module_id, [new_mod_id])
                set_matchmaking(algorithm, **self._matchmaking())  # policystore: matchmaking is league state
            else:  # policystore: one shared copy per node instead of add_module + set_state
                add_frozen(algorithm, new_mod_id, module_id, **self._matchmaking())
        result["league_size"] = len(self.non_trainable_policies) + len(self.trainable_policies)
        if league_changed:
            self._print_league(algorithm)

    def _new_id(self, module_id: str) -> str:
        if module_id in self.main_policies:
            new_id = re.sub("(main)(_\\d+)?$", f"\\1_{len(self.main_policies) - 1}", module_id)
            self.main_policies.add(new_id)
        elif module_id in self.main_exploiters:
            new_id = re.sub("_\\d+$", f"_{len(self.main_exploiters)}", module_id)
            self.main_exploiters.add(new_id)
        else:
            new_id = re.sub("_\\d+$", f"_{len(self.league_exploiters)}", module_id)
            self.league_exploiters.add(new_id)
        return new_id

    def _copy_trainable(self, algorithm, from_id: str, to_ids: list[str]) -> None:
        """Trainable copies: set the Learner's weights; RLlib syncs them to the EnvRunners."""
        state = algorithm.learner_group.get_state(components=f"learner/rl_module/{from_id}")
        weights = state["learner"]["rl_module"][from_id]
        algorithm.set_state({"learner_group": {"learner": {"rl_module": {m: weights for m in to_ids}}}})
        algorithm.learner_group.foreach_learner(
            lambda learner, t=set(self.trainable_policies): learner.config.multi_agent(policies_to_train=t)
        )

    def _matchmaking(self) -> dict:
        return {
            "new_agent_to_module_mapping_fn": make_mapping_fn(
                self.agents, self.trainable_policies, self.non_trainable_policies,
                self.main_policies, self.main_exploiters, self.league_exploiters,
            ),
            "new_should_module_be_updated": sorted(self.trainable_policies),
        }

    def _print_league(self, algorithm) -> None:
        log.info("league: trainable %s | frozen %s | in the store: %s", sorted(self.trainable_policies),
                 sorted(self.non_trainable_policies), sorted(frozen_modules(algorithm)))
        log.info("win rates: %s", {k: round(float(v), 2) for k, v in sorted(self.win_rates.items())})


def make_mapping_fn(agents, trainable, frozen, mains, main_exploiters, league_exploiters):
    """RLlib's matchmaking: league exploiters vs. anyone, main exploiters vs. mains; never two frozen ones.

    Built from plain sets (copied), so it pickles without the callback.
    """
    trainable, frozen, mains = sorted(trainable), sorted(frozen), sorted(mains)
    n_main_exploiters, n_league_exploiters = len(main_exploiters), len(league_exploiters)

    def mapping(agent_id, episode, **kwargs):
        rng = np.random.default_rng(hash(episode.id_) % (2**32))  # one draw per episode: both agents agree
        first = agents[hash(episode.id_) % 2]
        if rng.integers(1, 3) == 1:
            exploiter = f"league_exploiter_{rng.integers(n_league_exploiters)}"
            opponent = rng.choice(trainable if exploiter not in trainable else frozen)
        else:
            exploiter = f"main_exploiter_{rng.integers(n_main_exploiters)}"
            opponent = "main" if exploiter not in trainable else rng.choice([m for m in mains if m != "main"])
        return exploiter if agent_id == first else str(opponent)

    return mapping


def initial_mapping(agents):
    def mapping(agent_id, episode, **kwargs):
        return "main" if agent_id == agents[hash(episode.id_) % 2] else "main_exploiter_0"

    return mapping


def build_config(args, env: str, agents: tuple):
    names = ["main", "main_0", "main_exploiter_0", "main_exploiter_1", "league_exploiter_0", "league_exploiter_1"]
    specs = {
        mid: RLModuleSpec(
            module_class=RandomRLModule if mid in ("main_exploiter_0", "league_exploiter_0") else None,
            model_config=DefaultModelConfig(fcnet_hiddens=[args.hidden, args.hidden]),
        )
        for mid in names
    }
    config = (
        PPOConfig()
        .environment(env)
        .callbacks(functools.partial(SelfPlayLeagueBasedCallback, win_rate_threshold=args.win_rate_threshold,
                                     agents=agents))
        .env_runners(num_env_runners=args.env_runners, num_envs_per_env_runner=1, num_cpus_per_env_runner=0.5)
        .training(num_epochs=args.num_epochs)
        .multi_agent(policies=set(names), policy_mapping_fn=initial_mapping(agents), policies_to_train=["main"])
        .rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs=specs))
    )
    return with_policystore(config)  # policystore: SharedEnvRunner + PolicyStoreCallback


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--env", default="markov_soccer", help="open_spiel game (falls back to TicTacToe)")
    parser.add_argument("--iters", type=int, default=50, help="training iterations at most")
    parser.add_argument("--min-league-size", type=int, default=8, help="stop once the league has this many")
    parser.add_argument("--win-rate-threshold", type=float, default=0.85,
                        help="win rate against non-trained opponents at which a copy is added to the league")
    parser.add_argument("--env-runners", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256, help="hidden layer width (RLlib's example: 1024)")
    parser.add_argument("--num-epochs", type=int, default=20)
    parser.add_argument("--checkpoint-dir", type=Path, default=None, help="save a checkpoint here at the end")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[RichHandler(show_path=False)])

    ray.init(address="local", include_dashboard=False, logging_level="warning")
    env, agents = make_env(args.env)
    algorithm = build_config(args, env, agents).build_algo()
    try:
        with Progress() as progress:
            task = progress.add_task("league self-play", total=args.iters)
            for _ in range(args.iters):
                result = algorithm.train()
                progress.update(task, advance=1, description=f"league size {result.get('league_size', 6)}")
                if result.get("league_size", 0) >= args.min_league_size:
                    break
        log.info("frozen modules in the node store: %s", frozen_modules(algorithm))
        if args.checkpoint_dir is not None:
            log.info("checkpoint: %s", algorithm.save_to_path(args.checkpoint_dir.resolve()))
    finally:
        algorithm.stop()
        ray.shutdown()


if __name__ == "__main__":
    main()
