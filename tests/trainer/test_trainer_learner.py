"""The learner shard's device choice (policystore/trainer/learner.py) and the host copies it publishes."""

import torch

from policystore.league.model import PolicyNet
from policystore.trainer.learner import choose_device, host_weights


def test_device_is_cpu_without_a_gpu_and_weights_publish_from_host():
    assert choose_device([]) == torch.device("cpu")
    if not torch.cuda.is_available():
        assert choose_device([0]) == torch.device("cpu")  # Ray said GPU, torch cannot see one: stay on CPU
    weights = host_weights(PolicyNet(8))
    assert all(t.device.type == "cpu" for t in weights.values())
