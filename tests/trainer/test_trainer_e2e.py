"""End to end on a local Ray: a short league run trains, evaluates, snapshots, resumes, and its agent can be loaded
and played. What a short run learns depends on the steps the machine gives it, so nothing here asserts strength
(that is the trainer's evaluation and docs/trainer.md); the move logic is tested with hand-set weights in
test_trainer_policy.py."""

import io
import itertools
import json
import subprocess
import sys

import numpy as np
import pytest
from rich.console import Console

from policystore.errors import UnknownPolicyError
from policystore.league.constants import DEFAULT_PLAYER, HISTORICAL, MAIN
from policystore.league.games import CONNECT4
from policystore.trainer import openspiel_bots
from policystore.trainer.config import TrainConfig
from policystore.trainer.play import play_game
from policystore.trainer.policy import load_net, load_policy
from policystore.trainer.ppo import PPOConfig
from policystore.trainer.run import train
from policystore.workers.play import net_policy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("e2e") / "run"
    # Small sizes (a 32-wide net, matches of 128 games, updates of 2048 samples) so that every player updates and
    # the main agent is evaluated at least 3 times within 15 s, whatever the machine's load.
    config = TrainConfig(minutes=0.25, num_cpus=2, object_store_mib=512, hot_capacity_mib=64, eval_games=50,
                         eval_every_s=4.0, checkpoint_every_s=8.0, reference_games=1, hidden=32, games_per_match=128,
                         ppo=PPOConfig(epochs=1, batch=2048, minibatch=1024))
    train(run, config, console=Console(file=io.StringIO()))
    return run


def read(run, name):
    return json.loads((run / name).read_text())


def test_the_run_trains_evaluates_and_reports(run_dir):
    curve = read(run_dir, "curve.json")
    assert len(curve) >= 3 and curve[0]["steps"] == 0
    # Evaluated as it trains: steps and time only move forward, every point has a rate against each baseline.
    assert all(b["steps"] >= a["steps"] and b["time_s"] > a["time_s"] for a, b in itertools.pairwise(curve))
    assert all(0.0 <= point[f"win_{name}"] <= 1.0 for point in curve for name in ("random", "winblock"))
    league = read(run_dir, "league.json")
    kinds = [p["kind"] for p in league["players"]]
    assert kinds.count(HISTORICAL) >= 1  # the main agent's initial weights are its first snapshot
    report = read(run_dir, "report/report.json")
    assert report["env_steps"] > 0 and report["memory"]["frozen_snapshots"] == kinds.count(HISTORICAL)
    assert all((run_dir / "report" / f).stat().st_size > 0 for f in ("payoff.png", "curve.png", "players.md"))
    # After training: main_0 against OpenSpiel's MCTS(100) at the env steps its snapshots were frozen, and now.
    strength = report["reference"]
    if not openspiel_bots.available():
        assert "open_spiel is not installed" in strength["skipped"]
        return
    frozen = {p["name"]: p["frozen_at"] for p in league["players"]}
    total = sum(p["steps"] for p in league["players"] if p["kind"] != HISTORICAL)
    *snapshots, final = strength["points"]
    assert (final["player"], final["steps"]) == (DEFAULT_PLAYER, total) and final["games"] == 2
    assert all(p["steps"] == frozen[p["player"]] > 0 for p in snapshots)


def test_resume_continues_the_run(run_dir):
    before = read(run_dir, "league.json")
    evaluations = len(read(run_dir, "curve.json"))
    elapsed = read(run_dir, "state.json")["elapsed_s"]
    updates = read(run_dir, "checkpoints/main_0.json")["updates"]
    train(run_dir, resume=True, minutes=0.12, console=Console(file=io.StringIO()))
    after = read(run_dir, "league.json")
    steps = {p["name"]: p["steps"] for p in after["players"]}
    # Same players and snapshots as before plus new ones; learning counters continue instead of restarting.
    assert {p["name"] for p in before["players"]} <= set(steps)
    assert all(steps[p["name"]] > p["steps"] for p in before["players"] if p["kind"] == MAIN)
    # Restored, not restarted from 0 (whether 7 s on a loaded machine fill another batch is not the point).
    assert read(run_dir, "checkpoints/main_0.json")["updates"] >= updates
    assert read(run_dir, "state.json")["elapsed_s"] > elapsed + 6  # 7.2 s more
    assert len(read(run_dir, "curve.json")) > evaluations
    # The first session's live versions were cleaned up too: only the newest two of main_0 stay on disk.
    assert len(list((run_dir / "store" / DEFAULT_PLAYER).glob("*.safetensors*"))) <= 2
    with pytest.raises(FileExistsError, match="--resume"):
        train(run_dir, TrainConfig(minutes=0.1))


def test_load_policy_reads_the_run_store(run_dir):
    act = load_policy(run_dir)
    board = np.zeros((6, 7), np.int8)
    board[5, :3] = 1
    board[5, 4:6] = 2
    board[4, 0] = 2
    assert 0 <= act(board, 1, None) < 7
    assert act(board, 1, [0, 6]) in (0, 6)
    with pytest.raises(ValueError, match="player 2 is not to move"):
        act(board, 2, None)
    with pytest.raises(UnknownPolicyError, match="no snapshot of 'nobody'"):  # a KeyError, from the store's reader
        load_policy(run_dir, player="nobody")
    snapshot = load_policy(run_dir, player="main_0.s0")
    assert 0 <= snapshot(np.zeros((6, 7), np.int8), 1, None) < 7


def test_terminal_play_and_evaluate_command(run_dir):
    out: list[str] = []
    moves = itertools.chain(["9"], itertools.cycle("0123456"))  # a bad answer first, then every column in turn
    agent = net_policy(load_net(run_dir), greedy=True)
    mine = play_game(CONNECT4, agent, human_player=1, read=lambda _: next(moves), write=out.append)
    assert mine in (-1, 0, 1) and any("is not a legal move" in line for line in out)
    proc = subprocess.run([sys.executable, "-m", "policystore.trainer.evaluate", "--run-dir", str(run_dir),
                           "--games", "50", "--json"], capture_output=True, text=True, check=True, timeout=120)
    result = json.loads(proc.stdout)
    assert set(result) >= {"random", "winblock"} and result["random"]["games"] == 100
