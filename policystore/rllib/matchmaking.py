"""The driver's check of a league's matchmaking, before any EnvRunner sees it.

A mapping function that names a module the EnvRunners do not hold would fail in every EnvRunner's ``sample()``;
RLlib then stops and restarts them, and ``train()`` returns NaN with no healthy EnvRunner until they are back.
So ``add_frozen``, ``remove_frozen`` and ``set_matchmaking`` first call the new mapping function in the driver,
for every agent of the environment and a few fresh episodes, and refuse the change (LeagueError, nothing
changed) if it names a module that neither RLlib nor the new league holds. A mapping that picks rarely, or
fails on a bare episode, is still checked by every EnvRunner when it samples (env_runner.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from .env_runner import unchecked
from .registry import LeagueError, LeagueState

logger = logging.getLogger(__name__)
EPISODES = 16  # fresh episodes the mapping function is called with, for every agent


def check_mapping(algorithm: Any, state: LeagueState) -> None:
    """Raise LeagueError if ``state``'s mapping function (or the config's) names a module EnvRunners would lack."""
    mapping_fn = unchecked(state.mapping_fn or algorithm.config.policy_mapping_fn)
    held = _rllib_modules(algorithm)
    agents = _agent_ids(algorithm)
    if mapping_fn is None or held is None or not agents:
        return
    playable = held | set(state.frozen)
    for agent_id, module_id in _probe(mapping_fn, agents):
        if module_id not in playable:
            raise LeagueError(
                f"the mapping function maps agent {agent_id!r} to module {module_id!r}, which neither RLlib nor the "
                f"league holds (modules: {sorted(playable)}); nothing was changed. Pass a mapping function that "
                "names only these, or freeze the module first (add_frozen)"
            )


def _probe(mapping_fn: Callable[..., str], agents: list[Any]) -> list[tuple[Any, Any]]:
    """(agent, module) pairs the mapping gives for fresh episodes (fewer if it cannot take a bare episode)."""
    pairs = []
    for _ in range(EPISODES):
        episode = MultiAgentEpisode()
        for agent_id in agents:
            try:
                pairs.append((agent_id, mapping_fn(agent_id, episode)))
            except Exception as exc:  # noqa: BLE001 - a mapping that needs a real episode: the EnvRunners check it
                logger.debug("mapping function not checkable in the driver (%r); EnvRunners check it", exc)
                return pairs
    return pairs


def _rllib_modules(algorithm: Any) -> set[str] | None:
    """RLlib's own (non-frozen) module ids on the EnvRunners (None: no EnvRunner to ask)."""
    runner = algorithm.env_runner
    if runner is not None:
        return set(runner.module.keys()) - set(runner.frozen_modules())
    found = algorithm.env_runner_group.foreach_env_runner(
        lambda r: sorted(set(r.module.keys()) - set(r.frozen_modules())), local_env_runner=False
    )
    return set(found[0]) if found else None


def _agent_ids(algorithm: Any) -> list[Any]:
    """The environment's possible agents, asked once per Algorithm (of the local EnvRunner's env, else a remote
    one's: the driver's local EnvRunner has no env by default)."""
    cached = getattr(algorithm, "_policystore_agents", None)
    if cached is not None:
        return cached
    runner = algorithm.env_runner
    if runner is not None and getattr(runner, "env", None) is not None:
        agents = _possible_agents(runner)
    else:
        found = algorithm.env_runner_group.foreach_env_runner(_possible_agents, local_env_runner=False)
        agents = found[0] if found else []
    algorithm._policystore_agents = agents
    return agents


def _possible_agents(runner: Any) -> list[Any]:
    envs = getattr(runner.env, "envs", None)  # RLlib's vector env of MultiAgentEnvs
    env = (envs[0] if envs else runner.env).unwrapped
    return list(getattr(env, "possible_agents", None) or getattr(env, "agents", None) or [])
