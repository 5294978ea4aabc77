"""RLlib adapter (new API stack, Ray 2.60): league-frozen modules as zero-copy views into the node store.

The lines a user changes::

    config = with_policystore(PPOConfig()...)   # SharedEnvRunner + PolicyStoreCallback
    # instead of algorithm.add_module(...) + algorithm.set_state(...):
    add_frozen(algorithm, "main_3", "main", new_agent_to_module_mapping_fn=fn)
    remove_frozen(algorithm, "main_0")          # instead of algorithm.remove_module(...)

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
