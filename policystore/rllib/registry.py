"""League state that outlives EnvRunners: which modules are frozen (as which snapshot), and the matchmaking.

Ray restarts a dead EnvRunner from its original config and RLlib does not tell anyone (no
``on_env_runners_recreated`` then), so pushing league changes is not enough: every EnvRunner pulls this state
when it builds its modules, on every ``set_state`` and at the top of every ``sample()``. It lives in the GCS
key-value store of the Ray cluster, not in an actor: an actor would be one more Python process importing RLlib
(about 260 MiB of PSS measured here), more than a whole league of small snapshots. Only ids, specs and the
mapping function are kept here; the weights live in the node stores. The driver is the only writer of the league
state; an EnvRunner only leaves the LeagueError it raised, for the driver to raise from ``train()``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ray import cloudpickle
from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_get, _internal_kv_put
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from ..errors import PolicyStoreError
from ..ids import SnapshotId

_NAMESPACE = "policystore"


class LeagueError(PolicyStoreError, ValueError):
    """The league cannot be played or changed as asked: a mapping to a module the EnvRunners do not hold (refused
    in the driver when the mapping is set; raised from ``train()`` when an EnvRunner meets one, e.g. a frozen module
    whose snapshot could not be attached), or a frozen id that names one of RLlib's modules or another
    architecture. The message names the module and the fix."""


@dataclasses.dataclass(frozen=True)
class FrozenEntry:
    """One frozen module: the snapshot with its weights, and the inference-only spec that builds it."""

    snapshot: SnapshotId
    spec: RLModuleSpec
    on_learners: bool = False
    durable: bool = False  # published durably: kept when the league lets go of it (remove_frozen, the job's end)
    # Checksums of other packings of exactly these tensors (a restore re-publishes a checkpoint's snapshot: same
    # tensors, new pack metadata, new checksum); a process still holding such a packing may use it.
    same_tensors_as: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class LeagueState:
    """What an EnvRunner needs to match the league: ``version`` goes up on every change."""

    version: int = 0
    frozen: Mapping[str, FrozenEntry] = dataclasses.field(default_factory=dict)
    mapping_fn: Callable[..., str] | None = None
    policies_to_train: Any = None
    kept: frozenset[SnapshotId] = frozenset()  # snapshots the league let go of but keeps on purpose


def _keys(league: str) -> tuple[bytes, bytes]:
    return f"rllib.league.{league}".encode(), f"rllib.league.{league}.version".encode()


def read(league: str) -> LeagueState:
    """The league's current state (empty if nothing was ever frozen in it)."""
    raw = _internal_kv_get(_keys(league)[0], namespace=_NAMESPACE)
    return LeagueState() if raw is None else cloudpickle.loads(raw)


def _write(league: str, state: LeagueState) -> LeagueState:
    state_key, version_key = _keys(league)
    _internal_kv_put(state_key, cloudpickle.dumps(state), overwrite=True, namespace=_NAMESPACE)
    _internal_kv_put(version_key, str(state.version).encode(), overwrite=True, namespace=_NAMESPACE)  # last
    return state


def changed(
    old: LeagueState,
    add: Mapping[str, FrozenEntry] | None = None,
    remove: Iterable[str] = (),
    mapping_fn: Callable[..., str] | None = None,
    policies_to_train: Any = None,
    keep: Iterable[SnapshotId] = (),
) -> LeagueState:
    """``old`` with the change applied (not written): what the driver checks before it commits a change."""
    frozen = {mid: e for mid, e in old.frozen.items() if mid not in set(remove)}
    frozen.update(add or {})
    return LeagueState(
        version=old.version + 1,
        frozen=frozen,
        mapping_fn=mapping_fn if mapping_fn is not None else old.mapping_fn,
        policies_to_train=policies_to_train if policies_to_train is not None else old.policies_to_train,
        kept=old.kept | frozenset(keep),
    )


def write(league: str, state: LeagueState) -> LeagueState:
    """Commit a state made by ``changed`` (the driver is the only writer)."""
    return _write(league, state)


def report_error(league: str, message: str) -> None:
    """Leave an EnvRunner's LeagueError for the driver: RLlib's fault tolerance swallows errors raised in
    ``sample()`` on remote EnvRunners (and restarts them, to fail again), so the driver raises it from there."""
    _internal_kv_put(_error_key(league), message.encode(), overwrite=True, namespace=_NAMESPACE)


def take_error(league: str) -> str | None:
    """The league's reported error, if any, now cleared (so a fixed league does not raise it again)."""
    raw = _internal_kv_get(_error_key(league), namespace=_NAMESPACE)
    if raw is not None:
        _internal_kv_del(_error_key(league), namespace=_NAMESPACE)
    return None if raw is None else raw.decode()


def _error_key(league: str) -> bytes:
    return f"rllib.league.{league}.error".encode()


def replace(league: str, frozen: Mapping[str, FrozenEntry], mapping_fn: Any, policies_to_train: Any) -> LeagueState:
    """Set the whole state at once (checkpoint restore); snapshots kept on purpose stay kept."""
    old = read(league)
    return _write(league, LeagueState(old.version + 1, dict(frozen), mapping_fn, policies_to_train, old.kept))


class LeagueFollower:
    """An EnvRunner's side: one small key read per poll, the full state only when its version moved."""

    def __init__(self, league: str) -> None:
        self.league = league
        self.version = 0

    def poll(self) -> LeagueState | None:
        """The league state if it changed since the last ``mark_seen`` (None: unchanged or no league)."""
        raw = _internal_kv_get(_keys(self.league)[1], namespace=_NAMESPACE)
        if raw is None or int(raw) == self.version:
            return None
        return read(self.league)

    def mark_seen(self, state: LeagueState) -> None:
        self.version = state.version
