"""PolicyStoreCallback: names the league, connects the node stores, fits RLlib around store-backed modules."""

from __future__ import annotations

import logging
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback

import policystore

from . import connectors

logger = logging.getLogger(__name__)

DEFAULT_LEAGUE = "default"


class PolicyStoreCallback(RLlibCallback):
    """Carries the league name and store settings to every process RLlib builds (driver, EnvRunners).

    RLlib instantiates callbacks in each EnvRunner from the config, so these settings also reach an EnvRunner
    that Ray restarts. On the driver it adds the learner-connector piece that keeps frozen modules off the
    Learners' batches, and after a checkpoint is loaded it makes every EnvRunner re-attach the restored
    league.
    """

    def __init__(self, league: str = DEFAULT_LEAGUE, store_config: Any = None) -> None:
        super().__init__()
        self.league = league
        self.store_config = store_config
        self._store = None

    def store(self) -> Any:
        """This node's PolicyStore client (started if missing), cached per process."""
        if self._store is None:
            self._store = policystore.connect(self.store_config)
        return self._store

    def on_algorithm_init(self, *, algorithm: Any, **kwargs: Any) -> None:
        from .env_runner import SharedModulesMixin

        if not issubclass(algorithm.config.env_runner_cls or object, SharedModulesMixin):
            raise TypeError(
                "PolicyStoreCallback needs an EnvRunner with policystore.rllib.SharedModulesMixin "
                f"(config.env_runners(env_runner_cls=SharedEnvRunner)); got {algorithm.config.env_runner_cls}"
            )
        if algorithm.env_runner is None:
            logger.warning(
                "no local EnvRunner (create_local_env_runner=False): checkpoints will not contain the frozen "
                "modules of league %r", self.league
            )
        self.store()
        algorithm.learner_group.foreach_learner(
            lambda learner: connectors.install(learner._learner_connector)
        )

    def on_checkpoint_loaded(self, *, algorithm: Any, **kwargs: Any) -> None:
        sync_all(algorithm)

    def on_env_runners_recreated(self, *, algorithm: Any, env_runner_group: Any, **kwargs: Any) -> None:
        env_runner_group.foreach_env_runner(lambda runner: runner.sync_league(), local_env_runner=False)


def settings_of(algorithm: Any) -> PolicyStoreCallback:
    """The PolicyStoreCallback instance of a built Algorithm (clear error if the config lacks it)."""
    callbacks = algorithm.callbacks if isinstance(algorithm.callbacks, list) else [algorithm.callbacks]
    for callback in callbacks:
        if isinstance(callback, PolicyStoreCallback):
            return callback
    raise TypeError(
        "this Algorithm was built without policystore.rllib.PolicyStoreCallback; build its config with "
        "policystore.rllib.with_policystore(config)"
    )


def sync_all(algorithm: Any) -> None:
    """Make every (training and evaluation) EnvRunner match the league now, not at its next sample."""
    for group in (algorithm.env_runner_group, algorithm.eval_env_runner_group):
        if group is not None:
            group.foreach_env_runner(lambda runner: runner.sync_league(), local_env_runner=True)
