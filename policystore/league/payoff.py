"""Decayed payoff matrix: who beats whom, recently.

Every result multiplies the pair's earlier score/game counts by ``decay`` (0.99), so the win rate follows
players that keep learning. A game scores 1 for a win, 0.5 for a draw, 0 for a loss, or, in a game that pays
amounts (poker's chips), ``(1 + return / max_return) / 2``. A pair that never met counts as 0.5. The raw number
of games each pair played is kept beside the decayed counts, for the report (a decayed count saturates near 100
after one batch).
"""

from __future__ import annotations

from typing import Any

import numpy as np


class Payoff:
    def __init__(self, decay: float = 0.99):
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must lie in (0, 1], got {decay}")
        self.decay = decay
        self.players: list[str] = []
        self._index: dict[str, int] = {}
        self._score = np.zeros((0, 0))
        self._games = np.zeros((0, 0))
        self._played = np.zeros((0, 0), dtype=np.int64)

    def add_player(self, name: str) -> None:
        if name in self._index:
            raise ValueError(f"player {name!r} is already in the payoff matrix")
        self._index[name] = len(self.players)
        self.players.append(name)
        self._score, self._games, self._played = (
            np.pad(m, ((0, 1), (0, 1))) for m in (self._score, self._games, self._played))

    def _idx(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(f"unknown player {name!r} in the payoff matrix") from None

    def update(self, home: str, away: str, wins: int, draws: int, losses: int, score: float | None = None) -> None:
        """Record ``wins + draws + losses`` games of ``home`` against ``away``, one decay step per game.

        ``score``: ``home``'s points in those games, in [0, n] (None: ``wins + draws / 2``); ``away`` gets the rest.
        The games of a batch are taken as arriving in random order: the counts after the batch equal the
        expectation of ``n`` single updates.
        """
        if min(wins, draws, losses) < 0:
            raise ValueError(f"negative result counts: {wins}/{draws}/{losses}")
        n = wins + draws + losses
        score = wins + 0.5 * draws if score is None else score
        if not -1e-6 <= score <= n + 1e-6:  # a sum of floats may stray by rounding
            raise ValueError(f"a score of {score} in {n} games: it must lie in [0, {n}]")
        score = min(max(score, 0.0), float(n))
        if n == 0:
            return
        h, a = self._idx(home), self._idx(away)
        keep = self.decay ** n
        fresh = float(n) if self.decay == 1.0 else (1.0 - keep) / (1.0 - self.decay)  # sum of decay^k, k < n
        for i, j, points in ((h, a, score), (a, h, n - score)):
            self._score[i, j] = keep * self._score[i, j] + fresh * points / n
            self._games[i, j] = keep * self._games[i, j] + fresh
            self._played[i, j] += n

    def win_rate(self, home: str, away: str) -> float:
        """P[home beats away] with draws as half a win; 0.5 for a pair that never met."""
        return float(self.win_rates(home, [away])[0])

    def win_rates(self, home: str, aways: list[str]) -> np.ndarray:
        h = self._idx(home)
        idx = [self._idx(a) for a in aways]
        games = self._games[h, idx]
        score = self._score[h, idx]
        return np.where(games > 0, score / np.where(games > 0, games, 1.0), 0.5)

    def matrix(self) -> np.ndarray:
        """``(n, n)`` win rates of row player against column player."""
        return np.stack([self.win_rates(p, self.players) for p in self.players]) if self.players else \
            np.zeros((0, 0))

    def met(self) -> np.ndarray:
        """``(n, n)`` bool: the row player has played the column player (the matrix's 0.5 is a real result)."""
        return self._games > 0

    def played(self) -> np.ndarray:
        """``(n, n)`` int: games the row player has played against the column player (not decayed)."""
        return self._played.copy()

    def to_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "players": list(self.players), "score": self._score.tolist(),
                "games": self._games.tolist(), "played": self._played.tolist()}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Payoff:
        payoff = cls(state["decay"])
        for name in state["players"]:
            payoff.add_player(name)
        n = len(payoff.players)
        def matrix(key: str) -> np.ndarray:
            return np.asarray(state[key], dtype=np.float64).reshape(n, n)
        payoff._games = matrix("games")
        # A state saved before scores were kept holds decayed wins and draws: the same points.
        payoff._score = matrix("score") if "score" in state else matrix("wins") + 0.5 * matrix("draws")
        # A state saved before raw counts were kept: its decayed counts, rounded up, are the best lower bound.
        played = state["played"] if "played" in state else np.ceil(payoff._games)
        payoff._played = np.asarray(played, dtype=np.int64).reshape(n, n)
        return payoff
