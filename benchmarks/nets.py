"""Policy networks of a chosen size: the snapshots the benchmarks publish, load and run.

Two realistic shapes: an MLP policy (vector observations, three hidden layers) and the Nature-DQN conv net
(84x84x4 frames) whose fully connected layer is widened until the state dict has the wanted size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

ARCHS = ("mlp", "conv")
OBS_DIM = 64
ACTIONS = 16
_CONV_PARAMS = (32 * 4 * 8 * 8 + 32) + (64 * 32 * 4 * 4 + 64) + (64 * 64 * 3 * 3 + 64)
_CONV_FLAT = 64 * 7 * 7


@dataclass(frozen=True)
class NetSpec:
    """A picklable builder (``spec()`` returns a fresh module) for a float32 net of about ``target_bytes``."""

    arch: str
    width: int

    @classmethod
    def for_bytes(cls, arch: str, target_bytes: int) -> NetSpec:
        if arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
        params = target_bytes // 4
        if arch == "mlp":  # 2h^2 + (OBS_DIM + ACTIONS + 3) h + ACTIONS parameters
            b = OBS_DIM + ACTIONS + 3
            width = round((-b + math.sqrt(b * b + 8 * (params - ACTIONS))) / 4)
        else:  # conv trunk + (flat + 1 + ACTIONS) w + ACTIONS
            width = round((params - _CONV_PARAMS - ACTIONS) / (_CONV_FLAT + 1 + ACTIONS))
        if width < 8:
            raise ValueError(f"{target_bytes} bytes is too small for a {arch} policy")
        return cls(arch, width)

    def __call__(self) -> nn.Module:
        h = self.width
        if self.arch == "mlp":
            return nn.Sequential(
                nn.Linear(OBS_DIM, h), nn.Tanh(), nn.Linear(h, h), nn.Tanh(), nn.Linear(h, h), nn.Tanh(),
                nn.Linear(h, ACTIONS),
            )
        return nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(), nn.Linear(_CONV_FLAT, h), nn.ReLU(),
            nn.Linear(h, ACTIONS),
        )

    def example_input(self, batch: int = 1) -> torch.Tensor:
        shape = (batch, OBS_DIM) if self.arch == "mlp" else (batch, 4, 84, 84)
        return torch.zeros(shape)

    @property
    def nbytes(self) -> int:
        with torch.device("meta"):
            return sum(t.numel() * t.element_size() for t in self().state_dict().values())


def random_weights(spec: NetSpec, seed: int) -> dict[str, torch.Tensor]:
    """A freshly initialised state dict (PyTorch's default init), reproducible from ``seed``."""
    torch.manual_seed(seed)
    return spec().state_dict()


def trained_weights(spec: NetSpec, steps: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Weights after ``steps`` of SGD on a fixed random regression task: what a real snapshot looks like on disk
    (initial weights plus small, correlated updates), as opposed to ``random_weights``."""
    torch.manual_seed(seed)
    net = spec()
    opt = torch.optim.SGD(net.parameters(), lr=1e-2, momentum=0.9)
    x = torch.randn((32, *spec.example_input().shape[1:]))
    y = torch.randn(32, ACTIONS)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return {k: v.detach() for k, v in net.state_dict().items()}
