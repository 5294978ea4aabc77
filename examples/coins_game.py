"""Coins in a line: a game written against the league trainer's game protocol, outside the package.

A row of 8 coins worth 1 to 9 each (dealt at random per game); the players take turns taking the coin at either
end of the row; when the row is empty, player 1's return is the value player 1 took minus the value player 2 took.
The greedy move (the larger end) loses against good play, so there is something to learn.

It shows what a game gives the trainer (docs/own-game.md is the reference): a batch of games stepped at once in
numpy (``CoinsVec``, the ``VecGame`` protocol), a flat observation vector (not board planes), a real-valued return
(coins, not win/loss), a legal-action mask, a text rendering, and the ``Game`` record a factory returns::

    python -m policystore.trainer --run-dir runs/coins --game examples.coins_game:make_game --minutes 1

Run it from the clone's root (the module must be importable by every process of the run: on a cluster, on every
node).
"""

from __future__ import annotations

import numpy as np

from policystore.league.vecgame import Game

COINS = 8          # coins in the row; a game takes exactly this many moves
TOP = 9            # the largest coin
LEFT, RIGHT = 0, 1  # the actions: take the left or the right end


class CoinsVec:
    """``num_envs`` games of coins in a line; player 1 moves first in every game."""

    plane_shape = (COINS + 1,)   # the row left-aligned (coin / TOP, 0 past its end), then the mover's lead
    obs_dtype = np.float32       # coin values are not 0/1
    num_actions = 2
    max_moves = COINS
    max_return = float(COINS * TOP)  # the most one player can lead by

    def __init__(self, num_envs: int, seed: int | None = None):
        self.num_envs = num_envs
        self.rng = np.random.default_rng(seed)
        self.coins = np.zeros((num_envs, COINS), dtype=np.int64)
        self.left = np.zeros(num_envs, dtype=np.int64)    # index of the row's first coin
        self.right = np.zeros(num_envs, dtype=np.int64)   # index of its last coin
        self.lead = np.zeros(num_envs, dtype=np.int64)    # player 1's total minus player 2's
        self.done = np.zeros(num_envs, dtype=bool)
        self.winner = np.zeros(num_envs, dtype=np.int8)
        self.returns = np.zeros(num_envs, dtype=np.float32)
        self.to_move = np.ones(num_envs, dtype=np.int8)
        self.moves = np.zeros(num_envs, dtype=np.int16)
        self.reset()

    def _ids(self, env_ids: np.ndarray | None) -> np.ndarray:
        return np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids, dtype=np.int64)

    def reset(self, env_ids: np.ndarray | None = None) -> None:
        ids = self._ids(env_ids)
        self.coins[ids] = self.rng.integers(1, TOP + 1, (ids.size, COINS))
        self.left[ids], self.right[ids], self.lead[ids] = 0, COINS - 1, 0
        self.done[ids], self.winner[ids], self.returns[ids] = False, 0, 0.0
        self.to_move[ids], self.moves[ids] = 1, 0

    def legal_mask(self, env_ids: np.ndarray | None = None) -> np.ndarray:
        """Both ends while coins remain (the same coin when one is left); nothing in a finished game."""
        ids = self._ids(env_ids)
        return np.repeat(~self.done[ids, None], 2, axis=1)

    def planes(self, env_ids: np.ndarray) -> np.ndarray:
        ids = self._ids(env_ids)
        index = self.left[ids, None] + np.arange(COINS)
        in_row = index <= self.right[ids, None]
        row = np.where(in_row, self.coins[ids[:, None], np.minimum(index, COINS - 1)], 0) / TOP
        sign = np.where(self.to_move[ids] == 1, 1, -1)
        return np.concatenate([row, (sign * self.lead[ids] / self.max_return)[:, None]], axis=1).astype(np.float32)

    def step(self, actions: np.ndarray, env_ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        ids, actions = self._ids(env_ids), np.asarray(actions, dtype=np.int64)
        if actions.shape != ids.shape or ((actions != LEFT) & (actions != RIGHT)).any():
            raise ValueError(f"actions must be {LEFT} (left end) or {RIGHT} (right end), one per game")
        if self.done[ids].any():
            raise ValueError(f"game {int(ids[self.done[ids]][0])} is finished; reset it before stepping")
        end = np.where(actions == LEFT, self.left[ids], self.right[ids])
        taken = self.coins[ids, end]
        self.lead[ids] += np.where(self.to_move[ids] == 1, taken, -taken)
        self.left[ids] += actions == LEFT
        self.right[ids] -= actions == RIGHT
        self.moves[ids] += 1
        over = self.left[ids] > self.right[ids]
        finished = ids[over]
        self.done[finished] = True
        self.returns[finished] = self.lead[finished]
        self.winner[finished] = np.where(self.lead[finished] > 0, 1, np.where(self.lead[finished] < 0, 2, 0))
        self.to_move[ids] = 3 - self.to_move[ids]
        return self.done[ids].copy(), self.winner[ids].copy()

    def render(self, env_id: int, player: int | None = None) -> str:
        """The row, each coin's value, and player 1's lead (both players see everything)."""
        row = self.coins[env_id, self.left[env_id]:self.right[env_id] + 1]
        return f"row: {' '.join(map(str, row.tolist())) or '(empty)'}   player 1 leads by {int(self.lead[env_id])}"


def make_game() -> Game:
    """The factory ``--game examples.coins_game:make_game`` calls."""
    return Game("coins", CoinsVec, CoinsVec.plane_shape, CoinsVec.num_actions, baselines=("random",),
                perfect_information=True)
