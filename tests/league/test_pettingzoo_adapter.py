"""PettingZoo classic games behind the trainer's game interface (skipped without the pettingzoo extra)."""

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo.classic.tictactoe_v3", reason="needs the pettingzoo extra")

from policystore.league.games import get_game  # noqa: E402
from policystore.trainer.evaluate import evaluate  # noqa: E402
from policystore.trainer.ppo import PPO, PPOConfig  # noqa: E402
from policystore.workers.play import net_policy, play  # noqa: E402


def test_connect_four_v3_agrees_with_the_built_in_rules():
    game = get_game("pettingzoo:connect_four_v3")
    assert game.plane_shape == (2, 6, 7) and game.num_actions == 7 and game.baselines == ("random",)
    env = game.make(2)
    for column in (0, 1, 0, 1, 0, 1):
        env.step(np.array([column, 6 - column]))
        assert not env.done.any()
    assert env.to_move.tolist() == [1, 1]
    done, winner = env.step(np.array([0, 6]))      # four in a column for the first player in both games
    assert done.all() and winner.tolist() == [1, 1] and env.moves.tolist() == [7, 7]
    with pytest.raises(ValueError, match="game 0 is finished"):
        env.step(np.array([3]), np.array([0]))


def test_illegal_moves_are_rejected():
    env = get_game("pettingzoo:connect_four_v3").make(1)
    for _ in range(6):
        env.step(np.array([2]))
    with pytest.raises(ValueError, match="illegal move: action 2 in game 0"):
        env.step(np.array([2]))
    with pytest.raises(ValueError, match="no classic game 'chess_v0'"):
        get_game("pettingzoo:chess_v0")


def test_tictactoe_trajectories_train_a_ppo_learner():
    game = get_game("pettingzoo:tictactoe_v3")
    assert game.plane_shape == (2, 3, 3) and game.num_actions == 9
    net = game.net(16)
    policy = net_policy(net, torch.Generator().manual_seed(0))
    out = play(game.make(64), (policy, policy), record=(True, True))
    assert out.wins + out.draws + out.losses == 64 and len(out.batch["actions"]) == out.steps
    assert out.batch["planes"].shape[1:] == (2, 3, 3) and out.batch["legal"].shape[1] == 9
    ppo = PPO(net, PPOConfig(batch=out.steps, minibatch=64, epochs=1), torch.device("cpu"))
    stats = ppo.update(out.batch)
    assert np.isfinite(stats["pg_loss"])
    result = evaluate(net, game, games_per_seat=20)
    assert set(result) == {"random"} and result["random"]["games"] == 40
