"""The decayed payoff table (league/payoff.py): unseen pairs, decay per game, raw game counts across a save."""

import json

import numpy as np
import pytest

from policystore.league.payoff import Payoff


def test_unseen_pair_counts_as_half():
    payoff = Payoff()
    payoff.add_player("a")
    payoff.add_player("b")
    assert payoff.win_rate("a", "b") == 0.5 and payoff.win_rate("b", "a") == 0.5
    with pytest.raises(KeyError, match="unknown player 'c'"):
        payoff.win_rate("a", "c")


def test_payoff_decays_old_results_by_0_99_per_game():
    payoff = Payoff()
    for p in "ab":
        payoff.add_player(p)
    payoff.update("a", "b", wins=1, draws=0, losses=0)
    payoff.update("a", "b", wins=0, draws=0, losses=1)
    # Hand-computed pseudocode updates: games = 0.99 + 1, wins = 0.99.
    assert payoff.win_rate("a", "b") == pytest.approx(0.99 / 1.99)
    assert payoff.win_rate("b", "a") == pytest.approx(1.0 / 1.99)
    payoff.update("a", "b", wins=0, draws=1, losses=0)
    assert payoff.win_rate("a", "b") == pytest.approx((0.99 ** 2 + 0.5) / (0.99 ** 2 + 0.99 + 1))


def test_payoff_batch_equals_sequential_updates_and_tracks_recent_form():
    batch, single = Payoff(), Payoff()
    for p in (batch, single):
        p.add_player("a")
        p.add_player("b")
        p.update("a", "b", wins=0, draws=0, losses=50)
    batch.update("a", "b", wins=30, draws=0, losses=0)
    for _ in range(30):
        single.update("a", "b", wins=1, draws=0, losses=0)
    assert batch.win_rate("a", "b") == pytest.approx(single.win_rate("a", "b"))
    # 30 recent wins after 50 older losses: decay makes the recent form count for more than 30/80.
    assert batch.win_rate("a", "b") > 30 / 80 + 0.05
    np.testing.assert_allclose(batch.matrix() + batch.matrix().T, np.ones((2, 2)))


def test_payoff_counts_the_games_each_pair_played_across_a_save():
    payoff = Payoff()
    for p in "abc":
        payoff.add_player(p)
    payoff.update("a", "b", wins=300, draws=12, losses=200)
    payoff.update("b", "a", wins=1, draws=0, losses=0)
    played = payoff.played()
    assert played[0, 1] == played[1, 0] == 513 and played[0, 2] == played[2, 0] == 0
    state = json.loads(json.dumps(payoff.to_dict()))
    np.testing.assert_array_equal(Payoff.from_dict(state).played(), played)
    # A state saved before raw counts were kept: its decayed counts (99.4 after 513 games), rounded up.
    del state["played"]
    np.testing.assert_array_equal(Payoff.from_dict(state).played(), [[0, 100, 0], [100, 0, 0], [0, 0, 0]])


def test_payoff_rejects_bad_updates():
    payoff = Payoff()
    payoff.add_player("a")
    with pytest.raises(ValueError, match="already"):
        payoff.add_player("a")
    with pytest.raises(ValueError, match="negative"):
        payoff.update("a", "a", -1, 0, 0)
    with pytest.raises(ValueError, match="decay"):
        Payoff(decay=0.0)


def test_a_game_that_pays_amounts_scores_by_the_amount_and_old_states_still_load():
    payoff = Payoff(decay=1.0)
    for name in ("a", "b"):
        payoff.add_player(name)
    # 10 poker hands: a won 4, lost 6, but its points (chips scaled to [0, 1] per hand) come to 6.5 of 10
    payoff.update("a", "b", wins=4, draws=0, losses=6, score=6.5)
    assert payoff.win_rate("a", "b") == pytest.approx(0.65) and payoff.win_rate("b", "a") == pytest.approx(0.35)
    with pytest.raises(ValueError, match="must lie in"):
        payoff.update("a", "b", wins=1, draws=0, losses=0, score=2.0)
    old = {"decay": 1.0, "players": ["a", "b"], "wins": [[0, 3], [1, 0]], "draws": [[0, 2], [2, 0]],
           "games": [[0, 6], [6, 0]], "played": [[0, 6], [6, 0]]}
    assert Payoff.from_dict(old).win_rate("a", "b") == pytest.approx(4 / 6)  # 3 wins and 2 draws of 6
