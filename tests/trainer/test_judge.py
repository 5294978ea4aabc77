"""The perfect-play judge: its position sets, its scoring, its cache. Late positions (22 to 30 stones) keep it fast;
the default range only costs solve time."""

import json

import numpy as np
import pytest

from policystore.league.baselines import random_player, win_block_player
from policystore.league.model import PolicyNet
from policystore.league.solver import Solver, from_moves, perfect_player
from policystore.trainer import judge
from policystore.trainer.evaluate import judge_players, main
from policystore.workers.play import scripted_policy

LATE = (22, 30)


def test_a_perfect_player_keeps_every_value_and_random_play_far_fewer():
    found = judge.sample_positions(16, seed=5, stones=LATE, cache_dir=None)
    positions = found.positions
    assert len(positions) == 16 and found.skipped == 0 and found.sampled >= 16
    rng = np.random.default_rng(0)
    assert judge.score(scripted_policy(perfect_player(), rng), positions).all()
    assert judge.score(scripted_policy(random_player, rng), positions).sum() <= 10


def test_judged_positions_are_ones_where_the_choice_matters_and_values_are_exact():
    found = judge.sample_positions(6, seed=2, stones=LATE, cache_dir=None)
    for p in found.positions:
        values = [v for v in p.values if v is not None]
        assert min(values) < max(values)  # some moves keep the value, some give it up
        position = from_moves(p.moves)
        assert [v is None for v in p.values] == [bool(position[1] >> (c * 7 + 5) & 1) for c in range(7)]
        assert max(values) == Solver().value(position)
        assert sum(p.keeps(c) for c in range(7) if p.values[c] is not None) == values.count(max(values))


def test_a_fixed_seed_gives_a_fixed_set_and_a_smaller_count_is_its_prefix():
    big = judge.sample_positions(8, seed=9, stones=LATE, cache_dir=None).positions
    small = judge.sample_positions(3, seed=9, stones=LATE, cache_dir=None).positions
    assert small == big[:3]
    assert judge.sample_positions(3, seed=10, stones=LATE, cache_dir=None).positions != small


def test_the_cache_serves_a_second_call_without_solving_and_survives_a_corrupt_file(tmp_path, monkeypatch):
    first = judge.sample_positions(5, seed=1, stones=LATE, cache_dir=tmp_path)
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and len(json.loads(files[0].read_text())) == first.sampled

    def no_solving(moves, node_limit):
        raise AssertionError("solved again although cached")

    monkeypatch.setattr(judge, "_solve", no_solving)
    assert judge.sample_positions(5, seed=1, stones=LATE, cache_dir=tmp_path).positions == first.positions
    monkeypatch.undo()
    files[0].write_text("{not json")
    assert judge.sample_positions(5, seed=1, stones=LATE, cache_dir=tmp_path).positions == first.positions
    assert len(json.loads(files[0].read_text())) == first.sampled  # rewritten whole


def test_positions_too_slow_to_solve_are_counted_as_skipped():
    found = judge.sample_positions(4, seed=0, stones=(16, 30), node_limit=300, cache_dir=None)
    assert found.skipped > 0
    assert found.sampled >= len(found.positions) + found.skipped


def test_a_node_limit_that_skips_most_positions_is_an_error_not_an_endless_loop():
    with pytest.raises(ValueError, match="needed more than 10 nodes"):
        judge.sample_positions(4, seed=0, stones=(12, 14), node_limit=10, cache_dir=None)
    with pytest.raises(ValueError, match="stones must be a range"):
        judge.sample_positions(4, stones=(30, 12), cache_dir=None)


@pytest.mark.parametrize("search", [0, 2])
def test_judge_players_reports_the_agent_and_the_yardsticks_with_intervals(search, tmp_path):
    results = judge_players(PolicyNet(16), 4, seed=3, search=search, stones=LATE, cache_dir=tmp_path)
    assert set(results) == {"agent", "random", "winblock", "safe"}
    for r in results.values():
        assert r["positions"] == 4 and r["kept_low"] <= r["kept"] <= r["kept_high"]
        assert r["kept"] * 4 == pytest.approx(round(r["kept"] * 4))
        assert 0 <= r["quiet_positions"] <= 4


def test_quiet_positions_are_those_without_a_win_in_one_or_a_threat_to_block():
    # Player 1 to move with three in the bottom row; player 2 to move facing it; then a calm opening.
    assert not judge.JudgedPosition((0, 6, 1, 6, 2, 5), (0,) * 7).quiet
    assert not judge.JudgedPosition((0, 6, 1, 6, 2), (0,) * 7).quiet
    assert judge.JudgedPosition((3, 3, 2, 4), (0,) * 7).quiet
    # Win/block keeps every tactical position's value by construction; its quiet-position rate is random play's.
    found = judge.sample_positions(16, seed=5, stones=LATE, cache_dir=None).positions
    kept = judge.score(scripted_policy(win_block_player, np.random.default_rng(0)), found)
    assert all(kept[i] for i, p in enumerate(found) if not p.quiet)


def test_command_rejects_a_negative_judge_count(capsys):
    with pytest.raises(SystemExit):
        main(["--run-dir", "nowhere", "--judge", "-1"])
    assert "--judge" in capsys.readouterr().err
