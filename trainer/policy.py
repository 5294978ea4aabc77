"""Playing a trained agent outside the trainer: ``load_policy(run_dir)`` -> ``act(board, player, legal)``.

Reads the run directory's store spill files directly (the store's on-disk format: one safetensors buffer
per snapshot, lz4-framed when compressed, checksum in the header), so it needs no Ray and no running store.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

import lz4.frame
import numpy as np
from safetensors.torch import load as load_safetensors

from league.connect4 import COLS, VecConnectFour, observation_planes
from league.constants import DEFAULT_PLAYER
from league.games import CONNECT4, get_game
from league.model import PolicyNet, act
from policystore.format import verify_buffer
from trainer.rundir import RunDir

_FILE = re.compile(r"^(\d+)\.safetensors(\.lz4)?$")

Act = Callable[[np.ndarray, int, Sequence[int] | np.ndarray | None], int]


def _versions(folder: Path) -> dict[int, Path]:
    found = {}
    for path in folder.glob("*.safetensors*"):
        m = _FILE.match(path.name)
        if m:
            found[int(m.group(1))] = path
    return found


def load_net(run_dir: str | Path, player: str | None = None, version: int | str = "latest") -> PolicyNet:
    """The policy net of ``player`` (a trainable player such as ``main_0`` or a snapshot such as
    ``main_0.s3``; ``None`` = the first main agent) at a store version (``"latest"`` or an int)."""
    rd = RunDir(run_dir)
    config = rd.load_config()
    player = player or DEFAULT_PLAYER
    folder = rd.store / player
    versions = _versions(folder) if folder.is_dir() else {}
    if not versions:
        known = sorted(p.name for p in rd.store.iterdir() if p.is_dir()) if rd.store.is_dir() else []
        raise KeyError(f"no saved weights for player {player!r} in {run_dir}; players with weights: {known}")
    if version == "latest":
        version = max(versions)
    if not isinstance(version, int) or version not in versions:
        raise KeyError(f"player {player!r} has no version {version!r} on disk; versions: {sorted(versions)}")
    path = versions[version]
    data = lz4.frame.decompress(path.read_bytes()) if path.name.endswith(".lz4") else path.read_bytes()
    verify_buffer(np.frombuffer(data, dtype=np.uint8), name=f"{player} v{version} ({path})")
    net = get_game(config.game).net(config.hidden)
    net.load_state_dict(load_safetensors(data))
    return net.eval()


def load_policy(run_dir: str | Path, player: str | None = None, version: int | str = "latest") -> Act:
    """``act(board, player_to_move, legal_actions=None) -> column`` for a trained player (greedy).

    ``board``: ``(6, 7)`` int8, row 0 the top row, 0 empty, 1/2 the players' stones; ``player_to_move``: 1
    or 2; ``legal_actions``: columns allowed (default: every column that is not full).
    """
    game = RunDir(run_dir).load_config().game
    if game != CONNECT4.name:
        raise ValueError(f"load_policy plays Connect Four boards; {run_dir} trained {game!r}")
    net = load_net(run_dir, player, version)

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
        actions, _, _ = act(net, observation_planes(env, np.array([0])), legal, greedy=True)
        return int(actions[0])

    return act_on
