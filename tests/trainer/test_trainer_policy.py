"""``trainer.policy``'s move selection with a net whose weights are set by hand, so the right answer is known.

A trained agent's moves depend on what a short run happened to learn; these tests check the mechanics instead: the
input planes the net sees (threat planes included), the legal-move mask, the seat, and the documented errors.
"""

import dataclasses

import numpy as np
import pytest
import torch

from policystore.league.connect4 import COLS, ROWS
from policystore.league.games import CONNECT4
from policystore.league.model import PolicyNet
from policystore.trainer.policy import connect_four_policy, observation_policy

WIN_PLANE, BLOCK_PLANE = 3, 4  # observation_planes: cells that win for the mover, cells that win for the opponent


def threat_net(prefer: int | None = None) -> PolicyNet:
    """Column logits = 10 x (mover's winning cells in the column) + 5 x (opponent's winning cells in it): win if
    you can, block if you must, else column 0 (or ``prefer``, through the policy bias)."""
    net = PolicyNet(hidden=2 * COLS)
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        first, second = net.body[1], net.body[3]
        for col in range(COLS):
            for row in range(ROWS):
                first.weight[col, WIN_PLANE * ROWS * COLS + row * COLS + col] = 1.0
                first.weight[COLS + col, BLOCK_PLANE * ROWS * COLS + row * COLS + col] = 1.0
        second.weight.copy_(torch.eye(2 * COLS))
        net.policy.weight[:, :COLS] = 10 * torch.eye(COLS)
        net.policy.weight[:, COLS:] = 5 * torch.eye(COLS)
        if prefer is not None:
            net.policy.bias[prefer] = 100.0
    return net.eval()


def board_with_win_at_3() -> np.ndarray:
    board = np.zeros((ROWS, COLS), np.int8)
    board[5, :3] = 1   # player 1: three in a row on the bottom, column 3 completes it
    board[5, 4:6] = 2
    board[4, 0] = 2
    return board


def test_takes_the_win_the_threat_planes_show():
    assert connect_four_policy(threat_net())(board_with_win_at_3(), 1) == 3


def test_a_win_comes_before_a_block_so_the_planes_are_the_movers():
    board = np.zeros((ROWS, COLS), np.int8)
    board[5, :3] = 1     # player 1 wins at column 3...
    board[3:, 6] = 2     # ...player 2 threatens column 6; swapped planes would block instead
    assert connect_four_policy(threat_net())(board, 1) == 3


def test_blocks_the_opponents_threat_from_the_other_seat():
    board = np.zeros((ROWS, COLS), np.int8)
    board[5, 4:7] = 1  # player 1 threatens column 3; player 2 to move
    board[5, 0] = 2
    board[4, 0] = 2
    assert connect_four_policy(threat_net())(board, 2) == 3


def test_legal_actions_restrict_the_choice():
    act = connect_four_policy(threat_net())
    assert act(board_with_win_at_3(), 1, [0, 6]) in (0, 6)
    assert act(board_with_win_at_3(), 1, np.array([5])) == 5


def test_a_full_column_is_never_played_even_when_the_net_prefers_it():
    board = np.zeros((ROWS, COLS), np.int8)
    board[:, 2] = [1, 2, 1, 2, 1, 2]  # column 2 full, three stones each
    act = connect_four_policy(threat_net(prefer=2))
    assert act(np.zeros((ROWS, COLS), np.int8), 1) == 2  # the bias works where column 2 is open...
    assert act(board, 1) != 2                                # ...and the mask wins where it is full


def test_bad_input_raises_the_documented_errors():
    act = connect_four_policy(threat_net())
    with pytest.raises(ValueError, match="player_to_move"):
        act(board_with_win_at_3(), 3)
    with pytest.raises(ValueError, match="player 2 is not to move"):
        act(board_with_win_at_3(), 2)
    with pytest.raises(ValueError, match="none of legal_actions"):
        act(board_with_win_at_3(), 1, [])
    board = board_with_win_at_3()
    board[:, 6] = [1, 2, 1, 2, 1, 2]  # column 6 full (player 1 still to move: three stones each added)
    with pytest.raises(ValueError, match=r"none of legal_actions \[6\] is playable"):
        act(board, 1, [6])


def test_search_plays_within_legal_actions_and_finds_what_the_net_misses():
    blank = PolicyNet(hidden=8)
    with torch.no_grad():
        for p in blank.parameters():
            p.zero_()
    searched = connect_four_policy(blank, search=32)
    assert connect_four_policy(blank)(board_with_win_at_3(), 1) == 0  # the blank net alone: the first column
    assert searched(board_with_win_at_3(), 1) == 3                   # its search sees the win
    assert searched(board_with_win_at_3(), 1, [5, 6]) in (5, 6)
    with pytest.raises(ValueError, match="search"):
        connect_four_policy(blank, search=-1)


def test_any_game_is_played_on_its_own_observation_among_the_legal_actions():
    """A net that reads one entry of a flat observation: the move follows what it sees, stays legal, and takes
    legal actions as ids or as a mask."""
    game = dataclasses.replace(CONNECT4, name="flat", plane_shape=(4,), num_actions=3)
    net = PolicyNet(4, (4,), 3)
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.body[1].weight[0, 0] = 1.0  # hidden unit 0 = observation[0]
        net.body[3].weight[0, 0] = 1.0
        net.policy.weight[2, 0] = 10.0  # observation[0] high: action 2
        net.policy.bias[1] = 1.0        # else action 1
    act = observation_policy(net.eval(), game)
    assert act(np.array([1.0, 0, 0, 0]), [0, 1, 2]) == 2
    assert act(np.zeros(4), [0, 1, 2]) == 1
    assert act(np.array([1.0, 0, 0, 0]), np.array([True, True, False])) == 1
    assert act([1.0, 0, 0, 0], [0]) == 0
    with pytest.raises(ValueError, match=r"flat observations have shape \(4,\)"):
        act(np.zeros(5), [0])
    with pytest.raises(ValueError, match=r"legal actions must lie in 0..2"):
        act(np.zeros(4), [3])
    with pytest.raises(ValueError, match="no legal action"):
        act(np.zeros(4), np.zeros(3, dtype=bool))
