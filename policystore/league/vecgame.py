"""What a game is to the league: a vectorized two-player environment and how to build a net for it.

A game is a vectorized two-player, zero-sum, turn-based environment (``VecGame``; ``league.connect4.VecConnectFour``
is the reference, ``league.openspiel_adapter.OpenSpielVec`` wraps any such OpenSpiel game) and a ``Game`` record that
names it and says what else it offers. ``docs/own-game.md`` is the reference page for writing one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from torch import nn

from policystore.league.model import PolicyNet


class VecGame(Protocol):
    """``num_envs`` games stepped as one batch. Players are 1 and 2; each game's mover is ``to_move``.

    ``plane_shape`` is the shape of one observation: board planes ``(c, h, w)`` or a flat vector ``(n,)`` (the net
    flattens either). ``obs_dtype`` is how trajectories store observations: ``np.bool_`` when every entry is 0 or 1
    (an eighth of the memory), else ``np.float32``. ``max_moves``: the most moves one game can take (both players
    together), which sizes the trajectory buffers. ``returns`` holds player 1's return of each finished game in the
    game's own units (chips for poker; player 2 gets the negative), ``max_return`` the largest ``|return|``:
    learners train on ``return / max_return``. ``winner`` is 1 or 2 for a positive or negative return, 0 for a zero
    one or a game still running. ``render(i, player)`` is game ``i`` as text, as ``player`` (1 or 2) may see it or,
    with None, all of it.
    """
    num_envs: int
    plane_shape: tuple[int, ...]
    obs_dtype: type
    num_actions: int
    max_moves: int
    max_return: float
    done: np.ndarray       # (num_envs,) bool
    winner: np.ndarray     # (num_envs,) int8
    returns: np.ndarray    # (num_envs,) float32
    to_move: np.ndarray    # (num_envs,) int8, 1 or 2
    moves: np.ndarray      # (num_envs,) moves played so far

    def reset(self, env_ids: np.ndarray | None = None) -> None: ...
    def legal_mask(self, env_ids: np.ndarray | None = None) -> np.ndarray: ...
    def planes(self, env_ids: np.ndarray) -> np.ndarray: ...
    def step(self, actions: np.ndarray, env_ids: np.ndarray | None = None) -> Any: ...
    def render(self, env_id: int, player: int | None = None) -> str: ...


@dataclass(frozen=True)
class Game:
    name: str
    make: Callable[[int], VecGame]     # num_envs -> a batch of games
    plane_shape: tuple[int, ...]       # one observation's shape: board planes or a flat vector
    num_actions: int
    baselines: tuple[str, ...] = ("random",)  # scripted opponents for evaluation (league.baselines)
    # Every player sees the whole state (Connect Four, tic-tac-toe); False for poker and other hidden-card games,
    # which referees judge by exploitability rather than against a search.
    perfect_information: bool = True
    # The OpenSpiel game string behind the game (pyspiel.load_game takes it), so referees can search or solve it;
    # None: no OpenSpiel twin.
    openspiel: str | None = None
    # Left-right symmetric rules: a position with its planes' last axis reversed is as good as the original, with
    # move a there being num_actions - 1 - a here (Connect Four's mirror). Rollouts may then train on both.
    mirrored: bool = False
    # (env, lengths, rng) -> None: plays lengths[i] random moves in game i and leaves every game running; rollouts
    # start a share of their games there, to meet positions the league's own openings never reach (None: no such).
    opening: Callable[[VecGame, np.ndarray, np.random.Generator], None] | None = None
    # planes (n, *plane_shape) -> (n, num_actions) bool: the moves a short look-ahead proves right (for Connect
    # Four: league.tactics), none where it proves nothing; learners add a loss towards them
    # (PPOConfig.tactics_coef). None: no such rule.
    tactics: Callable[[np.ndarray], np.ndarray] | None = None
    # (net, planes, simulations) -> (n, num_actions) float: the visit shares of a tree search from each position
    # with the net as prior and value (league.search); learners may add a loss towards them
    # (PPOConfig.search_coef). None: the game has no search.
    search: Callable[[nn.Module, np.ndarray, int], np.ndarray] | None = None

    def net(self, hidden: int) -> PolicyNet:
        """The league's policy/value net for this game's observations (an MLP over the flattened observation)."""
        return PolicyNet(hidden, self.plane_shape, self.num_actions)


ENV_FIELDS = ("num_envs", "plane_shape", "obs_dtype", "num_actions", "max_moves", "max_return", "done", "winner",
              "returns", "to_move", "moves", "reset", "legal_mask", "planes", "step", "render")


def check_game(game: Game, num_envs: int = 4, seed: int = 0) -> None:
    """Play ``num_envs`` of ``game``'s envs to the end with random legal moves, checking the protocol on the way;
    a one-line ``ValueError`` naming what is wrong otherwise. The trainer runs this once before Ray starts, so a
    game it cannot take fails in seconds, not in a learner minutes later."""
    env = game.make(num_envs)
    missing = [f for f in ENV_FIELDS if not hasattr(env, f)]
    if missing:
        raise ValueError(f"{game.name}: its env lacks {', '.join(missing)} (see the VecGame protocol)")
    if tuple(env.plane_shape) != tuple(game.plane_shape) or env.num_actions != game.num_actions:
        raise ValueError(f"{game.name}: the env observes {env.plane_shape} with {env.num_actions} actions, the Game "
                         f"says {game.plane_shape} with {game.num_actions}")
    rng = np.random.default_rng(seed)
    env.reset()
    for _ in range(env.max_moves + 1):
        ids = np.flatnonzero(~env.done)
        if ids.size == 0:
            break
        if not np.isin(env.to_move[ids], (1, 2)).all():
            raise ValueError(f"{game.name}: to_move holds {sorted(set(env.to_move[ids].tolist()))}; the league plays "
                             "two-player games (players 1 and 2)")
        legal = np.asarray(env.legal_mask(ids))
        if legal.shape != (ids.size, game.num_actions) or legal.dtype != np.bool_:
            raise ValueError(f"{game.name}: legal_mask must be a bool (games, {game.num_actions}) legal-action mask, "
                             f"got {legal.dtype} {legal.shape}")
        if not legal.any(axis=1).all():
            raise ValueError(f"{game.name}: a running game has no legal move")
        planes = np.asarray(env.planes(ids))
        if planes.shape != (ids.size, *game.plane_shape):
            raise ValueError(f"{game.name}: planes gave {planes.shape[1:]}, plane_shape says {game.plane_shape}")
        env.step(np.array([rng.choice(np.flatnonzero(row)) for row in legal]), ids)
    else:
        raise ValueError(f"{game.name}: games ran past max_moves={env.max_moves} moves without ending")
    if (np.abs(env.returns) > env.max_return + 1e-6).any():
        raise ValueError(f"{game.name}: a return of {float(np.abs(env.returns).max())} exceeds max_return="
                         f"{env.max_return}")
    if not isinstance(env.render(0), str):
        raise ValueError(f"{game.name}: render(env_id) must return text")
