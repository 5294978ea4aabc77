"""PUCT search (league/search.py) with a know-nothing net (uniform prior, value 0): whatever it finds, the tree
found, so tactics a net cannot see show that selection, expansion and the sign of the backup are right."""

import numpy as np
import pytest
import torch

from policystore.league.connect4 import COLS, ROWS, VecConnectFour, observation_planes
from policystore.league.model import PolicyNet
from policystore.league.search import best_moves, root_visits, visit_targets


@pytest.fixture(scope="module")
def blank_net() -> PolicyNet:
    net = PolicyNet(hidden=16)
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
    return net


def game(rows: dict[tuple[int, int], int]) -> VecConnectFour:
    board = np.zeros((ROWS, COLS), np.int8)
    for (r, c), player in rows.items():
        board[r, c] = player
    return VecConnectFour.from_boards(board)


def test_finds_the_win_and_the_block(blank_net):
    win = game({(5, 0): 1, (5, 1): 1, (5, 2): 1, (5, 4): 2, (5, 5): 2, (4, 0): 2})
    assert best_moves(blank_net, win, [0], 16)[0] == 3
    block = game({(5, 4): 1, (5, 5): 1, (5, 6): 1, (5, 0): 2, (4, 0): 2})  # player 2 to move
    assert best_moves(blank_net, block, [0], 64)[0] == 3


def test_does_not_play_under_the_opponents_threat(blank_net):
    # Player 2 has three on row 4 (columns 0-2); a stone of player 1 in column 3 would let player 2 complete it.
    trap = game({(5, 0): 1, (5, 1): 1, (5, 2): 2, (5, 4): 1, (4, 0): 2, (4, 1): 2, (4, 2): 2, (3, 0): 1})
    visits = root_visits(blank_net, trap, [0], 200)[0]
    assert visits[3] == visits.min() and best_moves(blank_net, trap, [0], 200)[0] != 3


def test_visits_add_up_and_skip_full_columns(blank_net):
    env = VecConnectFour(3)
    env.step(np.array([2, 2, 2]))
    for _ in range(5):  # fill column 2 in game 1 only
        env.step(np.array([2]), np.array([1]))
    visits = root_visits(blank_net, env, [0, 1, 2], 40)
    assert visits.sum(axis=1).tolist() == [40, 40, 40]
    assert visits[1, 2] == 0 and visits[0, 2] > 0


def test_searches_many_games_at_once_like_one_at_a_time(blank_net):
    win = game({(5, 0): 1, (5, 1): 1, (5, 2): 1, (5, 4): 2, (5, 5): 2, (4, 0): 2})
    batch = VecConnectFour.from_boards(np.stack([win.boards[0], np.zeros((ROWS, COLS), np.int8)]))
    together = root_visits(blank_net, batch, [0, 1], 30)
    assert np.array_equal(together[0], root_visits(blank_net, win, [0], 30)[0])
    assert np.array_equal(together[1], root_visits(blank_net, VecConnectFour(1), [0], 30)[0])


def test_rejects_bad_arguments(blank_net):
    env = game({(5, 0): 1, (5, 1): 1, (5, 2): 1, (4, 0): 2, (4, 1): 2, (4, 2): 2})
    env.step(np.array([3]))  # player 1 wins
    with pytest.raises(ValueError, match="unfinished"):
        best_moves(blank_net, env, [0], 8)
    with pytest.raises(ValueError, match="simulations"):
        best_moves(blank_net, VecConnectFour(1), [0], 0)


def test_visit_targets_are_the_searchs_shares_read_from_the_nets_input_planes(blank_net):
    """The learner has only a batch's planes: the targets rebuild each game from them and search it."""
    win = game({(5, 0): 1, (5, 1): 1, (5, 2): 1, (5, 4): 2, (5, 5): 2, (4, 0): 2})
    block = game({(5, 4): 1, (5, 5): 1, (5, 6): 1, (5, 0): 2, (4, 0): 2})  # player 2 to move
    boards = np.stack([win.boards[0], block.boards[0]])
    env = VecConnectFour.from_boards(boards)
    targets = visit_targets(blank_net, observation_planes(env, np.arange(2)), 64)
    np.testing.assert_allclose(targets.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(targets * 64, root_visits(blank_net, env, [0, 1], 64))
    assert targets.argmax(axis=1).tolist() == [3, 3]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_net_on_a_gpu_searches_like_the_same_net_on_the_cpu(blank_net):
    """A learner on a GPU computes its search targets with its net where it is."""
    env = VecConnectFour(4)
    env.step(np.array([3, 2, 4, 0]))
    planes = observation_planes(env, np.arange(4))
    on_gpu = PolicyNet(hidden=16).to("cuda")
    on_gpu.load_state_dict(blank_net.state_dict())
    np.testing.assert_array_equal(visit_targets(on_gpu, planes, 32), visit_targets(blank_net, planes, 32))
