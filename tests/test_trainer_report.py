"""The end-of-run payoff heatmap: training players against the players they met, by Elo, unseen pairs blank."""

import numpy as np

from league.matchmaking import League, LeagueConfig, MatchResult
from trainer import report


def test_heatmap_shows_training_players_against_whom_they_met(tmp_path, monkeypatch):
    league = League(LeagueConfig(main_agents=1, main_exploiters=1, league_exploiters=1))
    for request in league.pop_requests():
        league.add_snapshot(request)
    league.report(MatchResult("main_0", "main_0.s0", wins=30, draws=0, losses=10, steps=10))
    league.report(MatchResult("main_exploiter_0", "main_0", wins=5, draws=0, losses=35, steps=10))
    league.elo.ratings.update({"main_0": 1100.0, "main_exploiter_0": 1200.0})
    shown = {}
    real_imshow = None

    def spy(ax, data, **kw):  # what the picture holds, cell by cell
        shown["grid"] = np.ma.filled(data, np.nan)
        return real_imshow(ax, data, **kw)

    plt = report.pyplot()
    real_imshow = plt.Axes.imshow
    monkeypatch.setattr(plt.Axes, "imshow", spy)
    report.payoff_heatmap(league.summary(), *league.payoff_matrix(), tmp_path / "payoff.png")
    assert (tmp_path / "payoff.png").read_bytes()[:4] == b"\x89PNG"
    # Rows: the three training players by Elo; columns: the players they met (exploiter, main_0, main_0.s0) by Elo.
    grid = shown["grid"]
    assert grid.shape == (3, 3)
    rate = league.payoff.win_rate
    assert grid[0, 1] == rate("main_exploiter_0", "main_0") and grid[1, 0] == rate("main_0", "main_exploiter_0")
    assert grid[1, 2] == rate("main_0", "main_0.s0") and np.isnan(grid[0, 2])
    assert np.isnan(grid[2]).all()  # the league exploiter never played: grey, not 0.5
