"""Any two-player, zero-sum, turn-based OpenSpiel game behind the league's game interface (``openspiel:<name>``).

``kuhn_poker``, ``leduc_poker``, ``tic_tac_toe``, ``connect_four``, ``liars_dice`` and the like: one OpenSpiel state
per env, stepped in one Python loop per batch (the net's forward pass is batched over all of them by the caller).
Chance nodes (the deal) are resolved at once by sampling their outcomes, so a game's mover is always a player. The
net observes the information-state tensor where the game has one and hides information (it gives perfect recall),
else the observation tensor, written in place by OpenSpiel's observer API. A step visits each state once: it applies
the move, settles chance, and writes the new mover's observation and legal moves into preallocated arrays, from
which ``planes`` and ``legal_mask`` are plain numpy gathers. Needs the ``openspiel`` extra; pyspiel is imported only
when a game is made, so importing this module costs nothing without it.
"""

from __future__ import annotations

import math
import random
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


def _observer(game: pyspiel.Game) -> tuple[Any, tuple[int, ...]]:
    """Perfect-recall information state for hidden-information games that have it, else the observation."""
    from open_spiel.python.observation import INFO_STATE_OBS_TYPE, make_observation

    kind = game.get_type()
    hidden = kind.information != kind.information.PERFECT_INFORMATION
    if hidden and kind.provides_information_state_tensor:
        return make_observation(game, INFO_STATE_OBS_TYPE), tuple(game.information_state_tensor_shape())
    return make_observation(game), tuple(game.observation_tensor_shape())


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
        self._observation, shape = _observer(game)
        size = self._observation.tensor.size
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
        # position (one pass over the states per step); planes and legal_mask only gather rows.
        self._obs = np.zeros((num_envs, self._observation.tensor.size), dtype=np.float32)
        self._legal = np.zeros((num_envs, self.num_actions), dtype=bool)
        self.reset()

    def _ids(self, env_ids: np.ndarray | None) -> np.ndarray:
        return np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids, dtype=np.int64).reshape(-1)

    def _settle(self, i: int) -> int:
        """Sample through chance nodes; record how the game ended if it did. Returns the player to move (0-based;
        negative once the game is over)."""
        state = self.states[i]
        while state.is_chance_node():
            actions, probs = zip(*state.chance_outcomes(), strict=True)
            state.apply_action(self.rng.choices(actions, probs)[0])
        if state.is_terminal():
            ret = state.returns()[0]
            self.done[i] = True
            self.returns[i] = ret
            self.winner[i] = 1 if ret > 0 else (2 if ret < 0 else 0)
        return state.current_player()

    def _advance(self, ids: np.ndarray, actions: list[int] | None) -> None:
        """Apply ``actions`` in the listed games (None: they were just reset), settle chance, and write each running
        game's mover, observation and legal moves."""
        states, settle, observation, tensor, obs = self.states, self._settle, self._observation, \
            self._observation.tensor, self._obs
        movers, legal, running = [], [], []
        for k, i in enumerate(ids.tolist()):
            state = states[i]
            if actions is not None:
                state.apply_action(actions[k])
            mover = state.current_player()
            if mover < 0:  # a chance node, or the game is over
                mover = settle(i)
                if mover < 0:
                    continue
            observation.set_from(state, mover)
            obs[i] = tensor
            legal += state.legal_actions_mask(mover)
            movers.append(mover)
            running.append(i)
        self._legal[ids] = False
        if running:
            self._legal[running] = np.array(legal, dtype=bool).reshape(len(running), self.num_actions)
            self.to_move[running] = np.array(movers, dtype=np.int64) + 1

    def reset(self, env_ids: np.ndarray | None = None) -> None:
        ids = self._ids(env_ids)
        self.done[ids], self.winner[ids], self.returns[ids], self.moves[ids] = False, 0, 0.0, 0
        for i in ids.tolist():
            self.states[i] = self.game.new_initial_state()
        self._advance(ids, None)

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
        if np.unique(ids).size != ids.size:
            raise ValueError("each game can take only one move per step; env_ids has duplicates")
        finished = self.done[ids]
        if finished.any():
            raise ValueError(f"game {int(ids[finished][0])} is finished; reset it before stepping")
        inside = (actions >= 0) & (actions < self.num_actions)
        legal = inside & self._legal[ids, np.where(inside, actions, 0)]
        if not legal.all():
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
