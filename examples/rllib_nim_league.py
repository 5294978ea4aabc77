"""A league on a hand-written two-player game (Nim), with frozen opponents in the node's PolicyStore.

The second RLlib example beside ``rllib_league_self_play.py`` (a port of RLlib's OpenSpiel league): nothing here
comes from OpenSpiel or from this project's own games. The game is one-pile Nim written as an RLlib
``MultiAgentEnv`` below: players take turns taking 1-3 stones from a pile of 9-15; whoever takes the last stone
wins (the winning play leaves a multiple of 4).

``main`` trains (PPO) against a league of its frozen past selves plus a random player. Whenever ``main`` wins more
than ``--win-rate-threshold`` of its games, a frozen copy joins the league; beyond ``--max-frozen`` copies the
oldest leaves. ``--stock`` does the same with RLlib's own ``add_module`` / ``set_state`` / ``remove_module`` (every
EnvRunner then holds a private copy of every frozen opponent); without it the frozen copies are one snapshot per
node in the store (``add_frozen`` / ``remove_frozen``). The lines that differ are marked ``# stock:`` and
``# policystore:``.

    python -m examples.rllib_nim_league --iters 30
    python -m examples.rllib_nim_league --iters 30 --stock
"""

from __future__ import annotations

import argparse
import functools
import logging
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.env.multi_agent_env import MultiAgentEnv
from ray.rllib.examples.rl_modules.classes.random_rlm import RandomRLModule
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS

from policystore.rllib import add_frozen, remove_frozen, with_policystore

log = logging.getLogger("nim_league")
PLAYERS = ("p0", "p1")
MAX_STONES, MAX_TAKE = 15, 3


class Nim(MultiAgentEnv):
    """One-pile Nim, turn based: only the player to move observes (the pile size, one-hot) and acts.

    The winner gets +1, the loser -1, at the end. A pile starts with at least 9 stones, so both players move
    before anyone can win (RLlib needs an observation before the final reward).
    """

    def __init__(self, config: dict | None = None) -> None:
        super().__init__()
        self.agents = self.possible_agents = list(PLAYERS)
        self.observation_spaces = {p: gym.spaces.Box(0.0, 1.0, (MAX_STONES + 1,), np.float32) for p in PLAYERS}
        self.action_spaces = {p: gym.spaces.Discrete(MAX_TAKE) for p in PLAYERS}
        self.rng = np.random.default_rng((config or {}).get("seed"))
        self.stones, self.to_move = 0, 0

    def _obs(self) -> dict[str, np.ndarray]:
        obs = np.zeros(MAX_STONES + 1, np.float32)
        obs[self.stones] = 1.0
        return {PLAYERS[self.to_move]: obs}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.stones, self.to_move = int(self.rng.integers(9, MAX_STONES + 1)), 0
        return self._obs(), {}

    def step(self, action_dict: dict[str, int]) -> tuple[dict, dict, dict, dict, dict]:
        mover = PLAYERS[self.to_move]
        self.stones -= min(int(action_dict[mover]) + 1, self.stones)
        if self.stones == 0:
            other = PLAYERS[1 - self.to_move]
            return {}, {mover: 1.0, other: -1.0}, {"__all__": True}, {"__all__": False}, {}
        self.to_move = 1 - self.to_move
        return self._obs(), {}, {"__all__": False}, {"__all__": False}, {}


def league_mapping(opponents: Sequence[str]):
    """``main`` against one of ``opponents`` per episode, on a random side (a plain closure: Ray ships it)."""
    opponents = list(opponents)

    def mapping(agent_id: str, episode: Any, **kwargs: Any) -> str:
        draw = hash(episode.id_) % (2 * len(opponents))  # one draw per episode: both agents agree
        return "main" if PLAYERS.index(agent_id) == draw % 2 else opponents[draw // 2]

    return mapping


class NimLeague(RLlibCallback):
    """Adds a frozen copy of ``main`` when it wins often enough; drops the oldest beyond ``max_frozen``."""

    def __init__(self, win_rate_threshold: float, max_frozen: int, stock: bool) -> None:
        super().__init__()
        self.win_rate_threshold, self.max_frozen, self.stock = win_rate_threshold, max_frozen, stock
        self.frozen: list[str] = []
        self.added = 0
        self.history: list[dict[str, Any]] = []

    def on_episode_end(self, *, episode: Any, metrics_logger: Any, **kwargs: Any) -> None:
        for aid, agent_episode in episode.agent_episodes.items():
            if episode.module_for(aid) == "main":  # the final reward: +1 won, -1 lost
                metrics_logger.log_value("main_win_rate", float(agent_episode.get_return() > 0), window=200)

    def on_train_result(self, *, algorithm: Any, result: dict, **kwargs: Any) -> None:
        win_rate = result[ENV_RUNNER_RESULTS].get("main_win_rate", 0.0)
        if win_rate > self.win_rate_threshold:
            self.added += 1
            new_id = f"main_v{self.added}"
            self.frozen.append(new_id)
            mapping = league_mapping(["random", *self.frozen[-self.max_frozen:]])
            if self.stock:  # stock: a module on the Learner and in every EnvRunner, then its weights
                algorithm.add_module(
                    module_id=new_id,
                    module_spec=RLModuleSpec.from_module(algorithm.get_module("main")),
                    new_agent_to_module_mapping_fn=mapping,
                    new_should_module_be_updated=["main"],
                )
                state = algorithm.learner_group.get_state(components="learner/rl_module/main")
                main_state = state["learner"]["rl_module"]["main"]
                algorithm.set_state({"learner_group": {"learner": {"rl_module": {new_id: main_state}}}})
            else:  # policystore: one snapshot per node, read-only views in every EnvRunner
                add_frozen(algorithm, new_id, "main", new_agent_to_module_mapping_fn=mapping)
            if len(self.frozen) > self.max_frozen:
                old_id = self.frozen.pop(0)
                if self.stock:  # stock: drop it from the Learner and every EnvRunner
                    algorithm.remove_module(old_id, new_agent_to_module_mapping_fn=mapping,
                                            new_should_module_be_updated=["main"])
                else:  # policystore: drop it from every EnvRunner; the store deletes its snapshot
                    remove_frozen(algorithm, old_id, new_agent_to_module_mapping_fn=mapping)
            log.info("iter %d: main wins %.2f -> %s joins; league %s", algorithm.iteration, win_rate, new_id,
                     ["random", *self.frozen])
        result["league"] = ["random", *self.frozen]
        self.history.append({"iteration": algorithm.iteration, "main_win_rate": win_rate, "league": result["league"]})


def league_of(algorithm: Any) -> NimLeague:
    """The NimLeague callback of a built Algorithm."""
    callbacks = algorithm.callbacks if isinstance(algorithm.callbacks, list) else [algorithm.callbacks]
    return next(c for c in callbacks if isinstance(c, NimLeague))


def build_config(args: argparse.Namespace) -> PPOConfig:
    config = (
        PPOConfig()
        .environment(Nim)  # the class itself: no registry entry to lose in a new Ray session
        .callbacks(functools.partial(NimLeague, win_rate_threshold=args.win_rate_threshold,
                                     max_frozen=args.max_frozen, stock=args.stock))
        .env_runners(num_env_runners=args.env_runners, num_cpus_per_env_runner=0.1, rollout_fragment_length="auto")
        .learners(num_learners=0)
        .training(train_batch_size_per_learner=args.batch, minibatch_size=min(128, args.batch), num_epochs=4,
                  lr=1e-3)
        .multi_agent(policies={"main", "random"}, policy_mapping_fn=league_mapping(["random"]),
                     policies_to_train=["main"])
        .rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs={
            "main": RLModuleSpec(model_config=DefaultModelConfig(fcnet_hiddens=[args.hidden, args.hidden])),
            "random": RLModuleSpec(module_class=RandomRLModule),
        }))
        .debugging(seed=args.seed, log_level="ERROR")
    )
    return config if args.stock else with_policystore(config)  # policystore: SharedEnvRunner + callback


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--iters", type=int, default=30, help="training iterations")
    parser.add_argument("--win-rate-threshold", type=float, default=0.7,
                        help="main's win rate over its last games at which a frozen copy joins the league")
    parser.add_argument("--max-frozen", type=int, default=4, help="frozen copies kept in the league")
    parser.add_argument("--env-runners", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64, help="width of the two hidden layers")
    parser.add_argument("--batch", type=int, default=1000, help="train batch size (env steps)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stock", action="store_true", help="RLlib's add_module/remove_module, no store")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Train ``args.iters`` iterations in the running Ray session; the league after each one."""
    algorithm = build_config(args).build_algo()
    try:
        for _ in range(args.iters):
            algorithm.train()
        return league_of(algorithm).history
    finally:
        algorithm.stop()


def main(argv: Sequence[str] | None = None) -> None:
    import ray

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ray.init(address="local", include_dashboard=False, logging_level="warning")
    try:
        history = run(args)
    finally:
        ray.shutdown()
    log.info("main's win rate by iteration: %s", [round(float(h["main_win_rate"]), 2) for h in history])


if __name__ == "__main__":
    main()
