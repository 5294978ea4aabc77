"""Weights for tests, shared by the format, server and client tests (import it; never import another test module).

Every dtype the store supports, filled with every bit pattern (NaNs and infs included), plus the odd shapes that
catch alignment bugs: what a bitwise round trip through the store has to survive; and a small net and plain
weights of a given size for the store's tests.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from policystore.memory import MiB

DTYPES = [  # all 15 safetensors dtypes
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int16,
    torch.int32, torch.int64, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32,
    torch.uint64,
]


def random_tensor(dtype: torch.dtype, shape=(5, 7), seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size(),),
                        dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        return (raw[: int(np.prod(shape))] % 2).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)  # every bit pattern, NaNs and infs included


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bytes(a.contiguous().reshape(-1).view(torch.uint8).numpy()) \
        == bytes(b.contiguous().reshape(-1).view(torch.uint8).numpy())


def mixed_weights() -> dict[str, torch.Tensor]:
    weights = {f"t.{str(d).split('.')[-1]}": random_tensor(d, seed=i) for i, d in enumerate(DTYPES)}
    weights["scalar"] = torch.tensor(3.5)
    weights["empty"] = torch.empty(0, 4)
    weights["odd"] = random_tensor(torch.int8, shape=(3,))  # odd sizes must not misalign what follows
    return weights


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))


def weights_of_mib(mib: float, seed: int = 0, compressible: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = int(mib * MiB) // 4
    w = torch.randn(n, generator=g)
    return {"w": torch.round(w) if compressible else w}


def big_net() -> nn.Module:
    """4 MiB of float32 weights."""
    return nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512))
