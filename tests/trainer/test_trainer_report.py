"""The end-of-run report read as a person reads it: the payoff heatmap (training players against the league, in
order, never-met pairs marked) and the main agent at a few points of the run by the measure that fits the game:
against OpenSpiel's MCTS(100), or its exact NashConv in a poker game."""

import dataclasses
import json

import numpy as np
import pytest

from policystore.league.constants import HISTORICAL
from policystore.league.games import CONNECT4, get_game
from policystore.league.matchmaking import League, LeagueConfig, MatchResult
from policystore.league.model import PolicyNet
from policystore.trainer import evaluate, openspiel_bots, reference, report

CURVE = [{"time_s": 5.0, "steps": 30, "elo": {"main_0": 1100.0}, "win_random": 0.6, "win_winblock": 0.1}]


def spy(monkeypatch, method: str) -> list[tuple]:
    """Record every call of ``matplotlib.axes.Axes.<method>`` (axes, args, kwargs) and let it draw."""
    plt = report.pyplot()
    real, calls = getattr(plt.Axes, method), []

    def record(ax, *args, **kwargs):
        calls.append((ax, args, kwargs))
        return real(ax, *args, **kwargs)

    monkeypatch.setattr(plt.Axes, method, record)
    return calls


def play(league: League, learner: str, opponent: str, wins: int, losses: int) -> None:
    """Report a match and publish the snapshots it triggers (the league actor's part)."""
    league.report(MatchResult(learner, opponent, wins=wins, draws=0, losses=losses, steps=10))
    for request in league.pop_requests():
        league.add_snapshot(request)


@pytest.fixture
def league():
    """Three training players; tiny step budgets so that every 10-step match of main_0 freezes a snapshot."""
    league = League(LeagueConfig(main_agents=1, main_exploiters=1, league_exploiters=1))
    for request in league.pop_requests():
        league.add_snapshot(request)
    league.set_run_steps(100)
    play(league, "main_0", "main_0.s0", 30, 10)                # -> main_0.s1
    play(league, "main_exploiter_0", "main_0", 5, 35)          # -> main_exploiter_0.s0
    play(league, "main_0", "main_exploiter_0.s0", 20, 20)      # -> main_0.s2; a real 50%
    league.elo.ratings.update({"main_0": 1100.0, "main_exploiter_0": 1200.0, "league_exploiter_0": 1000.0})
    return league


def test_heatmap_rows_are_the_training_players_against_the_whole_league_in_order(league, tmp_path, monkeypatch):
    shown = spy(monkeypatch, "imshow")
    report.payoff_heatmap(league.summary(), *league.payoff_matrix(), tmp_path / "payoff.png")
    assert (tmp_path / "payoff.png").read_bytes()[:4] == b"\x89PNG"
    ((ax, (data,), _),) = shown
    rows = [t.get_text().split()[0] for t in ax.get_yticklabels()]
    cols = [t.get_text().split()[0] for t in ax.get_xticklabels()]
    assert rows == ["main_exploiter_0", "main_0", "league_exploiter_0"]  # only the players that train, by Elo
    # Every league member, lineage by lineage: snapshots in the order they were frozen, then the player now.
    assert cols == ["main_0.s0", "main_0.s1", "main_0.s2", "main_0", "main_exploiter_0.s0", "main_exploiter_0",
                    "league_exploiter_0"]
    grid = np.ma.filled(data, np.nan)
    rate = league.payoff.win_rate
    assert grid[1, 0] == rate("main_0", "main_0.s0") == 0.75
    assert grid[1, 4] == 0.5  # met and drew level: a real 0.5, shown as one
    assert grid[0, 3] == rate("main_exploiter_0", "main_0") and grid[1, 5] == rate("main_0", "main_exploiter_0")
    never = np.isnan(grid)
    assert never.sum() == 21 - 4 and never[2].all()  # 4 pairs met; the league exploiter never played
    hatched = {(round(p.get_x() + 0.5), round(p.get_y() + 0.5)) for p in ax.patches if p.get_hatch()}
    assert hatched == {(j, i) for i, j in np.argwhere(never)}
    counts = {t.get_text() for t in ax.texts}
    assert {"75", "50", "40"} <= counts  # a rate and the games played in the cells that met


def test_scripted_players_are_columns_of_the_heatmap_never_rows(tmp_path, monkeypatch):
    league = League(LeagueConfig(main_exploiters=0, league_exploiters=0, scripted=("winblock",),
                                 scripted_share=0.5))
    for request in league.pop_requests():
        league.add_snapshot(request)
    play(league, "main_0", "winblock", 30, 10)
    shown = spy(monkeypatch, "imshow")
    report.payoff_heatmap(league.summary(), *league.payoff_matrix(), tmp_path / "payoff.png")
    ((ax, (data,), _),) = shown
    assert [t.get_text().split()[0] for t in ax.get_yticklabels()] == ["main_0"]
    assert [t.get_text().split()[0] for t in ax.get_xticklabels()] == ["main_0.s0", "main_0", "winblock"]
    assert np.ma.filled(data, np.nan)[0, 2] == 0.75


def test_game_counts_stay_short():
    assert [report.count_text(n) for n in (7, 512, 5120, 51_200, 1_234_567)] == ["7", "512", "5.1k", "51k", "1.2M"]


def test_milestones_spread_over_the_run_and_end_with_the_player_now(league):
    for _ in range(4):  # main_0.s3 .. main_0.s6
        play(league, "main_0", "main_0.s0", 1, 1)
    summary = league.summary()
    frozen = {r["name"]: r["frozen_at"] for r in summary if r["kind"] == HISTORICAL}
    picked = evaluate.milestones(summary, count=4)
    # Six trained snapshots (s0, the initial weights, says nothing): every 1.5th, the last one included.
    assert picked == [(name, frozen[name]) for name in ("main_0.s2", "main_0.s3", "main_0.s5", "main_0.s6")] + \
        [("main_0", league.total_steps())]
    assert [s for _, s in picked] == sorted(s for _, s in picked)
    assert evaluate.milestones(summary, count=10)[:-1] == [(f"main_0.s{i}", frozen[f"main_0.s{i}"])
                                                            for i in range(1, 7)]


def test_reference_points_are_measured_recorded_and_drawn(league, tmp_path, monkeypatch):
    pytest.importorskip("pyspiel", reason="the openspiel extra is not installed")
    nets = {}
    record = reference.measure(league.summary(), lambda name: nets.setdefault(name, PolicyNet(16)), CONNECT4,
                               games_per_seat=1, seed=3)
    assert [(p["player"], p["steps"]) for p in record["points"]] == evaluate.milestones(league.summary())
    assert set(nets) == {"main_0.s1", "main_0.s2", "main_0"}
    for p in record["points"]:
        assert p["games"] == 2 and p["win"] + p["draw"] + p["loss"] == pytest.approx(1.0)
        assert p["win_low"] <= p["win"] <= p["win_high"]
    assert record["measure"] == "mcts" and record["opponent"] == "mcts100" and record["games_per_point"] == 2
    assert record["seconds"] > 0
    drawn = spy(monkeypatch, "errorbar")
    report.write_report(tmp_path, league.summary(), *league.payoff_matrix(), CURVE, record)
    ((_, (x, y), kwargs),) = drawn
    assert list(x) == [p["steps"] / 1e6 for p in record["points"]] and list(y) == [p["win"] for p in record["points"]]
    assert "mcts100" in kwargs["label"]
    players = (tmp_path / "players.md").read_text()
    assert "## main_0 against OpenSpiel mcts100" in players and "| main_0.s2 |" in players
    final = report.final_record({"steps": 1, "steps_per_s": 1.0, "elapsed_s": 1.0}, [], {}, [], [], record)
    assert json.loads(json.dumps(final))["reference"]["points"] == record["points"]


def test_reference_is_skipped_cleanly_without_open_spiel(league, tmp_path, monkeypatch):
    monkeypatch.setattr(openspiel_bots, "available", lambda: False)
    record = reference.measure(league.summary(), lambda name: pytest.fail("nothing is loaded"), CONNECT4, 10)
    assert record == {"measure": "mcts", "opponent": "mcts100", "games_per_point": 20,
                      "skipped": 'open_spiel is not installed (pip install -e ".[openspiel]")'}
    drawn = spy(monkeypatch, "errorbar")
    report.write_report(tmp_path, league.summary(), *league.payoff_matrix(), CURVE, record)
    assert drawn == [] and (tmp_path / "curve.png").stat().st_size > 0
    assert "Not measured: open_spiel is not installed" in (tmp_path / "players.md").read_text()


def test_reference_is_skipped_for_games_no_measure_fits_and_when_switched_off():
    tictactoe = dataclasses.replace(CONNECT4, name="pettingzoo:tictactoe_v3", openspiel=None)
    assert reference.skip_reason(tictactoe, 10) == \
        "pettingzoo:tictactoe_v3 names no OpenSpiel game to search (Game.openspiel)"
    assert reference.skip_reason(CONNECT4, 0) == "reference_games is 0"
    poker = dataclasses.replace(CONNECT4, name="mypoker", perfect_information=False, openspiel=None)
    assert reference.measure_of(poker) == "nash_conv"
    assert "names no OpenSpiel game to solve" in reference.skip_reason(poker, 10)


def test_nash_conv_points_are_measured_recorded_and_drawn(league, tmp_path, monkeypatch):
    pytest.importorskip("pyspiel", reason="the openspiel extra is not installed")
    game = get_game("openspiel:kuhn_poker")
    nets = {}
    record = reference.measure(league.summary(), lambda name: nets.setdefault(name, game.net(8)), game,
                               games_per_seat=1)
    assert record["measure"] == "nash_conv" and record["game"] == "kuhn_poker"
    assert [(p["player"], p["steps"]) for p in record["points"]] == evaluate.milestones(league.summary())
    uniform = record["uniform_nash_conv"]
    assert uniform == pytest.approx(0.9166666, abs=1e-6)  # OpenSpiel's figure for the uniform policy in Kuhn
    assert all(0 < p["nash_conv"] < 3 for p in record["points"])  # random nets: exploitable, within Kuhn's stakes
    drawn = spy(monkeypatch, "plot")
    report.write_report(tmp_path, league.summary(), *league.payoff_matrix(), CURVE, record)
    steps, values = next((x, y) for ax, (x, y, *_), _ in drawn if ax.get_ylabel().startswith("NashConv"))
    assert steps == [p["steps"] / 1e6 for p in record["points"]]
    assert values == [p["nash_conv"] for p in record["points"]]
    players = (tmp_path / "players.md").read_text()
    assert "## main_0's NashConv, computed exactly by OpenSpiel" in players and "| main_0.s2 |" in players
    assert "main_0's NashConv" in report.reference_text(record) and "0.917" in report.reference_text(record)
