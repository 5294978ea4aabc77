"""PPO with action masking (clipped objective), CleanRL-style: one function per idea.

The advantages arrive with the batch: the rollout workers compute them with ``league.gae``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from policystore.league.model import masked_logits

BATCH_KEYS = ("planes", "legal", "actions", "logp", "advantages", "returns")


@dataclass
class PPOConfig:
    lr: float = 1e-3
    lr_final: float | None = None  # the learning rate at the run's end, reached linearly; None: constant lr
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.2
    epochs: int = 2
    minibatch: int = 2048
    batch: int = 8192             # samples gathered before an update
    entropy_coef: float = 0.01
    tactics_coef: float = 1.0     # weight of -log p(the named moves) where the game's rule names some (Game.tactics)
    search_coef: float = 0.0      # weight of the cross-entropy to a tree search's visit shares (Game.search)
    search_positions: int = 512   # positions of each batch searched for that target
    search_sims: int = 16         # simulations per searched position
    value_coef: float = 0.5
    max_grad_norm: float = 0.5

    def __post_init__(self) -> None:
        if min(self.epochs, self.minibatch) < 1:
            raise ValueError(f"epochs and minibatch must be >= 1, got {self.epochs} and {self.minibatch}")
        if self.minibatch > self.batch:
            raise ValueError(f"minibatch ({self.minibatch}) must not exceed batch ({self.batch})")
        if self.lr <= 0 or (self.lr_final is not None and self.lr_final < 0):
            raise ValueError(f"lr must be > 0 and lr_final >= 0, got {self.lr} and {self.lr_final}")
        if min(self.entropy_coef, self.value_coef, self.tactics_coef, self.search_coef) < 0:
            raise ValueError(f"entropy_coef, value_coef, tactics_coef and search_coef must be >= 0, got "
                             f"{self.entropy_coef}, {self.value_coef}, {self.tactics_coef} and {self.search_coef}")
        if min(self.search_positions, self.search_sims) < 1:
            raise ValueError(f"search_positions and search_sims must be >= 1, got {self.search_positions} and "
                             f"{self.search_sims}")
        if not (0 < self.gamma <= 1 and 0 <= self.gae_lambda <= 1):
            raise ValueError("gamma must lie in (0, 1] and gae_lambda in [0, 1]")


def ppo_loss(net: nn.Module, mb: dict[str, torch.Tensor], cfg: PPOConfig) -> tuple[torch.Tensor, dict]:
    """Clipped surrogate + value MSE - entropy bonus, over one minibatch."""
    logits, value = net(mb["planes"])
    logp_all = torch.log_softmax(masked_logits(logits, mb["legal"]), dim=-1)
    logp = logp_all.gather(-1, mb["actions"][:, None]).squeeze(-1)
    ratio = torch.exp(logp - mb["logp"])
    adv = mb["advantages"]
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip, 1 + cfg.clip)).mean()
    value_loss = 0.5 * (value - mb["returns"]).pow(2).mean()
    probs = logp_all.exp()
    entropy = -(probs * torch.where(mb["legal"], logp_all, torch.zeros_like(logp_all))).sum(-1).mean()
    loss = pg_loss + cfg.value_coef * value_loss - cfg.entropy_coef * entropy
    with torch.no_grad():
        clipfrac = ((ratio - 1).abs() > cfg.clip).float().mean()
    info = {"pg_loss": pg_loss.item(), "value_loss": value_loss.item(), "entropy": entropy.item(),
            "clipfrac": clipfrac.item()}
    if "forced" in mb:
        tactics = tactics_loss(logp_all, mb["forced"])
        loss = loss + cfg.tactics_coef * tactics
        info["tactics_loss"] = tactics.item()
    if "search_pi" in mb:
        search = search_loss(logp_all, mb["search_pi"])
        loss = loss + cfg.search_coef * search
        info["search_loss"] = search.item()
    return loss, info


def tactics_loss(logp_all: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
    """Mean -log of the probability given to the forced moves, over the positions that have some (0 if none):
    a supervised nudge that PPO's sparse reward gives only after many lost games."""
    has = forced.any(-1)
    if not has.any():
        return logp_all.new_zeros(())
    chosen = logp_all[has].masked_fill(~forced[has], -torch.inf)
    return -torch.logsumexp(chosen, dim=-1).mean()


def search_loss(logp_all: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy to the search's visit shares over the positions that were searched (rows of ``pi`` that
    sum to 1; the others are 0), as AlphaZero's policy loss: 0 if none in this minibatch."""
    searched = pi.sum(-1) > 0
    if not searched.any():
        return logp_all.new_zeros(())
    logp = torch.where(pi[searched] > 0, logp_all[searched], torch.zeros_like(logp_all[searched]))
    return -(pi[searched] * logp).sum(-1).mean()


class PPO:
    """Owns the trainable net and its optimizer; ``update`` runs the PPO epochs over one batch."""

    def __init__(self, net: nn.Module, cfg: PPOConfig, device: torch.device, seed: int = 0,
                 tactics: Callable[[np.ndarray], np.ndarray] | None = None,
                 search: Callable[[nn.Module, np.ndarray, int], np.ndarray] | None = None):
        """``tactics``: the game's forced-move rule (``Game.tactics``); ``search``: its tree search's visit shares
        (``Game.search``). Without one, there is no tactics (search) loss."""
        self.net = net.to(device)
        self.cfg = cfg
        self.tactics = tactics if cfg.tactics_coef else None
        self.search = search if cfg.search_coef else None
        self.device = device
        self.opt = self.new_optimizer()
        self.rng = np.random.default_rng(seed)
        self.updates = 0

    def new_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.net.parameters(), lr=self.cfg.lr, eps=1e-5)

    def set_progress(self, progress: float) -> None:
        """Anneal the learning rate: ``progress`` is the share of the run done (0 to 1)."""
        if self.cfg.lr_final is None:
            return
        p = min(max(progress, 0.0), 1.0)
        for group in self.opt.param_groups:
            group["lr"] = self.cfg.lr + (self.cfg.lr_final - self.cfg.lr) * p

    def to_tensors(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """The batch on the device; with ``forced`` (the game's forced moves) when the tactics loss is on, and
        ``search_pi`` (visit shares for ``search_positions`` random positions, zero rows elsewhere) when the
        search loss is."""
        dtypes = {"planes": torch.float32, "legal": torch.bool, "actions": torch.int64, "forced": torch.bool}
        arrays = {k: batch[k] for k in BATCH_KEYS}
        if self.tactics is not None:
            arrays["forced"] = self.tactics(batch["planes"]) & batch["legal"]
        if self.search is not None:
            n = len(batch["actions"])
            chosen = self.rng.choice(n, min(n, self.cfg.search_positions), replace=False)
            pi = np.zeros(batch["legal"].shape, np.float32)
            pi[chosen] = self.search(self.net, batch["planes"][chosen], self.cfg.search_sims)
            arrays["search_pi"] = pi
        return {k: torch.as_tensor(v).to(self.device, dtypes.get(k, torch.float32)) for k, v in arrays.items()}

    def update(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        data = self.to_tensors(batch)
        n = data["actions"].shape[0]
        stats: dict[str, list[float]] = {}
        self.net.train()
        for _ in range(self.cfg.epochs):
            order = torch.from_numpy(self.rng.permutation(n)).to(self.device)
            for start in range(0, n - self.cfg.minibatch + 1, self.cfg.minibatch):
                idx = order[start:start + self.cfg.minibatch]
                loss, info = ppo_loss(self.net, {k: v[idx] for k, v in data.items()}, self.cfg)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.net.parameters(), self.cfg.max_grad_norm)
                self.opt.step()
                for k, v in info.items():
                    stats.setdefault(k, []).append(v)
        self.updates += 1
        return {k: float(np.mean(v)) for k, v in stats.items()}
