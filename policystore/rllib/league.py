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

from ..errors import PolicyStoreError, UnknownPolicyError
from ..ids import SnapshotId
from . import registry
from .env_runner import sync_all, update_algorithm_config
from .matchmaking import check_mapping
from .registry import FrozenEntry, LeagueError
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
    durable: bool = False,
    meta: Mapping[str, Any] | None = None,
) -> SnapshotId:
    """Freeze the current weights of ``from_module_id`` as a new league member ``module_id``.

    The weights go to the node store once; every EnvRunner (and Ray-restarted ones later) attaches the
    module as read-only views into it. The new module stays off the Learners unless ``add_to_learners`` (then give a
    ``new_should_module_be_updated`` that excludes it). Re-freezing an existing frozen id points it at the new
    snapshot (same architecture only) and lets go of the old one. ``durable``: the snapshot is written to disk (and
    the durable tier) before this returns, and stays when the league lets go of it. Raises LeagueError, before
    anything changes, for an id of one of RLlib's modules, another architecture under a frozen id, or a mapping
    that names a module the EnvRunners would not hold. Returns the snapshot id.
    """
    settings = settings_of(algorithm)
    validate_module_id(module_id, error=True)
    if module_id == from_module_id:
        raise LeagueError(f"add_frozen: module_id and from_module_id are both {module_id!r}; use a new id")
    source = algorithm.get_module(from_module_id)
    if source is None:
        raise LeagueError(f"add_frozen: no module {from_module_id!r} in this Algorithm (known: {_modules(algorithm)})")
    old = registry.read(settings.league)
    spec = dataclasses.replace(RLModuleSpec.from_module(source), inference_only=True, load_state_path=None)
    _check_frozen_id(algorithm, old, module_id, from_module_id, spec)
    weights = _inference_weights(algorithm, from_module_id, source, spec)
    pending = FrozenEntry(SnapshotId(f"{settings.league}.{module_id}", 1), spec, add_to_learners, durable)
    check_mapping(algorithm, registry.changed(old, {module_id: pending}, mapping_fn=new_agent_to_module_mapping_fn))
    snapshot = settings.store().publish(
        f"{settings.league}.{module_id}",
        weights,
        meta={"league": settings.league, "module_id": module_id, "from_module_id": from_module_id,
              "iteration": int(algorithm.iteration), **(meta or {})},
        durable=durable,
    )
    if add_to_learners:
        _add_to_learners(algorithm, module_id, from_module_id, source, new_should_module_be_updated)
    replaced = old.frozen.get(module_id)
    _change_league(algorithm, settings, new_agent_to_module_mapping_fn, new_should_module_be_updated,
                   add={module_id: FrozenEntry(snapshot, spec, add_to_learners, durable)},
                   keep=[replaced.snapshot] if replaced is not None and replaced.durable else [])
    if replaced is not None:
        _let_go(settings, replaced)
    return snapshot


def remove_frozen(
    algorithm: Any,
    module_id: str,
    *,
    new_agent_to_module_mapping_fn: Callable[..., str] | None = None,
    new_should_module_be_updated: Any = None,
    keep: bool = False,
) -> None:
    """Take a frozen module out of the league (all EnvRunners drop it; episodes restart as in remove_module).

    The league lets go of its snapshot: once every EnvRunner has dropped the module, the store deletes it (memory
    and disk tier) unless it was frozen ``durable`` or ``keep`` is given (league history, payoff tables: it then
    stays listed in the store, and with the job's end as well).
    """
    settings = settings_of(algorithm)
    old = registry.read(settings.league)
    entry = old.frozen.get(module_id)
    if entry is None:
        raise NotFrozenError(
            f"remove_frozen: {module_id!r} is not a frozen module of league {settings.league!r}"
        )
    check_mapping(algorithm, registry.changed(old, remove=[module_id], mapping_fn=new_agent_to_module_mapping_fn))
    if entry.on_learners:
        algorithm.learner_group.remove_module(module_id, new_should_module_be_updated=new_should_module_be_updated)
    _change_league(algorithm, settings, new_agent_to_module_mapping_fn, new_should_module_be_updated,
                   remove=[module_id], keep=[entry.snapshot] if keep or entry.durable else [])
    if not keep:
        _let_go(settings, entry)


def set_matchmaking(
    algorithm: Any,
    new_agent_to_module_mapping_fn: Callable[..., str] | None = None,
    new_should_module_be_updated: Any = None,
) -> None:
    """Change the matchmaking (and trainable set) of the league without adding or removing a module.

    Use it after RLlib's own ``add_module``/``remove_module`` (e.g. for a trainable copy): EnvRunners take
    their mapping function from the league, so a mapping set only through RLlib would be replaced by the
    league's at the next league change, and a restarted EnvRunner would not see it at all. A mapping that names a
    module the EnvRunners would not hold raises LeagueError here, and the league stays as it was.
    """
    settings = settings_of(algorithm)
    old = registry.read(settings.league)
    check_mapping(algorithm, registry.changed(old, mapping_fn=new_agent_to_module_mapping_fn))
    _change_league(algorithm, settings, new_agent_to_module_mapping_fn, new_should_module_be_updated)


def _change_league(algorithm: Any, settings: LeagueSettings, mapping_fn: Callable[..., str] | None,
                   should_update: Any, **change: Any) -> None:
    """Record a change of the league (frozen modules added or removed, matchmaking) in its registry, then bring the
    driver's config and every EnvRunner in line with it now (a mapping or trainable set of None keeps the current
    one)."""
    state = registry.changed(registry.read(settings.league), mapping_fn=mapping_fn, policies_to_train=should_update,
                             **change)
    registry.write(settings.league, state)
    update_algorithm_config(algorithm, mapping_fn, should_update)
    sync_all(algorithm)


def _let_go(settings: LeagueSettings, entry: FrozenEntry) -> None:
    """The league no longer plays ``entry`` (every EnvRunner has dropped it): delete its snapshot from the store,
    memory and disk, unless it is durable. Views a process still holds stay valid until it lets go of them."""
    if entry.durable:
        return
    try:
        settings.store().delete(entry.snapshot.policy_id, version=entry.snapshot.version)
    except UnknownPolicyError:
        pass  # already gone (deleted by hand, or a restore re-published the module under a new version)


def _check_frozen_id(algorithm: Any, league: registry.LeagueState, module_id: str, from_module_id: str,
                     spec: RLModuleSpec) -> None:
    """Refuse a frozen id that names one of RLlib's own modules, or a frozen module of another architecture."""
    frozen = league.frozen.get(module_id)
    if frozen is None:
        if algorithm.get_module(module_id) is not None:
            raise LeagueError(
                f"add_frozen: {module_id!r} is one of this Algorithm's RLlib modules (trained or not), not a frozen "
                f"league member: EnvRunners would play the frozen copy while the Learner trains its own under that "
                f"name; freeze under a new id (or take it out first with algorithm.remove_module({module_id!r}))"
            )
        return
    old, new = _architecture(frozen.spec), _architecture(spec)
    if old != new:
        differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise LeagueError(
            f"add_frozen: frozen module {module_id!r} has another architecture than {from_module_id!r} (they differ "
            f"in {differ[:4]}); freeze it under a new id, or remove_frozen({module_id!r}) first"
        )


def _architecture(spec: RLModuleSpec) -> dict[str, Any]:
    """The module class and each inference weight's shape and dtype (built on the meta device: no memory)."""
    with torch.device("meta"):
        module = spec.build()
    return {"class": type(module).__qualname__,
            **{k: (tuple(v.shape), str(v.dtype)) for k, v in module.state_dict().items()}}


def _modules(algorithm: Any) -> list[str]:
    return sorted(algorithm.env_runner.module.keys()) if algorithm.env_runner is not None else []


def frozen_modules(algorithm: Any) -> dict[str, SnapshotId]:
    """The league's frozen module ids and the snapshots they are views of."""
    return {mid: e.snapshot for mid, e in registry.read(settings_of(algorithm).league).frozen.items()}


def league_store(algorithm: Any) -> LeagueStore:
    """This node's store of the Algorithm's league (``list``, ``stats``, ``verify``; its disk tier in ``stats()``)."""
    settings = settings_of(algorithm)
    return LeagueStore(settings.store(), settings.league)


class LeagueStore:
    """The league's store client as ``league_store`` hands it out: every call is the client's, but ``publish``
    refuses weights under a frozen module's policy id that its module could not load (the league plays the
    snapshot it froze and would never show them; a user meaning to replace the module re-freezes it)."""

    def __init__(self, client: Any, league: str) -> None:
        self._client, self._league = client, league

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def publish(self, policy_id: str, weights: Mapping[str, Any], meta: Mapping[str, Any] | None = None, *,
                durable: bool = False) -> SnapshotId:
        prefix = f"{self._league}."
        module_id = policy_id[len(prefix):] if policy_id.startswith(prefix) else None
        entry = registry.read(self._league).frozen.get(module_id) if module_id else None
        if entry is not None:
            want = {k: v for k, v in _architecture(entry.spec).items() if k != "class"}
            got = {k: _shape_dtype(v) for k, v in weights.items()}
            if got != want:
                differ = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
                raise LeagueError(
                    f"publish: {policy_id!r} is frozen module {module_id!r} of league {self._league!r}, and these "
                    f"weights do not fit its architecture (they differ in {differ[:4]}); publish under another id, "
                    f"or freeze them as a league member with add_frozen(algorithm, <new id>, <module>)"
                )
        return self._client.publish(policy_id, weights, meta, durable=durable)


def _shape_dtype(value: Any) -> tuple[tuple[int, ...], str]:
    """A weight's shape and dtype as torch names it (what ``_architecture`` compares)."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), str(value.dtype)
    array = np.asarray(value)
    try:
        return tuple(array.shape), str(torch.from_numpy(np.empty(0, array.dtype)).dtype)
    except TypeError:  # a dtype torch lacks: it fits no module (the store's own checks name it)
        return tuple(array.shape), str(array.dtype)


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
        raise LeagueError(f"add_frozen: {from_module_id!r} lacks weights {missing} of its inference module")
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
