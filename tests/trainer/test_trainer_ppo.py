"""PPO (policystore/trainer/ppo.py): the clipped objective, an update's effect, its config, the learner's checkpoint."""

import numpy as np
import pytest
import torch

from policystore.league.connect4 import COLS, NUM_PLANES, ROWS
from policystore.league.model import PolicyNet, masked_logits
from policystore.trainer.checkpoint import has_learner, load_learner, save_learner
from policystore.trainer.ppo import PPO, PPOConfig, ppo_loss, search_loss, tactics_loss


def _batch(n: int, good_action: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    planes = rng.random((n, NUM_PLANES, ROWS, COLS)) < 0.2
    legal = np.ones((n, COLS), dtype=bool)
    legal[:, 6] = False  # column 6 is never legal
    actions = rng.integers(0, 6, n)
    return {"planes": planes, "legal": legal, "actions": actions,
            "logp": np.full(n, np.log(1 / 6), dtype=np.float32),
            "advantages": np.where(actions == good_action, 1.0, -0.2).astype(np.float32),
            "returns": np.zeros(n, dtype=np.float32)}


def mean_prob(ppo: PPO, tensors: dict[str, torch.Tensor], column: int, rows: slice = slice(None)) -> float:
    """The net's mean probability of ``column`` over ``rows`` of a batch (masked as in training)."""
    with torch.no_grad():
        logits, _ = ppo.net(tensors["planes"][rows])
        return torch.softmax(masked_logits(logits, tensors["legal"][rows]), -1)[:, column].mean().item()


def test_ppo_update_raises_the_probability_of_advantaged_actions():
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    cfg = PPOConfig(batch=1024, minibatch=256, epochs=4, lr=3e-3)
    ppo = PPO(PolicyNet(32), cfg, torch.device("cpu"))
    batch = _batch(1024, good_action=2, rng=rng)
    tensors = ppo.to_tensors(batch)

    before = mean_prob(ppo, tensors, 2)
    stats = ppo.update(batch)
    assert mean_prob(ppo, tensors, 2) > before + 0.05
    assert set(stats) == {"pg_loss", "value_loss", "entropy", "clipfrac"} and ppo.updates == 1
    # After the update the new policy has moved away from the behaviour policy: some ratios are clipped.
    loss, info = ppo_loss(ppo.net, {k: v[:256] for k, v in tensors.items()}, cfg)
    assert torch.isfinite(loss) and 0.0 < info["clipfrac"] <= 1.0


def test_the_tactics_loss_is_minus_log_the_forced_moves_probability_where_there_are_some():
    logp = torch.log_softmax(torch.tensor([[1.0, 2.0, 0.5], [0.0, 0.0, 0.0], [3.0, 1.0, 1.0]]), -1)
    forced = torch.tensor([[True, False, True], [False, False, False], [False, True, False]])
    expected = -(torch.log(logp[0].exp()[[0, 2]].sum()) + logp[2, 1]) / 2  # the quiet middle row does not count
    assert tactics_loss(logp, forced).item() == pytest.approx(expected.item())
    assert tactics_loss(logp, torch.zeros_like(forced)).item() == 0.0


def test_an_update_with_the_tactics_loss_raises_the_forced_moves_probability():
    """Advantages that favour column 2 everywhere; where a position forces another column, the tactics loss wins
    that column ground, and without it that column loses ground."""
    rng = np.random.default_rng(1)
    batch = _batch(1024, good_action=2, rng=rng)
    planes = batch["planes"]
    planes[:, 3:] = False
    planes[:, 2] = False
    planes[:, 2, ROWS - 1] = True  # the bottom row is playable
    planes[: 512, 3, ROWS - 1, 4] = True  # in half the positions column 4 wins at once

    def column_4_wins(planes: np.ndarray) -> np.ndarray:  # a stand-in for the game's rule, read off plane 3
        forced = np.zeros((len(planes), COLS), dtype=bool)
        forced[:, 4] = planes[:, 3, ROWS - 1, 4] > 0
        return forced

    assert column_4_wins(planes)[:512].any(axis=1).all() and not column_4_wins(planes)[512:].any()

    def forced_prob(coef: float) -> tuple[float, float]:
        torch.manual_seed(0)
        ppo = PPO(PolicyNet(32), PPOConfig(batch=1024, minibatch=256, epochs=4, lr=3e-3, tactics_coef=coef),
                  torch.device("cpu"), tactics=column_4_wins)
        tensors = ppo.to_tensors(batch)

        before = mean_prob(ppo, tensors, 4, slice(512))
        stats = ppo.update(batch)
        assert ("tactics_loss" in stats) == (coef > 0)
        return before, mean_prob(ppo, tensors, 4, slice(512))

    before, with_tactics = forced_prob(2.0)
    _, without = forced_prob(0.0)
    assert with_tactics > before + 0.1 and without < before


def test_the_tactics_loss_applies_only_where_the_game_has_a_forced_move_rule():
    batch = _batch(256, good_action=2, rng=np.random.default_rng(2))
    without_rule = PPO(PolicyNet(32), PPOConfig(batch=256, minibatch=256), torch.device("cpu"))
    assert "forced" not in without_rule.to_tensors(batch) and "tactics_loss" not in without_rule.update(batch)
    with pytest.raises(ValueError, match="tactics_coef"):
        PPOConfig(tactics_coef=-1.0)


def test_the_search_loss_is_the_cross_entropy_to_the_visit_shares_of_the_searched_rows():
    logp = torch.log_softmax(torch.tensor([[1.0, 2.0, 0.5], [0.0, 0.0, 0.0], [3.0, 1.0, -1e9]]), -1)
    pi = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0], [0.25, 0.75, 0.0]])
    expected = -((0.5 * logp[0, 0] + 0.5 * logp[0, 1]) + (0.25 * logp[2, 0] + 0.75 * logp[2, 1])) / 2
    assert search_loss(logp, pi).item() == pytest.approx(expected.item())  # an illegal column's -1e9 is no term
    assert search_loss(logp, torch.zeros_like(pi)).item() == 0.0


def test_an_update_with_the_search_loss_moves_the_policy_towards_the_search_on_the_searched_positions():
    """A stand-in search that always prefers column 5 (advantages favour column 2): the searched positions'
    targets pull column 5 up, and only ``search_positions`` of the batch get one."""
    batch = _batch(1024, good_action=2, rng=np.random.default_rng(4))
    calls = []

    def column_5(net: torch.nn.Module, planes: np.ndarray, simulations: int) -> np.ndarray:
        calls.append((len(planes), simulations))
        pi = np.full((len(planes), COLS), 0.02, np.float32)
        pi[:, 5] = 1 - 0.02 * (COLS - 1)
        return pi

    def column_5_prob(coef: float) -> tuple[float, float, dict]:
        torch.manual_seed(0)
        cfg = PPOConfig(batch=1024, minibatch=256, epochs=4, lr=3e-3, search_coef=coef, search_positions=300,
                        search_sims=7)
        ppo = PPO(PolicyNet(32), cfg, torch.device("cpu"), search=column_5)
        tensors = ppo.to_tensors(batch)

        before = mean_prob(ppo, tensors, 5)
        stats = ppo.update(batch)
        return before, mean_prob(ppo, tensors, 5), {"stats": stats, "pi": tensors.get("search_pi")}

    before, with_search, seen = column_5_prob(1.0)
    assert calls == [(300, 7), (300, 7)]  # once in to_tensors above, once in update
    assert int((seen["pi"].sum(-1) > 0).sum()) == 300 and "search_loss" in seen["stats"]
    _, without, unseen = column_5_prob(0.0)
    assert len(calls) == 2 and unseen["pi"] is None and "search_loss" not in unseen["stats"]
    assert with_search > before + 0.1 and without < before
    with pytest.raises(ValueError, match="search_coef"):
        PPOConfig(search_coef=-1.0)
    with pytest.raises(ValueError, match="search_sims"):
        PPOConfig(search_sims=0)


def test_ppo_config_rejects_minibatch_larger_than_batch():
    with pytest.raises(ValueError, match="minibatch"):
        PPOConfig(batch=100, minibatch=200)
    with pytest.raises(ValueError, match="lr_final"):
        PPOConfig(lr_final=-1e-4)


def test_the_learning_rate_follows_the_runs_progress_only_when_annealed():
    annealed = PPO(PolicyNet(32), PPOConfig(lr=1e-3, lr_final=1e-4), torch.device("cpu"))
    constant = PPO(PolicyNet(32), PPOConfig(lr=1e-3), torch.device("cpu"))
    for progress, expected in [(0.0, 1e-3), (0.5, 5.5e-4), (1.0, 1e-4), (1.7, 1e-4)]:
        annealed.set_progress(progress)
        constant.set_progress(progress)
        assert annealed.opt.param_groups[0]["lr"] == pytest.approx(expected)
        assert constant.opt.param_groups[0]["lr"] == 1e-3


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


