"""Connect Four rules: wins in all four directions, draws, illegal moves, spaces, scripted players."""

import numpy as np
import pytest

from policystore.league.baselines import random_opening, random_player, safe_player, win_block_player, winning_columns
from policystore.league.connect4 import (
    COLS,
    ROWS,
    VecConnectFour,
    canonical,
    games_from_planes,
    is_win,
    observation_planes,
)


def play(env: VecConnectFour, columns: list[int], game: int = 0):
    done = winner = None
    for c in columns:
        done, winner = env.step(np.array([c]), np.array([game]))
    return bool(done[0]), int(winner[0])


@pytest.mark.parametrize("moves, winner", [
    ([0, 1, 0, 1, 0, 1, 0], 1),                 # vertical
    ([0, 0, 1, 1, 2, 2, 3], 1),                 # horizontal, bottom row
    ([0, 1, 1, 2, 2, 3, 2, 3, 3, 6, 3], 1),     # diagonal rising to the right
    ([6, 5, 5, 4, 4, 3, 4, 3, 3, 0, 3], 1),     # diagonal rising to the left
    ([6, 0, 6, 1, 6, 2, 5, 3], 2),              # second player, horizontal
    ([3, 4, 3, 4, 3, 4, 5, 4], 2),              # second player, vertical at the top half
])
def test_four_in_a_row_wins_in_every_direction(moves, winner):
    env = VecConnectFour(1)
    for i, c in enumerate(moves[:-1]):
        done, w = play(env, [c])
        assert not done and w == 0, f"game ended early at move {i}"
    assert play(env, moves[-1:]) == (True, winner)
    assert env.legal_mask().sum() == 0  # a finished game has no legal moves


def test_horizontal_wins_do_not_wrap_around_columns():
    # Column 6's stones and column 0's must not connect through the sentinel bit between columns.
    env = VecConnectFour(1)
    moves = [6, 0, 6, 0, 6, 0, 5, 6, 1, 6, 1, 6, 2]  # column 6 filled, then 3 stones on the bottom row
    for c in moves:
        done, _ = play(env, [c])
        assert not done
    assert not is_win(env.bits).any()


def test_full_board_without_four_is_a_draw():
    # Column order that fills the board with no four in a row (a classic drawn filling).
    order = [0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 4, 5, 4, 5, 4, 5, 6, 6, 6, 6, 6, 6,
             1, 0, 1, 0, 1, 0, 3, 2, 3, 2, 3, 2, 5, 4, 5, 4, 5, 4]
    env = VecConnectFour(1)
    for i, c in enumerate(order):
        done, winner = play(env, [c])
        assert done == (i == len(order) - 1), f"move {i}"
    assert winner == 0 and env.done[0] and env.moves[0] == ROWS * COLS


def test_illegal_moves_are_rejected_and_leave_the_game_untouched():
    env = VecConnectFour(2)
    for _ in range(ROWS):
        env.step(np.array([3]), np.array([0]))
    before = env.boards.copy()
    with pytest.raises(ValueError, match="column 3 is full in game 0"):
        env.step(np.array([3, 0]), np.array([0, 1]))
    with pytest.raises(ValueError, match="column 7 is outside"):
        env.step(np.array([7]), np.array([1]))
    with pytest.raises(ValueError, match="column -1 is outside"):
        env.step(np.array([-1]), np.array([1]))
    with pytest.raises(ValueError, match="duplicates"):
        env.step(np.array([1, 2]), np.array([1, 1]))
    np.testing.assert_array_equal(env.boards, before)
    play(env, [0, 1, 0, 1, 0, 1, 0], game=1)
    with pytest.raises(ValueError, match="game 1 is finished"):
        env.step(np.array([5]), np.array([1]))


def test_batch_steps_games_independently_and_reset_clears():
    env = VecConnectFour(3)
    env.step(np.array([0, 6, 3]))
    env.step(np.array([1, 5]), np.array([0, 2]))
    assert env.boards[0, ROWS - 1, 0] == 1 and env.boards[0, ROWS - 1, 1] == 2
    assert env.boards[1, ROWS - 1, 6] == 1 and env.to_move.tolist() == [1, 2, 1]
    assert env.boards[2, ROWS - 1, 3] == 1 and env.boards[2, ROWS - 1, 5] == 2
    env.reset(np.array([0]))
    assert env.boards[0].sum() == 0 and env.to_move[0] == 1 and env.boards[2].sum() == 3


def test_spaces_contain_observations():
    env = VecConnectFour(4)
    env.step(np.array([0, 1, 2, 3]))
    obs = env.observe()
    assert env.observation_space.contains(obs)
    assert env.single_observation_space.contains({k: v[0] for k, v in obs.items()})
    assert env.single_action_space.n == COLS and env.action_space.shape == (4,)


def test_from_boards_round_trips_and_validates():
    env = VecConnectFour(1)
    play(env, [3, 3, 2, 4, 1])
    rebuilt = VecConnectFour.from_boards(env.boards[0], to_move=2)
    np.testing.assert_array_equal(rebuilt.bits, env.bits)
    np.testing.assert_array_equal(rebuilt.heights, env.heights)
    # The rebuilt game continues like the original: player 2 blocks nothing, player 1 then wins at column 0.
    assert play(rebuilt, [6, 0]) == (True, 1)
    floating = np.zeros((ROWS, COLS), np.int8)
    floating[0, 0] = 1
    with pytest.raises(ValueError, match="floating stone"):
        VecConnectFour.from_boards(floating)
    two_stones = np.zeros((ROWS, COLS), np.int8)
    two_stones[-1, :2] = 1
    with pytest.raises(ValueError, match="impossible stone counts"):
        VecConnectFour.from_boards(two_stones)
    with pytest.raises(ValueError, match="player 2 is not to move"):
        VecConnectFour.from_boards(np.zeros((ROWS, COLS), np.int8), to_move=2)
    with pytest.raises(ValueError, match="shape"):
        VecConnectFour.from_boards(np.zeros((7, 6), np.int8))


def test_games_come_back_from_their_input_planes_with_the_right_player_to_move():
    rng = np.random.default_rng(3)
    env = VecConnectFour(400)
    lengths = rng.integers(0, 21, 400)
    for k in range(20):  # random games of every length up to 20 moves; finished ones stay as they are
        live = np.flatnonzero(~env.done & (lengths > k))
        legal = env.legal_mask(live)
        env.step(np.array([rng.choice(np.flatnonzero(row)) for row in legal], dtype=np.int64), live)
    running = np.flatnonzero(~env.done)
    rebuilt = games_from_planes(observation_planes(env, running))
    assert len(set(env.moves[running].tolist())) > 10 and set(env.to_move[running].tolist()) == {1, 2}
    for name in ("boards", "bits", "heights", "to_move", "moves"):
        np.testing.assert_array_equal(getattr(rebuilt, name), getattr(env, name)[running], err_msg=name)


def test_canonical_planes_are_from_the_movers_view():
    env = VecConnectFour(1)
    play(env, [3, 4])
    planes = canonical(env.boards, env.to_move)  # player 1 to move
    assert planes[0, 0, ROWS - 1, 3] == 1 and planes[0, 1, ROWS - 1, 4] == 1 and planes.sum() == 2


def test_win_block_player_takes_wins_then_blocks():
    env = VecConnectFour(2)
    play(env, [0, 6, 0, 6, 0], game=0)       # player 2 to move; player 1 threatens column 0
    play(env, [0, 6, 0, 6, 1, 6], game=1)    # player 1 to move; player 2 threatens column 6
    rng = np.random.default_rng(0)
    ids = np.array([0, 1])
    acts = win_block_player(env, ids, rng)
    assert acts[0] == 0                      # block the vertical threat
    assert winning_columns(env, np.array([1]), np.array([1]))[0, 6]  # player 2 threatens column 6
    assert acts[1] == 6                      # player 1 blocks it
    play(env, [5], game=0)                   # player 2 does not block in game 0...
    assert win_block_player(env, np.array([0]), rng)[0] == 0  # player 1 to move wins at column 0


def test_the_safe_player_never_opens_a_cell_where_the_opponent_wins_but_still_wins_and_blocks():
    board = np.zeros((ROWS, COLS), np.int8)
    bottom, second = ROWS - 1, ROWS - 2
    board[bottom, [1, 2, 3, 6]] = [1, 2, 1, 1]
    board[second, [1, 2, 3, 6]] = [2, 2, 2, 1]  # player 2 wins on (0, 1) and (4, 1), once they are reachable
    env = VecConnectFour.from_boards(np.repeat(board[None], 400, axis=0), to_move=np.ones(400, np.int8))
    ids, rng = np.arange(400), np.random.default_rng(0)
    assert not winning_columns(env, ids, np.ones(400, np.int64)).any()  # no threat to block now
    assert set(safe_player(env, ids, rng)) == {1, 2, 3, 5, 6}            # every move but the two that open them
    assert {0, 4} <= set(win_block_player(env, ids, rng))                # win/block plays them
    env = VecConnectFour(2)
    play(env, [0, 6, 0, 6, 0], game=0)       # player 2 must block column 0
    play(env, [0, 6, 0, 6, 0, 6], game=1)    # player 1 wins at column 0
    assert list(safe_player(env, np.array([0, 1]), rng)) == [0, 0]


def test_scripted_players_only_play_legal_moves_to_the_end():
    env = VecConnectFour(256)
    rng = np.random.default_rng(1)
    results = []
    for player_1, player_2 in [(win_block_player, random_player), (random_player, win_block_player)]:
        env.reset()
        while not env.done.all():
            ids = np.flatnonzero(~env.done)
            mover = env.to_move[ids]
            acts = np.empty(ids.size, np.int64)
            for p, fn in ((1, player_1), (2, player_2)):
                sel = mover == p
                if sel.any():
                    acts[sel] = fn(env, ids[sel], rng)
            assert env.legal_mask(ids)[np.arange(ids.size), acts].all()
            env.step(acts, ids)
        results.append(env.winner.copy())
    # The win/block player beats random by a wide margin in both seats.
    assert (results[0] == 1).mean() > 0.8 and (results[1] == 2).mean() > 0.8


def test_a_random_opening_plays_each_games_length_and_leaves_every_game_running():
    env = VecConnectFour(2000)
    rng = np.random.default_rng(2)
    lengths = rng.integers(0, 30, env.num_envs)
    random_opening(env, lengths, rng)
    assert not env.done.any()
    # A game stops short only where every legal move would complete four (rare this early, never below 7 stones).
    short = env.moves < lengths
    assert (env.moves <= lengths).all() and short.mean() < 0.01 and (lengths[short] > 7).all()
    me = (env.to_move[short] - 1).astype(np.int64)
    assert (winning_columns(env, np.flatnonzero(short), me) == env.legal_mask(np.flatnonzero(short))).all()
    # Random: the same lengths from a fresh batch give other positions.
    again = VecConnectFour(env.num_envs)
    random_opening(again, lengths, np.random.default_rng(3))
    assert (again.boards != env.boards).any(axis=(1, 2)).sum() > 0.5 * (lengths > 3).sum()
