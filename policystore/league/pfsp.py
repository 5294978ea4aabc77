"""Prioritized fictitious self-play: how likely each candidate opponent is to be picked.

``p(B) = f(P[A beats B]) / sum f`` with ``f_hard(x) = (1 - x)^2`` (focus on opponents A loses to) and
``f_var(x) = x (1 - x)`` (focus on opponents of A's level). When every weight is zero (A beats or loses to
everyone for certain) the choice falls back to uniform instead of dividing by zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

WEIGHTINGS = {
    "hard": lambda x: (1.0 - x) ** 2,
    "var": lambda x: x * (1.0 - x),
}


def pfsp_probs(win_rates: Sequence[float] | np.ndarray, weighting: str = "hard") -> np.ndarray:
    """Selection probabilities for candidates A beats with the given win rates (each in [0, 1])."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"unknown PFSP weighting {weighting!r}; choose one of {sorted(WEIGHTINGS)}")
    x = np.asarray(win_rates, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError("PFSP needs a non-empty 1-d sequence of win rates")
    if np.isnan(x).any() or (x < 0).any() or (x > 1).any():
        raise ValueError(f"win rates must lie in [0, 1], got {x.tolist()}")
    weights = WEIGHTINGS[weighting](x)
    total = weights.sum()
    if total < 1e-10:
        return np.full(x.size, 1.0 / x.size)
    return weights / total


def remove_monotonic_suffix(win_rates: np.ndarray, players: list[str]) -> tuple[np.ndarray, list[str]]:
    """Drop the tail of (oldest-first) snapshots whose win rates only fall: A is still learning against them,
    so they are not "forgotten" (from DeepMind's AlphaStar pseudocode)."""
    for i in range(len(win_rates) - 1, 0, -1):
        if win_rates[i - 1] < win_rates[i]:
            return win_rates[: i + 1], players[: i + 1]
    return np.array([]), []
