"""An exact Connect Four solver: the game-theoretic value (win/draw/loss for the side to move) of a position
under perfect play, and of each of its moves. It is the judge of how well an agent plays, so it is exact, never
a heuristic.

Pure Python on Python ints, Pascal Pons' techniques: the bit layout of ``league.connect4`` (bit ``col * 7 + h``,
a sentinel bit on top of each column), negamax with alpha-beta over the three values -1/0/+1, null-window tests
to pin the value down, a transposition table of bounds keyed by ``position + mask``, moves ordered by the threats
they create and then centre first, and pruning by the rules of the game itself: a position whose mover can win at
once is a win, a mover facing two threats (or one under their own playable cell) has lost, and a single threat
must be blocked, so only the moves that do not hand the opponent an immediate win are searched.

A position is ``(current, mask, moves)``: the mover's stones, all stones, and the number of stones played.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from policystore.league.baselines import Player
from policystore.league.connect4 import COLS, ROWS, VecConnectFour

_H1 = ROWS + 1
_CELLS = ROWS * COLS
BOTTOM = sum(1 << (c * _H1) for c in range(COLS))
BOARD = BOTTOM * ((1 << ROWS) - 1)
_COLUMN = [((1 << ROWS) - 1) << (c * _H1) for c in range(COLS)]
_TOP = [1 << (ROWS - 1 + c * _H1) for c in range(COLS)]
# Columns from the centre out: the order of the search among moves that create as many threats.
CENTRE_FIRST = sorted(range(COLS), key=lambda c: (abs(2 * c - (COLS - 1)), c))
# Transposition table entry: (lower bound + 1) * 3 + (upper bound + 1); small ints, no allocation per entry.
_UNKNOWN = (-1 + 1) * 3 + (1 + 1)  # bounds -1 and +1: nothing known yet
Position = tuple[int, int, int]


def winning_cells(stones: int, mask: int) -> int:
    """Empty cells (playable or not) where one more stone would give ``stones`` four in a row."""
    r = (stones << 1) & (stones << 2) & (stones << 3)  # vertical: three below
    for s in (_H1, _H1 - 1, _H1 + 1):  # horizontal and the two diagonals
        p = (stones << s) & (stones << 2 * s)
        r |= p & (stones << 3 * s)
        r |= p & (stones >> s)
        p = (stones >> s) & (stones >> 2 * s)
        r |= p & (stones << s)
        r |= p & (stones >> 3 * s)
    return r & (BOARD ^ mask)


def playable(mask: int) -> int:
    """One bit per open column: the cell a stone dropped there lands on."""
    return (mask + BOTTOM) & BOARD


def can_win_now(current: int, mask: int) -> bool:
    """Whether the mover completes four in a row with their next stone."""
    return bool(winning_cells(current, mask) & playable(mask))


def play(position: Position, col: int) -> Position:
    """The position after the mover drops a stone in ``col`` (which must be open); the opponent then moves."""
    current, mask, moves = position
    new_mask = mask | (mask + (1 << (col * _H1)))
    return current ^ mask, new_mask, moves + 1


def is_winning_move(position: Position, col: int) -> bool:
    """Whether the mover completes four in a row by playing ``col``."""
    current, mask, _ = position
    return bool(winning_cells(current, mask) & playable(mask) & _COLUMN[col])


def from_moves(columns: Sequence[int]) -> Position:
    """The position after the given columns (0-based) were played from the empty board, checked as it goes."""
    position: Position = (0, 0, 0)
    for col in columns:
        if not 0 <= col < COLS or position[1] & _TOP[col]:
            raise ValueError(f"illegal move: column {col} is {'full' if 0 <= col < COLS else 'outside 0..6'}")
        if is_winning_move(position, col):
            raise ValueError(f"the game is over: column {col} completes four in a row")
        position = play(position, col)
    return position


def from_env(env: VecConnectFour, i: int) -> Position:
    """Game ``i`` of a ``VecConnectFour`` (the same bit layout) as a solver position."""
    seat = int(env.to_move[i]) - 1
    current = int(env.bits[i, seat])
    return current, current | int(env.bits[i, 1 - seat]), int(env.moves[i])


class NodeLimitExceeded(Exception):
    """A solve searched more than the solver's ``node_limit`` positions (the caller decides what to skip)."""


class Solver:
    """Weak solver: values are +1 (the mover wins), 0 (draw), -1 (the mover loses) under perfect play.

    The transposition table persists between calls (the children of one position share most of their subtrees);
    it is cleared before a solve once it holds ``max_entries`` to bound memory (about 100 bytes an entry).
    ``node_limit``, if set, makes a search raise ``NodeLimitExceeded`` once ``nodes`` (the positions searched
    since the solver was made) passes it.
    """

    def __init__(self, max_entries: int = 2_000_000, node_limit: int | None = None):
        self.max_entries = max_entries
        self.node_limit = node_limit
        self.table: dict[int, int] = {}
        self.nodes = 0

    def value(self, position: Position) -> int:
        """The value of ``position`` for the side to move (which must be a game still running)."""
        current, mask, moves = position
        if moves >= _CELLS:
            return 0
        if can_win_now(current, mask):
            return 1
        if len(self.table) >= self.max_entries:
            self.table.clear()
        # Two null-window tests: is it better than a draw, and if not, is it worse.
        if self._negamax(current, mask, moves, 0, 1) > 0:
            return 1
        return 0 if self._negamax(current, mask, moves, -1, 0) > -1 else -1

    def move_values(self, position: Position) -> dict[int, int]:
        """``{column: value for the mover after playing it}`` for every open column.

        The position's own value comes first (its search fills the table for the children); then one null-window
        test per move says whether it keeps that value, and only a move that gives up a win needs a second test
        to tell a draw from a loss.
        """
        best = self.value(position)
        values = {}
        for col in range(COLS):
            if not is_open(position, col):
                continue
            current, mask, moves = child = play(position, col)
            if is_winning_move(position, col):
                values[col] = 1
            elif best == -1 or moves >= _CELLS:
                values[col] = best if best == -1 else 0  # nothing beats the best; a full board is a draw
            elif can_win_now(current, mask) or self._negamax(current, mask, moves, -best, 1 - best) > -best:
                # The move gives the value up: after a draw that means a loss, after a win it may be either.
                values[col] = -1 if best == 0 else -self.value(child)
            else:
                values[col] = best
        return values

    def _negamax(self, current: int, mask: int, moves: int, alpha: int, beta: int) -> int:
        """Value within ``[alpha, beta]`` (fail-soft bounds outside it); the mover cannot win at once."""
        self.nodes += 1
        if self.node_limit is not None and self.nodes > self.node_limit:
            raise NodeLimitExceeded(f"more than {self.node_limit} positions searched")
        opponent_wins = winning_cells(current ^ mask, mask)
        possible = playable(mask)
        forced = possible & opponent_wins
        if forced:
            if forced & (forced - 1):
                return -1  # two threats on playable cells: one is left for the opponent
            possible = forced
        possible &= ~(opponent_wins >> 1)  # never play right under an opponent's winning cell
        if not possible:
            return -1
        if moves >= _CELLS - 2:
            return 0  # neither side can complete a line in the last two stones (checked above)
        key = current + mask
        entry = self.table.get(key, _UNKNOWN)
        low, high = entry // 3 - 1, entry % 3 - 1
        if low >= beta:
            return low
        if high <= alpha:
            return high
        alpha, beta = max(alpha, low), min(beta, high)
        if alpha >= beta:
            return alpha
        start_alpha = alpha
        ordered = []
        for col in CENTRE_FIRST:
            move = possible & _COLUMN[col]
            if move:
                ordered.append((-(winning_cells(current | move, mask).bit_count()), len(ordered), move))
        ordered.sort()
        opponent = current ^ mask
        best = -1
        for _, _, move in ordered:
            value = -self._negamax(opponent, mask | move, moves + 1, -beta, -alpha)
            if value > best:
                best = value
                if value >= beta:
                    break
                if value > alpha:
                    alpha = value
        if best >= beta:
            low = best
        elif best <= start_alpha:
            high = best
        else:
            low = high = best
        self.table[key] = (low + 1) * 3 + (high + 1)
        return best


def is_open(position: Position, col: int) -> bool:
    """Whether column ``col`` has room for another stone."""
    return not position[1] & _TOP[col]


def perfect_moves(solver: Solver, position: Position) -> list[int]:
    """The columns that keep the value of ``position`` (every move of a perfect player)."""
    values = solver.move_values(position)
    best = max(values.values())
    return [c for c, v in values.items() if v == best]


def perfect_player(solver: Solver | None = None) -> Player:
    """A scripted player (``league.baselines.Player``) that plays a value-keeping move, centre first; the
    judge's check that its own scoring gives a perfect player 100%."""
    solver = solver or Solver()

    def player(env: VecConnectFour, env_ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.array([min(perfect_moves(solver, from_env(env, int(i))), key=CENTRE_FIRST.index)
                         for i in np.asarray(env_ids)], dtype=np.int64)

    return player
