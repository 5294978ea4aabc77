"""The policy net's action choice (policystore/league/model.py): masked columns are never chosen."""

import numpy as np
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
