"""PolicyStoreCallback: carries the league settings into every RLlib process and fits RLlib around them."""

from __future__ import annotations

import logging
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback

from . import connectors
from .env_runner import check_env_runner_cls, sync_all
from .settings import DEFAULT_LEAGUE, LeagueSettings

logger = logging.getLogger(__name__)


class PolicyStoreCallback(LeagueSettings, RLlibCallback):
    """Carries the league name and store settings to every process RLlib builds (driver, EnvRunners).

    RLlib instantiates callbacks in each EnvRunner from the config, so these settings also reach an EnvRunner
    that Ray restarts. On the driver it adds the learner-connector piece that keeps frozen modules off the
    Learners' batches, and after a checkpoint is loaded it makes every EnvRunner re-attach the restored
    league.
    """

    def __init__(self, league: str = DEFAULT_LEAGUE, store_config: Any = None) -> None:
        RLlibCallback.__init__(self)
        LeagueSettings.__init__(self, league, store_config)

    def on_algorithm_init(self, *, algorithm: Any, **kwargs: Any) -> None:
        check_env_runner_cls(algorithm.config.env_runner_cls)
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
