"""Freeze and unfreeze league members: what a league callback calls instead of add_module + set_state."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE
from ray.rllib.core.rl_module import validate_module_id
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from ..errors import PolicyStoreError
from ..ids import SnapshotId
from . import registry
from .env_runner import sync_all, update_algorithm_config
from .registry import FrozenEntry
from .settings import LeagueSettings, find_settings


class NotFrozenError(PolicyStoreError, KeyError):
    """remove_frozen() of a module id that is not a frozen member of the league."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def add_frozen(
    algorithm: Any,
    module_id: str,
    from_module_id: str,
    *,
    new_agent_to_module_mapping_fn: Callable[..., str] | None = None,
    new_should_module_be_updated: Any = None,
    add_to_learners: bool = False,
    meta: Mapping[str, Any] | None = None,
) -> SnapshotId:
    """Freeze the current weights of ``from_module_id`` as a new league member ``module_id``.

    The weights go to the node store once; every EnvRunner (and Ray-restarted ones later) attaches the
    module as read-only views into it. The new module stays off the Learners unless ``add_to_learners`` (then give a
    ``new_should_module_be_updated`` that excludes it). Re-freezing an existing frozen id points it at the new
    snapshot. Returns the snapshot id.
    """
    settings = settings_of(algorithm)
    validate_module_id(module_id, error=True)
    if module_id == from_module_id:
        raise ValueError(f"add_frozen: module_id and from_module_id are both {module_id!r}; use a new id")
    source = algorithm.get_module(from_module_id)
    if source is None:
        known = sorted(algorithm.env_runner.module.keys()) if algorithm.env_runner is not None else []
        raise KeyError(f"add_frozen: no module {from_module_id!r} in this Algorithm (known: {known})")
    spec = dataclasses.replace(RLModuleSpec.from_module(source), inference_only=True, load_state_path=None)
    weights = _inference_weights(algorithm, from_module_id, source, spec)
    snapshot = settings.store().publish(
        f"{settings.league}.{module_id}",
        weights,
        meta={"league": settings.league, "module_id": module_id, "from_module_id": from_module_id,
              "iteration": int(algorithm.iteration), **(meta or {})},
    )
    if add_to_learners:
        _add_to_learners(algorithm, module_id, from_module_id, source, new_should_module_be_updated)
    _change_league(algorithm, settings.league, new_agent_to_module_mapping_fn, new_should_module_be_updated,
                   add={module_id: FrozenEntry(snapshot, spec, add_to_learners)})
    return snapshot


def remove_frozen(
    algorithm: Any,
    module_id: str,
    *,
    new_agent_to_module_mapping_fn: Callable[..., str] | None = None,
    new_should_module_be_updated: Any = None,
    delete_snapshot: bool = False,
) -> None:
    """Take a frozen module out of the league (all EnvRunners drop it; episodes restart as in remove_module).

    The snapshot stays in the store (league history, payoff tables) unless ``delete_snapshot``.
    """
    settings = settings_of(algorithm)
    entry = registry.read(settings.league).frozen.get(module_id)
    if entry is None:
        raise NotFrozenError(
            f"remove_frozen: {module_id!r} is not a frozen module of league {settings.league!r}"
        )
    if entry.on_learners:
        algorithm.learner_group.remove_module(module_id, new_should_module_be_updated=new_should_module_be_updated)
    _change_league(algorithm, settings.league, new_agent_to_module_mapping_fn, new_should_module_be_updated,
                   remove=[module_id])
    if delete_snapshot:
        settings.store().delete(entry.snapshot.policy_id, version=entry.snapshot.version)


def set_matchmaking(
    algorithm: Any,
    new_agent_to_module_mapping_fn: Callable[..., str] | None = None,
    new_should_module_be_updated: Any = None,
) -> None:
    """Change the matchmaking (and trainable set) of the league without adding or removing a module.

    Use it after RLlib's own ``add_module``/``remove_module`` (e.g. for a trainable copy): EnvRunners take
    their mapping function from the league, so a mapping set only through RLlib would be replaced by the
    league's at the next league change, and a restarted EnvRunner would not see it at all.
    """
    _change_league(algorithm, settings_of(algorithm).league, new_agent_to_module_mapping_fn,
                   new_should_module_be_updated)


def _change_league(algorithm: Any, league: str, mapping_fn: Callable[..., str] | None, should_update: Any,
                   **change: Any) -> None:
    """Record a change of the league (frozen modules added or removed, matchmaking) in its registry, then bring the
    driver's config and every EnvRunner in line with it now (a mapping or trainable set of None keeps the current
    one)."""
    registry.update(league, mapping_fn=mapping_fn, policies_to_train=should_update, **change)
    update_algorithm_config(algorithm, mapping_fn, should_update)
    sync_all(algorithm)


def frozen_modules(algorithm: Any) -> dict[str, SnapshotId]:
    """The league's frozen module ids and the snapshots they are views of."""
    return {mid: e.snapshot for mid, e in registry.read(settings_of(algorithm).league).frozen.items()}


def league_name(algorithm: Any) -> str:
    """The league of this Algorithm: ``with_policystore``'s ``league``, or the Algorithm's own automatic one."""
    return settings_of(algorithm).league


def settings_of(algorithm: Any) -> LeagueSettings:
    """The league settings of a built Algorithm (NotSetUpError if its config lacks PolicyStoreCallback)."""
    return find_settings(algorithm.callbacks, "this Algorithm")


def _inference_weights(
    algorithm: Any, from_module_id: str, source: Any, spec: RLModuleSpec
) -> dict[str, np.ndarray]:
    """The trained weights of ``from_module_id`` (the Learner's if it has it), cut to the inference keys."""
    state = algorithm.learner_group.get_state(
        components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}/{from_module_id}", inference_only=True
    )
    weights = state.get(COMPONENT_LEARNER, {}).get(COMPONENT_RL_MODULE, {}).get(from_module_id)
    if weights is None:  # not on the Learners (e.g. a frozen or scripted module): take the EnvRunner's
        weights = source.get_state()
    with torch.device("meta"):
        keys = spec.build().state_dict().keys()
    missing = sorted(set(keys) - set(weights))
    if missing:
        raise ValueError(f"add_frozen: {from_module_id!r} lacks weights {missing} of its inference module")
    return {k: np.ascontiguousarray(weights[k]) for k in keys}


def _add_to_learners(
    algorithm: Any, module_id: str, from_module_id: str, source: Any, should_update: Any
) -> None:
    full = dataclasses.replace(RLModuleSpec.from_module(source), inference_only=False, load_state_path=None)
    algorithm.learner_group.add_module(
        module_id=module_id, module_spec=full, new_should_module_be_updated=should_update
    )
    state = algorithm.learner_group.get_state(
        components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}/{from_module_id}"
    )
    module_state = state[COMPONENT_LEARNER][COMPONENT_RL_MODULE][from_module_id]
    algorithm.learner_group.set_state({COMPONENT_LEARNER: {COMPONENT_RL_MODULE: {module_id: module_state}}})
