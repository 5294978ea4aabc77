"""Where an RLlib process finds the league name and the store: the one lookup every part of the adapter uses.

RLlib builds the callbacks from the config in every process (driver, each EnvRunner, restarted ones too), so the
settings ride on a callback instance. This module sits below the EnvRunner and the callback, so neither has to
import the other to find them.

The league name: one given to ``with_policystore(config, league=...)`` is fixed (it travels in the config, so in
checkpoints too): every Algorithm built or restored from that config shares the league, on purpose. Without one,
each Algorithm gets a league of its own, named after its log directory: RLlib makes a fresh one for every
Algorithm (``Algorithm.from_checkpoint`` included) and Tune one per trial, and it hands it to every EnvRunner it
builds, restarted ones too, so all processes of one Algorithm agree on the name and no other Algorithm shares it.

The store: an automatic league is the job's alone, so it gets a store of its own (a store league of the same name:
its own store actor per node, its own catalog) whose disk tier is ``<log dir>/policystore-spill`` (or
``<spill_dir>/.leagues/<league>`` under a configured ``StoreConfig.spill_dir``): it lives where the job lives and
is removed with it (``release``). A fixed league is shared on purpose; it keeps the store league the user's
``StoreConfig`` names (or the fixed league's name) and is never removed by one of its Algorithms.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
from collections.abc import Iterable
from typing import Any

import ray

import policystore

from ..client import shutdown_all
from ..config import StoreConfig, check_league, league_folder
from ..errors import PolicyStoreError

logger = logging.getLogger(__name__)
SPILL_FOLDER = "policystore-spill"  # the job's disk tier, in the Algorithm's log directory


class NotSetUpError(PolicyStoreError, TypeError):
    """An Algorithm, config or EnvRunner is missing a piece of the adapter (build configs with with_policystore)."""


def league_for_log_dir(log_dir: str) -> str:
    """The automatic league name of the Algorithm whose log directory is ``log_dir``."""
    return f"league-{hashlib.blake2b(str(log_dir).encode(), digest_size=6).hexdigest()}"


class LeagueSettings:
    """The league name and store settings of one Algorithm, and this process's store client."""

    def __init__(self, league: str | None = None, store_config: StoreConfig | None = None) -> None:
        self.explicit_league = league is not None
        self._league = league
        self._log_dir: str | None = None
        self.store_config = store_config
        self._store = None
        self._session = None

    @property
    def league(self) -> str:
        if self._league is None:
            raise NotSetUpError(
                "this process has not been told which Algorithm it belongs to yet, so its automatic league name is "
                "unknown; build EnvRunners through an Algorithm, or name the league: with_policystore(config, "
                "league=...)"
            )
        return self._league

    def bind(self, log_dir: str | None) -> None:
        """Name an automatic league after the owning Algorithm's log directory (a fixed name stays as it is)."""
        if not self.explicit_league and log_dir is not None:
            self._league = league_for_log_dir(log_dir)
            self._log_dir = str(log_dir)

    @property
    def job_owned(self) -> bool:
        """Whether the league's store is this Algorithm's alone (an automatic league and no store league named in
        the StoreConfig): then its disk tier lives in the job's folder and is removed with the job."""
        return not self.explicit_league and (self.store_config is None or self.store_config.league is None)

    def resolved_store_config(self) -> StoreConfig:
        """The StoreConfig every process of this Algorithm connects with (the same in all of them, so the first
        one to connect starts the store with it and the others find it)."""
        config = self.store_config or StoreConfig()
        if not self.job_owned:
            return config if config.league else dataclasses.replace(config, league=check_league(self.league))
        spill_dir = config.spill_dir
        if spill_dir is None and self._log_dir is not None:
            spill_dir = os.path.join(self._log_dir, SPILL_FOLDER)
        return dataclasses.replace(config, league=self.league, spill_dir=spill_dir)

    def spill_folder(self) -> str | None:
        """The job's disk tier on this node (None: the store's default folder of the Ray session)."""
        config = self.resolved_store_config()
        if config.spill_dir is None:
            return None
        return league_folder(os.path.abspath(os.path.expanduser(config.spill_dir)), config.league)

    def store(self) -> Any:
        """This node's PolicyStore client, connected once per Ray session (a new ``ray.init()`` reconnects)."""
        session = ray.get_runtime_context().get_session_name() if ray.is_initialized() else None
        if self._store is None or session is None or session != self._session:
            self._store = policystore.connect(self.resolved_store_config())  # starts a local Ray if none runs
            self._session = ray.get_runtime_context().get_session_name()
        return self._store

    def release(self, keep: Iterable[Any] = ()) -> None:
        """The job ends: delete its snapshots but those in ``keep`` (durable or kept on purpose), stop its store on
        every node and its catalog, and remove its disk tier if nothing kept is left in it. Only for a job-owned
        store; a shared one is left as it is."""
        if not self.job_owned or not ray.is_initialized():
            return
        keep = set(keep)
        store = self.store()
        for row in store.list():
            if row.id not in keep:
                store.delete(row.id.policy_id, version=row.id.version)
        folder = self.spill_folder()
        shutdown_all(league=self.league)
        self._store = None
        if folder is not None and not keep:
            shutil.rmtree(folder, ignore_errors=True)
            if self._log_dir is not None and folder.startswith(os.path.join(self._log_dir, SPILL_FOLDER)):
                shutil.rmtree(os.path.join(self._log_dir, SPILL_FOLDER), ignore_errors=True)
        elif keep:
            logger.info("league %r: %d durable or kept snapshot(s) stay in %s", self.league, len(keep), folder)


def find_settings(callbacks: Any, owner: str) -> LeagueSettings:
    """The LeagueSettings among an Algorithm's or EnvRunner's callbacks (``owner`` names it in the error)."""
    items: Iterable[Any] = callbacks if isinstance(callbacks, (list, tuple)) else [callbacks]
    for callback in items:
        if isinstance(callback, LeagueSettings):
            return callback
    raise NotSetUpError(
        f"{owner} has no policystore.rllib.PolicyStoreCallback among its callbacks (it names the league and the "
        "store settings): build the config with policystore.rllib.with_policystore(config), and call it after "
        "config.callbacks(...), which replaces every callback (with_policystore keeps the ones set before it)"
    )
