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
    """
    n = env.num_envs
    env.reset()
    if opening is not None:
        opening(env)
    opened = env.moves.copy()
    seat0 = np.where(np.arange(n) % 2 == 0, 1, 2).astype(np.int8)  # side 0's player number per game
    recorders = [Trajectories(n, env.plane_shape, env.num_actions, env.max_moves, env.obs_dtype) if r else None
                 for r in record]
    same = policies[0] is policies[1]
    while True:
        ids = np.flatnonzero(~env.done)
        if ids.size == 0:
            break
        to_move = env.to_move[ids]
        planes = env.planes(ids)
        legal = env.legal_mask(ids)
        side0 = to_move == seat0[ids]
        actions = np.empty(ids.size, dtype=np.int64)
        groups = [np.ones(ids.size, dtype=bool)] if same else [side0, ~side0]
        for side, sel in enumerate(groups):
            if not sel.any():
                continue
            seen, seen_legal = planes[sel], legal[sel]
            flip = np.zeros(seen.shape[0], dtype=bool)
            if mirror_rng is not None and (same or record[side]):
                flip = mirror_rng.random(flip.size) < 0.5
                seen, seen_legal = mirror(seen, seen_legal, flip)
            a, logp, values = policies[side](env, ids[sel], seen, seen_legal)
            actions[sel] = np.where(flip, env.num_actions - 1 - a, a)
            for s, rec in enumerate(recorders):
                if rec is None:
                    continue
                mine = (side0 if s == 0 else ~side0)[sel]
                if mine.any():
                    rec.add(ids[sel][mine], seen[mine], seen_legal[mine], a[mine], logp[mine], values[mine])
        env.step(actions, ids)
    reward0 = np.where(seat0 == 1, env.returns, -env.returns) / env.max_return  # side 0's return, in [-1, 1]
    batches = [rec.finish(reward0 if s == 0 else -reward0, gamma, lam)
               for s, rec in enumerate(recorders) if rec is not None]
    batch = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]} if batches else None
    return Outcome(int((reward0 > 0).sum()), int((reward0 == 0).sum()), int((reward0 < 0).sum()),
                   int((env.moves - opened).sum()), float((1.0 + reward0).sum() / 2), batch)
