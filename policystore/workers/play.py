"""Playing a batch of games between two policies, recording the moves a learner trains on.

Pure numpy/torch (no Ray): the rollout actor, the evaluation command and the tests all play through here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from policystore import fast_reads
from policystore.league.baselines import Player
from policystore.league.gae import gae
from policystore.league.model import act
from policystore.league.search import best_moves
from policystore.league.vecgame import VecGame

# (env, env ids, planes, legal) -> (actions, log-probs or None, values or None)
Policy = Callable[[VecGame, np.ndarray, np.ndarray, np.ndarray],
                  tuple[np.ndarray, np.ndarray | None, np.ndarray | None]]


def net_policy(net: nn.Module, generator: torch.Generator | None = None, greedy: bool = False) -> Policy:
    """A policy that samples (or, ``greedy``, argmaxes) the net's masked distribution in one batched call.

    The forward runs in ``fast_reads()``: it only reads the weights, and over store views (``store`` mode) that
    drops the write guard's per-op cost while the OS protection of the shared pages stays on; for a private net
    it changes nothing.
    """
    def policy(env, ids, planes, legal):
        with fast_reads():
            return act(net, planes, legal, generator, greedy)
    return policy


def search_policy(net: nn.Module, simulations: int) -> Policy:
    """Connect Four only: the move a PUCT search with ``net`` as prior and value picks (``league.search``)."""
    def policy(env, ids, planes, legal):
        return best_moves(net, env, ids, simulations), None, None
    return policy


def scripted_policy(player: Player, rng: np.random.Generator) -> Policy:
    def policy(env, ids, planes, legal):
        return player(env, ids, rng), None, None
    return policy


class Trajectories:
    """One side's moves in a batch of games, kept per game in move order (for GAE).

    Room for half a game's moves at first (players who alternate), grown to all of them the first time a side
    moves more often (poker: a player may act twice in a row).
    """

    FIELDS = ("planes", "legal", "actions", "logp", "values")

    def __init__(self, num_games: int, plane_shape: tuple[int, ...], num_actions: int, max_moves: int,
                 obs_dtype: type = np.bool_):
        t = (max_moves + 1) // 2  # the first mover's share
        self.max_moves = max_moves
        self.planes = np.zeros((num_games, t, *plane_shape), dtype=obs_dtype)
        self.legal = np.zeros((num_games, t, num_actions), dtype=bool)
        self.actions = np.zeros((num_games, t), dtype=np.int64)
        self.logp = np.zeros((num_games, t), dtype=np.float32)
        self.values = np.zeros((num_games, t), dtype=np.float32)
        self.length = np.zeros(num_games, dtype=np.int64)

    def _grow(self) -> None:
        extra = self.max_moves - self.actions.shape[1]
        if extra <= 0:
            raise ValueError(f"a side moved more than max_moves={self.max_moves} times in one game")
        for name in self.FIELDS:
            old = getattr(self, name)
            setattr(self, name, np.concatenate([old, np.zeros((old.shape[0], extra, *old.shape[2:]), old.dtype)],
                                               axis=1))

    def add(self, ids: np.ndarray, planes: np.ndarray, legal: np.ndarray, actions: np.ndarray,
            logp: np.ndarray, values: np.ndarray) -> None:
        t = self.length[ids]
        if t.size and t.max() >= self.actions.shape[1]:
            self._grow()
        self.planes[ids, t] = planes
        self.legal[ids, t] = legal
        self.actions[ids, t] = actions
        self.logp[ids, t] = logp
        self.values[ids, t] = values
        self.length[ids] += 1

    def finish(self, final_reward: np.ndarray, gamma: float, lam: float) -> dict[str, np.ndarray]:
        """Flat training batch (only recorded moves) with GAE advantages and returns."""
        advantages, returns = gae(self.values, self.length, final_reward.astype(np.float32), gamma, lam)
        valid = np.arange(self.actions.shape[1])[None, :] < self.length[:, None]
        return {"planes": self.planes[valid], "legal": self.legal[valid], "actions": self.actions[valid],
                "logp": self.logp[valid], "advantages": advantages[valid], "returns": returns[valid]}


@dataclass
class Outcome:
    wins: int           # from side 0's view: games with a positive return
    draws: int
    losses: int
    steps: int          # moves played by both sides
    score: float        # side 0's points: per game (1 + return / max_return) / 2, so 1 a win, 0.5 a draw
    batch: dict[str, np.ndarray] | None   # side 0's moves (and side 1's if it was recorded too)


def mirror(planes: np.ndarray, legal: np.ndarray, flip: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``planes``/``legal`` where ``flip`` is set, mirrored left to right (the last axis reversed);
    the others as they are. A move ``a`` in the mirrored position is ``num_actions - 1 - a`` in the real one."""
    return (np.where(flip.reshape(-1, *([1] * (planes.ndim - 1))), planes[..., ::-1], planes),
            np.where(flip[:, None], legal[:, ::-1], legal))


def play(env: VecGame, policies: tuple[Policy, Policy], record: tuple[bool, bool] = (False, False),
         gamma: float = 0.99, lam: float = 0.95, mirror_rng: np.random.Generator | None = None,
         opening: Callable[[VecGame], None] | None = None) -> Outcome:
    """Play every game in ``env`` to the end: side 0 moves first in even games, second in odd ones. Each game's
    return (``env.returns``, scaled by ``env.max_return``) is the reward of its last move for each side.

    ``record[s]`` keeps side ``s``'s moves for training; the batch holds both sides' moves when both are
    recorded (self-play, where each side's moves train the same player).

    ``mirror_rng`` (games whose rules are left-right symmetric, ``Game.mirrored``): each move of a recorded
    side is chosen, at random with probability 1/2, on the mirrored position and mirrored back, and recorded as
    the net saw it. The learner then trains on both orientations with log-probs that match its samples exactly,
    for no extra forward or backward pass.

    ``opening`` plays the games' first moves after the reset (a random opening, ``Game.opening``); the policies
    take over from there, and the opening's moves are neither recorded nor counted in ``steps``.

    One policy on both sides (self-play) moves every running game in one call per step, with no per-side split:
    the per-step numpy work is a handful of calls whatever the batch, which matters when the env itself is fast.
    """
    n = env.num_envs
    env.reset()
    if opening is not None:
        opening(env)
    opened = env.moves.copy()
    seat1 = np.where(np.arange(n) % 2 == 0, 2, 1).astype(np.int8)  # side 1's player number per game
    both = record[0] and record[1]
    # One recorder: game i's row is i, or with both sides recorded, 2 * i + side (each side's moves in order).
    rec = Trajectories(2 * n if both else n, env.plane_shape, env.num_actions, env.max_moves, env.obs_dtype) \
        if record[0] or record[1] else None
    same = policies[0] is policies[1]
    while True:
        ids = np.flatnonzero(~env.done)
        if ids.size == 0:
            break
        planes, legal = env.planes(ids), env.legal_mask(ids)
        side1 = env.to_move[ids] == seat1[ids]
        if same:
            actions = _turn(policies[0], env, ids, planes, legal, side1, slice(None), mirror_rng, rec, record)
        else:
            actions = np.empty(ids.size, dtype=np.int64)
            for side, sel in enumerate((~side1, side1)):
                if sel.any():
                    actions[sel] = _turn(policies[side], env, ids, planes, legal, side1, sel,
                                         mirror_rng if record[side] else None, rec, record)
        env.step(actions, ids)
    reward0 = np.where(seat1 == 2, env.returns, -env.returns) / env.max_return  # side 0's return, in [-1, 1]
    batch = None
    if rec is not None:
        final = np.stack([reward0, -reward0], axis=1).reshape(-1) if both else reward0 if record[0] else -reward0
        batch = rec.finish(final, gamma, lam)
    return Outcome(int((reward0 > 0).sum()), int((reward0 == 0).sum()), int((reward0 < 0).sum()),
                   int((env.moves - opened).sum()), float((1.0 + reward0).sum() / 2), batch)


def _turn(policy: Policy, env: VecGame, ids: np.ndarray, planes: np.ndarray, legal: np.ndarray, side1: np.ndarray,
          sel: np.ndarray | slice, mirror_rng: np.random.Generator | None, rec: Trajectories | None,
          record: tuple[bool, bool]) -> np.ndarray:
    """``policy``'s moves in the games ``ids[sel]`` (``side1``: side 1 is to move), each recorded if its side is;
    returns the moves for the env (mirrored back where the policy saw the mirror)."""
    ids, planes, legal, side1 = ids[sel], planes[sel], legal[sel], side1[sel]
    flip = None
    if mirror_rng is not None:
        flip = mirror_rng.random(ids.size) < 0.5
        planes, legal = mirror(planes, legal, flip)
    a, logp, values = policy(env, ids, planes, legal)
    if rec is not None:
        if record[0] and record[1]:
            rec.add(2 * ids + side1, planes, legal, a, logp, values)
        else:
            mine = side1 if record[1] else ~side1
            if mine.all():
                rec.add(ids, planes, legal, a, logp, values)
            elif mine.any():
                rec.add(ids[mine], planes[mine], legal[mine], a[mine], logp[mine], values[mine])
    return a if flip is None else np.where(flip, env.num_actions - 1 - a, a)
