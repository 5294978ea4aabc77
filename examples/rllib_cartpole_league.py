"""The smallest league: PPO on two-agent CartPole, ``main`` against frozen copies of itself, stock or store.

Agent 0 plays the trained ``main``; agent 1 plays an opponent: ``main_v0`` (trained, but never updated: it is not in
``policies_to_train``) until copies are frozen, then the frozen copies in turn. The tests and benchmarks of
``policystore.rllib`` build on this config; run it to see the two ways of freezing side by side:

    python -m examples.rllib_cartpole_league --frozen 4            # policystore.rllib.add_frozen
    python -m examples.rllib_cartpole_league --frozen 4 --stock    # RLlib's add_module + set_state
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from typing import Any

from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

log = logging.getLogger("cartpole_league")


class TwoAgentCartPole(MultiAgentCartPole):
    """Two independent CartPoles, agents 0 and 1 (a class, so no env registry entry is needed in any session)."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__({"num_agents": 2})


def ppo_config(*, env_runners: int = 2, hidden: int = 16, store: bool = True, league: str | None = None) -> PPOConfig:
    """PPO on two-agent CartPole: agent 0 plays the trained ``main``, agent 1 its opponent (``main_v0`` at first).

    ``store`` adds policystore (SharedEnvRunner + PolicyStoreCallback); otherwise it is stock RLlib. Hidden widths
    of 256 and more get two layers (1024: a 4.0 MiB inference module), smaller ones one.
    """
    model = DefaultModelConfig(fcnet_hiddens=[hidden, hidden] if hidden >= 256 else [hidden])
    config = (
        PPOConfig()
        .environment(TwoAgentCartPole)
        .env_runners(num_env_runners=env_runners, num_cpus_per_env_runner=0.1, rollout_fragment_length="auto")
        .learners(num_learners=0)
        .training(train_batch_size_per_learner=400, minibatch_size=100, num_epochs=8, lr=3e-3)
        .fault_tolerance(restart_failed_env_runners=True, delay_between_env_runner_restarts_s=0.0)
        .multi_agent(policies={"main", "main_v0"}, policy_mapping_fn=first_mapping, policies_to_train=["main"])
        .rl_module(
            rl_module_spec=MultiRLModuleSpec(
                rl_module_specs={m: RLModuleSpec(model_config=model) for m in ("main", "main_v0")}
            )
        )
        .debugging(seed=0, log_level="ERROR")
    )
    if store:
        from policystore.rllib import with_policystore

        config = with_policystore(config, league=league)
    return config


def first_mapping(agent_id: Any, episode: Any, **kwargs: Any) -> str:
    return "main" if agent_id == 0 else "main_v0"


def opponent_mapping(opponent: str):
    """Matchmaking after a freeze: agent 1 plays ``opponent`` (a plain function: Ray ships it by value)."""

    def mapping(agent_id: Any, episode: Any, **kwargs: Any) -> str:
        return "main" if agent_id == 0 else opponent

    return mapping


def round_robin_mapping(opponents: Sequence[str]):
    """Agent 1 plays each of ``opponents`` in turn, one per episode, so K episodes play all K of them."""
    opponents, episodes = list(opponents), [0]

    def mapping(agent_id: Any, episode: Any, **kwargs: Any) -> str:
        if agent_id == 0:
            return "main"
        episodes[0] += 1  # RLlib maps each agent once per episode; each process counts its own episodes
        return opponents[episodes[0] % len(opponents)]

    return mapping


def freeze(algorithm: Any, module_id: str, mapping: Any, *, stock: bool) -> None:
    """Freeze a copy of ``main`` as ``module_id``, agent 1 then matched by ``mapping``.

    Stock: how RLlib's own league example does it (a module on the Learner and in every EnvRunner, then the
    weights through ``set_state``). Store: ``add_frozen`` (one snapshot per node, views in every EnvRunner).
    """
    if stock:
        algorithm.add_module(
            module_id=module_id,
            module_spec=RLModuleSpec.from_module(algorithm.get_module("main")),
            new_agent_to_module_mapping_fn=mapping,
        )
        state = algorithm.learner_group.get_state(components="learner/rl_module/main")["learner"]["rl_module"]
        algorithm.set_state({"learner_group": {"learner": {"rl_module": {module_id: state["main"]}}}})
    else:
        from policystore.rllib import add_frozen

        add_frozen(algorithm, module_id, "main", new_agent_to_module_mapping_fn=mapping)


def unfreeze(algorithm: Any, module_id: str, mapping: Any, *, stock: bool) -> None:
    """Take frozen ``module_id`` out of the league, agent 1 then matched by ``mapping``.

    Stock: RLlib's ``remove_module`` (off the Learner and every EnvRunner). Store: ``remove_frozen`` (off every
    EnvRunner; the store deletes the snapshot).
    """
    if stock:
        algorithm.remove_module(module_id, new_agent_to_module_mapping_fn=mapping)
    else:
        from policystore.rllib import remove_frozen

        remove_frozen(algorithm, module_id, new_agent_to_module_mapping_fn=mapping)


def main(argv: Sequence[str] | None = None) -> None:
    import ray

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frozen", type=int, default=4, help="frozen copies of main to add, one per iteration")
    parser.add_argument("--env-runners", type=int, default=2)
    parser.add_argument("--stock", action="store_true", help="RLlib's add_module + set_state instead of the store")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ray.init(address="local", include_dashboard=False, logging_level="warning")
    try:
        algorithm = ppo_config(env_runners=args.env_runners, store=not args.stock).build_algo()
        frozen: list[str] = []
        for i in range(1, args.frozen + 1):
            result = algorithm.train()
            frozen.append(f"main_v{i}")
            freeze(algorithm, frozen[-1], round_robin_mapping(frozen), stock=args.stock)
            log.info("iter %d: main's return %.1f; frozen %s", algorithm.iteration,
                     result["env_runners"]["module_episode_returns_mean"]["main"], frozen)
        algorithm.stop()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
