"""Elo ratings (policystore/league/elo.py): moved towards results, zero-sum, settling at the formula's gap."""

import numpy as np
import pytest

from policystore.league.elo import Elo


def test_elo_moves_ratings_towards_results_and_is_zero_sum():
    elo = Elo(k=16)
    for p in "ab":
        elo.add(p)
    elo.update("a", "b", wins=90, draws=0, losses=10)
    assert elo.ratings["a"] == pytest.approx(1000 + 16 * 0.4)
    assert elo.ratings["a"] + elo.ratings["b"] == pytest.approx(2000)
    for _ in range(500):
        elo.update("a", "b", wins=90, draws=0, losses=10)
    # A 90% score settles near a 382-point gap (the Elo formula's value for 0.9).
    assert elo.ratings["a"] - elo.ratings["b"] == pytest.approx(400 * np.log10(9), abs=5)
    elo.update("a", "a", 5, 0, 0)  # self-play moves nothing
    assert elo.ratings["a"] + elo.ratings["b"] == pytest.approx(2000)
