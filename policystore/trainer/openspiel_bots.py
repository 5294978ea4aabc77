"""OpenSpiel's MCTS bot as an opponent in any perfect-information game with an OpenSpiel twin (``Game.openspiel``):
a reference strength that nobody in this project wrote.

Optional: needs the ``openspiel`` extra (``pip install -e ".[openspiel]"``). The bot keeps one OpenSpiel state per
game of the batch and learns the moves played there from a shared ``Moves`` record, which both sides' policies
write to (``Moves.record``); the game's actions must be OpenSpiel's action ids (Connect Four's columns are).
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any

import numpy as np

from policystore.league.vecgame import Game
from policystore.workers.play import Policy

MCTS_NAME = re.compile(r"mcts(\d+)$")


def is_mcts(name: str) -> bool:
    """``mcts100``: OpenSpiel's MCTS with 100 simulations (UCT c = 2, one random rollout per leaf)."""
    return MCTS_NAME.match(name) is not None


def available() -> bool:
    """Whether the openspiel extra is installed (found without importing it)."""
    return importlib.util.find_spec("pyspiel") is not None


def _pyspiel():
    try:
        import pyspiel
        from open_spiel.python.algorithms import mcts
    except ImportError as e:
        raise ImportError("OpenSpiel opponents need the openspiel extra: pip install 'policystore[openspiel]'") from e
    return pyspiel, mcts


def mcts_unfit(game: Game) -> str | None:
    """Why OpenSpiel's MCTS cannot play ``game`` (None when it can): it needs the whole state (perfect
    information), an OpenSpiel twin to search, and no chance moves (it replays the moves played; a die roll or a
    deal in the env would not replay)."""
    if not game.perfect_information:
        return f"{game.name} hides information; MCTS searches perfect-information games"
    if game.openspiel is None:
        return f"{game.name} names no OpenSpiel game to search (Game.openspiel)"
    if not available():
        return 'open_spiel is not installed (pip install -e ".[openspiel]")'
    pyspiel, _ = _pyspiel()
    if pyspiel.load_game(game.openspiel).get_type().chance_mode != pyspiel.GameType.ChanceMode.DETERMINISTIC:
        return f"{game.openspiel} has chance moves, which the referee cannot replay"
    return None


class Moves:
    """The moves played so far in each game of a batch, in order, as the policies that ``record`` wraps chose
    them (a batch played from the start: no opening moves)."""

    def __init__(self, num_envs: int):
        self.played: list[list[int]] = [[] for _ in range(num_envs)]

    def record(self, policy: Policy) -> Policy:
        def recorded(env: Any, ids: np.ndarray, planes: np.ndarray, legal: np.ndarray):
            actions, logp, values = policy(env, ids, planes, legal)
            for i, action in zip(ids.tolist(), np.asarray(actions).tolist(), strict=True):
                self.played[i].append(int(action))
            return actions, logp, values
        return recorded


def mcts_policy(name: str, game: Game, moves: Moves, seed: int) -> Policy:
    """A batch policy that plays OpenSpiel's ``MCTSBot`` in every game of a batch of ``game``, following the
    games through ``moves`` (wrap the returned policy and its opponent with ``moves.record``)."""
    match = MCTS_NAME.match(name)
    if match is None:
        raise ValueError(f"not an MCTS opponent name: {name!r} (expected mcts<simulations>, e.g. mcts100)")
    reason = mcts_unfit(game)
    if reason:
        raise ValueError(reason)
    pyspiel, mcts = _pyspiel()
    twin = pyspiel.load_game(game.openspiel)
    rng = np.random.RandomState(seed)
    bot = mcts.MCTSBot(twin, uct_c=2.0, max_simulations=int(match.group(1)),
                       evaluator=mcts.RandomRolloutEvaluator(1, rng), random_state=rng)
    states: dict[int, Any] = {}

    def policy(env: Any, ids: np.ndarray, planes: np.ndarray, legal: np.ndarray):
        actions = np.empty(ids.size, np.int64)
        for k, i in enumerate(ids.tolist()):
            played = moves.played[i]
            if len(played) != env.moves[i]:
                raise ValueError(f"game {i} has {int(env.moves[i])} moves but {len(played)} were recorded: wrap "
                                 "both sides' policies with the same Moves.record")
            state = states.setdefault(i, twin.new_initial_state())
            for action in played[len(state.history()):]:
                state.apply_action(action)
            actions[k] = bot.step(state)
        return actions, None, None

    return policy
