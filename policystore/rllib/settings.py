"""Where an RLlib process finds the league name and the store: the one lookup every part of the adapter uses.

RLlib builds the callbacks from the config in every process (driver, each EnvRunner, restarted ones too), so the
settings ride on a callback instance. This module sits below the EnvRunner and the callback, so neither has to
import the other to find them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import ray

import policystore

from ..errors import PolicyStoreError

DEFAULT_LEAGUE = "default"


class NotSetUpError(PolicyStoreError, TypeError):
    """An Algorithm, config or EnvRunner is missing a piece of the adapter (build configs with with_policystore)."""


class LeagueSettings:
    """The league name and store settings of one Algorithm, and this process's store client."""

    def __init__(self, league: str = DEFAULT_LEAGUE, store_config: Any = None) -> None:
        self.league = league
        self.store_config = store_config
        self._store = None
        self._session = None

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
