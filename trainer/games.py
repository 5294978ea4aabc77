"""The games the league trains on: Connect Four (built in, vectorized) or a PettingZoo classic AEC game.

A game is a vectorized two-player environment with this interface (``VecConnectFour`` is the reference):
``num_envs``, ``plane_shape``, ``num_actions``, ``max_moves``; arrays ``done``, ``winner`` (0 = draw or
running, else 1/2), ``to_move`` (1/2), ``moves``; ``reset()``, ``legal_mask(ids)``, ``planes(ids)`` (the
net's input from the mover's view) and ``step(actions, ids)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from trainer.connect4 import COLS, NUM_PLANES, ROWS, VecConnectFour
from trainer.model import PolicyNet

PETTINGZOO_PREFIX = "pettingzoo:"


class VecGame(Protocol):
    num_envs: int
    plane_shape: tuple[int, ...]
    num_actions: int
    max_moves: int
    done: np.ndarray
    winner: np.ndarray
    to_move: np.ndarray
    moves: np.ndarray

    def reset(self) -> None: ...
    def legal_mask(self, env_ids: np.ndarray | None = None) -> np.ndarray: ...
    def planes(self, env_ids: np.ndarray) -> np.ndarray: ...
    def step(self, actions: np.ndarray, env_ids: np.ndarray | None = None) -> Any: ...


@dataclass(frozen=True)
class Game:
    name: str
    make: Callable[[int], VecGame]     # num_envs -> a batch of games
    plane_shape: tuple[int, ...]
    num_actions: int
    baselines: tuple[str, ...]         # scripted opponents for evaluation (trainer.baselines)

    def net(self, hidden: int) -> PolicyNet:
        return PolicyNet(hidden, self.plane_shape, self.num_actions)


CONNECT4 = Game("connect4", VecConnectFour, (NUM_PLANES, ROWS, COLS), COLS, ("random", "winblock"))


def get_game(name: str) -> Game:
    """``connect4``, or ``pettingzoo:<classic env>`` such as ``pettingzoo:tictactoe_v3`` (needs the
    ``pettingzoo`` extra)."""
    if name == CONNECT4.name:
        return CONNECT4
    if name.startswith(PETTINGZOO_PREFIX):
        from trainer.pettingzoo_adapter import pettingzoo_game

        return pettingzoo_game(name[len(PETTINGZOO_PREFIX):])
    raise ValueError(f"unknown game {name!r}; use 'connect4' or '{PETTINGZOO_PREFIX}<classic env>', "
                     f"e.g. '{PETTINGZOO_PREFIX}tictactoe_v3'")
