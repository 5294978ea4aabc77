"""Play-time tree search for Connect Four: PUCT with the policy net's move probabilities as prior and its value
head at the leaves (AlphaZero's search), for a batch of games at once.

Every game gets its own tree, and the trees advance in lockstep: one simulation descends every tree by a few
vectorized steps, then evaluates all the new leaves in one batched forward pass. So a search over 1,000 games
costs about what a search over one costs in Python overhead, and the evaluation command can play thousands of
searched games.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from policystore.league.connect4 import COLS, VecConnectFour, games_from_planes, observation_planes
from policystore.league.model import masked_logits

C_PUCT = 1.5  # exploration weight of the prior (AlphaZero's range: 1 to 2.5)


class _Forest:
    """One PUCT tree per game, all nodes' game states in one ``VecConnectFour`` pool (node ``k`` of tree ``t`` is
    pool row ``t * capacity + k``; row 0 of each tree is its root)."""

    def __init__(self, net: nn.Module, env: VecConnectFour, env_ids: np.ndarray, simulations: int,
                 root_mask: np.ndarray | None):
        self.net = net
        self.device = next(net.parameters()).device  # a learner's net may sit on a GPU
        self.n = len(env_ids)
        self.capacity = simulations + 1  # each simulation adds at most one node
        shape = (self.n, self.capacity, COLS)
        self.prior = np.zeros(shape, np.float32)
        self.visits = np.zeros(shape, np.float32)
        self.value_sum = np.zeros(shape, np.float32)
        self.child = np.full(shape, -1, np.int32)
        self.legal = np.zeros(shape, bool)
        self.terminal_value = np.full((self.n, self.capacity), np.nan, np.float32)  # mover's view; NaN: not over
        self.used = np.ones(self.n, np.int64)
        self.pool = VecConnectFour(self.n * self.capacity)
        self._copy(np.asarray(env_ids), self._row(np.arange(self.n), 0), source=env)
        self._expand(np.arange(self.n), np.zeros(self.n, np.int64))
        if root_mask is not None:
            self.legal[:, 0] &= root_mask

    def _row(self, trees: np.ndarray, nodes: np.ndarray | int) -> np.ndarray:
        return trees * self.capacity + nodes

    def _copy(self, src: np.ndarray, dst: np.ndarray, source: VecConnectFour | None = None) -> None:
        source = self.pool if source is None else source
        for name in ("boards", "heights", "bits", "to_move", "moves", "done", "winner"):
            getattr(self.pool, name)[dst] = getattr(source, name)[src]

    @torch.inference_mode()
    def _expand(self, trees: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """Prior and legal moves of new non-terminal nodes; returns the net's value for the mover there."""
        rows = self._row(trees, nodes)
        legal = self.pool.legal_mask(rows)
        logits, value = self.net(torch.from_numpy(observation_planes(self.pool, rows)).to(self.device))
        prior = torch.softmax(masked_logits(logits, torch.from_numpy(legal).to(self.device)), dim=-1)
        self.prior[trees, nodes] = prior.cpu().numpy()
        self.legal[trees, nodes] = legal
        return value.cpu().numpy().astype(np.float32)

    def simulate(self) -> None:
        """One simulation in every tree: select to a leaf, expand it, back the value up the path. The new leaves
        of all trees are made and evaluated together once every descent has ended (one forward pass)."""
        trees = np.arange(self.n)
        node = np.zeros(self.n, np.int64)
        path_nodes, path_moves, path_trees = [], [], []
        leaf_value = np.zeros(self.n, np.float32)
        new_trees, new_parents, new_moves = [], [], []
        active = trees
        while active.size:
            cur = node[active]
            n_sa = self.visits[active, cur]
            q = np.divide(self.value_sum[active, cur], n_sa, out=np.zeros_like(n_sa), where=n_sa > 0)
            u = C_PUCT * self.prior[active, cur] * np.sqrt(n_sa.sum(axis=1, keepdims=True) + 1.0) / (1.0 + n_sa)
            move = np.where(self.legal[active, cur], q + u, -np.inf).argmax(axis=1)
            path_trees.append(active)
            path_nodes.append(cur)
            path_moves.append(move)
            nxt = self.child[active, cur, move]
            new = nxt < 0
            new_trees.append(active[new])
            new_parents.append(cur[new])
            new_moves.append(move[new])
            old = ~new
            reached = np.zeros_like(old)
            reached[old] = ~np.isnan(self.terminal_value[active[old], nxt[old]])
            leaf_value[active[reached]] = self.terminal_value[active[reached], nxt[reached]]
            node[active] = np.where(new, 0, nxt)
            active = active[old & ~reached]
        t, parent, m = np.concatenate(new_trees), np.concatenate(new_parents), np.concatenate(new_moves)
        if t.size:  # expand: each new child's state is its parent's plus the move
            slot = self.used[t]
            self.used[t] += 1
            self._copy(self._row(t, parent), self._row(t, slot))
            done, winner = self.pool.step(m, self._row(t, slot))
            self.child[t, parent, m] = slot
            self.terminal_value[t[done], slot[done]] = np.where(winner[done] != 0, -1.0, 0.0)
            leaf_value[t[done]] = self.terminal_value[t[done], slot[done]]
            if (~done).any():
                leaf_value[t[~done]] = self._expand(t[~done], slot[~done])
        # Back up: an edge at depth d scores the leaf's value from the view of the mover at depth d, which is the
        # leaf's mover when the leaf lies an even number of moves below.
        length = np.zeros(self.n, np.int64)
        for t in path_trees:
            length[t] += 1
        for depth, (t, cur, move) in enumerate(zip(path_trees, path_nodes, path_moves, strict=True)):
            sign = np.where((length[t] - depth) % 2 == 0, 1.0, -1.0).astype(np.float32)
            self.visits[t, cur, move] += 1
            self.value_sum[t, cur, move] += sign * leaf_value[t]



def _forest(net: nn.Module, env: VecConnectFour, env_ids: np.ndarray, simulations: int,
            root_mask: np.ndarray | None) -> _Forest:
    if simulations < 1:
        raise ValueError(f"simulations must be >= 1, got {simulations}")
    env_ids = np.asarray(env_ids, dtype=np.int64)
    if env.done[env_ids].any():
        raise ValueError("search needs unfinished games")
    forest = _Forest(net.eval(), env, env_ids, simulations, root_mask)
    for _ in range(simulations):
        forest.simulate()
    return forest


def root_visits(net: nn.Module, env: VecConnectFour, env_ids: np.ndarray, simulations: int,
                root_mask: np.ndarray | None = None) -> np.ndarray:
    """Root visit counts ``(n, 7)`` after ``simulations`` PUCT simulations in each listed (unfinished) game;
    illegal moves (and those ``root_mask`` leaves out) get 0 visits."""
    return _forest(net, env, env_ids, simulations, root_mask).visits[:, 0].copy()


def best_moves(net: nn.Module, env: VecConnectFour, env_ids: np.ndarray, simulations: int,
               root_mask: np.ndarray | None = None) -> np.ndarray:
    """The search's move in each listed game: the most visited, ties broken by the net's prior; ``root_mask``
    ``(n, 7)`` limits the first move."""
    forest = _forest(net, env, env_ids, simulations, root_mask)
    score = forest.visits[:, 0] + 0.5 * forest.prior[:, 0]  # priors < 1 only break ties between visit counts
    return np.where(forest.legal[:, 0], score, -np.inf).argmax(axis=1)


def visit_targets(net: nn.Module, planes: np.ndarray, simulations: int) -> np.ndarray:
    """``(n, 7)`` float32: each position's root visit shares after a ``simulations``-simulation search, the
    policy target of AlphaZero's training (a search over the net's own prior and value is a better policy than
    the net alone; the net learns towards it)."""
    env = games_from_planes(planes)
    visits = root_visits(net, env, np.arange(len(planes)), simulations)
    return visits / visits.sum(axis=1, keepdims=True)
