"""trainer.evaluate's mechanics (seats, opponents, intervals, search) with untrained nets: no strength asserted."""

import numpy as np
import pytest
import torch

from policystore.league.games import get_game
from policystore.league.model import PolicyNet
from policystore.trainer.evaluate import evaluate, main, wilson_interval


def test_wilson_interval_brackets_the_rate_and_narrows_with_games():
    low, high = wilson_interval(45, 50)
    assert low < 0.9 < high
    low_many, high_many = wilson_interval(900, 1000)
    assert low < low_many < 0.9 < high_many < high
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0


@pytest.mark.parametrize("search", [0, 4])
def test_evaluate_plays_both_seats_against_each_opponent(search):
    results = evaluate(PolicyNet(16), games_per_seat=6, seed=1, search=search)
    assert set(results) == {"random", "winblock", "safe"}
    for r in results.values():
        assert r["games"] == 12 and r["win"] + r["draw"] + r["loss"] == pytest.approx(1.0)
        assert r["win_low"] <= r["win"] <= r["win_high"]
        assert r["win"] == pytest.approx((r["win_first"] + r["win_second"]) / 2)
        assert np.isfinite(r["ms_per_batch_move"]) and r["ms_per_batch_move"] > 0


def test_unknown_opponent_is_named():
    with pytest.raises(ValueError, match="unknown opponent 'alphazero'"):
        evaluate(PolicyNet(16), games_per_seat=1, opponents=("alphazero",))


def test_openspiel_mcts_opponent_plays_whole_games_in_both_seats():
    pytest.importorskip("pyspiel", reason="the openspiel extra is not installed")
    results = evaluate(PolicyNet(16), games_per_seat=2, seed=0, opponents=("mcts8",))
    assert results["mcts8"]["games"] == 4
    assert results["mcts8"]["win"] + results["mcts8"]["draw"] + results["mcts8"]["loss"] == pytest.approx(1.0)


def test_command_rejects_a_negative_search(capsys):
    with pytest.raises(SystemExit):
        main(["--run-dir", "nowhere", "--search", "-1"])
    assert "--search" in capsys.readouterr().err


def test_openspiel_mcts_is_a_real_referee_in_any_perfect_information_openspiel_game():
    """Tic-tac-toe through the OpenSpiel adapter: the bot follows every game from the moves both sides played, and
    an untrained net wins none of its games against 100 simulations (a bot out of step would play at random)."""
    pytest.importorskip("pyspiel", reason="the openspiel extra is not installed")
    game = get_game("openspiel:tic_tac_toe")
    torch.manual_seed(0)
    results = evaluate(game.net(8), game, games_per_seat=4, seed=0, opponents=("random", "mcts100"))
    assert results["mcts100"]["games"] == 8 and results["mcts100"]["win"] == 0.0
    assert results["mcts100"]["return"] < 0


def test_poker_is_played_for_chips_and_refuses_a_search_referee():
    pytest.importorskip("pyspiel", reason="the openspiel extra is not installed")
    game = get_game("openspiel:leduc_poker")
    results = evaluate(game.net(8), game, games_per_seat=20, seed=0)
    r = results["random"]
    assert r["games"] == 40 and r["win"] + r["draw"] + r["loss"] == pytest.approx(1.0)
    # chips, not a +1/-1 score per game: raised pots make the mean return differ from win rate minus loss rate
    assert r["return"] != pytest.approx(r["win"] - r["loss"]) and abs(r["return"]) <= 13  # Leduc's pot: 13 a side
    with pytest.raises(ValueError, match="opponent mcts100: openspiel:leduc_poker hides information"):
        evaluate(game.net(8), game, games_per_seat=1, opponents=("mcts100",))
    with pytest.raises(ValueError, match="--search needs a game with a tree search"):
        evaluate(game.net(8), game, games_per_seat=1, search=4)
