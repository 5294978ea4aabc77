"""What a game is to the league: a vectorized two-player environment and how to build a net for it.

A game is a vectorized two-player environment with this interface (``league.connect4.VecConnectFour`` is the
reference): ``num_envs``, ``plane_shape``, ``num_actions``, ``max_moves``; arrays ``done``, ``winner`` (0 =
draw or running, else 1/2), ``to_move`` (1/2), ``moves``; ``reset()``, ``legal_mask(ids)``, ``planes(ids)``
(the net's input from the mover's view) and ``step(actions, ids)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from torch import nn

from policystore.league.model import PolicyNet


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
    baselines: tuple[str, ...]         # scripted opponents for evaluation (league.baselines)
    # Left-right symmetric rules: a position with its planes' last axis reversed is as good as the original, with
    # move a there being num_actions - 1 - a here (Connect Four's mirror). Rollouts may then train on both.
    mirrored: bool = False
    # (env, lengths, rng) -> None: plays lengths[i] random moves in game i and leaves every game running; rollouts
    # start a share of their games there, to meet positions the league's own openings never reach (None: no such).
    opening: Callable[[VecGame, np.ndarray, np.random.Generator], None] | None = None
    # planes (n, *plane_shape) -> (n, num_actions) bool: the moves a short look-ahead proves right (for Connect
    # Four: league.tactics), none where it proves nothing; learners add a loss towards them
    # (PPOConfig.tactics_coef). None: no such rule.
    tactics: Callable[[np.ndarray], np.ndarray] | None = None
    # (net, planes, simulations) -> (n, num_actions) float: the visit shares of a tree search from each position
    # with the net as prior and value (league.search); learners may add a loss towards them
    # (PPOConfig.search_coef). None: the game has no search.
    search: Callable[[nn.Module, np.ndarray, int], np.ndarray] | None = None

    def net(self, hidden: int) -> PolicyNet:
        return PolicyNet(hidden, self.plane_shape, self.num_actions)
