"""RLlib's metrics records of a module id, forgotten when the league drops the module."""

from __future__ import annotations

from typing import Any

from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    EPISODE_MODULE_RETURN_MEAN,
    EVALUATION_RESULTS,
    LEARNER_RESULTS,
    NUM_MODULE_STEPS_SAMPLED,
    NUM_MODULE_STEPS_SAMPLED_LIFETIME,
)

SAMPLED = (NUM_MODULE_STEPS_SAMPLED, NUM_MODULE_STEPS_SAMPLED_LIFETIME, EPISODE_MODULE_RETURN_MEAN)


def forget_module(metrics: Any, module_id: str, *, algorithm: bool = False) -> None:
    """Drop what ``metrics`` records of ``module_id``: an EnvRunner's sampling records, or (``algorithm``) the
    Algorithm's merged copies of them and its Learner results for the module.

    RLlib keeps these for every module id ever played, lifetime counters included, and reports all of them in every
    result (``remove_module`` leaves them too): a league that drops an opponent every iteration would carry every
    opponent it ever had, in memory and in each ``train()`` result.
    """
    prefixes = [(ENV_RUNNER_RESULTS,), (EVALUATION_RESULTS, ENV_RUNNER_RESULTS)] if algorithm else [()]
    for prefix in prefixes:
        for key in SAMPLED:
            metrics.delete(*prefix, key, module_id, key_error=False)
    if algorithm:
        metrics.delete(LEARNER_RESULTS, module_id, key_error=False)
