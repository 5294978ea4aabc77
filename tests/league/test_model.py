"""The policy net's action choice (policystore/league/model.py): masked columns are never chosen."""

import numpy as np
import pytest
import torch

from policystore.league.connect4 import COLS, NUM_PLANES, ROWS
from policystore.league.model import PolicyNet, act, masked_logits


def test_masked_columns_get_zero_probability_and_are_never_sampled():
    net = PolicyNet(32)
    logits = masked_logits(torch.zeros(2, COLS), torch.tensor([[True] * 6 + [False]] * 2))
    assert torch.softmax(logits, -1)[:, 6].max().item() == 0.0
    planes = np.zeros((500, NUM_PLANES, ROWS, COLS), np.float32)
    legal = np.zeros((500, COLS), bool)
    legal[:, [1, 4]] = True
    actions, logp, values = act(net, planes, legal, torch.Generator().manual_seed(0))
    assert set(actions.tolist()) == {1, 4} and (logp <= 0).all() and (np.abs(values) <= 1).all()


def test_sampled_moves_follow_the_masked_softmax_and_greedy_takes_its_best():
    net = PolicyNet(8, (5,), 4)
    with torch.no_grad():  # logits are the bias: column 0 masked, then softmax over (2, 0, -1)
        net.policy.weight.zero_()
        net.policy.bias.copy_(torch.tensor([3.0, 2.0, 0.0, -1.0]))
    probs = np.exp([2.0, 0.0, -1.0]) / np.exp([2.0, 0.0, -1.0]).sum()
    n = 40_000
    planes = np.random.default_rng(0).random((n, 5), dtype=np.float32)
    legal = np.tile([False, True, True, True], (n, 1))
    actions, logp, _ = act(net, planes, legal, torch.Generator().manual_seed(0))
    assert np.bincount(actions, minlength=4) / n == pytest.approx([0.0, *probs], abs=0.01)
    assert logp == pytest.approx(np.log(probs[actions - 1]), abs=1e-5)
    assert (act(net, planes[:3], legal[:3], greedy=True)[0] == 1).all()
