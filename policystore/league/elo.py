"""Elo ratings for every league player and snapshot."""

from __future__ import annotations

BASE_RATING = 1000.0


def expected_score(rating_a: float, rating_b: float) -> float:
    """Expected score of A against B (a win counts 1, a draw 1/2)."""
    return 1.0 / (1.0 + 10.0 ** ((rating_b - rating_a) / 400.0))


class Elo:
    """Online Elo. A batch of games between the same pair counts as one rated game scored by the batch
    mean: a match of 256 games must not move ratings 256 times as far as one game, since the ratings
    would then swing by hundreds of points whenever a learning player improves."""

    def __init__(self, k: float = 16.0):
        self.k = k
        self.ratings: dict[str, float] = {}

    def add(self, name: str, rating: float | None = None) -> None:
        self.ratings[name] = BASE_RATING if rating is None else rating

    def update(self, a: str, b: str, wins: int, draws: int, losses: int) -> None:
        n = wins + draws + losses
        if n == 0 or a == b:
            return
        score = (wins + 0.5 * draws) / n
        delta = self.k * (score - expected_score(self.ratings[a], self.ratings[b]))
        self.ratings[a] += delta
        self.ratings[b] -= delta
