"""Batched game playing: outcomes, recorded trajectories for the learner, self-play, feature planes."""

import numpy as np
import pytest
import torch

from policystore.league.baselines import random_opening, random_player
from policystore.league.connect4 import ROWS, VecConnectFour, observation_planes
from policystore.league.model import PolicyNet
from policystore.workers.play import Trajectories, mirror, net_policy, play, scripted_policy


def test_play_records_only_the_learner_side_with_terminal_rewards():
    env = VecConnectFour(64)
    net = PolicyNet(16)
    rng = np.random.default_rng(0)
    out = play(env, (net_policy(net, torch.Generator().manual_seed(0)), scripted_policy(random_player, rng)),
               record=(True, False), gamma=1.0, lam=1.0)
    assert out.wins + out.draws + out.losses == 64 and out.steps == int(env.moves.sum())
    # Side 0 moves first in even games: its move count is ceil(moves / 2) there, floor(moves / 2) otherwise.
    first = np.arange(64) % 2 == 0
    expected = np.where(first, (env.moves + 1) // 2, env.moves // 2).sum()
    b = out.batch
    assert len(b["actions"]) == expected
    assert b["legal"][np.arange(expected), b["actions"]].all()          # recorded moves were legal
    # gamma = lambda = 1: every move's return is the game's final result for side 0.
    assert set(np.round(b["returns"], 5).tolist()) <= {-1.0, 0.0, 1.0}
    assert (b["returns"] == 1).sum() > 0 and (b["returns"] == -1).sum() > 0


def test_self_play_records_both_sides_and_is_zero_sum():
    env = VecConnectFour(32)
    policy = net_policy(PolicyNet(16), torch.Generator().manual_seed(1))
    out = play(env, (policy, policy), record=(True, True), gamma=1.0, lam=1.0)
    assert len(out.batch["actions"]) == out.steps                        # every move of both sides
    # Zero-sum: per game the winner's moves return +1 and the loser's -1. A first-player win has one move
    # more than its loser (sum +1); a second-player win has as many (sum 0).
    assert abs(out.batch["returns"].sum() - (env.winner == 1).sum()) < 1e-3


def test_two_policies_both_recorded_or_one_policy_recording_one_side_keep_exactly_those_moves():
    env = VecConnectFour(32)
    a, b = (net_policy(PolicyNet(16), torch.Generator().manual_seed(s)) for s in (3, 4))
    out = play(env, (a, b), record=(True, True), gamma=1.0, lam=1.0)
    assert len(out.batch["actions"]) == out.steps
    assert abs(out.batch["returns"].sum() - (env.winner == 1).sum()) < 1e-3
    out = play(env, (a, a), record=(False, True), gamma=1.0, lam=1.0)  # self-play, only side 1's moves kept
    first = np.arange(32) % 2 == 0                                      # side 1 moves second in even games
    assert len(out.batch["actions"]) == np.where(first, env.moves // 2, (env.moves + 1) // 2).sum()
    assert set(np.round(out.batch["returns"], 5).tolist()) <= {-1.0, 0.0, 1.0}


def test_games_after_an_opening_record_and_count_only_the_policies_moves():
    env = VecConnectFour(64)
    lengths = np.where(np.arange(64) < 32, 0, 9)   # half the games start after 9 random moves
    policy = net_policy(PolicyNet(16), torch.Generator().manual_seed(2))
    out = play(env, (policy, policy), record=(True, True), gamma=1.0, lam=1.0,
               opening=lambda e: random_opening(e, lengths, np.random.default_rng(0)))
    assert (env.moves[32:] > 9).all()
    assert out.steps == int(env.moves.sum()) - 9 * 32 == len(out.batch["actions"])
    assert out.wins + out.draws + out.losses == 64


def test_threat_planes_show_wins_and_blocks_from_the_movers_view():
    env = VecConnectFour(1)
    for c in (0, 6, 1, 6, 2):             # player 1: three on the bottom row; player 2: two in column 6
        env.step(np.array([c]), np.array([0]))
    planes = observation_planes(env, np.array([0]))[0]  # player 2 to move
    own, opp, playable, my_wins, their_wins = planes
    assert own.sum() == 2 and opp.sum() == 3
    assert playable[5, 3] == 1 and playable[3, 6] == 1 and playable.sum() == 7
    assert my_wins.sum() == 0
    assert their_wins[5, 3] == 1 and their_wins.sum() == 1  # player 1 completes four at the bottom of column 3


class Probe(PolicyNet):
    """A PolicyNet that records how an op on its weights dispatches: a guarded view's alias comes back a
    SharedTensor (the write guard's per-op Python dispatch), a fast read's a plain tensor."""

    def forward(self, planes):
        self.seen = type(self.policy.weight.view(-1))
        return super().forward(planes)


def test_a_net_policy_over_store_views_runs_its_forward_without_the_guards_dispatch():
    from policystore import format as fmt
    from policystore.modules import build_on_views
    from policystore.views import SharedTensor

    buf = fmt.pack(Probe(16).state_dict(), policy_id="p")
    buf.flags.writeable = False
    net = build_on_views(lambda: Probe(16), buf, fmt.parse_header(buf, name="p"), "p@v1")
    env = VecConnectFour(4)
    ids = np.arange(4)
    net(torch.from_numpy(observation_planes(env, ids)))
    assert net.seen is SharedTensor  # called directly: guarded
    net_policy(net)(env, ids, observation_planes(env, ids), env.legal_mask(ids))
    assert net.seen is torch.Tensor


def random_boards(n: int, seed: int) -> VecConnectFour:
    """``n`` positions reached by random play (some games over, most still running)."""
    env, rng = VecConnectFour(n), np.random.default_rng(seed)
    for _ in range(rng.integers(5, 25)):
        ids = np.flatnonzero(~env.done)
        env.step(random_player(env, ids, rng), ids)
    return env


def test_a_mirrored_position_is_the_mirror_of_the_position_in_every_plane_and_legal_column():
    env = random_boards(200, 0)
    ids = np.flatnonzero(~env.done)
    flipped = VecConnectFour.from_boards(env.boards[ids, :, ::-1], env.to_move[ids])
    every = np.ones(ids.size, dtype=bool)
    planes, legal = mirror(observation_planes(env, ids), env.legal_mask(ids), every)
    assert (planes == observation_planes(flipped, np.arange(ids.size))).all()   # threat planes included
    assert (legal == flipped.legal_mask()).all()
    none = ~every
    same, same_legal = mirror(observation_planes(env, ids), env.legal_mask(ids), none)
    assert (same == observation_planes(env, ids)).all() and (same_legal == env.legal_mask(ids)).all()


def leftmost(seen: list):
    """A recorded policy that plays the leftmost legal column of the position it is shown (and keeps it)."""
    def policy(env, ids, planes, legal):
        seen.append((env.boards[ids].copy(), planes.copy()))
        a = legal.argmax(axis=1)
        return a, np.zeros(ids.size, np.float32), np.zeros(ids.size, np.float32)
    return policy


def test_mirrored_rollouts_record_what_the_net_saw_and_play_the_mirrored_move():
    env = VecConnectFour(256)
    seen: list = []
    out = play(env, (leftmost(seen), scripted_policy(random_player, np.random.default_rng(1))),
               record=(True, False), mirror_rng=np.random.default_rng(2))
    b = out.batch
    # The recorded sample is the position as the net saw it: its legal columns are its playable plane's, and
    # the recorded move is the net's own (leftmost there), never the column the env got.
    assert (b["planes"][:, 2].any(axis=1) == b["legal"]).all()
    assert (b["actions"] == b["legal"].argmax(axis=1)).all()
    # Each position shown is the real one or its mirror, and both occur.
    boards, planes = (np.concatenate(x) for x in zip(*seen, strict=True))
    real = observation_planes(VecConnectFour.from_boards(boards), np.arange(len(boards)))
    flipped = (planes == real[..., ::-1]).all(axis=(1, 2, 3)) & ~(planes == real).all(axis=(1, 2, 3))
    assert ((planes == real).all(axis=(1, 2, 3)) | flipped).all()
    assert 0.4 < flipped.mean() < 0.6
    # The env got the mirrored move: side 0's first move on the empty board (even games) is column 0 when the
    # net saw the real board, column 6 when it saw the mirror; both happened.
    first = env.boards[::2, ROWS - 1]
    assert ((first[:, 0] == 1) | (first[:, 6] == 1)).all()
    assert (first[:, 0] == 1).any() and (first[:, 6] == 1).any()


def test_without_a_mirror_rng_a_recorded_side_sees_the_real_positions():
    env = VecConnectFour(64)
    seen: list = []
    play(env, (leftmost(seen), scripted_policy(random_player, np.random.default_rng(1))), record=(True, False))
    boards, planes = (np.concatenate(x) for x in zip(*seen, strict=True))
    assert (planes == observation_planes(VecConnectFour.from_boards(boards), np.arange(len(boards)))).all()
    assert (env.boards[::2, ROWS - 1, 0] == 1).all()


def test_a_side_that_moves_several_times_in_a_row_gets_room_for_all_its_moves():
    rec = Trajectories(2, (3,), 2, max_moves=5, obs_dtype=np.float32)  # room for 3 moves per side at first
    for t in range(5):  # game 0's side moves every time (as a poker player may), game 1's once
        ids = np.array([0, 1]) if t == 0 else np.array([0])
        rec.add(ids, np.full((ids.size, 3), t + 0.5, np.float32), np.ones((ids.size, 2), bool), np.zeros(ids.size),
                np.zeros(ids.size), np.zeros(ids.size))
    batch = rec.finish(np.array([1.0, -1.0]), gamma=1.0, lam=1.0)
    assert rec.length.tolist() == [5, 1] and batch["planes"].dtype == np.float32
    assert batch["planes"][:, 0].tolist() == [0.5, 1.5, 2.5, 3.5, 4.5, 0.5]  # game 0's five moves, then game 1's
    with pytest.raises(ValueError, match="more than max_moves=5"):
        rec.add(np.array([0]), np.zeros((1, 3), np.float32), np.ones((1, 2), bool), np.zeros(1), np.zeros(1),
                np.zeros(1))
