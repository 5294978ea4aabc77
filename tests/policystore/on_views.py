"""Snapshots packed in memory and modules built on their views, shared by the view and module tests (no Ray)."""

import numpy as np
import torch
from torch import nn

from policystore import format as fmt
from policystore.modules import build_on_views
from policystore.views import tensor_views


def make_net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.BatchNorm1d(16), nn.Linear(16, 3))


def build_on(build, buf, snapshot: str = "p@v1") -> nn.Module:
    """``build_on_views`` over a packed snapshot buffer."""
    return build_on_views(build, buf, fmt.parse_header(buf, name="p"), snapshot)


def shared_views(module: nn.Module, snapshot: str = "p@v1") -> tuple[dict[str, torch.Tensor], np.ndarray]:
    buf = fmt.pack(module.state_dict(), policy_id="p")
    buf.flags.writeable = False
    return tensor_views(buf, fmt.verify_buffer(buf, name="p"), snapshot), buf
