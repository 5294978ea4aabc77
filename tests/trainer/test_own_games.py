"""The league trainer on games other than its built-in one, end to end on a local Ray: the example game written
against the protocol outside the package (examples/coins_game.py, through its import path, as ``--game`` takes it)
and OpenSpiel's Kuhn poker (chips as returns, the information-state tensor as observation). Tiny sizes: what is
checked is that learners update on the game's moves and the store serves its snapshots as shared views, not
strength (docs/own-game.md). The runs join the suite's shared Ray session, as a trainer started inside a running
Ray does, each with a store of its own."""

import io

import numpy as np
import pytest
from rich.console import Console

import policystore
from policystore import remote
from policystore.league.matchmaking import LeagueConfig
from policystore.trainer.config import TrainConfig
from policystore.trainer.ppo import PPOConfig
from policystore.trainer.run import Trainer
from policystore.trainer.rundir import prepare_run_dir

pytestmark = pytest.mark.slow


def tiny_run(run_dir, game: str) -> tuple[dict, list[dict]]:
    """The run's report, and what its rollout workers held: per cached policy, whether it is store views."""
    config = TrainConfig(minutes=0.05, game=game, num_cpus=2, games_per_match=64, hidden=16,
                         object_store_mib=256, hot_capacity_mib=32, eval_games=20, eval_every_s=1e9,
                         checkpoint_every_s=1e9, reference_games=0, opening_share=0.0,
                         league=LeagueConfig(main_exploiters=0, league_exploiters=0, main_share=1.0),
                         ppo=PPOConfig(batch=128, minibatch=64, epochs=1))  # one match: an update
    rd, config = prepare_run_dir(run_dir, config, resume=False)
    trainer = Trainer(rd, config, resume=False, console=Console(file=io.StringIO()))
    try:
        trainer.start()
        result = trainer.run(config.minutes)
        modules = [m for w in trainer.workers for m in remote.call(w, "module_report", timeout_s=120)]
        return trainer.finish(result), modules
    finally:
        trainer.shutdown()
        rd.release()


@pytest.fixture
def in_ray(ray_session):
    """The shared session, with no store of another run in it (the trainer connects its own to its run folder)."""
    policystore.client.shutdown_all()
    yield
    policystore.client.shutdown_all()


@pytest.mark.parametrize("game", ["examples.coins_game:make_game", "openspiel:kuhn_poker"])
def test_a_tiny_run_trains_on_the_game_with_its_snapshots_shared(in_ray, tmp_path, game):
    report, modules = tiny_run(tmp_path / "run", game)
    assert report["env_steps"] > 0
    learner = report["learners"][0]
    assert learner["updates"] >= 1 and learner["samples"] >= 128 and np.isfinite(learner["pg_loss"])
    assert report["memory"]["frozen_snapshots"] >= 1  # the main agent's first snapshot, in the store
    assert modules and all(m["shared"] for m in modules)  # every policy a worker played: views into the store
