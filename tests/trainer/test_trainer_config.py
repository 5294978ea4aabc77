"""The run configuration: saved and loaded as JSON, old run directories still load, bad values are refused."""

import dataclasses
import json

import pytest

from policystore.league.matchmaking import League, LeagueConfig
from policystore.trainer.config import TrainConfig
from policystore.trainer.rundir import RunDir, prepare_run_dir


def test_config_round_trips_through_the_run_directory(tmp_path):
    config = TrainConfig(minutes=2, workers=3, league=LeagueConfig(main_agents=2, first_run_steps=50_000))
    rd, saved = prepare_run_dir(tmp_path / "run", config, resume=False)
    assert RunDir(tmp_path / "run").load_config() == saved == config
    with pytest.raises(FileExistsError, match="another trainer runs in"):
        prepare_run_dir(tmp_path / "run", config, resume=False)
    rd.write_json(rd.state, {"elapsed_s": 1.0})  # its first checkpoint
    rd.release()
    with pytest.raises(FileExistsError, match="--resume"):
        prepare_run_dir(tmp_path / "run", config, resume=False)
    with pytest.raises(FileNotFoundError, match="not a trainer run directory"):
        RunDir(tmp_path / "nothing").load_config()


def test_a_config_written_before_first_run_steps_still_loads(tmp_path):
    # Older runs saved `expected_steps_per_s` (never read) and no `first_run_steps`: they resume with the default.
    data = TrainConfig().to_dict()
    data["league"].pop("first_run_steps")
    data["expected_steps_per_s"] = 8000.0
    (tmp_path / "config.json").write_text(json.dumps(data))
    loaded = RunDir(tmp_path).load_config()
    assert loaded == TrainConfig()
    assert League(loaded.league).budgets["main_0"] == int(1_000_000 * 0.8 / 10)


def test_unknown_keys_and_bad_values_are_refused():
    with pytest.raises(ValueError, match="unknown config keys"):
        TrainConfig.from_dict(TrainConfig().to_dict() | {"typo_minutes": 3})
    with pytest.raises(ValueError, match="first_run_steps"):
        LeagueConfig(first_run_steps=0)
    with pytest.raises(ValueError, match="minutes"):
        TrainConfig(minutes=0)
    with pytest.raises(ValueError, match="reference_games"):
        TrainConfig(reference_games=-1)


def test_a_config_written_before_mirroring_and_scripted_players_still_loads(tmp_path):
    data = TrainConfig().to_dict()
    data.pop("mirror")
    for key in ("scripted", "scripted_share"):
        data["league"].pop(key)
    (tmp_path / "config.json").write_text(json.dumps(data))
    loaded = RunDir(tmp_path).load_config()
    # It resumes mirrored, and without scripted players, as its saved league has none.
    assert loaded.mirror and loaded.league.scripted == () and loaded.league.scripted_share == 0.0
    assert dataclasses.replace(loaded, league=TrainConfig().league) == TrainConfig()


def test_scripted_league_members_must_be_the_games_scripted_players(tmp_path):
    config = TrainConfig(league=LeagueConfig(scripted=("winblock",), scripted_share=0.1))
    rd, saved = prepare_run_dir(tmp_path / "run", config, resume=False)
    assert RunDir(tmp_path / "run").load_config().league.scripted == ("winblock",)
    with pytest.raises(ValueError, match="scripted players"):
        TrainConfig(league=LeagueConfig(scripted=("perfect",), scripted_share=0.1))


def test_the_command_lines_defaults_are_the_default_config_and_its_flags_reach_it():
    from policystore.trainer.__main__ import config_from_args, parse_args

    assert config_from_args(parse_args(["--run-dir", "r"])) == TrainConfig()
    off = config_from_args(parse_args(["--run-dir", "r", "--scripted-share", "0", "--no-mirror", "--ppo-epochs",
                                       "3", "--main-share", "0.5", "--opening-share", "0",
                                       "--entropy-coef", "0.002", "--lr-final", "0.0001", "--search-coef", "0.5",
                                       "--search-positions", "128", "--search-sims", "8"]))
    assert (off.league.scripted, off.league.scripted_share, off.mirror, off.ppo.epochs, off.league.main_share,
            off.opening_share, off.ppo.entropy_coef, off.ppo.lr_final) == ((), 0.0, False, 3, 0.5, 0.0, 0.002, 1e-4)
    assert (off.ppo.search_coef, off.ppo.search_positions, off.ppo.search_sims) == (0.5, 128, 8)
    both = config_from_args(parse_args(["--run-dir", "r", "--scripted", "winblock,safe"]))
    assert both.league.scripted == ("winblock", "safe")
    assert both.league.scripted_share == TrainConfig().league.scripted_share
    # Another game: no Connect Four scripted players in its league (its config is not even checked for them), and
    # no random openings.
    other = config_from_args(parse_args(["--run-dir", "r", "--game", "pettingzoo:tictactoe_v3"]))
    assert other.league.scripted == () and other.league.scripted_share == 0.0 and other.opening_share == 0.0
    searched = config_from_args(parse_args(["--run-dir", "r", "--game", "pettingzoo:tictactoe_v3",
                                            "--search-coef", "1"]))
    assert searched.ppo.search_coef == 0.0  # Connect Four's search only


@pytest.mark.parametrize("flags, named", [(["--ppo-epochs", "0"], "epochs"),
                                          (["--scripted-share", "2"], "scripted_share"),
                                          (["--main-share", "0"], "main_share"),
                                          (["--opening-share", "1.5"], "opening_share"),
                                          (["--entropy-coef", "-0.1"], "entropy_coef"),
                                          (["--lr-final", "-1"], "lr_final"),
                                          (["--search-sims", "0"], "search_sims"),
                                          (["--scripted", "winblock,perfect"], "scripted players")])
def test_a_setting_out_of_range_stops_the_command_before_anything_starts(capsys, tmp_path, flags, named):
    from policystore.trainer.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--run-dir", str(tmp_path / "run"), *flags])
    assert exit_info.value.code == 2 and named in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
