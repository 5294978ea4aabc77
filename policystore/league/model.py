"""The Connect Four policy/value net: a small MLP, because on 2 CPU cores the forward/backward cost of the net
is the whole budget (a 2-layer conv net was 5x slower per sample here for the same width)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from policystore.league.connect4 import COLS, NUM_PLANES, ROWS

MASKED_LOGIT = -1e9


class PolicyNet(nn.Module):
    """``(n, *planes)`` input planes -> (logits ``(n, actions)``, value ``(n,)``); Connect Four by default.

    Parameters only, no buffers: the module can be rebuilt on the meta device over store views.
    """

    def __init__(self, hidden: int = 128, planes: tuple[int, ...] = (NUM_PLANES, ROWS, COLS), actions: int = COLS):
        super().__init__()
        self.hidden = hidden
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(planes), hidden), nn.ReLU(),
                                  nn.Linear(hidden, hidden), nn.ReLU())
        self.policy = nn.Linear(hidden, actions)
        self.value = nn.Linear(hidden, 1)

    def forward(self, planes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(planes)
        return self.policy(h), torch.tanh(self.value(h)).squeeze(-1)


def masked_logits(logits: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
    """Illegal columns get a logit of -1e9: probability 0, and no gradient flows to them."""
    return torch.where(legal, logits, torch.full_like(logits, MASKED_LOGIT))


@torch.inference_mode()
def act(net: nn.Module, planes: np.ndarray, legal: np.ndarray, generator: torch.Generator | None = None,
        greedy: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Batched moves: ``(actions, log-probs, values)`` as numpy arrays. ``greedy`` takes the argmax.

    Only reads ``net``'s weights. A caller whose net is built on a store's guarded views runs this inside the
    store's read-only fast path (``workers.play`` does), which saves the guard's per-op dispatch (about 100 µs per
    forward of this net; see benchmarks/league_throughput): the rules here know nothing of the store.

    After the forward pass the distribution is sampled in numpy by inverting its cumulative sum with one uniform
    draw per row (from ``generator``): a third of the cost of torch's ``log_softmax`` + ``multinomial`` at these
    sizes (rows of a few actions), which rollouts pay once per move of every game.
    """
    logits, value = net(torch.from_numpy(planes))
    z = np.where(legal, logits.numpy(), np.float32(MASKED_LOGIT))
    z -= z.max(axis=-1, keepdims=True)
    cdf = np.exp(z).cumsum(axis=-1)  # illegal columns add exactly 0: exp(-1e9) underflows
    total = cdf[:, -1]
    if greedy:
        actions = z.argmax(axis=-1)
    else:
        # u in (0, total]: the first column whose cumulative sum reaches u has a positive probability
        u = (1.0 - torch.rand(z.shape[0], generator=generator).numpy()) * total
        actions = (cdf < u[:, None]).sum(axis=-1)
    logp = z[np.arange(z.shape[0]), actions] - np.log(total)
    return actions, logp, value.numpy()
