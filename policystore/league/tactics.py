"""Connect Four tactics a few plies deep, vectorized on bitboards: the moves a learner is told to prefer.

PPO learns a tactic only from the games it loses for want of it. These rules name the right move where a short
look-ahead proves it, and the learner adds a supervised loss towards them (``PPOConfig.tactics_coef``), in this
order: a move that wins at once; else one that stops the opponent's win at once; else one that makes a double
threat the opponent cannot parry (two threats to win, or one under another); else, where some moves lose within
the opponent's next two moves (they win at once, or set up such a double threat) and some do not, the others.
Every rule is sound (a named move wins, a move left out loses) but not complete; positions where none applies
give no target.

Bitboards use the layout of ``league.connect4``: bit ``col * 7 + height``, a sentinel bit on top of each column.
"""

from __future__ import annotations

import numpy as np

from policystore.league.connect4 import CELL_BITS, COL_BIT, ROWS
from policystore.league.solver import playable, winning_cells  # plain-int bit tricks that work on uint64 arrays as-is

_COLUMN = np.bitwise_or.reduce(COL_BIT[:, :ROWS], axis=1)  # (7,) each column's six cells
_CELL_BITS = CELL_BITS.ravel()  # (42,) each cell's bit, in the planes' row-major order
_SAME_COLUMN = np.eye(len(_COLUMN), dtype=bool)[None]  # (1, 7, 7): my move and their reply in one column


def has_won(threats: np.ndarray, landing: np.ndarray) -> np.ndarray:
    """Whether the side whose winning cells are ``threats`` wins next move against any defence, the opponent
    moving first and unable to win at once: two playable threats, or a playable one under another."""
    open_threats = threats & landing
    return (np.bitwise_count(open_threats) >= 2) | (((open_threats << 1) & threats) != 0)


def bitboards(planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mover's and the opponent's stones as bitboards, from ``observation_planes`` (channels 0 and 1): each
    plane's 0/1 cells times their bits, summed (the bits are distinct, so the sum is their OR) in one matmul."""
    cells = (planes[:, :2] > 0).reshape(planes.shape[0], 2, -1).astype(np.uint64)
    return cells[:, 0] @ _CELL_BITS, cells[:, 1] @ _CELL_BITS


def forced_moves(planes: np.ndarray) -> np.ndarray:
    """``(n, 7)`` bool: the columns the rules above name for each position of ``observation_planes`` (none
    where no rule applies)."""
    own, opp = bitboards(planes)
    mask = own | opp
    moves = playable(mask)[:, None] & _COLUMN[None, :]  # (n, 7): where a stone in each column lands
    legal = moves != 0
    my_threats, their_threats = winning_cells(own, mask)[:, None], winning_cells(opp, mask)[:, None]
    win, block = (my_threats & moves) != 0, (their_threats & moves) != 0
    # One ply on: after each of my moves, the opponent to move (the cells they can reach were empty before it).
    mine, mask2 = own[:, None] | moves, mask[:, None] | moves
    landing2 = playable(mask2)
    gives = legal & ((their_threats & landing2) != 0)
    mine_threats = winning_cells(mine, mask2)
    double = legal & ~gives & has_won(mine_threats, landing2)
    # Two plies on, where no rule above applies: after each opponent reply, me to move, unable to win at once
    # and facing their double threat.
    named = np.zeros_like(legal)
    deep = np.flatnonzero(legal.any(axis=1) & ~(win | block | double).any(axis=1))
    replies = landing2[deep][:, :, None] & _COLUMN[None, None, :]  # (k, 7, 7): [my move, their reply]
    mask3 = mask2[deep][:, :, None] | replies
    landing3 = playable(mask3)
    can_answer = (mine_threats[deep][:, :, None] & landing3) != 0
    # Their stones after a reply are theirs plus one cell: the reply column's landing cell, or the cell above my
    # stone when they answer in my column. So their lines are tested for 14 stone sets per position, not 49.
    opp_k = opp[deep][:, None]
    beside = winning_cells(opp_k | moves[deep], np.uint64(0))                          # (k, 7) by reply column
    above = winning_cells(opp_k | (landing2[deep] & _COLUMN[None, :]), np.uint64(0))  # (k, 7) by my column
    theirs = np.where(_SAME_COLUMN, above[:, :, None], beside[:, None, :]) & ~mask3
    trapped = ((replies != 0) & ~can_answer & has_won(theirs, landing3)).any(axis=-1)
    loses = legal[deep] & (gives[deep] | trapped)
    keeps = legal[deep] & ~loses
    named[deep] = np.where((keeps.any(axis=1) & loses.any(axis=1))[:, None], keeps, False)
    for rule in (double, block, win):  # the last that applies wins: win over block over double over the rest
        named = np.where(rule.any(axis=1, keepdims=True), rule, named)
    return named
