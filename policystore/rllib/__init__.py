"""RLlib adapter (new API stack, Ray 2.60): league-frozen modules as zero-copy views into the node store.

A league of PPO on two-agent CartPole, ``main`` against frozen copies of itself (the lines that differ from stock
RLlib are marked)::

    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

    from policystore.rllib import add_frozen, remove_frozen, with_policystore


    def plays(opponent):  # agent 0 plays "main", agent 1 plays ``opponent``
        return lambda agent_id, episode, **kwargs: "main" if agent_id == 0 else opponent


    config = with_policystore(  # policystore: SharedEnvRunner + PolicyStoreCallback
        PPOConfig()
        .environment(MultiAgentCartPole, env_config={"num_agents": 2})
        .env_runners(num_env_runners=1)
        .training(train_batch_size_per_learner=256, minibatch_size=64, num_epochs=1)
        .multi_agent(policies={"main", "random"}, policy_mapping_fn=plays("random"), policies_to_train=["main"])
    )
    algorithm = config.build_algo()
    for i in range(1, 4):
        algorithm.train()
        # policystore: instead of algorithm.add_module(...) + algorithm.set_state(...)
        add_frozen(algorithm, f"main_{i}", "main", new_agent_to_module_mapping_fn=plays(f"main_{i}"))
        if i > 2:  # policystore: instead of algorithm.remove_module(...); the store deletes the snapshot
            remove_frozen(algorithm, f"main_{i - 2}")
    algorithm.train()
    algorithm.stop()  # also removes the league's store and its disk tier

See docs/rllib.md for what is guaranteed and the known limits.
"""

from ..extras import needs

with needs("rllib", "policystore.rllib"):
    import ray.rllib  # noqa: F401  (ray[rllib]'s own dependencies: dm-tree, gymnasium, pandas, ...)

from .callback import PolicyStoreCallback
from .connectors import DropModulesNotOnLearner
from .env_runner import SharedEnvRunner, SharedModulesMixin
from .league import (
    NotFrozenError,
    add_frozen,
    frozen_modules,
    league_name,
    league_store,
    remove_frozen,
    set_matchmaking,
)
from .registry import LeagueError
from .settings import NotSetUpError
from .setup import with_policystore

__all__ = [
    "DropModulesNotOnLearner",
    "LeagueError",
    "NotFrozenError",
    "NotSetUpError",
    "PolicyStoreCallback",
    "SharedEnvRunner",
    "SharedModulesMixin",
    "add_frozen",
    "frozen_modules",
    "league_name",
    "league_store",
    "remove_frozen",
    "set_matchmaking",
    "with_policystore",
]
