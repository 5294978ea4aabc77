"""OpenSpiel games behind the league's game interface (policystore/league/openspiel_adapter.py), with the real
pyspiel: observations are OpenSpiel's own tensors, returns are its payoffs (chips in poker), and games the league
cannot play are refused by name."""

import numpy as np
import pytest
import torch

pyspiel = pytest.importorskip("pyspiel", reason="needs the openspiel extra")

from policystore.league.games import get_game  # noqa: E402
from policystore.league.openspiel_adapter import OpenSpielVec  # noqa: E402
from policystore.league.vecgame import check_game  # noqa: E402
from policystore.trainer.ppo import PPO, PPOConfig  # noqa: E402
from policystore.workers.play import net_policy, play  # noqa: E402


def random_games(env, rng):
    env.reset()
    while not env.done.all():
        ids = np.flatnonzero(~env.done)
        legal = env.legal_mask(ids)
        env.step(np.array([rng.choice(np.flatnonzero(row)) for row in legal]), ids)


def test_leduc_observes_the_movers_information_state_and_pays_chips():
    game = get_game("openspiel:leduc_poker")
    assert (game.plane_shape, game.num_actions, game.perfect_information, game.openspiel) == \
        ((30,), 3, False, "leduc_poker")
    env = game.make(64)
    rng = np.random.default_rng(0)
    ids = np.arange(64)
    for _ in range(2):  # two moves in: both players have acted, nothing dealt beyond the private cards
        planes = env.planes(ids)
        for k in (0, 7, 63):
            state = env.states[k]
            assert state.current_player() == env.to_move[k] - 1
            assert planes[k].tolist() == pytest.approx(state.information_state_tensor(state.current_player()))
            assert env.legal_mask(ids)[k].tolist() == [bool(m) for m in state.legal_actions_mask()]
        env.step(np.full(64, 1), ids)  # call, call: round 1 ends and the public card is dealt
    random_games(env, rng)
    assert env.done.all() and (env.moves <= env.max_moves).all() and env.max_return == 13.0
    assert set(np.abs(env.returns).tolist()) - {1.0} and (np.abs(env.returns) <= 13).all()  # chips, not win/loss
    assert (np.sign(env.returns) == np.select([env.winner == 1, env.winner == 2], [1, -1], 0)).all()
    assert [env.returns[k] for k in (0, 5)] == [env.states[k].returns()[0] for k in (0, 5)]
    assert "Player" in env.render(0) and env.render(0, player=1).startswith("[Observer: 0]")


def test_tic_tac_toe_follows_openspiels_rules_and_refuses_illegal_moves():
    env = get_game("openspiel:tic_tac_toe").make(2)
    assert env.plane_shape == (3, 3, 3) and env.to_move.tolist() == [1, 1]
    for a, b in ((0, 3), (1, 4)):
        env.step(np.array([a, a]))
        env.step(np.array([b, b]))
    with pytest.raises(ValueError, match="illegal move: action 4 in game 1"):
        env.step(np.array([4]), np.array([1]))
    done, winner = env.step(np.array([2, 2]))  # the top row
    assert done.all() and winner.tolist() == [1, 1] and env.returns.tolist() == [1.0, 1.0]
    assert env.render(0).splitlines()[0] == "xxx"
    with pytest.raises(ValueError, match="game 0 is finished"):
        env.step(np.array([5]), np.array([0]))
    env.reset(np.array([0]))
    assert not env.done[0] and env.done[1] and env.moves.tolist() == [0, 5]


@pytest.mark.parametrize(("name", "says"), [
    ("goofspiel", "move simultaneously"),
    ("leduc_poker(players=3)", "it has 3 players"),
    ("no_such_game", "OpenSpiel has no game 'no_such_game'"),
])
def test_games_the_league_cannot_play_are_refused_with_the_reason(name, says):
    with pytest.raises(ValueError, match=says):
        get_game(f"openspiel:{name}")


def test_kuhn_matches_train_a_learner_on_chip_returns():
    game = get_game("openspiel:kuhn_poker")
    check_game(game)
    net = game.net(16)
    policy = net_policy(net, torch.Generator().manual_seed(0))
    env = OpenSpielVec(pyspiel.load_game("kuhn_poker"), 128, seed=1)
    out = play(env, (policy, policy), record=(True, True))
    assert out.wins + out.draws + out.losses == 128 and out.draws == 0  # kuhn has no ties
    assert len(out.batch["actions"]) == out.steps and out.batch["planes"].dtype == np.float32
    side0 = np.where(np.arange(128) % 2 == 0, env.returns, -env.returns)
    assert out.score == pytest.approx(((1 + side0 / 2) / 2).sum())  # chips scaled by kuhn's largest pot, 2
    assert set(np.round(np.abs(out.batch["returns"][out.batch["returns"] != 0]), 2)) >= {0.5}  # one chip: 0.5
    stats = PPO(net, PPOConfig(batch=out.steps, minibatch=64, epochs=1), torch.device("cpu")).update(out.batch)
    assert np.isfinite(stats["pg_loss"])


@pytest.mark.parametrize("name", ["tic_tac_toe", "connect_four", "leduc_poker"])
def test_every_steps_batched_observations_and_masks_are_openspiels_own(name):
    """The batch arrays gathered after each step (one buffer per game, masks joined in one go) hold, for every
    running game, OpenSpiel's tensor and legal-action mask for its mover; finished games have no legal move."""
    game = get_game(f"openspiel:{name}")
    tensor = "observation_tensor" if game.perfect_information else "information_state_tensor"
    env, rng = game.make(16), np.random.default_rng(0)
    for _ in range(env.max_moves + 1):
        ids = np.flatnonzero(~env.done)
        if ids.size == 0:
            break
        planes, legal = env.planes(ids), env.legal_mask(ids)
        for k, i in enumerate(ids.tolist()):
            state = env.states[i]
            mover = state.current_player()
            assert env.to_move[i] == mover + 1
            assert planes[k].ravel().tolist() == getattr(state, tensor)(mover)
            assert legal[k].tolist() == [bool(m) for m in state.legal_actions_mask(mover)]
        env.step(np.array([rng.choice(np.flatnonzero(row)) for row in legal]), ids)
    assert env.done.all() and not env.legal_mask().any()


def test_a_seed_deals_the_same_cards_and_another_seed_other_cards():
    def deals(seed):
        env = OpenSpielVec(pyspiel.load_game("leduc_poker"), 32, seed=seed)
        random_games(env, np.random.default_rng(0))
        return [state.history() for state in env.states]

    assert deals(5) == deals(5) != deals(6)
