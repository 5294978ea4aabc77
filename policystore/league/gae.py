"""Generalized advantage estimation for finished two-player games (the only reward is the game's result).

Here rather than beside PPO because the rollout workers compute it where the games are played; the learner
only consumes the advantages and returns.
"""

from __future__ import annotations

import numpy as np


def gae(values: np.ndarray, lengths: np.ndarray, final_reward: np.ndarray, gamma: float,
        lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns for a batch of finished episodes, one row each.

    ``values`` is ``(episodes, T)`` with each episode's values left-aligned (``lengths`` of them); the only
    reward is ``final_reward`` after an episode's last move. Entries past an episode's end come back as 0.
    """
    episodes, steps = values.shape
    advantages = np.zeros_like(values, dtype=np.float32)
    running = np.zeros(episodes, dtype=np.float32)
    for t in reversed(range(steps)):
        last = t == lengths - 1
        next_value = values[:, t + 1] if t + 1 < steps else np.zeros(episodes, dtype=values.dtype)
        delta = np.where(last, final_reward - values[:, t], gamma * next_value - values[:, t])
        running = delta + gamma * lam * np.where(last, 0.0, running)
        advantages[:, t] = np.where(t < lengths, running, 0.0)
    returns = np.where(np.arange(steps)[None, :] < lengths[:, None], advantages + values, 0.0)
    return advantages, returns.astype(np.float32)
