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

from league.connect4 import CELL_BITS, COL_BIT, ROWS

_BOTTOM = np.bitwise_or.reduce(COL_BIT[:, 0])
_BOARD = np.bitwise_or.reduce(COL_BIT[:, :ROWS].ravel())
_COLUMN = np.bitwise_or.reduce(COL_BIT[:, :ROWS], axis=1)  # (7,) each column's six cells
_ONE = np.uint64(1)
_H1 = ROWS + 1


def lines(stones: np.ndarray) -> np.ndarray:
    """Cells where one more stone would give ``stones`` four in a row (uint64, any shape), occupied or off the
    board included: mask with the empty cells (``_BOARD ^ mask``) before counting them."""
    r = (stones << _ONE) & (stones << np.uint64(2)) & (stones << np.uint64(3))  # vertical: three below
    for s in (np.uint64(_H1), np.uint64(_H1 - 1), np.uint64(_H1 + 1)):  # horizontal and the two diagonals
        p = (stones << s) & (stones << (s + s))
        r |= p & (stones << (s + s + s))
        r |= p & (stones >> s)
        p = (stones >> s) & (stones >> (s + s))
        r |= p & (stones << s)
        r |= p & (stones >> (s + s + s))
    return r


def playable(mask: np.ndarray) -> np.ndarray:
    """The cell a stone dropped in each open column lands on, one bit per column."""
    return (mask + _BOTTOM) & _BOARD


def has_won(threats: np.ndarray, landing: np.ndarray) -> np.ndarray:
    """Whether the side whose winning cells are ``threats`` wins next move against any defence, the opponent
    moving first and unable to win at once: two playable threats, or a playable one under another."""
    open_threats = threats & landing
    return (np.bitwise_count(open_threats) >= 2) | (((open_threats << _ONE) & threats) != 0)


def bitboards(planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mover's and the opponent's stones as bitboards, from ``observation_planes`` (channels 0 and 1)."""
    own = np.bitwise_or.reduce(np.where(planes[:, 0] > 0, CELL_BITS, np.uint64(0)), axis=(1, 2))
    opp = np.bitwise_or.reduce(np.where(planes[:, 1] > 0, CELL_BITS, np.uint64(0)), axis=(1, 2))
    return own, opp


def forced_moves(planes: np.ndarray) -> np.ndarray:
    """``(n, 7)`` bool: the columns the rules above name for each position of ``observation_planes`` (none
    where no rule applies)."""
    own, opp = bitboards(planes)
    mask = own | opp
    moves = playable(mask)[:, None] & _COLUMN[None, :]  # (n, 7): where a stone in each column lands
    legal = moves != 0
    my_lines, their_lines = lines(own)[:, None], lines(opp)[:, None]
    win, block = (my_lines & moves) != 0, (their_lines & moves) != 0
    # One ply on: after each of my moves, the opponent to move.
    mine, mask2 = own[:, None] | moves, mask[:, None] | moves
    landing2 = playable(mask2)
    gives = legal & ((their_lines & landing2) != 0)
    mine_lines = lines(mine)
    double = legal & ~gives & has_won(mine_lines & (_BOARD ^ mask2), landing2)
    # Two plies on, where no rule above applies: after each opponent reply, me to move, unable to win at once
    # and facing their double threat.
    named = np.zeros_like(legal)
    deep = np.flatnonzero(legal.any(axis=1) & ~(win | block | double).any(axis=1))
    replies = landing2[deep][:, :, None] & _COLUMN[None, None, :]  # (k, 7, 7)
    mask3 = mask2[deep][:, :, None] | replies
    landing3 = playable(mask3)
    can_answer = (mine_lines[deep][:, :, None] & landing3) != 0
    theirs = lines(opp[deep][:, None, None] | replies) & (_BOARD ^ mask3)
    trapped = ((replies != 0) & ~can_answer & has_won(theirs, landing3)).any(axis=-1)
    loses = legal[deep] & (gives[deep] | trapped)
    keeps = legal[deep] & ~loses
    named[deep] = np.where((keeps.any(axis=1) & loses.any(axis=1))[:, None], keeps, False)
    for rule in (double, block, win):  # the last that applies wins: win over block over double over the rest
        named = np.where(rule.any(axis=1, keepdims=True), rule, named)
    return named
