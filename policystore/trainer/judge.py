"""A perfect-play judge: how often a policy's move keeps the game-theoretic value of a Connect Four position.

Positions come from random play (a fixed seed gives a fixed set): a number of stones drawn uniformly from
``stones`` is played at random from the empty board (a game that ends sooner is replayed from scratch). The
exact solver (``league.solver``) values every legal move; the position is kept only when the choice matters:
some moves keep the value (win, draw or loss for the mover under perfect play) and some give it up. A position
whose solve exceeds ``node_limit`` is skipped and counted, never silently dropped.

Solved positions are cached in ``~/.cache/policystore/judge/`` (one JSON file per seed, stone range and node
limit), because solving a few hundred positions takes minutes on a laptop core and judging several players or
snapshots reuses the same set.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from policystore.league.connect4 import COLS, VecConnectFour
from policystore.league.solver import (
    NodeLimitExceeded,
    Solver,
    from_moves,
    is_open,
    is_winning_move,
    play,
    playable,
    winning_cells,
)
from policystore.workers.play import Policy

STONES = (12, 30)  # stones played before a judged position; see docs/trainer.md for why this range
NODE_LIMIT = 1_000_000  # positions searched per judged position before it is skipped (10 to 40 s here)
CACHE_DIR = Path.home() / ".cache" / "policystore" / "judge"


@dataclass(frozen=True)
class JudgedPosition:
    """A position (the columns played from the empty board) and each column's value for the mover (None: full)."""

    moves: tuple[int, ...]
    values: tuple[int | None, ...]

    def keeps(self, col: int) -> bool:
        """Whether playing ``col`` keeps the position's value."""
        return self.values[col] == max(v for v in self.values if v is not None)

    @property
    def quiet(self) -> bool:
        """No win in one for the mover and no immediate threat to block: the win/block player's rules say
        nothing here, so keeping the value takes planning, not tactics."""
        current, mask, _ = from_moves(self.moves)
        return not (winning_cells(current, mask) | winning_cells(current ^ mask, mask)) & playable(mask)


@dataclass
class PositionSet:
    """The judged positions and how they were drawn (what was skipped is reported, never hidden)."""

    positions: list[JudgedPosition]
    skipped: int   # positions whose solve exceeded the node limit
    sampled: int   # positions solved (or skipped) to find these: the others' choice did not matter


def _random_prefix(rng: np.random.Generator, stones: int) -> tuple[int, ...]:
    """``stones`` uniformly random moves from the empty board that do not end the game (else a new game)."""
    while True:
        moves: list[int] = []
        position = from_moves(moves)
        while len(moves) < stones:
            col = int(rng.choice([c for c in range(COLS) if is_open(position, c)]))
            if is_winning_move(position, col):
                break  # the game ended before this many stones
            moves.append(col)
            position = play(position, col)
        else:
            return tuple(moves)


def sample_positions(count: int, seed: int = 0, stones: tuple[int, int] = STONES, node_limit: int = NODE_LIMIT,
                     cache_dir: Path | None = CACHE_DIR, done: Callable[[int], None] | None = None) -> PositionSet:
    """The first ``count`` positions that matter from the random games of ``seed`` (a fixed seed, a fixed set;
    a smaller count is a prefix of a larger one). ``done(n)`` hears how many are found so far."""
    if not 0 <= stones[0] <= stones[1] < COLS * 6:
        raise ValueError(f"stones must be a range within 0..41, got {stones}")
    cache = _Cache(cache_dir, seed, stones, node_limit)
    rng = np.random.default_rng(seed)
    found: list[JudgedPosition] = []
    skipped = sampled = 0
    try:
        while len(found) < count:
            moves = _random_prefix(rng, int(rng.integers(stones[0], stones[1] + 1)))
            sampled += 1
            values = cache.get(moves)
            if values is None:
                values = _solve(moves, node_limit)
                cache.put(moves, values)
            if values == "skipped":
                skipped += 1
                if skipped > max(count, sampled // 2):
                    raise ValueError(f"{skipped} of {sampled} positions needed more than {node_limit} nodes to "
                                     "solve: raise the node limit or the fewest stones")
            elif len({v for v in values if v is not None}) > 1:
                found.append(JudgedPosition(moves, values))
                if done is not None:
                    done(len(found))
    finally:
        cache.save()
    return PositionSet(found, skipped, sampled)


def _solve(moves: tuple[int, ...], node_limit: int) -> tuple[int | None, ...] | str:
    try:
        values = Solver(node_limit=node_limit).move_values(from_moves(moves))
    except NodeLimitExceeded:
        return "skipped"
    return tuple(values.get(c) for c in range(COLS))


def score(policy: Policy, positions: Sequence[JudgedPosition]) -> np.ndarray:
    """Per position, whether the policy's move (one batched call over all of them) keeps the value (bool)."""
    env = VecConnectFour(len(positions))
    longest = max((len(p.moves) for p in positions), default=0)
    for t in range(longest):
        ids = np.array([i for i, p in enumerate(positions) if len(p.moves) > t], dtype=np.int64)
        env.step(np.array([positions[i].moves[t] for i in ids], dtype=np.int64), ids)
    ids = np.arange(len(positions))
    actions, _, _ = policy(env, ids, env.planes(ids), env.legal_mask(ids))
    return np.array([p.keeps(int(a)) for p, a in zip(positions, actions, strict=True)], dtype=bool)


class _Cache:
    """Solved positions of one (seed, stone range, node limit) on disk; written whole, atomically."""

    def __init__(self, directory: Path | None, seed: int, stones: tuple[int, int], node_limit: int):
        self.path = None if directory is None else Path(directory) / (
            f"seed{seed}-stones{stones[0]}-{stones[1]}-nodes{node_limit}.json")
        self.solved: dict[str, list[int | None] | str] = {}
        self.dirty = False
        if self.path is not None and self.path.exists():
            try:
                self.solved = json.loads(self.path.read_text())
            except (OSError, ValueError):
                self.solved = {}  # unreadable: solve again and rewrite it

    def get(self, moves: tuple[int, ...]) -> tuple[int | None, ...] | str | None:
        entry = self.solved.get("".join(map(str, moves)))
        if entry == "skipped":
            return "skipped"
        if isinstance(entry, list) and len(entry) == COLS and all(v in (None, -1, 0, 1) for v in entry):
            return tuple(entry)
        return None

    def put(self, moves: tuple[int, ...], values: tuple[int | None, ...] | str) -> None:
        self.solved["".join(map(str, moves))] = values if isinstance(values, str) else list(values)
        self.dirty = True

    def save(self) -> None:
        if self.path is None or not self.dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.solved))
        os.replace(tmp, self.path)
