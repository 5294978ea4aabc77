"""PPO pieces: GAE, the masked clipped objective, an update's effect, learner checkpoints, device choice."""

import numpy as np
import pytest
import torch

from league.connect4 import COLS, NUM_PLANES, ROWS
from league.gae import gae
from league.model import PolicyNet, act, masked_logits
from trainer.checkpoint import has_learner, load_learner, save_learner
from trainer.learner import choose_device, host_weights
from trainer.ppo import PPO, PPOConfig, ppo_loss


def test_gae_matches_a_hand_computed_episode():
    gamma, lam = 0.9, 0.5
    values = np.array([[0.1, 0.2, 0.3, 0.0], [0.5, 0.0, 0.0, 0.0]], dtype=np.float32)
    lengths = np.array([3, 1])
    final = np.array([1.0, -1.0], dtype=np.float32)
    adv, ret = gae(values, lengths, final, gamma, lam)
    d2 = 1.0 - 0.3
    d1 = gamma * 0.3 - 0.2
    d0 = gamma * 0.2 - 0.1
    a2, a1 = d2, d1 + gamma * lam * d2
    a0 = d0 + gamma * lam * a1
    np.testing.assert_allclose(adv[0], [a0, a1, a2, 0.0], rtol=1e-6)
    np.testing.assert_allclose(adv[1], [-1.5, 0, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(ret[0, :3], adv[0, :3] + values[0, :3], rtol=1e-6)
    assert ret[0, 3] == 0 and ret[1, 1:].sum() == 0
    # lambda = 1: advantages are discounted returns minus values (Monte Carlo).
    adv, _ = gae(values, lengths, final, gamma, 1.0)
    np.testing.assert_allclose(adv[0, :3], [gamma ** 2 - 0.1, gamma - 0.2, 1 - 0.3], rtol=1e-6)


def _batch(n: int, good_action: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    planes = rng.random((n, NUM_PLANES, ROWS, COLS)) < 0.2
    legal = np.ones((n, COLS), dtype=bool)
    legal[:, 6] = False  # column 6 is never legal
    actions = rng.integers(0, 6, n)
    return {"planes": planes, "legal": legal, "actions": actions,
            "logp": np.full(n, np.log(1 / 6), dtype=np.float32),
            "advantages": np.where(actions == good_action, 1.0, -0.2).astype(np.float32),
            "returns": np.zeros(n, dtype=np.float32)}


def test_masked_columns_get_zero_probability_and_are_never_sampled():
    net = PolicyNet(32)
    logits = masked_logits(torch.zeros(2, COLS), torch.tensor([[True] * 6 + [False]] * 2))
    assert torch.softmax(logits, -1)[:, 6].max().item() == 0.0
    planes = np.zeros((500, NUM_PLANES, ROWS, COLS), np.float32)
    legal = np.zeros((500, COLS), bool)
    legal[:, [1, 4]] = True
    actions, logp, values = act(net, planes, legal, torch.Generator().manual_seed(0))
    assert set(actions.tolist()) == {1, 4} and (logp <= 0).all() and (np.abs(values) <= 1).all()


def test_ppo_update_raises_the_probability_of_advantaged_actions():
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    cfg = PPOConfig(batch=1024, minibatch=256, epochs=4, lr=3e-3)
    ppo = PPO(PolicyNet(32), cfg, torch.device("cpu"))
    batch = _batch(1024, good_action=2, rng=rng)
    tensors = ppo.to_tensors(batch)

    def prob_good() -> float:
        with torch.no_grad():
            logits, _ = ppo.net(tensors["planes"])
            return torch.softmax(masked_logits(logits, tensors["legal"]), -1)[:, 2].mean().item()

    before = prob_good()
    stats = ppo.update(batch)
    assert prob_good() > before + 0.05
    assert set(stats) == {"pg_loss", "value_loss", "entropy", "clipfrac"} and ppo.updates == 1
    # After the update the new policy has moved away from the behaviour policy: some ratios are clipped.
    loss, info = ppo_loss(ppo.net, {k: v[:256] for k, v in tensors.items()}, cfg)
    assert torch.isfinite(loss) and 0.0 < info["clipfrac"] <= 1.0


def test_ppo_config_rejects_minibatch_larger_than_batch():
    with pytest.raises(ValueError, match="minibatch"):
        PPOConfig(batch=100, minibatch=200)


def test_learner_checkpoint_restores_weights_and_adam_state(tmp_path):
    rng = np.random.default_rng(1)
    torch.manual_seed(1)
    cfg = PPOConfig(batch=512, minibatch=256, epochs=1)
    ppo = PPO(PolicyNet(16), cfg, torch.device("cpu"))
    ppo.update(_batch(512, 1, rng))
    save_learner(tmp_path, "main_0", ppo.net, ppo.opt, {"updates": 1, "samples": 512})
    assert has_learner(tmp_path, "main_0") and not has_learner(tmp_path, "main_1")
    fresh = PPO(PolicyNet(16), cfg, torch.device("cpu"))
    counters = load_learner(tmp_path, "main_0", fresh.net, fresh.opt)
    assert counters == {"updates": 1, "samples": 512}
    for (k, a), b in zip(ppo.net.state_dict().items(), fresh.net.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    # Identical next updates prove the optimizer moments came back too.
    batch = _batch(512, 3, rng)
    ppo.rng, fresh.rng = np.random.default_rng(5), np.random.default_rng(5)
    ppo.update(batch)
    fresh.update(batch)
    for a, b in zip(ppo.net.parameters(), fresh.net.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_device_is_cpu_without_a_gpu_and_weights_publish_from_host():
    assert choose_device([]) == torch.device("cpu")
    if not torch.cuda.is_available():
        assert choose_device([0]) == torch.device("cpu")  # Ray said GPU, torch cannot see one: stay on CPU
    weights = host_weights(PolicyNet(8))
    assert all(t.device.type == "cpu" for t in weights.values())
