"""Scripted Connect Four players, vectorized: the yardsticks for evaluation.

Both take ``(env, env_ids, rng)`` and return one column per listed game, for whoever is to move there.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from policystore.league.connect4 import COL_BIT, COLS, ROWS, VecConnectFour, is_win

Player = Callable[[VecConnectFour, np.ndarray, np.random.Generator], np.ndarray]


def sample_legal(legal: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random legal column per row of a ``(n, 7)`` mask (rows need at least one legal column)."""
    noise = rng.random(legal.shape)
    noise[~legal] = -1.0
    return noise.argmax(axis=1)


def winning_columns(env: VecConnectFour, env_ids: np.ndarray, seat: np.ndarray) -> np.ndarray:
    """``(n, 7)`` bool: columns where a stone of ``seat`` (0 or 1) would complete four in a row."""
    legal = env.legal_mask(env_ids)
    heights = env.heights[env_ids].astype(np.int64)  # a full column points at its sentinel bit: masked below
    candidate = COL_BIT[np.arange(COLS)[None, :], heights]
    stones = env.bits[env_ids, seat][:, None]
    return is_win(stones | candidate) & legal


def random_player(env: VecConnectFour, env_ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Uniformly random legal moves."""
    return sample_legal(env.legal_mask(env_ids), rng)


def win_block_player(env: VecConnectFour, env_ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Win if you can, block if you must, else random."""
    env_ids = np.asarray(env_ids)
    me = (env.to_move[env_ids] - 1).astype(np.int64)
    return _win_block_or(env, env_ids, me, env.legal_mask(env_ids), rng)


def safe_player(env: VecConnectFour, env_ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Win if you can, block if you must, else never a move that lets the opponent win on the cell above it:
    one ply deeper than win/block, so beating it takes a double threat, not only a missed block."""
    env_ids = np.asarray(env_ids)
    me = (env.to_move[env_ids] - 1).astype(np.int64)
    legal = env.legal_mask(env_ids)
    above = env.heights[env_ids].astype(np.int64) + 1  # the cell my stone would open to the opponent
    cell = COL_BIT[np.arange(COLS)[None, :], np.minimum(above, ROWS)]
    gives = is_win(env.bits[env_ids, 1 - me][:, None] | cell) & legal & (above < ROWS)
    safe = np.where((legal & ~gives).any(axis=1)[:, None], legal & ~gives, legal)
    return _win_block_or(env, env_ids, me, safe, rng)


def _win_block_or(env: VecConnectFour, env_ids: np.ndarray, me: np.ndarray, otherwise: np.ndarray,
                  rng: np.random.Generator) -> np.ndarray:
    """A winning column if there is one, else a blocking one, else one of ``otherwise`` (an ``(n, 7)`` mask)."""
    win = winning_columns(env, env_ids, me)
    block = winning_columns(env, env_ids, 1 - me)
    choice = np.where(win.any(axis=1)[:, None], win, np.where(block.any(axis=1)[:, None], block, otherwise))
    return sample_legal(choice, rng)


def random_opening(env: VecConnectFour, lengths: np.ndarray, rng: np.random.Generator) -> None:
    """Play ``lengths[i]`` uniformly random moves in game ``i``, never one that completes four, so every game is
    still running afterwards. Games that start here reach middle-game positions that a league's games, which
    follow its players' own openings, never meet."""
    lengths = np.asarray(lengths)
    for t in range(int(lengths.max(initial=0))):
        ids = np.flatnonzero((lengths > t) & ~env.done)
        me = (env.to_move[ids] - 1).astype(np.int64)
        quiet = env.legal_mask(ids) & ~winning_columns(env, ids, me)
        some = quiet.any(axis=1)  # a game whose every legal move wins ends its opening here
        env.step(sample_legal(quiet[some], rng), ids[some])


BASELINES: dict[str, Player] = {"random": random_player, "winblock": win_block_player, "safe": safe_player}
