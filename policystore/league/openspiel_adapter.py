"""Any two-player, zero-sum, turn-based OpenSpiel game behind the league's game interface (``openspiel:<name>``).

``kuhn_poker``, ``leduc_poker``, ``tic_tac_toe``, ``connect_four``, ``liars_dice`` and the like: one OpenSpiel state
per env (the net's forward pass is batched over all of them by the caller). Chance nodes (the deal) are resolved at
once by sampling their outcomes, so a game's mover is always a player. The net observes the information-state
tensor where the game has one and hides information (it gives perfect recall), else the observation tensor,
written in place by one OpenSpiel observer per env. A step makes each OpenSpiel call (apply the move, who moves,
observe, legal moves) over the whole batch in one ``map``, and gathers the observations and masks into
preallocated arrays in one numpy call each, from which ``planes`` and ``legal_mask`` are plain gathers: OpenSpiel's
own per-call cost is then most of a step (docs/results/trainer.md has the figures). Needs the ``openspiel`` extra;
pyspiel is imported only when a game is made, so importing this module costs nothing without it.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from operator import call
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from policystore.league.vecgame import Game

if TYPE_CHECKING:
    import pyspiel

OPENSPIEL_PREFIX = "openspiel:"  # game names: openspiel:<OpenSpiel game string>


def _pyspiel(name: str) -> ModuleType:
    try:
        import pyspiel
    except ModuleNotFoundError as exc:
        raise ImportError(f"{OPENSPIEL_PREFIX}{name} needs the openspiel extra: pip install 'policystore[openspiel]'"
                          ) from exc
    return pyspiel


def load_openspiel(name: str) -> pyspiel.Game:
    """The OpenSpiel game ``name`` (parameters allowed: ``leduc_poker(players=2)``), or a one-line ``ValueError``
    saying why the league cannot train on it."""
    pyspiel = _pyspiel(name)
    if name.split("(")[0] not in pyspiel.registered_names():  # before load_game, which prints every name to stderr
        raise ValueError(f"OpenSpiel has no game {name.split('(')[0]!r} (e.g. kuhn_poker, leduc_poker, tic_tac_toe, "
                         "connect_four)")
    try:
        game = pyspiel.load_game(name)
    except pyspiel.SpielError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "not an OpenSpiel game"
        raise ValueError(f"OpenSpiel cannot load {name!r}: {first.rstrip('. ')}") from None
    kind = game.get_type()
    why = None
    if kind.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
        why = "its players move simultaneously; the league plays turn-based games"
    elif game.num_players() != 2:
        why = f"it has {game.num_players()} players; the league plays two-player games"
    elif kind.utility != pyspiel.GameType.Utility.ZERO_SUM:
        why = f"it is not zero-sum ({kind.utility.name}); the league assumes one player's gain is the other's loss"
    elif kind.chance_mode == pyspiel.GameType.ChanceMode.SAMPLED_STOCHASTIC:
        why = "its chance nodes do not list their outcomes (sampled stochastic)"
    elif not (kind.provides_information_state_tensor or kind.provides_observation_tensor):
        why = "it offers no observation or information-state tensor for the net to read"
    if why:
        raise ValueError(f"{OPENSPIEL_PREFIX}{name}: {why}")
    return game


def _observer(game: pyspiel.Game) -> tuple[Callable[[], Any], tuple[int, ...]]:
    """A maker of observers (each with its own ``tensor`` buffer) and the observation's shape: the perfect-recall
    information state for hidden-information games that have it, else the observation."""
    from open_spiel.python.observation import INFO_STATE_OBS_TYPE, make_observation

    kind = game.get_type()
    hidden = kind.information != kind.information.PERFECT_INFORMATION
    if hidden and kind.provides_information_state_tensor:
        return lambda: make_observation(game, INFO_STATE_OBS_TYPE), tuple(game.information_state_tensor_shape())
    return lambda: make_observation(game), tuple(game.observation_tensor_shape())


def _draw(outcomes: list[tuple[int, float]], r: float) -> int:
    """The outcome that ``r`` (uniform in [0, 1)) falls on; the last one if rounding leaves the sum short."""
    for action, p in outcomes:
        r -= p
        if r < 0:
            return action
    return outcomes[-1][0]


class OpenSpielVec:
    """``num_envs`` states of one OpenSpiel game as a ``VecGame``; player 1 is OpenSpiel's player 0."""

    obs_dtype = np.float32

    def __init__(self, game: pyspiel.Game, num_envs: int, seed: int | None = None):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.game = game
        self.num_envs = num_envs
        self.num_actions = game.num_distinct_actions()
        self.max_moves = game.max_game_length()
        self.max_return = float(max(abs(game.max_utility()), abs(game.min_utility()))) or 1.0
        make, shape = _observer(game)
        size = make().tensor.size
        self.plane_shape = shape if math.prod(shape) == size else (size,)
        kind = game.get_type()
        self.hidden = kind.information != kind.information.PERFECT_INFORMATION
        # chance outcomes (deals, dice) follow Python's global random state unless seeded: each process draws its
        # own, and a caller that seeds ``random`` (a test, an evaluation) replays the same ones
        self.rng = random.Random(random.getrandbits(64) if seed is None else seed)
        self.states: list[pyspiel.State] = [game.new_initial_state() for _ in range(num_envs)]
        self.done = np.zeros(num_envs, dtype=bool)
        self.winner = np.zeros(num_envs, dtype=np.int8)
        self.returns = np.zeros(num_envs, dtype=np.float32)
        self.to_move = np.ones(num_envs, dtype=np.int8)
        self.moves = np.zeros(num_envs, dtype=np.int16)
        # Each running game's observation for its mover and its legal moves, written as the game reaches the
        # position; planes and legal_mask only gather rows.
        self._obs = np.zeros((num_envs, size), dtype=np.float32)
        # one OpenSpiel observer per game, each writing into its own buffer (``_tensors[i]`` views it)
        self._observers = [make() for _ in range(num_envs)]
        self._tensors = [o.tensor for o in self._observers]
        self._set_from = [o._observation.set_from for o in self._observers]  # the C++ call, not its Python wrapper
        self._legal = np.zeros((num_envs, self.num_actions), dtype=bool)
        # Every game starts in the same state unless a chance node comes first: its observation, legal moves and
        # mover, worked out once and copied into the games a reset starts (None: a chance node comes first).
        root = game.new_initial_state()
        self._root = None
        if not root.is_chance_node():
            self._observers[0].set_from(root, root.current_player())
            self._root = (self._tensors[0].copy(), np.array(root.legal_actions_mask(), dtype=bool),
                          root.current_player() + 1)
        self.reset()

    def _ids(self, env_ids: np.ndarray | None) -> np.ndarray:
        return np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids, dtype=np.int64).reshape(-1)

    def _advance(self, ids: np.ndarray, actions: list[int] | None) -> None:
        """Apply ``actions`` in the listed games (None: they were just reset), settle chance, and note each running
        game's mover, observation and legal moves.

        Each OpenSpiel call runs over the whole batch in one ``map`` (no Python loop body per game); each game's
        observer writes into its own buffer, gathered into the batch array by one ``np.concatenate``, and the legal
        masks' 0/1 lists become one ``bytes``. Only games at a chance node or at their end take a Python loop.
        """
        idl = ids.tolist()
        if not idl:
            return
        states = list(map(self.states.__getitem__, idl))
        kind = type(states[0])  # one class per game: its methods (a Python game's overrides), not pyspiel.State's
        if actions is not None:
            deque(map(kind.apply_action, states, actions), maxlen=0)
        movers = list(map(kind.current_player, states))
        if min(movers, default=0) < 0:  # chance nodes (deals) or finished games: settle them one by one
            for k, mover in enumerate(movers):
                if mover < 0:
                    movers[k] = self._settle(idl[k])
            keep = [k for k, mover in enumerate(movers) if mover >= 0]
            self._legal[[i for i, mover in zip(idl, movers, strict=True) if mover < 0]] = False
            idl, states, movers = [idl[k] for k in keep], [states[k] for k in keep], [movers[k] for k in keep]
            if not idl:
                return
        deque(map(call, map(self._set_from.__getitem__, idl), states, movers), maxlen=0)
        self._obs[idl] = np.concatenate(list(map(self._tensors.__getitem__, idl))).reshape(len(idl), -1)
        masks: list[int] = []
        for mask in map(kind.legal_actions_mask, states, movers):
            masks += mask
        self._legal[idl] = np.frombuffer(bytes(masks), dtype=bool).reshape(len(idl), self.num_actions)
        self.to_move[idl] = np.frombuffer(bytes(movers), dtype=np.int8) + 1  # movers are 0 and 1

    def _settle(self, i: int) -> int:
        """Sample game ``i`` through chance nodes; record how it ended if it did. Returns the player to move
        (0-based; negative once the game is over)."""
        state, rng = self.states[i], self.rng
        while state.is_chance_node():
            state.apply_action(_draw(state.chance_outcomes(), rng.random()))
        if state.is_terminal():
            ret = state.returns()[0]
            self.done[i] = True
            self.returns[i] = ret
            self.winner[i] = 1 if ret > 0 else (2 if ret < 0 else 0)
        return state.current_player()

    def reset(self, env_ids: np.ndarray | None = None) -> None:
        ids = self._ids(env_ids)
        self.done[ids], self.winner[ids], self.returns[ids], self.moves[ids] = False, 0, 0.0, 0
        states, new = self.states, self.game.new_initial_state
        for i in ids.tolist():
            states[i] = new()
        if self._root is None:  # the game starts with chance (a deal): each game draws its own
            self._advance(ids, None)
        else:
            self._obs[ids], self._legal[ids], self.to_move[ids] = self._root

    def legal_mask(self, env_ids: np.ndarray | None = None) -> np.ndarray:
        """``(n, num_actions)`` bool: the moves OpenSpiel allows the mover; none in finished games."""
        return self._legal[self._ids(env_ids)]

    def planes(self, env_ids: np.ndarray) -> np.ndarray:
        """The mover's observation of each listed game, ``(n, *plane_shape)`` float32."""
        ids = self._ids(env_ids)
        return self._obs[ids].reshape(ids.size, *self.plane_shape)

    def step(self, actions: np.ndarray, env_ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Play ``actions[k]`` in game ``env_ids[k]`` for its mover; returns ``(done, winner)`` for those games."""
        ids = self._ids(env_ids)
        actions = np.asarray(actions, dtype=np.int64).reshape(-1)
        if actions.size != ids.size:
            raise ValueError(f"got {actions.size} actions for {ids.size} games")
        if ids.size > 1 and not (np.diff(ids) > 0).all() and np.unique(ids).size != ids.size:  # sorted: unique
            raise ValueError("each game can take only one move per step; env_ids has duplicates")
        inside = ids.size == 0 or (actions.min() >= 0 and actions.max() < self.num_actions)
        if not inside or not self._legal[ids, actions].all():  # a finished game has no legal move
            finished = self.done[ids]
            if finished.any():
                raise ValueError(f"game {int(ids[finished][0])} is finished; reset it before stepping")
            legal = (actions >= 0) & (actions < self.num_actions)
            legal[legal] = self._legal[ids[legal], actions[legal]]
            k = int(np.flatnonzero(~legal)[0])
            raise ValueError(f"illegal move: action {int(actions[k])} in game {int(ids[k])}")
        self.moves[ids] += 1
        self._advance(ids, actions.tolist())
        return self.done[ids].copy(), self.winner[ids].copy()

    def render(self, env_id: int, player: int | None = None) -> str:
        """Game ``env_id`` as text: what ``player`` (1 or 2) may see of it, or (None) the whole state."""
        state = self.states[env_id]
        if player is None or not self.hidden:
            return str(state)
        kind = self.game.get_type()
        if kind.provides_information_state_string:
            return state.information_state_string(player - 1)
        return state.observation_string(player - 1)


def openspiel_game(name: str) -> Game:
    """``openspiel:<name>`` as a league ``Game`` (checked: see ``load_openspiel``)."""
    game = load_openspiel(name)
    probe = OpenSpielVec(game, 1)
    return Game(f"{OPENSPIEL_PREFIX}{name}", lambda n: OpenSpielVec(game, n), probe.plane_shape,
                probe.num_actions, ("random",), perfect_information=not probe.hidden, openspiel=name)
