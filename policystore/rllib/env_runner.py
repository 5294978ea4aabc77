"""EnvRunners whose frozen league modules are zero-copy views into the node's PolicyStore.

Every way RLlib writes module weights into an EnvRunner ends in ``EnvRunner.set_state`` (``sync_weights``,
``add_module``/``remove_module``, ``Algorithm.set_state``/``restore_from_path``, ``restore_env_runners``),
and each of them broadcasts the state of every module. Loading that into a module whose parameters are shared
views would overwrite the snapshot for every process on the node, so ``set_state`` here drops the frozen
module ids first. The views themselves also refuse writes (the store's guard), so a path that slipped through
would fail loudly rather than corrupt the league. Sampling forwards of frozen modules run on the store's
read-only fast path (``policystore.views.fast_reads``), where the OS write protection of the pages still holds.
"""

from __future__ import annotations

import functools
import logging
import os
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import ray
import torch
from ray.rllib.core import COMPONENT_RL_MODULE
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner

from .. import remote
from ..errors import CorruptSnapshotError, PolicyStoreError, UnknownPolicyError
from ..ids import SnapshotId
from ..views import fast_reads
from . import checkpoint, faults, registry
from .metrics import forget_module
from .registry import FrozenEntry, LeagueError, LeagueFollower, LeagueState
from .settings import LeagueSettings, NotSetUpError, find_settings

logger = logging.getLogger(__name__)
BROADCAST_S = 600.0  # the longest an EnvRunner waits for the weights RLlib broadcasts by ref


class SharedModulesMixin:
    """Put first in the bases of a MultiAgentEnvRunner subclass: ``class R(SharedModulesMixin, MyBase)``.

    Frozen modules are attached from the league state when the module is built (which also happens when Ray
    restarts a dead EnvRunner) and at the top of every ``sample()``; they are never written by RLlib's syncs.
    """

    _owner: Callable[[], Any] | None = None  # the local EnvRunner's Algorithm (a weakref), set by the callback

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._policystore_log_dir = kwargs.get("log_dir")  # names an automatic league (settings.py)
        super().__init__(*args, **kwargs)

    def make_module(self) -> None:
        super().make_module()
        self._frozen: dict[str, SnapshotId] = {}
        self._unattached: dict[str, str] = {}
        self._league_state = LeagueState()
        self._not_set_up: NotSetUpError | None = None
        try:
            league = self._policystore_settings().league
        except NotSetUpError as exc:
            if not self.worker_index:
                raise  # the driver's local EnvRunner: build_algo() raises it where the mistake was made
            # A remote one: RLlib builds these before the local one, and one that fails to start makes build_algo()
            # fail with an IndexError far from the cause; it starts and refuses to sample instead.
            self._not_set_up = exc
            return
        self._league = LeagueFollower(league)
        self._set_mapping_fn(self.config.policy_mapping_fn)
        self.sync_league()

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        if self._not_set_up is not None:
            raise self._not_set_up
        self.sync_league()
        try:
            return super().sample(*args, **kwargs)
        except LeagueError as exc:
            if self.worker_index:  # remote: RLlib would swallow it; the driver raises it from train()
                registry.report_error(self._league.league, str(exc))
            raise

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Catch up with the league, then RLlib's set_state minus the frozen modules.

        RLlib calls this on every weight sync, restore and recovery, so the league (e.g. one a checkpoint
        restore just replaced) reaches every EnvRunner as soon as RLlib pushes anything, not only at the next
        sample. Modules frozen before or after the catch-up are both left out of the load.
        """
        before = set(self._frozen)
        self.sync_league()
        super().set_state(self._without_frozen(state, before | set(self._frozen)))

    def sync_league(self) -> bool:
        """Attach/detach frozen modules, take the matchmaking from the league; True if it changed."""
        if self._not_set_up is not None:
            return False
        state = self._league.poll()
        if state is None:
            return False
        if self._apply_league(state):
            self._league.mark_seen(state)  # else: poll the same state again at the next sample
        return True

    def frozen_modules(self) -> dict[str, SnapshotId]:
        """Frozen module ids on this EnvRunner and the snapshots they view."""
        return dict(self._frozen)

    def set_owner(self, algorithm: Any) -> None:
        """The Algorithm of this (local) EnvRunner: a restore also puts the checkpoint's matchmaking into its
        config and Learners, which no EnvRunner call of RLlib's reaches; its ``stop()`` ends the job's league."""
        self._owner = weakref.ref(algorithm)

    def stop(self) -> None:
        """RLlib's stop; the local EnvRunner of an Algorithm (``Algorithm.stop()``) also releases the job's store:
        its snapshots (but durable or kept ones), its store actors and its disk tier (settings.py)."""
        super().stop()
        faults.forget(self)
        if self._owner is None or self._not_set_up is not None:
            return
        owner = self._owner()
        if owner is not None:
            faults.stop_reporting(owner.logdir)
        settings = self._policystore_settings()
        state = registry.read(settings.league)
        keep = {e.snapshot for e in state.frozen.values() if e.durable} | set(state.kept)
        try:
            settings.release(keep)
        except PolicyStoreError as exc:  # the job ends either way; say what is left behind
            logger.warning("league %r: the job's store was not released: %s", settings.league, exc)

    def save_to_path(self, path: Any = None, **kwargs: Any) -> str:
        """RLlib's checkpoint (which leaves frozen modules out) plus the frozen snapshots, their specs and the
        matchmaking that names them."""
        self.sync_league()
        path = super().save_to_path(path, **kwargs)
        frozen = {mid: self._league_state.frozen[mid] for mid in self._frozen}
        matchmaking = checkpoint.Matchmaking(unchecked(self.config.policy_mapping_fn), self.config.policies_to_train)
        checkpoint.save(path, frozen, matchmaking, self._policystore_settings().store(), kwargs.get("filesystem"))
        return path

    def restore_from_path(self, path: Any, **kwargs: Any) -> None:
        """Restore RLlib's state, then make the checkpoint's frozen snapshots and matchmaking the league's."""
        super().restore_from_path(path, **kwargs)
        settings = self._policystore_settings()
        restored = checkpoint.load(path, settings, kwargs.get("filesystem"))
        if restored is None:  # a checkpoint written without the store: keep the league as it is
            return
        matchmaking = restored.matchmaking or checkpoint.Matchmaking(
            unchecked(self.config.policy_mapping_fn), self.config.policies_to_train
        )
        registry.replace(settings.league, restored.frozen, matchmaking.mapping_fn, matchmaking.policies_to_train)
        owner = self._owner() if self._owner is not None else None
        if owner is not None:
            update_algorithm_config(owner, matchmaking.mapping_fn, matchmaking.policies_to_train)
        self.sync_league()

    # -- internals -------------------------------------------------------------------------------------------

    def _policystore_settings(self) -> LeagueSettings:
        settings = find_settings(self._callbacks, type(self).__name__)
        settings.bind(self._policystore_log_dir)
        return settings

    def _apply_league(self, state: LeagueState) -> bool:
        """Match ``state``; False if a snapshot is not in the store (yet), to be retried."""
        self._league_state = state
        complete = True
        removed = [mid for mid in self._frozen if mid not in state.frozen]
        owner = self._owner() if self._owner is not None else None
        for module_id in removed:
            self.module.remove_module(module_id, raise_err_if_not_found=False)
            del self._frozen[module_id]
            self._needs_initial_reset = True  # as RLlib's remove_module: no episode may keep a removed module
            forget_module(self.metrics, module_id)
            if owner is not None:  # the driver's local EnvRunner: the Algorithm's merged records too
                forget_module(owner.metrics, module_id, algorithm=True)
        self._unattached = {}
        for module_id, entry in state.frozen.items():
            if self._frozen.get(module_id) != entry.snapshot:
                try:
                    module = self._build_frozen(entry)
                except UnknownPolicyError as exc:  # e.g. deleted while a restore re-publishes it
                    logger.warning("frozen module %r not attached yet: %s", module_id, exc)
                    self._unattached[module_id] = f"its snapshot {entry.snapshot} could not be attached: {exc}"
                    complete = False
                    continue
                self.module.add_module(module_id, module, override=True)
                self._frozen[module_id] = entry.snapshot
        if state.mapping_fn is not None:
            self._set_mapping_fn(state.mapping_fn)
        if state.policies_to_train is not None:
            self.config.multi_agent(policies_to_train=state.policies_to_train)
        faults.watch(self, [(mid, sid, self.module[mid]) for mid, sid in self._frozen.items()],
                     f"EnvRunner {self.worker_index} (pid {os.getpid()})", self._policystore_log_dir)
        return complete

    def _set_mapping_fn(self, mapping_fn: Callable[..., str]) -> None:
        self.config.multi_agent(policy_mapping_fn=_CheckedMapping(unchecked(mapping_fn), weakref.ref(self)))

    def _unplayable(self, agent_id: Any, module_id: Any) -> LeagueError:
        """The error for a mapping to a module this EnvRunner does not hold: which module, which league, why."""
        league = self._league.league
        if module_id in self._unattached:
            why = f"a frozen module of the league, but {self._unattached[module_id]}"
        elif module_id in self._league_state.frozen:
            why = "a frozen module of the league that this EnvRunner has not attached"
        else:
            why = "neither a frozen module of the league nor one of RLlib's modules here (the mapping function "
            why += "names a module the league does not have, e.g. one a restore or remove_frozen took out)"
        return LeagueError(
            f"league {league!r}: EnvRunner {self.worker_index} cannot play agent {agent_id!r}: the mapping function "
            f"maps it to module {module_id!r}, {why}; modules here: {sorted(self.module.keys())}"
        )

    def _build_frozen(self, entry: FrozenEntry) -> torch.nn.Module:
        store = self._policystore_settings().store()
        snapshot = entry.snapshot
        held = store.get(snapshot.policy_id, version=snapshot.version)
        _check_listed(store, held, entry.same_tensors_as)
        if self._device is None or torch.device(self._device).type == "cpu":
            module = store.load_module(snapshot.policy_id, build=entry.spec.build, version=snapshot.version)
            return _with_fast_forwards(module)
        # A module on an accelerator cannot run on host views: one private device copy per EnvRunner.
        module = entry.spec.build().to(self._device)
        module.set_state(dict(held))
        module.eval()
        return module

    @staticmethod
    def _without_frozen(state: Mapping[str, Any], frozen: set[str]) -> Mapping[str, Any]:
        modules = state.get(COMPONENT_RL_MODULE) if isinstance(state, Mapping) else None
        if modules is None or not frozen:
            return state
        if isinstance(modules, ray.ObjectRef):
            modules = remote.get(modules, BROADCAST_S, "the learners' broadcast weights")
        dropped = [mid for mid in modules if mid in frozen]
        if dropped:
            logger.debug("not loading broadcast state into frozen (store-backed) modules %s", dropped)
        kept = {mid: s for mid, s in modules.items() if mid not in frozen}
        return {**state, COMPONENT_RL_MODULE: kept}


class _CheckedMapping:
    """An EnvRunner's mapping function: the league's (or the config's), plus a check that the EnvRunner holds the
    module it names. Without it, an agent mapped to a module that is not there fails deep in RLlib's connectors
    (``KeyError: 'actions'``), every sample, on every restart. Pickles as the plain function (checkpoints,
    episodes sent to the driver)."""

    def __init__(self, mapping_fn: Callable[..., str], runner: Callable[[], Any]) -> None:
        self.mapping_fn, self._runner = mapping_fn, runner

    def __call__(self, agent_id: Any, episode: Any, **kwargs: Any) -> str:
        module_id = self.mapping_fn(agent_id, episode, **kwargs)
        runner = self._runner()
        if runner is not None and module_id not in runner.module:
            raise runner._unplayable(agent_id, module_id)
        return module_id

    def __reduce__(self) -> tuple:
        return unchecked, (self.mapping_fn,)


def unchecked(mapping_fn: Any) -> Any:
    """The plain mapping function inside a _CheckedMapping (itself otherwise)."""
    return mapping_fn.mapping_fn if isinstance(mapping_fn, _CheckedMapping) else mapping_fn


class SharedEnvRunner(SharedModulesMixin, MultiAgentEnvRunner):
    """RLlib's MultiAgentEnvRunner with league-frozen modules as views into the node store."""


def _check_listed(store: Any, held: Any, same_tensors_as: tuple[str, ...]) -> None:
    """Refuse a snapshot whose tensors may not be what the store of the current Ray session lists under its id.

    ``get`` may answer from this process's cache; after ``ray.shutdown()`` and a new ``ray.init()`` that cache can
    hold an earlier session's snapshot under an id the new session reuses. It is accepted when its checksum is the
    listed one, or one the league records as a packing of the same tensors (a restore's re-publish).
    """
    listed = {row.id: row.checksum for row in store.list(held.id.policy_id)}.get(held.id)
    if listed is None:
        raise UnknownPolicyError(f"{held.id} is not in the store of this Ray session")
    if held.checksum != listed and held.checksum not in same_tensors_as:
        raise CorruptSnapshotError(
            f"{held.id}: this process holds a copy with checksum {held.checksum}, but the store of this Ray session "
            f"lists {listed}; not attaching it as a frozen module"
        )


def _with_fast_forwards(module: Any) -> Any:
    """Run the sampling forward passes of a store-backed module on the store's read-only fast path.

    An EnvRunner only reads a frozen module (RLlib's writes are filtered out in ``set_state``), and every op of
    its forward would otherwise pay the write guard's per-op dispatch. The snapshot pages stay write-protected by
    the OS inside the block. The wrappers hold the module weakly: a cycle through them would keep a removed module,
    and so its snapshot's shared pages, alive until the process's next full garbage collection.
    """
    owner = weakref.ref(module)
    for name in ("forward_inference", "forward_exploration"):
        forward = getattr(type(module), name)

        @functools.wraps(forward)
        def fast(batch: Any, *args: Any, _forward: Any = forward, **kwargs: Any) -> Any:
            with fast_reads():
                return _forward(owner(), batch, *args, **kwargs)

        setattr(module, name, fast)
    return module


def check_env_runner_cls(runner: type | None) -> None:
    """Raise NotSetUpError unless ``runner`` (a config's env_runner_cls) keeps frozen modules in the store."""
    if runner is None or not issubclass(runner, SharedModulesMixin):
        name = getattr(runner, "__name__", "MultiAgentEnvRunner")
        raise NotSetUpError(
            f"env_runner_cls {name} does not keep frozen modules in the store: use "
            f"policystore.rllib.SharedEnvRunner, or define class My{name}(policystore.rllib.SharedModulesMixin, "
            f"{name}) and pass that (with_policystore(config) sets SharedEnvRunner when none is set)"
        )


def sync_all(algorithm: Any) -> None:
    """Make every (training and evaluation) EnvRunner match the league now, not at its next sample."""
    for group in (algorithm.env_runner_group, algorithm.eval_env_runner_group):
        if group is not None:
            group.foreach_env_runner(lambda runner: runner.sync_league(), local_env_runner=True)


def update_algorithm_config(algorithm: Any, mapping_fn: Any, should_update: Any) -> None:
    """Keep algorithm.config (RLlib checkpoints it) and the Learners' trainable set in line, as add_module."""
    if mapping_fn is None and should_update is None:
        return
    algorithm.config._is_frozen = False
    if mapping_fn is not None:
        algorithm.config.multi_agent(policy_mapping_fn=mapping_fn)
    if should_update is not None:
        algorithm.config.multi_agent(policies_to_train=should_update)
        algorithm.learner_group.foreach_learner(
            lambda learner: learner.config.multi_agent(policies_to_train=should_update)
        )
    algorithm.config.freeze()
