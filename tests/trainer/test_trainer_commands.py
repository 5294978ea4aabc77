"""The trainer's commands as a user types them: bad input is one line on stderr and exit 2, said before Ray starts;
a run folder that stopped before its first checkpoint takes a new start; long work shows progress.

The run folders here are written the way a run leaves them (config.json, state.json, the store's spill files)
without training, so every check takes seconds. The commands run in this process through their ``main(argv)``
(stderr is not a terminal under pytest), and as subprocesses where the process boundary is the point."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from policystore.format import pack, parse_header
from policystore.ids import SnapshotId
from policystore.league.games import get_game
from policystore.spill import DiskTier
from policystore.trainer import __main__ as trainer_command
from policystore.trainer import evaluate, play
from policystore.trainer.config import TrainConfig
from policystore.trainer.policy import load_net, load_policy
from policystore.trainer.rundir import RunDir, prepare_run_dir
from policystore.workers.play import net_policy

ROOT = Path(__file__).resolve().parents[2]
EXIT_USAGE = 2


def run_folder(root: Path, game: str = "connect4", checkpointed: bool = True) -> Path:
    """A run folder with main_0 v1 in its store, as a run leaves it."""
    league = TrainConfig().league if game == "connect4" else dataclasses.replace(
        TrainConfig().league, scripted=(), scripted_share=0.0)
    config = TrainConfig(game=game, hidden=16, league=league)
    rd = RunDir(root)
    rd.root.mkdir(parents=True)
    config.save(rd.config)
    if checkpointed:
        rd.write_json(rd.state, {"elapsed_s": 1.0})
    net = get_game(game).net(16)
    buf = pack(net.state_dict(), policy_id="main_0", meta={})
    disk, sid = DiskTier(rd.store), SnapshotId("main_0", 1)
    disk.commit(disk.write_temp(sid, buf, parse_header(buf, name=str(sid))), sid)
    return root


MAINS = {"": trainer_command.main, ".evaluate": evaluate.main, ".play": play.main}


def command(capsys, module: str, *argv: str) -> subprocess.CompletedProcess:
    """The command ``python -m policystore.trainer{module} argv`` in this process: its exit code and output."""
    capsys.readouterr()
    try:
        code = MAINS[module](list(argv)) or 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out, err)


def one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == EXIT_USAGE, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def connect4_run(tmp_path_factory):
    return run_folder(tmp_path_factory.mktemp("runs") / "c4")


@pytest.fixture(scope="module")
def tictactoe_run(tmp_path_factory):
    pytest.importorskip("pettingzoo", reason="the pettingzoo extra is not installed")
    return run_folder(tmp_path_factory.mktemp("runs") / "ttt", game="pettingzoo:tictactoe_v3")


@pytest.mark.parametrize(("argv", "says"), [
    (["--player", "main_0.s99"], "no snapshot of 'main_0.s99'"),
    (["--version", "7"], "main_0"),
    (["--opponents", "alphazero"], "unknown opponent 'alphazero'"),
])
def test_evaluate_refuses_what_the_run_does_not_have(capsys, connect4_run, argv, says):
    assert says in one_line(command(capsys, ".evaluate", "--run-dir", str(connect4_run), *argv))


def test_evaluate_and_play_refuse_a_folder_that_is_not_a_run(capsys, tmp_path):
    nope = str(tmp_path / "nope")
    assert "not a trainer run directory" in one_line(command(capsys, ".evaluate", "--run-dir", nope))
    assert "not a trainer run directory" in one_line(command(capsys, ".play", "--run-dir", nope))
    result = command(capsys, ".evaluate", "--run-dir", nope, "--version", "v3")
    assert result.returncode == EXIT_USAGE and "expected latest or a version number" in result.stderr


def test_connect_four_only_options_on_a_pettingzoo_run(capsys, tictactoe_run):
    assert "unknown opponent 'winblock' for pettingzoo:tictactoe_v3" in one_line(
        command(capsys, ".evaluate", "--run-dir", str(tictactoe_run), "--opponents", "winblock"))
    assert "opponent mcts100: pettingzoo:tictactoe_v3 names no OpenSpiel game" in one_line(
        command(capsys, ".evaluate", "--run-dir", str(tictactoe_run), "--opponents", "mcts100"))
    for module in (".evaluate", ".play"):
        assert "--search needs a game with a tree search (Connect Four)" in one_line(
            command(capsys, module, "--run-dir", str(tictactoe_run), "--search", "8"))
    assert "--judge judges Connect Four only" in one_line(
        command(capsys, ".evaluate", "--run-dir", str(tictactoe_run), "--judge", "8"))


@pytest.fixture(scope="module")
def leduc_run(tmp_path_factory):
    pytest.importorskip("pyspiel", reason="the openspiel extra is not installed")
    return run_folder(tmp_path_factory.mktemp("runs") / "leduc", game="openspiel:leduc_poker")


def test_evaluate_on_a_poker_run_gives_its_nash_conv_and_chips(capsys, leduc_run):
    """The run folder names the game: no --game; the exact NashConv comes before the games against random."""
    result = command(capsys, ".evaluate", "--run-dir", str(leduc_run), "--games", "10", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["nash_conv"]["uniform_nash_conv"] == pytest.approx(4.747222, abs=1e-5)  # OpenSpiel's uniform figure
    assert 0 < out["nash_conv"]["nash_conv"] < 30 and out["nash_conv"]["points"] == []  # no league.json here
    assert out["random"]["games"] == 20 and isinstance(out["random"]["return"], float)
    text = command(capsys, ".evaluate", "--run-dir", str(leduc_run), "--games", "10").stdout
    assert "main_0 (latest): NashConv" in text and "computed exactly by OpenSpiel" in text and "mean return" in text


def test_load_policy_and_play_on_a_poker_run(leduc_run):
    import pyspiel

    act = load_policy(leduc_run)
    state = pyspiel.load_game("leduc_poker").new_initial_state()
    state.apply_action(0)
    state.apply_action(3)  # the deal: J for the first player, Q for the second
    assert act(state.information_state_tensor(), state.legal_actions()) in state.legal_actions()
    assert act(state.information_state_tensor(), [2]) == 2
    with pytest.raises(ValueError, match="observations have shape"):
        act([0.0] * 7, [0, 1])
    out, prompts = [], []
    answers = iter(["7"] + ["1"] * 20)  # a bad answer, then call every time (always legal in Leduc)

    def read(prompt: str) -> str:
        prompts.append(prompt)
        return next(answers)

    game = get_game("openspiel:leduc_poker")
    mine = play.play_game(game, net_policy(load_net(leduc_run), greedy=True), human_player=1, read=read,
                          write=out.append)
    assert -13 <= mine <= 13 and any("is not a legal move" in line for line in out)
    assert "1 (Call)" in prompts[0]  # OpenSpiel's names for the moves
    assert "[Private:" in out[0] and "[Observer: 0]" in out[0]  # only what player 1 may see


def test_evaluate_shows_progress_and_plain_lines_off_a_terminal(capsys, connect4_run):
    result = command(capsys, ".evaluate", "--run-dir", str(connect4_run), "--games", "20", "--json")
    assert result.returncode == 0, result.stderr
    assert set(json.loads(result.stdout)) >= {"random", "winblock", "safe"}  # stdout: the JSON alone
    assert [line.split(":")[0] for line in result.stderr.splitlines()] == ["vs random", "vs winblock", "vs safe"]


@pytest.mark.parametrize(("argv", "says"), [
    (["--game", "pettingzoo:rps_v2"], "--game pettingzoo:rps_v2: the league plays turn-based board games"),
    (["--game", "chess"], "--game chess: unknown game 'chess'"),
    (["--game", "openspiel:goofspiel"], "openspiel:goofspiel: its players move simultaneously"),
    (["--game", "openspiel:leduc_poker(players=3)"], "it has 3 players; the league plays two-player games"),
    (["--game", "no_such_package.games:make"], "no module 'no_such_package.games' to import"),
    (["--game", "policystore.league.games:no_such_factory"], "has no function 'no_such_factory' that makes a Game"),
    (["--game", "policystore.league.games:GAME_HELP"], "has no function 'GAME_HELP'"),
    (["--workers", "0"], "need at least one worker"),
    (["--resume"], "cannot resume"),
])
def test_the_trainer_refuses_bad_input_before_ray_starts(capsys, tmp_path, argv, says):
    assert says in one_line(command(capsys, "", "--run-dir", str(tmp_path / "run"), *argv))
    assert not (tmp_path / "run" / "config.json").exists()
    import ray

    assert not ray.is_initialized()


def test_as_a_user_types_it(tmp_path):
    """One subprocess each: the line and the exit code are what a shell sees, and no Ray starts."""
    result = subprocess.run([sys.executable, "-m", "policystore.trainer", "--run-dir", str(tmp_path / "run"),
                             "--game", "pettingzoo:rps_v2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "pettingzoo:rps_v2" in one_line(result)
    result = subprocess.run([sys.executable, "-m", "policystore.trainer.evaluate", "--run-dir", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "not a trainer run directory" in one_line(result)


def test_a_run_folder_is_refused_only_once_it_checkpointed(capsys, tmp_path, connect4_run):
    assert "already holds a run; pass --resume" in one_line(command(capsys, "", "--run-dir", str(connect4_run)))
    assert "is a file" in one_line(command(capsys, "", "--run-dir", str(connect4_run / "config.json")))
    failed = run_folder(tmp_path / "failed", checkpointed=False)  # stopped before its first checkpoint
    resumed = command(capsys, "", "--run-dir", str(failed), "--resume")
    assert "stopped before its first checkpoint" in one_line(resumed)
    rd, config = prepare_run_dir(failed, TrainConfig(hidden=8), resume=False)
    assert TrainConfig.load(rd.config).hidden == 8 and not rd.store.exists()  # the failed start's files are gone
    with pytest.raises(FileExistsError, match="another trainer runs in"):  # while this process holds the folder
        prepare_run_dir(failed, TrainConfig(hidden=8), resume=False)
    holder = subprocess.run([sys.executable, "-m", "policystore.trainer", "--run-dir", str(failed)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert "another trainer runs in" in one_line(holder)
