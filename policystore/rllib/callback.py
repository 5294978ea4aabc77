"""PolicyStoreCallback: carries the league settings into every RLlib process and fits RLlib around them."""

from __future__ import annotations

import logging
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback

from . import connectors, faults, registry
from .env_runner import check_env_runner_cls, sync_all
from .registry import LeagueError
from .settings import LeagueSettings

logger = logging.getLogger(__name__)


class PolicyStoreCallback(LeagueSettings, RLlibCallback):
    """Carries the league name and store settings to every process RLlib builds (driver, EnvRunners).

    RLlib instantiates callbacks in each EnvRunner from the config, so these settings also reach an EnvRunner
    that Ray restarts. On the driver it names an automatic league after the Algorithm, adds the
    learner-connector piece that keeps frozen modules off the Learners' batches, makes every EnvRunner
    re-attach a restored league, and raises the LeagueError a remote EnvRunner reported from ``train()``.
    """

    def __init__(self, league: str | None = None, store_config: Any = None) -> None:
        RLlibCallback.__init__(self)
        LeagueSettings.__init__(self, league, store_config)

    def on_algorithm_init(self, *, algorithm: Any, **kwargs: Any) -> None:
        check_env_runner_cls(algorithm.config.env_runner_cls)
        self.bind(algorithm.logdir)  # the name every EnvRunner of this Algorithm derived from the same folder
        if algorithm.env_runner is None:
            logger.warning(
                "no local EnvRunner (create_local_env_runner=False): checkpoints will not contain the frozen "
                "modules of league %r", self.league
            )
        else:
            algorithm.env_runner.set_owner(algorithm)
        self.store()
        faults.report_from_driver(algorithm.logdir)
        algorithm.learner_group.foreach_learner(
            lambda learner: connectors.install(learner._learner_connector)
        )
        if not self.explicit_league and registry.read(self.league).version:
            # An automatic league is this Algorithm's alone; a state left under its name (a Tune trial that
            # failed and is started again in the same trial folder) is not this Algorithm's league.
            registry.replace(self.league, {}, algorithm.config.policy_mapping_fn, algorithm.config.policies_to_train)
            sync_all(algorithm)

    def on_checkpoint_loaded(self, *, algorithm: Any, **kwargs: Any) -> None:
        sync_all(algorithm)

    def on_env_runners_recreated(self, *, algorithm: Any, env_runner_group: Any, **kwargs: Any) -> None:
        env_runner_group.foreach_env_runner(lambda runner: runner.sync_league(), local_env_runner=False)

    def on_train_result(self, *, algorithm: Any, result: dict, **kwargs: Any) -> None:
        faults.report(algorithm.logdir)
        message = registry.take_error(self.league)
        if message is not None:
            raise LeagueError(message)
