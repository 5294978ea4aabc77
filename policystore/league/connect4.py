"""Connect Four, vectorized in numpy: a batch of boards stepped at once.

Each game keeps two representations:

* ``boards``: ``(N, 6, 7) int8``, row 0 the top row, 0 empty, 1 the first player's stones, 2 the second's.
  This is the public layout (observations, ``trainer.load_policy``).
* bitboards: one ``uint64`` per player and game, bit ``col * 7 + height`` (height 0 = bottom row, bit 6 of
  each column is a sentinel). A four-in-a-row test is then four shifts and ANDs for the whole batch, which is
  what keeps the environment far below the cost of the policy forward pass.
"""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np

ROWS = 6
COLS = 7
NUM_PLANES = 5  # input planes of the policy net, see observation_planes
SYMBOLS = {0: ".", 1: "X", 2: "O"}  # render: empty, player 1, player 2
_H1 = ROWS + 1  # bits per column including the sentinel
# Bit distance between neighbours: vertical, horizontal, and the two diagonals.
_SHIFTS = (np.uint64(1), np.uint64(_H1), np.uint64(_H1 - 1), np.uint64(_H1 + 1))
# COL_BIT[c, h]: the bit of the cell at column c, height h.
COL_BIT = (np.uint64(1) << (np.arange(COLS, dtype=np.uint64)[:, None] * np.uint64(_H1)
                             + np.arange(ROWS + 1, dtype=np.uint64)[None, :]))


def is_win(bits: np.ndarray) -> np.ndarray:
    """True where a bitboard (any shape, uint64) holds four in a row in any direction."""
    win = np.zeros(np.shape(bits), dtype=bool)
    for s in _SHIFTS:
        pairs = bits & (bits >> s)
        win |= (pairs & (pairs >> (s + s))) != 0
    return win


def single_observation_space() -> gym.spaces.Dict:
    """One game as an observation: the board and the legal-action mask."""
    return gym.spaces.Dict({
        "board": gym.spaces.Box(0, 2, shape=(ROWS, COLS), dtype=np.int8),
        "action_mask": gym.spaces.MultiBinary(COLS),
    })


def single_action_space() -> gym.spaces.Discrete:
    """A move is a column index."""
    return gym.spaces.Discrete(COLS)


class VecConnectFour:
    """``num_envs`` Connect Four games; player 1 moves first in every game.

    ``step(actions, env_ids)`` plays one move in each listed game for whoever is to move there. Games stay
    finished until ``reset``; stepping a finished game or playing a full column raises ``ValueError``.
    """

    max_moves = ROWS * COLS
    num_actions = COLS
    obs_dtype = np.bool_  # the planes are 0/1
    max_return = 1.0      # a win

    def __init__(self, num_envs: int):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = num_envs
        self.plane_shape = (NUM_PLANES, ROWS, COLS)
        self.single_observation_space = single_observation_space()
        self.single_action_space = single_action_space()
        self.boards = np.zeros((num_envs, ROWS, COLS), dtype=np.int8)
        self.heights = np.zeros((num_envs, COLS), dtype=np.int8)
        self.bits = np.zeros((num_envs, 2), dtype=np.uint64)  # [:, 0] player 1, [:, 1] player 2
        self.to_move = np.ones(num_envs, dtype=np.int8)
        self.moves = np.zeros(num_envs, dtype=np.int16)
        self.done = np.zeros(num_envs, dtype=bool)
        self.winner = np.zeros(num_envs, dtype=np.int8)  # 0 while running or for a draw

    # Batched spaces are built on first use: their bounds arrays cost as much as the game state (a search's node
    # pool holds hundreds of thousands of games and never asks for them).
    @functools.cached_property
    def observation_space(self) -> gym.spaces.Dict:
        return gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)

    @functools.cached_property
    def action_space(self) -> gym.spaces.Space:
        return gym.vector.utils.batch_space(self.single_action_space, self.num_envs)

    def reset(self, env_ids: np.ndarray | None = None) -> None:
        """Clear the listed games (all by default)."""
        ids = slice(None) if env_ids is None else np.asarray(env_ids)
        self.boards[ids] = 0
        self.heights[ids] = 0
        self.bits[ids] = 0
        self.to_move[ids] = 1
        self.moves[ids] = 0
        self.done[ids] = False
        self.winner[ids] = 0

    def legal_mask(self, env_ids: np.ndarray | None = None) -> np.ndarray:
        """``(n, 7)`` bool: columns that are not full, in games that are not finished."""
        ids = slice(None) if env_ids is None else np.asarray(env_ids)
        return (self.heights[ids] < ROWS) & ~self.done[ids, None]

    def observe(self, env_ids: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Batched observation in the layout of ``observation_space`` (copies)."""
        ids = slice(None) if env_ids is None else np.asarray(env_ids)
        return {"board": self.boards[ids].copy(), "action_mask": self.legal_mask(env_ids).astype(np.int8)}

    def planes(self, env_ids: np.ndarray) -> np.ndarray:
        """The policy net's input for the listed games (see ``observation_planes``)."""
        return observation_planes(self, env_ids)

    @property
    def returns(self) -> np.ndarray:
        """Player 1's return per game: +1 for a win, -1 for a loss, 0 for a draw or a game still running."""
        return np.where(self.winner == 1, 1.0, np.where(self.winner == 2, -1.0, 0.0)).astype(np.float32)

    def render(self, env_id: int, player: int | None = None) -> str:
        """Game ``env_id`` as text: X the first player, O the second, the column numbers under the board (every
        ``player`` sees the same)."""
        rows = [" ".join(SYMBOLS[int(v)] for v in row) for row in self.boards[env_id]]
        return "\n".join(rows + [" ".join(str(c) for c in range(COLS))])

    def step(self, actions: np.ndarray, env_ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Play ``actions[i]`` in game ``env_ids[i]``; returns ``(done, winner)`` for those games."""
        ids = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids, dtype=np.int64)
        actions = np.asarray(actions)
        if actions.shape != ids.shape:
            raise ValueError(f"got actions of shape {actions.shape} for {ids.size} games")
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_envs):
            raise ValueError(f"env ids must lie in [0, {self.num_envs}), got {ids.min()}..{ids.max()}")
        if np.unique(ids).size != ids.size:
            raise ValueError("each game can take only one move per step; env_ids has duplicates")
        if actions.size and (actions.min() < 0 or actions.max() >= COLS):
            bad = int(actions[(actions < 0) | (actions >= COLS)][0])
            raise ValueError(f"illegal move: column {bad} is outside 0..{COLS - 1}")
        actions = actions.astype(np.int64)
        finished = self.done[ids]
        if finished.any():
            raise ValueError(f"game {int(ids[finished][0])} is finished; reset it before stepping")
        heights = self.heights[ids, actions].astype(np.int64)
        full = heights >= ROWS
        if full.any():
            i = int(np.flatnonzero(full)[0])
            raise ValueError(f"illegal move: column {int(actions[i])} is full in game {int(ids[i])}")
        player = self.to_move[ids]
        seat = (player - 1).astype(np.int64)
        self.boards[ids, ROWS - 1 - heights, actions] = player
        self.heights[ids, actions] += 1
        self.bits[ids, seat] |= COL_BIT[actions, heights]
        self.moves[ids] += 1
        won = is_win(self.bits[ids, seat])
        done = won | (self.moves[ids] == ROWS * COLS)
        self.done[ids] = done
        self.winner[ids] = np.where(won, player, 0)
        self.to_move[ids] = 3 - player
        return done, self.winner[ids].copy()

    @classmethod
    def from_boards(cls, boards: np.ndarray, to_move: np.ndarray | None = None) -> VecConnectFour:
        """Games set up from ``(n, 6, 7)`` boards (checked for gravity, stone counts and finished games)."""
        boards = np.asarray(boards)
        if boards.ndim == 2:
            boards = boards[None]
        if boards.ndim != 3 or boards.shape[1:] != (ROWS, COLS):
            raise ValueError(f"a board must have shape ({ROWS}, {COLS}), got {boards.shape[1:]}")
        if not np.isin(boards, (0, 1, 2)).all():
            raise ValueError("board cells must be 0 (empty), 1 or 2")
        env = cls(boards.shape[0])
        filled = boards != 0
        heights = filled.sum(axis=1)
        # Gravity: the filled cells of a column are its last `height` rows.
        expected = np.arange(ROWS)[None, :, None] >= (ROWS - heights)[:, None, :]
        if (filled != expected).any():
            raise ValueError("board has a floating stone: an empty cell below a stone (row 0 is the top row)")
        n1 = (boards == 1).sum(axis=(1, 2))
        n2 = (boards == 2).sum(axis=(1, 2))
        if ((n1 - n2 != 0) & (n1 - n2 != 1)).any():
            raise ValueError("impossible stone counts: player 1 moves first, "
                             "so count(1) - count(2) must be 0 or 1")
        implied = np.where(n1 == n2, 1, 2).astype(np.int8)
        if to_move is not None:
            to_move = np.broadcast_to(np.asarray(to_move, dtype=np.int8), implied.shape)
            if (to_move != implied).any():
                raise ValueError(f"player {int(to_move[to_move != implied][0])} is not to move on this board "
                                 "(player 1 moves when the stone counts are equal)")
        env.boards[:] = boards.astype(np.int8)
        env.heights[:] = heights
        for seat, player in enumerate((1, 2)):
            cells = boards[:, ::-1, :] == player  # bottom row first
            env.bits[:, seat] = (cells.transpose(0, 2, 1).astype(np.uint64) * COL_BIT[None, :, :ROWS]).sum(
                axis=(1, 2), dtype=np.uint64)
        won = is_win(env.bits)
        if won.any(axis=1).any():
            raise ValueError("board already holds four in a row: the game is over")
        env.to_move[:] = implied
        env.moves[:] = n1 + n2
        env.done[:] = env.moves == ROWS * COLS
        return env


def games_from_planes(planes: np.ndarray) -> VecConnectFour:
    """The games whose ``observation_planes`` these are (channel 0 the mover's stones, 1 the opponent's; player 1
    is to move when the counts are equal)."""
    own, opp = planes[:, 0] > 0, planes[:, 1] > 0
    mover = np.where(own.sum(axis=(1, 2)) == opp.sum(axis=(1, 2)), 1, 2).astype(np.int8)[:, None, None]
    return VecConnectFour.from_boards(np.where(own, mover, np.where(opp, 3 - mover, 0)).astype(np.int8), mover[:, 0, 0])


def canonical(boards: np.ndarray, to_move: np.ndarray) -> np.ndarray:
    """``(n, 2, 6, 7) float32`` planes: the mover's stones, then the opponent's (one net plays both seats)."""
    own = boards == to_move[:, None, None]
    opp = (boards != 0) & ~own
    return np.stack([own, opp], axis=1).astype(np.float32)


def _lines() -> np.ndarray:
    """The 69 windows of four cells (any direction) as bitmasks."""
    masks = []
    for c in range(COLS):
        for h in range(ROWS):
            for dc, dh in ((0, 1), (1, 0), (1, 1), (1, -1)):
                cells = [(c + k * dc, h + k * dh) for k in range(4)]
                if all(0 <= cc < COLS and 0 <= hh < ROWS for cc, hh in cells):
                    masks.append(sum(1 << (cc * _H1 + hh) for cc, hh in cells))
    return np.array(masks, dtype=np.uint64)


_LINES = _lines()
# CELL_BITS[r, c]: the bit of board cell (r, c), row 0 the top row.
CELL_BITS = COL_BIT[:, :ROWS][:, ::-1].T.copy()


def threat_cells(env: VecConnectFour, env_ids: np.ndarray, seat: np.ndarray) -> np.ndarray:
    """``(n, 6, 7)`` bool: empty cells where a stone of ``seat`` (0 or 1) would complete four in a row,
    whether or not the cell is playable yet (row 0 the top row)."""
    stones = env.bits[env_ids, seat][:, None]
    occupied = (env.bits[env_ids, 0] | env.bits[env_ids, 1])[:, None]
    fourth = _LINES & ~stones                                   # per window: the cells not ours
    open_three = (np.bitwise_count(stones & _LINES) == 3) & ((fourth & occupied) == 0)
    threats = np.bitwise_or.reduce(np.where(open_three, fourth, np.uint64(0)), axis=1)
    return (threats[:, None, None] & CELL_BITS[None]) != 0


def observation_planes(env: VecConnectFour, env_ids: np.ndarray) -> np.ndarray:
    """``(n, 5, 6, 7) float32`` input planes from the mover's view: own stones, opponent stones, playable
    cells, cells that would win for the mover, cells that would win for the opponent.

    The last three are the Connect Four counterpart of AlphaGo's liberty/ladder feature planes: cheap
    bitboard facts that a small net would otherwise spend most of a short run rediscovering.
    """
    env_ids = np.asarray(env_ids)
    to_move = env.to_move[env_ids]
    me = (to_move - 1).astype(np.int64)
    boards = env.boards[env_ids]
    heights = env.heights[env_ids]
    playable = (np.arange(ROWS)[None, :, None] == (ROWS - 1 - heights)[:, None, :])
    return np.stack([boards == to_move[:, None, None], (boards != 0) & (boards != to_move[:, None, None]),
                     playable, threat_cells(env, env_ids, me), threat_cells(env, env_ids, 1 - me)],
                    axis=1).astype(np.float32)
