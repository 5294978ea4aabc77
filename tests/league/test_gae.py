"""Generalised advantage estimation (policystore/league/gae.py) against a hand-computed episode."""

import numpy as np

from policystore.league.gae import gae


def test_gae_matches_a_hand_computed_episode():
    gamma, lam = 0.9, 0.5
    values = np.array([[0.1, 0.2, 0.3, 0.0], [0.5, 0.0, 0.0, 0.0]], dtype=np.float32)
    lengths = np.array([3, 1])
    final = np.array([1.0, -1.0], dtype=np.float32)
    adv, ret = gae(values, lengths, final, gamma, lam)
    d2 = 1.0 - 0.3
    d1 = gamma * 0.3 - 0.2
    d0 = gamma * 0.2 - 0.1
    a2, a1 = d2, d1 + gamma * lam * d2
    a0 = d0 + gamma * lam * a1
    np.testing.assert_allclose(adv[0], [a0, a1, a2, 0.0], rtol=1e-6)
    np.testing.assert_allclose(adv[1], [-1.5, 0, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(ret[0, :3], adv[0, :3] + values[0, :3], rtol=1e-6)
    assert ret[0, 3] == 0 and ret[1, 1:].sum() == 0
    # lambda = 1: advantages are discounted returns minus values (Monte Carlo).
    adv, _ = gae(values, lengths, final, gamma, 1.0)
    np.testing.assert_allclose(adv[0, :3], [gamma ** 2 - 0.1, gamma - 0.2, 1 - 0.3], rtol=1e-6)
