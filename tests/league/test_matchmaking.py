"""The league's rules (league/matchmaking.py): who plays whom, snapshot and reset triggers, state through JSON."""

import json
from collections import Counter

import numpy as np
import pytest

from policystore.league.matchmaking import League, LeagueConfig, MatchResult


def serve(league: League) -> None:
    """Publish every requested snapshot (what the trainer's league actor has the learners do)."""
    for request in league.pop_requests():
        league.add_snapshot(request)


def snapshot_now(league: League, player: str) -> None:
    """Have ``player`` take its next snapshot: report a match without games that uses up its whole step budget."""
    opponent = league.snapshots()[0]
    league.report(MatchResult(player, opponent, wins=0, draws=0, losses=0, steps=league.budgets[player]))
    serve(league)


def set_rate(league: League, a: str, b: str, rate: float, games: int = 100) -> None:
    wins = int(round(rate * games))
    league.payoff.update(a, b, wins=wins, draws=0, losses=games - wins)


def counts(league: League, learner: str, n: int = 4000) -> Counter:
    return Counter(league.next_match(learner).opponent for _ in range(n))


def test_league_starts_with_trainables_and_a_snapshot_request_per_main_agent():
    league = League(LeagueConfig(main_agents=2, main_exploiters=1, league_exploiters=2))
    assert league.trainable() == ["main_0", "main_1", "main_exploiter_0",
                                "league_exploiter_0", "league_exploiter_1"]
    requests = league.pop_requests()
    assert [(r.player, r.name, r.reset) for r in requests] == [("main_0", "main_0.s0", False),
                                                                ("main_1", "main_1.s0", False)]
    assert league.pop_requests() == []  # handed out once
    league.elo.ratings["main_0"] = 1234.0
    league.add_snapshot(requests[0])
    assert league.snapshots() == ["main_0.s0"] and league.elo.ratings["main_0.s0"] == 1234.0
    with pytest.raises(ValueError, match="not requested"):
        league.add_snapshot(requests[0])


def test_learners_get_env_steps_in_proportion_to_their_shares():
    league = League(LeagueConfig(main_share=0.5))
    steps = Counter()
    for _ in range(400):
        match = league.next_match()
        league.report(MatchResult(match.learner, match.opponent, 1, 0, 1, steps=100))
        steps[match.learner] += 100
    assert steps["main_0"] == pytest.approx(0.5 * 40_000, rel=0.02)
    assert steps["main_exploiter_0"] == pytest.approx(0.25 * 40_000, rel=0.02)


def test_main_agent_mixes_pfsp_and_self_play():
    league = League(seed=1)
    serve(league)
    set_rate(league, "main_0", "main_0.s0", 0.9)
    # PFSP branch (50%) picks the only snapshot; verification finds nothing forgotten (0.9 >= 0.7): self-play.
    c = counts(league, "main_0")
    assert c["main_0.s0"] / 4000 == pytest.approx(0.5, abs=0.03)
    assert c["main_0"] / 4000 == pytest.approx(0.5, abs=0.03)
    # A forgotten past self (beaten < 70%, and less often than a newer snapshot) also gets the 15%
    # verification share.
    snapshot_now(league, "main_0")
    set_rate(league, "main_0", "main_0.s0", 0.5, games=2000)
    set_rate(league, "main_0", "main_0.s1", 0.9, games=2000)
    c = counts(league, "main_0")
    assert (c["main_0.s0"] + c["main_0.s1"]) / 4000 == pytest.approx(0.65, abs=0.03)
    assert c["main_0.s0"] / 4000 == pytest.approx(0.65 * 0.25 / 0.26, abs=0.03)


def test_main_agent_verifies_against_exploiters_it_loses_to():
    league = League(seed=2)
    serve(league)
    snapshot_now(league, "main_exploiter_0")
    set_rate(league, "main_0", "main_0.s0", 0.95)
    set_rate(league, "main_0", "main_exploiter_0.s0", 0.1)
    c = counts(league, "main_0")
    # PFSP-hard over both snapshots: weights 0.05^2 and 0.9^2; plus the whole 15% verification share.
    pfsp_share = 0.81 / (0.81 + 0.0025)
    assert c["main_exploiter_0.s0"] / 4000 == pytest.approx(0.5 * pfsp_share + 0.15, abs=0.03)


def test_main_agent_losing_self_play_falls_back_to_the_opponents_snapshots():
    league = League(LeagueConfig(main_agents=2, main_exploiters=0, league_exploiters=0), seed=3)
    serve(league)
    set_rate(league, "main_0", "main_1", 0.1)
    set_rate(league, "main_0", "main_0.s0", 0.99)
    set_rate(league, "main_0", "main_1.s0", 0.99)
    c = counts(league, "main_0")
    assert c["main_1"] == 0  # never plays the main agent it loses to
    assert c["main_0"] > 0.15 * 4000  # self-play against itself still happens (half the coin tosses)


def test_main_exploiter_plays_mains_until_it_cannot_win():
    league = League(seed=4)
    serve(league)
    assert set(counts(league, "main_exploiter_0", 200)) == {"main_0"}
    set_rate(league, "main_exploiter_0", "main_0", 0.05)
    assert set(counts(league, "main_exploiter_0", 200)) == {"main_0.s0"}


def test_league_exploiter_uses_pfsp_hard_over_snapshots():
    league = League(seed=5)
    serve(league)
    snapshot_now(league, "main_exploiter_0")
    set_rate(league, "league_exploiter_0", "main_0.s0", 0.5)
    set_rate(league, "league_exploiter_0", "main_exploiter_0.s0", 0.8)
    c = counts(league, "league_exploiter_0")
    assert c["main_0.s0"] / 4000 == pytest.approx(0.25 / (0.25 + 0.04), abs=0.03)


def test_main_agent_snapshots_exactly_at_its_budget_and_never_resets():
    league = League()
    serve(league)
    league.set_run_steps(100_000)
    budget = league.budgets["main_0"]
    assert budget == int(100_000 * 0.6 / 10)
    league.report(MatchResult("main_0", "main_0", 10, 0, 10, steps=budget - 1))
    assert league.pop_requests() == []
    league.report(MatchResult("main_0", "main_0", 10, 0, 10, steps=1))
    assert [(r.name, r.reset) for r in league.pop_requests()] == [("main_0.s1", False)]


def test_main_exploiter_snapshots_early_when_beating_mains_and_always_resets():
    league = League()
    serve(league)
    league.set_run_steps(100_000)
    budget = league.budgets["main_exploiter_0"]
    # Beating the main agent, but before half the budget: no snapshot yet.
    league.report(MatchResult("main_exploiter_0", "main_0", 90, 0, 10, steps=budget // 2 - 1))
    assert league.pop_requests() == []
    league.report(MatchResult("main_exploiter_0", "main_0", 90, 0, 10, steps=1))
    assert [(r.name, r.reset) for r in league.pop_requests()] == [("main_exploiter_0.s0", True)]
    # One request at a time: further results do not ask again before the snapshot is added.
    league.report(MatchResult("main_exploiter_0", "main_0", 90, 0, 10, steps=budget))
    assert league.pop_requests() == []


def test_league_exploiter_snapshots_at_budget_and_resets_a_quarter_of_the_time():
    resets = []
    for seed in range(400):
        league = League(seed=seed)
        serve(league)
        league.set_run_steps(100_000)
        budget = league.budgets["league_exploiter_0"]
        league.report(MatchResult("league_exploiter_0", "main_0.s0", 5, 0, 5, steps=budget - 1))
        assert league.pop_requests() == []
        league.report(MatchResult("league_exploiter_0", "main_0.s0", 5, 0, 5, steps=1))
        (request,) = league.pop_requests()
        resets.append(request.reset)
    assert np.mean(resets) == pytest.approx(0.25, abs=0.06)


def test_league_state_round_trips_through_json_with_open_requests():
    league = League(seed=6)
    serve(league)
    league.set_run_steps(50_000)
    league.report(MatchResult("main_0", "main_0.s0", 30, 2, 8, steps=league.budgets["main_0"]))
    (open_request,) = league.pop_requests()
    restored = League.from_dict(json.loads(json.dumps(league.to_dict())), seed=6)
    assert restored.summary() == league.summary()
    np.testing.assert_allclose(restored.payoff.matrix(), league.payoff.matrix())
    assert restored.budgets == league.budgets
    # The request handed out before the save was never served: the restored league hands it out again.
    assert restored.pop_requests() == [open_request]
    restored.add_snapshot(open_request)
    assert "main_0.s1" in restored.snapshots(parent="main_0")


def test_snapshots_record_the_league_steps_at_which_they_were_frozen():
    league = League(LeagueConfig(main_agents=1, main_exploiters=1, league_exploiters=0))
    serve(league)
    league.set_run_steps(100_000)
    league.report(MatchResult("main_exploiter_0", "main_0", 1, 0, 1, steps=123))
    snapshot_now(league, "main_0")
    assert league.total_steps() == 123 + league.players["main_0"].steps
    frozen = {r["name"]: r["frozen_at"] for r in league.summary() if r["parent"]}
    assert frozen == {"main_0.s0": 0, "main_0.s1": league.total_steps()}
    # A league saved before freeze steps were kept resumes with them unknown, not 0.
    state = json.loads(json.dumps(league.to_dict()))
    for player in state["players"]:
        del player["frozen_at"]
    assert all(r["frozen_at"] is None for r in League.from_dict(state).summary() if r["parent"])


def test_league_config_rejects_bad_values():
    with pytest.raises(ValueError, match="at least one main agent"):
        LeagueConfig(main_agents=0)
    with pytest.raises(ValueError, match="main_share"):
        LeagueConfig(main_share=1.5)
    with pytest.raises(ValueError, match="scripted_share"):
        LeagueConfig(scripted=("winblock",), scripted_share=1.0)
    with pytest.raises(ValueError, match="frozen snapshot"):
        league = League()
        serve(league)
        league.next_match("main_0.s0")


def test_main_agents_meet_the_scripted_players_at_the_configured_share_and_no_one_else_does():
    league = League(LeagueConfig(scripted=("winblock", "random"), scripted_share=0.2), seed=7)
    serve(league)
    c = counts(league, "main_0")
    assert c["winblock"] / 4000 == pytest.approx(0.1, abs=0.02) and c["random"] / 4000 == pytest.approx(0.1, abs=0.02)
    match = next(m for m in (league.next_match("main_0") for _ in range(100)) if m.opponent == "winblock")
    assert match.scripted and not match.frozen
    for player in ("main_exploiter_0", "league_exploiter_0"):
        assert not {"winblock", "random"} & set(counts(league, player, 400))
    # Scripted players are league members: rated, in the payoff table, never trainable, never snapshots.
    league.report(MatchResult("main_0", "winblock", wins=9, draws=0, losses=1, steps=200))
    assert league.payoff.win_rate("main_0", "winblock") > 0.5 and league.elo.ratings["winblock"] < 1000
    assert "winblock" not in league.trainable() and "winblock" not in league.snapshots()
    kinds = {r["name"]: r["kind"] for r in League.from_dict(json.loads(json.dumps(league.to_dict()))).summary()}
    assert kinds["winblock"] == "scripted"


def test_without_a_scripted_share_the_main_agents_matches_are_drawn_as_before():
    plain, scripted = League(seed=8), League(LeagueConfig(scripted=("winblock",), scripted_share=0.0), seed=8)
    serve(plain), serve(scripted)
    assert [plain.next_match("main_0").opponent for _ in range(200)] == \
        [scripted.next_match("main_0").opponent for _ in range(200)]
