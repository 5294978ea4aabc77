"""The games the league trains on, by name: Connect Four (built in, vectorized), any two-player zero-sum turn-based
OpenSpiel game, a PettingZoo classic game, or the user's own ``Game`` from an import path."""

from __future__ import annotations

import dataclasses
import functools
import importlib

from policystore.league.baselines import random_opening
from policystore.league.connect4 import COLS, NUM_PLANES, ROWS, VecConnectFour
from policystore.league.openspiel_adapter import OPENSPIEL_PREFIX, openspiel_game
from policystore.league.pettingzoo_adapter import PETTINGZOO_PREFIX, pettingzoo_game
from policystore.league.search import visit_targets
from policystore.league.tactics import forced_moves
from policystore.league.vecgame import Game

CONNECT4 = Game("connect4", VecConnectFour, (NUM_PLANES, ROWS, COLS), COLS, ("random", "winblock", "safe"),
                perfect_information=True, openspiel="connect_four", mirrored=True, opening=random_opening,
                tactics=forced_moves, search=visit_targets)
GAME_HELP = (f"{CONNECT4.name}, {OPENSPIEL_PREFIX}<game> (e.g. {OPENSPIEL_PREFIX}leduc_poker), "
             f"{PETTINGZOO_PREFIX}<classic env> (e.g. {PETTINGZOO_PREFIX}tictactoe_v3) or an import path "
             "package.module:factory returning a Game")


@functools.cache
def get_game(name: str) -> Game:
    """The game ``name`` names (see ``GAME_HELP``), made once per process.

    An import path ``package.module:factory`` calls ``factory()``, which returns a ``Game`` (named by the path, so
    that ``get_game(game.name)`` finds it again); the module must be importable in every process of the run (on a
    cluster: on every node)."""
    if name == CONNECT4.name:
        return CONNECT4
    if name.startswith(PETTINGZOO_PREFIX):
        return pettingzoo_game(name[len(PETTINGZOO_PREFIX):])
    if name.startswith(OPENSPIEL_PREFIX):
        return openspiel_game(name[len(OPENSPIEL_PREFIX):])
    module_name, colon, factory_name = name.partition(":")
    if not colon or not module_name or not factory_name.isidentifier():
        raise ValueError(f"unknown game {name!r}; use {GAME_HELP}")
    return _from_import_path(module_name, factory_name)


def _from_import_path(module_name: str, factory_name: str) -> Game:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ValueError(f"no module {module_name!r} to import (is its folder on PYTHONPATH?)") from None
        raise
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise ValueError(f"module {module_name!r} has no function {factory_name!r} that makes a Game")
    game = factory()
    if not isinstance(game, Game):
        raise ValueError(f"{module_name}:{factory_name}() returned {type(game).__name__}, not a "
                         "policystore.league.vecgame.Game")
    return dataclasses.replace(game, name=f"{module_name}:{factory_name}")  # get_game(game.name) finds it again
