import numpy as np

from policystore.league.baselines import random_opening, winning_columns
from policystore.league.connect4 import COLS, ROWS, VecConnectFour, observation_planes
from policystore.league.solver import (
    NodeLimitExceeded,
    Solver,
    can_win_now,
    from_env,
    is_open,
    is_winning_move,
    play,
    playable,
    winning_cells,
)
from policystore.league.tactics import forced_moves


def named(board: np.ndarray) -> set[int]:
    """The columns the rules name for player 1 to move on ``board``."""
    env = VecConnectFour.from_boards(board, to_move=np.ones(1, np.int8))
    return set(np.flatnonzero(forced_moves(observation_planes(env, np.arange(1)))[0]).tolist())


def test_wins_come_first_then_blocks():
    """On positions from random play: the columns that win at once for the mover, else the ones that stop the
    opponent's win at once, as the bitboard rules of the scripted players say."""
    env = VecConnectFour(3000)
    rng = np.random.default_rng(4)
    random_opening(env, rng.integers(5, 30, env.num_envs), rng)
    ids = np.flatnonzero(~env.done)
    me = (env.to_move[ids] - 1).astype(np.int64)
    win, block = winning_columns(env, ids, me), winning_columns(env, ids, 1 - me)
    forced = forced_moves(observation_planes(env, ids))
    has_win, has_block = win.any(axis=1), block.any(axis=1) & ~win.any(axis=1)
    assert (forced[has_win] == win[has_win]).all() and (forced[has_block] == block[has_block]).all()
    assert has_win.sum() > 100 and has_block.sum() > 100  # both kinds met
    assert (~forced.any(axis=1)).sum() > 100  # and positions where no rule applies


def _wins_next_move(stones: int, mask: int) -> bool:
    """The rules' "double threat" in the solver's plain-int bitboards: two playable threats, or one under another."""
    threats = winning_cells(stones, mask)
    open_threats = threats & playable(mask)
    return open_threats.bit_count() >= 2 or bool((open_threats << 1) & threats)


def _reference(position: tuple[int, int, int]) -> set[int]:
    """The rules of ``league.tactics`` for one position, written out move by move on the solver's functions."""
    legal = [c for c in range(COLS) if is_open(position, c)]
    for rule in ([c for c in legal if is_winning_move(position, c)],
                 [c for c in legal if is_winning_move((position[0] ^ position[1], *position[1:]), c)]):
        if rule:
            return set(rule)
    doubles, loses = set(), set()
    for c in legal:
        child = play(position, c)  # the opponent to move
        if can_win_now(child[0], child[1]):
            loses.add(c)
            continue
        if _wins_next_move(child[0] ^ child[1], child[1]):
            doubles.add(c)
        for d in (d for d in range(COLS) if is_open(child, d)):
            grandchild = play(child, d)  # me to move
            if not can_win_now(grandchild[0], grandchild[1]) and _wins_next_move(
                    grandchild[0] ^ grandchild[1], grandchild[1]):
                loses.add(c)
    if doubles:
        return doubles
    return set(legal) - loses if loses and loses != set(legal) else set()


def test_the_vectorized_rules_match_a_move_by_move_reading():
    env = VecConnectFour(2000)
    rng = np.random.default_rng(3)
    random_opening(env, rng.integers(0, 36, env.num_envs), rng)
    ids = np.flatnonzero(~env.done)
    forced = forced_moves(observation_planes(env, ids))
    for k, i in enumerate(ids):
        assert set(np.flatnonzero(forced[k]).tolist()) == _reference(from_env(env, int(i))), k
    assert forced.any(axis=1).sum() > len(ids) // 2


def test_a_double_threat_is_named_in_a_quiet_position():
    board = np.zeros((ROWS, COLS), np.int8)
    board[ROWS - 1, [2, 3, 6]] = [1, 1, 2]
    board[ROWS - 2, 6] = 2                    # two in a row for player 1 on an open bottom row
    assert named(board) == {1, 4}             # either end makes two threats at once


def test_the_moves_that_let_the_opponent_make_a_double_threat_are_left_out():
    board = np.zeros((ROWS, COLS), np.int8)
    board[ROWS - 1, [2, 3, 6]] = [2, 2, 1]
    board[ROWS - 2, 2] = 1                    # player 2 has two in a row on an open bottom row
    assert named(board) == {1, 4}             # elsewhere, player 2 plays an end and wins
    board[ROWS - 1, 6], board[ROWS - 2, 2] = 0, 0
    board[ROWS - 1, [1, 4]] = 1               # both ends taken: nothing to avoid, no rule applies
    assert named(board) == set()


def test_every_rule_is_sound_by_the_exact_solver():
    """Where a quiet position gets a target: every named move wins (a double threat), or every move left out
    loses (the opponent's double threat); the exact solver's values decide, so a rule that named a wrong move
    fails here."""
    env = VecConnectFour(600)
    rng = np.random.default_rng(7)
    random_opening(env, rng.integers(18, 30, env.num_envs), rng)
    ids = np.flatnonzero(~env.done)
    me = (env.to_move[ids] - 1).astype(np.int64)
    quiet = ~(winning_columns(env, ids, me) | winning_columns(env, ids, 1 - me)).any(axis=1)
    forced = forced_moves(observation_planes(env, ids))
    solver, checked = Solver(node_limit=100_000), {"wins": 0, "avoids": 0}
    for k in np.flatnonzero(quiet & forced.any(axis=1)):
        try:
            values = solver.move_values(from_env(env, int(ids[k])))
        except NodeLimitExceeded:
            continue
        target = {c for c in values if forced[k, c]}
        if all(values[c] == 1 for c in target) and max(values.values()) == 1 and len(target) < len(values):
            checked["wins"] += 1
        else:
            assert all(values[c] == -1 for c in values if c not in target), (k, values, target)
            checked["avoids"] += 1
    assert checked["wins"] >= 5 and checked["avoids"] >= 5, checked
