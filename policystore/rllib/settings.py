"""Where an RLlib process finds the league name and the store: the one lookup every part of the adapter uses.

RLlib builds the callbacks from the config in every process (driver, each EnvRunner, restarted ones too), so the
settings ride on a callback instance. This module sits below the EnvRunner and the callback, so neither has to
import the other to find them.

The league name: one given to ``with_policystore(config, league=...)`` is fixed (it travels in the config, so in
checkpoints too): every Algorithm built or restored from that config shares the league, on purpose. Without one,
each Algorithm gets a league of its own, named after its log directory: RLlib makes a fresh one for every
Algorithm (``Algorithm.from_checkpoint`` included) and Tune one per trial, and it hands it to every EnvRunner it
builds, restarted ones too, so all processes of one Algorithm agree on the name and no other Algorithm shares it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import ray

import policystore

from ..errors import PolicyStoreError


class NotSetUpError(PolicyStoreError, TypeError):
    """An Algorithm, config or EnvRunner is missing a piece of the adapter (build configs with with_policystore)."""


def league_for_log_dir(log_dir: str) -> str:
    """The automatic league name of the Algorithm whose log directory is ``log_dir``."""
    return f"league-{hashlib.blake2b(str(log_dir).encode(), digest_size=6).hexdigest()}"


class LeagueSettings:
    """The league name and store settings of one Algorithm, and this process's store client."""

    def __init__(self, league: str | None = None, store_config: Any = None) -> None:
        self.explicit_league = league is not None
        self._league = league
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

    def store(self) -> Any:
        """This node's PolicyStore client, connected once per Ray session (a new ``ray.init()`` reconnects)."""
        session = ray.get_runtime_context().get_session_name() if ray.is_initialized() else None
        if self._store is None or session is None or session != self._session:
            self._store = policystore.connect(self.store_config)  # starts a local Ray if none is running
            self._session = ray.get_runtime_context().get_session_name()
        return self._store


def find_settings(callbacks: Any, owner: str) -> LeagueSettings:
    """The LeagueSettings among an Algorithm's or EnvRunner's callbacks (``owner`` names it in the error)."""
    items: Iterable[Any] = callbacks if isinstance(callbacks, (list, tuple)) else [callbacks]
    for callback in items:
        if isinstance(callback, LeagueSettings):
            return callback
    raise NotSetUpError(
        f"{owner} has no policystore.rllib.PolicyStoreCallback among its callbacks (it names the league and the "
        "store settings); build the config with policystore.rllib.with_policystore(config)"
    )
