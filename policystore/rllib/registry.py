"""League state that outlives EnvRunners: which modules are frozen (as which snapshot), and the matchmaking.

Ray restarts a dead EnvRunner from its original config and RLlib does not tell anyone (no
``on_env_runners_recreated`` then), so pushing league changes is not enough: every EnvRunner pulls this state
from a small named actor, the league registry, when it builds its modules and at the top of every
``sample()``.
The registry only holds ids, specs and the mapping function; the weights live in the node stores.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import ray
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from ..ids import SnapshotId

_REGISTRY_PREFIX = "policystore.rllib.league."


@dataclasses.dataclass(frozen=True)
class FrozenEntry:
    """One frozen module: the snapshot with its weights, and the inference-only spec that builds it."""

    snapshot: SnapshotId
    spec: RLModuleSpec
    on_learners: bool = False


@dataclasses.dataclass(frozen=True)
class LeagueState:
    """What an EnvRunner needs to match the league: bumped ``version`` on every change."""

    version: int = 0
    frozen: Mapping[str, FrozenEntry] = dataclasses.field(default_factory=dict)
    mapping_fn: Callable[..., str] | None = None
    policies_to_train: Any = None


@ray.remote(num_cpus=0)
class LeagueRegistry:
    """The single source of truth for one league's frozen set and matchmaking (a named actor)."""

    def __init__(self) -> None:
        self._state = LeagueState()

    def pull(self, known_version: int) -> LeagueState | None:
        """The current state, or None when the caller is already at this version (cheap poll)."""
        return None if known_version == self._state.version else self._state

    def update(
        self,
        add: Mapping[str, FrozenEntry] | None = None,
        remove: Iterable[str] = (),
        mapping_fn: Callable[..., str] | None = None,
        policies_to_train: Any = None,
    ) -> LeagueState:
        """Add/remove frozen modules; a mapping function or trainable set of None keeps the current one."""
        frozen = dict(self._state.frozen)
        for module_id in remove:
            frozen.pop(module_id, None)
        frozen.update(add or {})
        self._state = LeagueState(
            version=self._state.version + 1,
            frozen=frozen,
            mapping_fn=mapping_fn if mapping_fn is not None else self._state.mapping_fn,
            policies_to_train=(
                policies_to_train if policies_to_train is not None else self._state.policies_to_train
            ),
        )
        return self._state

    def replace(
        self, frozen: Mapping[str, FrozenEntry], mapping_fn: Any, policies_to_train: Any
    ) -> LeagueState:
        """Set the whole state at once (checkpoint restore)."""
        self._state = LeagueState(self._state.version + 1, dict(frozen), mapping_fn, policies_to_train)
        return self._state


def registry_name(league: str) -> str:
    return _REGISTRY_PREFIX + league


def get_registry(league: str, *, create: bool = False) -> ray.actor.ActorHandle | None:
    """This league's registry; with ``create`` it is started if missing (call from the driver: its owner).

    Without ``create`` a missing registry means no frozen module was ever added: None.
    """
    if create:
        return LeagueRegistry.options(name=registry_name(league), get_if_exists=True).remote()
    try:
        return ray.get_actor(registry_name(league))
    except ValueError:
        return None


class LeagueFollower:
    """An EnvRunner's side of the registry: polls for changes, caching the actor handle once it exists."""

    def __init__(self, league: str) -> None:
        self.league = league
        self.version = 0
        self._registry: ray.actor.ActorHandle | None = None

    def poll(self) -> LeagueState | None:
        """The league state if it changed since the last ``mark_seen`` (None: unchanged or no league)."""
        if self._registry is None:
            self._registry = get_registry(self.league)
            if self._registry is None:
                return None
        try:
            return ray.get(self._registry.pull.remote(self.version))
        except ray.exceptions.RayActorError:
            self._registry = None  # the driver that owned it is gone; a restore will start a new one
            return None

    def mark_seen(self, state: LeagueState) -> None:
        self.version = state.version
