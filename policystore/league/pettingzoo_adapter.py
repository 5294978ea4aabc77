"""PettingZoo classic AEC games (tictactoe_v3, connect_four_v3, ...) behind the league's game interface.

Needs the ``pettingzoo`` extra. Two-player board games whose observation is ``{"observation": (rows, cols,
planes) from the mover's view, "action_mask": ...}`` and whose final step rewards the winner +1. The envs
are stepped one by one in Python, so this path is far slower than the built-in vectorized Connect Four; it
is there to train the same league on other games, not for throughput. pettingzoo itself is imported only when
a game is made, so importing this module costs nothing without the extra.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from policystore.league.vecgame import Game

PETTINGZOO_PREFIX = "pettingzoo:"  # game names: pettingzoo:<classic env>


def _env_factory(name: str) -> Callable[[], Any]:
    try:
        module = importlib.import_module(f"pettingzoo.classic.{name}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("pettingzoo.classic."):
            raise ValueError(f"pettingzoo has no classic game {name!r} (e.g. tictactoe_v3, connect_four_v3)") from exc
        if exc.name and exc.name.split(".")[0] == "pettingzoo":
            raise ImportError(f"{PETTINGZOO_PREFIX}{name} needs the pettingzoo extra: "
                              f"pip install 'policystore[pettingzoo]'") from exc
        raise ImportError(f"{PETTINGZOO_PREFIX}{name} needs {exc.name}, which pettingzoo's classic games import: "
                          f"pip install 'pettingzoo[classic]'") from exc
    return module.env


class PettingZooVec:
    """``num_envs`` instances of a two-player PettingZoo AEC game, as one batch."""

    obs_dtype = np.bool_  # classic board planes are 0/1
    max_return = 1.0      # the winner's reward

    def __init__(self, make_env: Callable[[], Any], num_envs: int, seed: int = 0):
        self.envs = [make_env() for _ in range(num_envs)]
        self.num_envs = num_envs
        self.seed = seed
        probe = self.envs[0]
        probe.reset(seed=seed)
        self.agents = list(probe.possible_agents)
        if len(self.agents) != 2:
            raise ValueError(f"only two-player games are supported, this one has agents {self.agents}")
        space = probe.observation_space(self.agents[0])
        shape = getattr(getattr(space, "spaces", {}).get("observation"), "shape", None)
        if shape is None or len(shape) != 3 or not hasattr(probe.action_space(self.agents[0]), "n"):
            raise ValueError(f"the league plays turn-based board games whose observation is {{'observation': (rows, "
                             f"cols, planes), 'action_mask': ...}} with one discrete move per turn (tictactoe_v3, "
                             f"connect_four_v3); this game observes {space}")
        rows, cols, planes = shape
        self.plane_shape = (planes, rows, cols)
        self.num_actions = int(probe.action_space(self.agents[0]).n)
        self.max_moves = rows * cols  # board games: every move fills a cell
        self.done = np.zeros(num_envs, dtype=bool)
        self.winner = np.zeros(num_envs, dtype=np.int8)
        self.to_move = np.ones(num_envs, dtype=np.int8)
        self.moves = np.zeros(num_envs, dtype=np.int16)
        self.returns = np.zeros(num_envs, dtype=np.float32)  # player 1's
        self.reset()

    def _ids(self, env_ids: np.ndarray | None) -> np.ndarray:
        return np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids, dtype=np.int64)

    def reset(self, env_ids: np.ndarray | None = None) -> None:
        for i in self._ids(env_ids):
            env = self.envs[i]
            env.reset(seed=self.seed + int(i))
            self.done[i], self.winner[i], self.returns[i], self.moves[i] = False, 0, 0.0, 0
            self.to_move[i] = self.agents.index(env.agent_selection) + 1

    def legal_mask(self, env_ids: np.ndarray | None = None) -> np.ndarray:
        ids = self._ids(env_ids)
        mask = np.zeros((ids.size, self.num_actions), dtype=bool)
        for row, i in enumerate(ids):
            if not self.done[i]:
                env = self.envs[i]
                mask[row] = env.observe(env.agent_selection)["action_mask"].astype(bool)
        return mask

    def planes(self, env_ids: np.ndarray) -> np.ndarray:
        obs = [self.envs[i].observe(self.envs[i].agent_selection)["observation"] for i in self._ids(env_ids)]
        return np.moveaxis(np.stack(obs), -1, 1).astype(np.float32)

    def render(self, env_id: int, player: int | None = None) -> str:
        """Game ``env_id``'s board as text, X for player 1's pieces and O for player 2's (from the observation's
        first two planes: the mover's pieces, the opponent's)."""
        env = self.envs[env_id]
        planes = env.observe(env.agent_selection)["observation"]
        mine, theirs = ("X", "O") if self.to_move[env_id] == 1 else ("O", "X")
        rows = [" ".join(mine if cell[0] else theirs if cell[1] else "." for cell in row) for row in planes]
        return "\n".join(rows)

    def step(self, actions: np.ndarray, env_ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        ids = self._ids(env_ids)
        actions = np.asarray(actions)
        legal = self.legal_mask(ids)
        for row, (i, action) in enumerate(zip(ids, actions, strict=True)):
            if self.done[i]:
                raise ValueError(f"game {i} is finished; reset it before stepping")
            if not 0 <= action < self.num_actions or not legal[row, action]:
                raise ValueError(f"illegal move: action {int(action)} in game {i}")
            env = self.envs[i]
            mover = env.agent_selection
            env.step(int(action))
            self.moves[i] += 1
            if any(env.terminations.values()) or any(env.truncations.values()):
                reward = env.rewards[mover]
                seat = self.agents.index(mover) + 1
                self.done[i] = True
                self.winner[i] = seat if reward > 0 else (3 - seat if reward < 0 else 0)
                self.returns[i] = reward if seat == 1 else -reward
            elif self.moves[i] >= self.max_moves:
                raise ValueError(f"game {i} went past {self.max_moves} moves without ending: "
                                 "only board games that fill a cell per move are supported")
            else:
                self.to_move[i] = self.agents.index(env.agent_selection) + 1
        return self.done[ids].copy(), self.winner[ids].copy()


def pettingzoo_game(name: str) -> Game:
    make_env = _env_factory(name)
    probe = PettingZooVec(make_env, 1)
    return Game(f"{PETTINGZOO_PREFIX}{name}", lambda n: PettingZooVec(make_env, n), probe.plane_shape,
                probe.num_actions, ("random",))
