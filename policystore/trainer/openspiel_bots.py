"""OpenSpiel's MCTS bot as a Connect Four opponent: a reference strength that nobody in this project wrote.

Optional: needs the ``openspiel`` extra (``pip install -e ".[openspiel]"``). Each game of a batch keeps its own
OpenSpiel state, kept in step with the batch's boards by the columns that grew since the bot last moved.
"""

from __future__ import annotations

import importlib.util
import re

import numpy as np

from policystore.league.connect4 import COLS, VecConnectFour
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


def mcts_policy(name: str, num_envs: int, seed: int) -> Policy:
    """A batch policy for ``VecConnectFour`` games that plays OpenSpiel's ``MCTSBot`` in every game."""
    match = MCTS_NAME.match(name)
    if match is None:
        raise ValueError(f"not an MCTS opponent name: {name!r} (expected mcts<simulations>, e.g. mcts100)")
    pyspiel, mcts = _pyspiel()
    game = pyspiel.load_game("connect_four")
    rng = np.random.RandomState(seed)
    bot = mcts.MCTSBot(game, uct_c=2.0, max_simulations=int(match.group(1)),
                       evaluator=mcts.RandomRolloutEvaluator(1, rng), random_state=rng)
    states = [game.new_initial_state() for _ in range(num_envs)]
    heights = np.zeros((num_envs, COLS), np.int64)

    def policy(env: VecConnectFour, ids: np.ndarray, planes: np.ndarray, legal: np.ndarray):
        actions = np.empty(ids.size, np.int64)
        for k, i in enumerate(ids):
            if env.moves[i] < heights[i].sum():  # the batch was reset: a new game in this slot
                states[i], heights[i] = game.new_initial_state(), 0
            for column in np.flatnonzero(env.heights[i] > heights[i]):  # the opponent's move(s) since
                states[i].apply_action(int(column))
            heights[i] = env.heights[i]
            actions[k] = bot.step(states[i])
            states[i].apply_action(int(actions[k]))
            heights[i, actions[k]] += 1
        return actions, None, None

    return policy
