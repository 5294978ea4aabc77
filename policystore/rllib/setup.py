"""with_policystore(config): the one config change that moves frozen league modules into the node stores."""

from __future__ import annotations

import functools
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.utils import force_list

from ..config import StoreConfig, check_league
from ..errors import ConfigError
from .callback import PolicyStoreCallback
from .env_runner import SharedEnvRunner, check_env_runner_cls


def with_policystore(config: Any, *, league: str | None = None, store_config: Any = None) -> Any:
    """Return ``config`` set up for store-backed frozen modules (RLlib is otherwise unchanged).

    Sets ``env_runner_cls`` to SharedEnvRunner (a custom EnvRunner must already mix in SharedModulesMixin) and
    adds a PolicyStoreCallback that names the league. Without ``league`` every Algorithm built or restored from
    the config gets a league of its own (named after its log directory, see settings.py), so two Algorithms
    never share frozen modules by accident; a ``league`` name is fixed and travels in checkpoints: every
    Algorithm built or restored from this config shares that league, on purpose. ``store_config``: the store's
    settings (``spill_dir``, ``durable_uri``, ...); see docs/rllib.md for where the job's disk tier lives.

    Call it after ``config.callbacks(...)``: RLlib's ``callbacks()`` replaces the whole list, PolicyStoreCallback
    included (``build_algo()`` then raises NotSetUpError saying so).
    """
    if league is not None:
        # it also names the league's store; a valid league also makes "<league>.<module_id>" (the name its frozen
        # snapshots are published under) a valid policy id, as far as the league goes
        check_league(league)
    if store_config is not None and not isinstance(store_config, StoreConfig):
        raise ConfigError(f"with_policystore(store_config=...) takes a policystore.StoreConfig, got "
                          f"{type(store_config).__name__}")
    if config.env_runner_cls is None:
        config.env_runners(env_runner_cls=SharedEnvRunner)
    check_env_runner_cls(config.env_runner_cls)
    callbacks = [c for c in force_list(config.callbacks_class) if c is not RLlibCallback]
    if any(isinstance(c, functools.partial) and c.func is PolicyStoreCallback or c is PolicyStoreCallback
           for c in callbacks):
        raise ConfigError("config already has a PolicyStoreCallback; call with_policystore() once per config")
    store_callback = functools.partial(PolicyStoreCallback, league=league, store_config=store_config)
    return config.callbacks(callbacks_class=[*callbacks, store_callback])
