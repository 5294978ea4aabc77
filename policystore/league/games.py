"""The games the league trains on, by name: Connect Four (built in, vectorized) or a PettingZoo classic game."""

from __future__ import annotations

from policystore.league.baselines import random_opening
from policystore.league.connect4 import COLS, NUM_PLANES, ROWS, VecConnectFour
from policystore.league.pettingzoo_adapter import PETTINGZOO_PREFIX, pettingzoo_game
from policystore.league.search import visit_targets
from policystore.league.tactics import forced_moves
from policystore.league.vecgame import Game

CONNECT4 = Game("connect4", VecConnectFour, (NUM_PLANES, ROWS, COLS), COLS, ("random", "winblock", "safe"),
                mirrored=True, opening=random_opening, tactics=forced_moves, search=visit_targets)


def get_game(name: str) -> Game:
    """``connect4``, or ``pettingzoo:<classic env>`` such as ``pettingzoo:tictactoe_v3`` (needs the
    ``pettingzoo`` extra)."""
    if name == CONNECT4.name:
        return CONNECT4
    if name.startswith(PETTINGZOO_PREFIX):
        return pettingzoo_game(name[len(PETTINGZOO_PREFIX):])
    raise ValueError(f"unknown game {name!r}; use 'connect4' or '{PETTINGZOO_PREFIX}<classic env>', "
                     f"e.g. '{PETTINGZOO_PREFIX}tictactoe_v3'")
