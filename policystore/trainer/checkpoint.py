"""Learner checkpoints on disk: weights and Adam state in one safetensors file (no pickle), counters in JSON.

Files are written to a temporary name, fsync'd and renamed, so a run killed mid-save keeps the previous one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_weights(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    _atomic(path, lambda p: save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(p)))


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} is missing")
    return load_file(str(path))


def optimizer_tensors(opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Adam's per-parameter state, flattened to ``optim.<param index>.<name>`` tensors."""
    return {f"optim.{i}.{k}": v for i, state in opt.state_dict()["state"].items() for k, v in state.items()}


def load_optimizer_tensors(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor]) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = value
    opt.load_state_dict({"state": state, "param_groups": opt.state_dict()["param_groups"]})


def save_learner(directory: Path, player: str, net: nn.Module, opt: torch.optim.Optimizer,
                 counters: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {f"net.{k}": v for k, v in net.state_dict().items()} | optimizer_tensors(opt)
    save_weights(directory / f"{player}.safetensors", tensors)
    _atomic(directory / f"{player}.json", lambda p: p.write_text(json.dumps(counters, indent=1)))


def load_learner(directory: Path, player: str, net: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore net and optimizer in place; returns the saved counters."""
    tensors = load_weights(directory / f"{player}.safetensors")
    net.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("net.")})
    load_optimizer_tensors(opt, {k: v for k, v in tensors.items() if k.startswith("optim.")})
    return json.loads((directory / f"{player}.json").read_text())


def has_learner(directory: Path, player: str) -> bool:
    return (directory / f"{player}.safetensors").exists() and (directory / f"{player}.json").exists()
