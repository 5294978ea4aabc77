"""Playing a trained agent outside the trainer: ``load_policy(run_dir)`` -> ``act(...) -> action``.

For Connect Four, ``act(board, player_to_move, legal_actions=None)``; for any other game,
``act(observation, legal_actions)`` on the game's own observation (what its ``VecGame.planes`` gives the mover: for an
OpenSpiel game with hidden information, ``state.information_state_tensor()``, else ``state.observation_tensor()``).
The run folder's config.json says which game it trained, so no game needs naming.

Reads the run directory's store folder through the store's Ray-free reader (``policystore.reader``), which
verifies every file before serving it, so it needs no Ray and no running store.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from torch import nn

from policystore.league.connect4 import COLS, VecConnectFour, observation_planes
from policystore.league.constants import DEFAULT_PLAYER
from policystore.league.games import CONNECT4, get_game
from policystore.league.model import PolicyNet, act
from policystore.league.search import best_moves
from policystore.league.vecgame import Game
from policystore.reader import open_folder
from policystore.trainer.rundir import RunDir

Act = Callable[[np.ndarray, int, Sequence[int] | np.ndarray | None], int]  # Connect Four: board, player, legal
ObservationAct = Callable[[np.ndarray, Sequence[int] | np.ndarray], int]  # any game: observation, legal actions


def load_net(run_dir: str | Path, player: str | None = None, version: int | str = "latest") -> PolicyNet:
    """The policy net of ``player`` (a trainable player such as ``main_0`` or a snapshot such as
    ``main_0.s3``; ``None`` = the first main agent) at a store version (``"latest"`` or an int).

    Raises the store's ``UnknownPolicyError``/``UnknownVersionError`` (both ``KeyError``s) naming what is there,
    and ``CorruptSnapshotError`` for a file that does not verify."""
    rd = RunDir(run_dir)
    config = rd.load_config()
    with open_folder(rd.store) as folder:
        weights = folder.tensors(player or DEFAULT_PLAYER, None if version == "latest" else version)
    net = get_game(config.game).net(config.hidden)
    net.load_state_dict(weights)
    return net.eval()


def load_policy(run_dir: str | Path, player: str | None = None, version: int | str = "latest",
                search: int = 0) -> Act | ObservationAct:
    """A trained player's greedy move (or, Connect Four, the move of a PUCT search of ``search`` simulations per
    move that uses the net's policy as prior and its value at the leaves), in the game the run trained:

    - Connect Four: ``act(board, player_to_move, legal_actions=None) -> column``; ``board``: ``(6, 7)`` int8, row
      0 the top row, 0 empty, 1/2 the players' stones; ``player_to_move``: 1 or 2; ``legal_actions``: columns
      allowed (default: every column that is not full).
    - Any other game: ``act(observation, legal_actions) -> action`` (``observation_policy``).
    """
    game = get_game(RunDir(run_dir).load_config().game)
    net = load_net(run_dir, player, version)
    if game.name == CONNECT4.name:
        return connect_four_policy(net, search)
    if search:
        raise ValueError(f"search plays Connect Four only; {run_dir} trained {game.name!r}")
    return observation_policy(net, game)


def observation_policy(net: nn.Module, game: Game) -> ObservationAct:
    """``act(observation, legal_actions) -> action``: ``net``'s greedy move among ``legal_actions`` (action ids, or
    a boolean mask of ``game.num_actions``) on one observation of ``game`` (``game.plane_shape``, or flat)."""

    def act_on(observation: np.ndarray, legal_actions: Sequence[int] | np.ndarray) -> int:
        planes = np.asarray(observation, dtype=np.float32)
        if planes.size != math.prod(game.plane_shape):
            raise ValueError(f"{game.name} observations have shape {game.plane_shape}, got {planes.shape}")
        legal = _mask(legal_actions, game.num_actions)
        if not legal.any():
            raise ValueError("no legal action given")
        actions, _, _ = act(net, planes.reshape(1, *game.plane_shape), legal[None], greedy=True)
        return int(actions[0])

    return act_on


def _mask(legal_actions: Sequence[int] | np.ndarray, num_actions: int) -> np.ndarray:
    """Legal actions, as ids or a boolean mask, as a boolean mask (ValueError for ids out of range)."""
    given = np.asarray(legal_actions)
    if given.dtype == bool:
        if given.shape != (num_actions,):
            raise ValueError(f"a legal-action mask needs {num_actions} entries, got shape {given.shape}")
        return given.copy()
    ids = given.astype(np.int64).ravel()
    if ((ids < 0) | (ids >= num_actions)).any():
        raise ValueError(f"legal actions must lie in 0..{num_actions - 1}, got {ids.tolist()}")
    mask = np.zeros(num_actions, dtype=bool)
    mask[ids] = True
    return mask


def connect_four_policy(net: nn.Module, search: int = 0) -> Act:
    """``act(board, player_to_move, legal_actions=None) -> column``: ``net``'s greedy move on Connect Four boards
    (the same input planes, threat planes included, as in training), or the move of a ``search``-simulation
    PUCT search over them, limited to legal columns."""
    if search < 0:
        raise ValueError(f"search must be >= 0 simulations, got {search}")

    def act_on(board: np.ndarray, player_to_move: int, legal_actions: Sequence[int] | np.ndarray | None = None
               ) -> int:
        if player_to_move not in (1, 2):
            raise ValueError(f"player_to_move must be 1 or 2, got {player_to_move!r}")
        env = VecConnectFour.from_boards(np.asarray(board), to_move=player_to_move)
        legal = env.legal_mask()
        if not legal.any():
            raise ValueError("no legal move: the board is full")
        if legal_actions is not None:
            allowed = np.zeros(COLS, dtype=bool)
            allowed[np.asarray(legal_actions, dtype=np.int64)] = True
            if not (allowed & legal[0]).any():
                raise ValueError(f"none of legal_actions {list(legal_actions)} is playable on this board")
            legal &= allowed
        if search:
            return int(best_moves(net, env, np.array([0]), search, root_mask=legal)[0])
        actions, _, _ = act(net, observation_planes(env, np.array([0])), legal, greedy=True)
        return int(actions[0])

    return act_on
