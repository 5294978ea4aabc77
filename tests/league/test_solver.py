"""The Connect Four solver against positions of known value and against a plain exhaustive minimax written
independently here (a list-of-lists board, a line scan around the last stone, no pruning, no table)."""

import numpy as np
import pytest

from policystore.league.connect4 import VecConnectFour
from policystore.league.solver import Solver, from_env, from_moves, play

# Published test positions of Pascal Pons' solver benchmark (columns 1-based, from the empty board) and the sign of
# their score: +1 the side to move wins, 0 draw, -1 it loses.
KNOWN = {
    "2252576253462244111563365343671351441": -1,
    "3575316255751336464276636772271112": -1,
    "7422341735647741166133573473242566": 1,
    "326615663752621323655335514271": 1,
    "74425337641465475671176741236615215533": 0,
    "23163416124767223154467471272416755633": 0,
    "24617524315172127": 1,
    "427631264721": 1,
    "335662333565": -1,
}


def _columns(text: str) -> list[int]:
    return [int(ch) - 1 for ch in text]


def _brute_value(moves: list[int]) -> int:
    """Exhaustive negamax over every continuation: the value for the side to move."""
    grid = [[0] * 6 for _ in range(7)]  # grid[col][height]
    for i, col in enumerate(moves):
        grid[col][grid[col].index(0)] = 1 + i % 2

    def wins(col: int, h: int, who: int) -> bool:
        for dc, dh in ((1, 0), (0, 1), (1, 1), (1, -1)):
            run = 1
            for sign in (1, -1):
                c, r = col + sign * dc, h + sign * dh
                while 0 <= c < 7 and 0 <= r < 6 and grid[c][r] == who:
                    run, c, r = run + 1, c + sign * dc, r + sign * dh
            if run >= 4:
                return True
        return False

    def negamax(ply: int) -> int:
        who, best, any_move = 1 + ply % 2, -1, False
        for col in range(7):
            if grid[col][5]:
                continue
            any_move = True
            h = grid[col].index(0)
            grid[col][h] = who
            value = 1 if wins(col, h, who) else -negamax(ply + 1)
            grid[col][h] = 0
            best = max(best, value)
            if best == 1:
                break
        return best if any_move else 0

    return negamax(len(moves))


def _random_game_prefix(rng: np.random.Generator, stones: int) -> list[int]:
    """``stones`` random moves that never complete four in a row (so late positions come cheap)."""
    while True:
        moves: list[int] = []
        while len(moves) < stones:
            options = [c for c in range(7) if moves.count(c) < 6 and not _wins_at_once(moves, c)]
            if not options:
                break
            moves.append(int(rng.choice(options)))
        if len(moves) == stones:
            return moves


def _wins_at_once(moves: list[int], col: int) -> bool:
    try:
        from_moves(moves + [col])
    except ValueError:
        return True
    return False


@pytest.mark.parametrize("sequence,value", sorted(KNOWN.items()))
def test_known_positions(sequence, value):
    assert Solver().value(from_moves(_columns(sequence))) == value


def test_immediate_win_and_forced_block():
    # Opening positions (far too early to solve whole): each answer must come from the win and block rules.
    solver = Solver(node_limit=1_000)
    # Player 1 to move has three in the bottom row (columns 0..2): a win now.
    assert solver.value(from_moves([0, 6, 1, 6, 2, 6])) == 1
    # Player 1 to move, player 2 has three stacked in column 6: every move but the block hands over the win.
    position = from_moves([0, 6, 1, 6, 5, 6])
    for col in range(6):
        assert solver.value(play(position, col)) == 1  # the opponent's value: they win at once
    # A horizontal threat: player 2 to move must fill column 3, next to player 1's three in the bottom row.
    position = from_moves([0, 0, 1, 1, 2])
    for col in (0, 1, 2, 4, 5, 6):
        assert solver.value(play(position, col)) == 1


def test_agrees_with_exhaustive_minimax_on_late_random_positions():
    rng = np.random.default_rng(7)
    seen = set()
    for _ in range(10):
        moves = _random_game_prefix(rng, int(rng.integers(35, 38)))
        position = from_moves(moves)
        expected = _brute_value(moves)
        solver = Solver()
        assert solver.value(position) == expected, moves
        values = solver.move_values(position)
        assert max(values.values()) == expected
        for col, v in values.items():
            child = moves + [col]
            try:
                from_moves(child)
            except ValueError:  # the move wins at once
                assert v == 1
                continue
            assert v == -_brute_value(child), (moves, col)
        seen.add(expected)
    assert len(seen) >= 2  # the sample is not all one value


def test_values_are_consistent_with_children_in_the_middle_game():
    rng = np.random.default_rng(3)
    for stones in (20, 22, 24, 26):
        moves = _random_game_prefix(rng, stones)
        position = from_moves(moves)
        solver = Solver()
        values = solver.move_values(position)
        assert max(values.values()) == solver.value(position)
        fresh = Solver()  # an empty table: the per-move values do not depend on what was searched before
        for col, v in values.items():
            assert v == (1 if _wins_at_once(moves, col) else -fresh.value(play(position, col))), (moves, col)


def test_positions_from_the_game_engine_match_replayed_moves():
    env = VecConnectFour(1)
    moves = [3, 3, 2, 4, 1]
    for col in moves:
        env.step(np.array([col]), np.array([0]))
    assert from_env(env, 0) == from_moves(moves)


def test_rejects_illegal_sequences():
    with pytest.raises(ValueError, match="full"):
        from_moves([0] * 7)
    with pytest.raises(ValueError, match="four in a row"):
        from_moves([0, 1, 0, 1, 0, 1, 0])
