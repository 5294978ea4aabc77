"""The adapter on a second, hand-written game: the Nim league of examples/rllib_nim_league.py in a short form.

Real RLlib PPO with 1 EnvRunner; every iteration a frozen copy of ``main`` joins and, beyond two, the oldest
leaves, so one run goes through add_frozen, remove_frozen and training against store-backed opponents.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("ray.rllib")

import policystore  # noqa: E402
from examples.rllib_nim_league import Nim, build_config, league_mapping, league_of, parse_args  # noqa: E402
from policystore.rllib import frozen_modules, league_store, remove_frozen  # noqa: E402

pytestmark = pytest.mark.rllib
SHORT = ["--env-runners", "1", "--hidden", "16", "--batch", "200", "--max-frozen", "2", "--win-rate-threshold", "-1"]


def test_nim_rules():
    env = Nim({"seed": 1})
    obs, _ = env.reset()
    assert list(obs) == ["p0"] and obs["p0"].sum() == 1.0
    stones = int(np.argmax(obs["p0"]))
    assert 9 <= stones <= 15
    movers, done = [], False
    while not done:
        (mover,) = obs
        movers.append(mover)
        obs, rewards, terminated, _, _ = env.step({mover: 2})  # take 3 (or what is left)
        done = terminated["__all__"]
    assert movers[:2] == ["p0", "p1"] and all(a != b for a, b in zip(movers, movers[1:], strict=False))
    assert rewards == {movers[-1]: 1.0, ("p1" if movers[-1] == "p0" else "p0"): -1.0}
    assert len(movers) == -(-stones // 3)


def test_nim_league_with_store_backed_opponents(ray_session, monkeypatch):
    algorithm = build_config(parse_args(SHORT)).build_algo()
    try:
        sampled = {}
        for _ in range(3):
            result = algorithm.train()
            for mid, n in result["env_runners"]["num_module_steps_sampled"].items():
                sampled[mid] = sampled.get(mid, 0) + n
        assert league_of(algorithm).frozen == ["main_v2", "main_v3"]  # main_v1 joined, then left
        assert set(frozen_modules(algorithm)) == {"main_v2", "main_v3"}
        runners = algorithm.env_runner_group.foreach_env_runner(
            lambda runner: sorted(runner.frozen_modules()), local_env_runner=True
        )
        assert runners == [["main_v2", "main_v3"]] * 2
        assert sampled.get("main_v1", 0) > 0 and sampled.get("main_v2", 0) > 0  # the frozen copies were played
        learners = algorithm.learner_group.foreach_learner(lambda learner: sorted(learner.module.keys()))
        assert [r.get() for r in learners] == [["main", "random"]]
        assert np.isfinite(result["learners"]["main"]["total_loss"])

        # A frozen module's sampling forward skips the views' write-guard dispatch (the fast path); RLlib's
        # unwrapped method would go through it on every op.
        module, calls = algorithm.env_runner.module["main_v3"], []
        guard = vars(policystore.SharedTensor)["__torch_function__"].__func__

        def counting(cls, func, types, args=(), kwargs=None):
            calls.append(func)
            return guard(cls, func, types, args, kwargs)

        monkeypatch.setattr(policystore.SharedTensor, "__torch_function__", classmethod(counting))
        batch = {"obs": torch.zeros(4, 16)}
        module.forward_exploration(batch)
        assert calls == []
        type(module).forward_exploration(module, batch)
        assert calls
        monkeypatch.undo()

        # The league lets go of what it removes (the runs above removed main_v1): the store deletes it, memory
        # and disk, unless kept on purpose.
        store = league_store(algorithm)
        listed = {row.id.policy_id.rsplit(".", 1)[1] for row in store.list()}
        assert listed == {"main_v2", "main_v3"}
        hot = store.stats().hot_bytes
        size = next(row.nbytes for row in store.list() if row.id == frozen_modules(algorithm)["main_v2"])
        remove_frozen(algorithm, "main_v2", keep=True, new_agent_to_module_mapping_fn=league_mapping(["main_v3"]))
        assert "main_v2" in {row.id.policy_id.rsplit(".", 1)[1] for row in store.list()}
        remove_frozen(algorithm, "main_v3", new_agent_to_module_mapping_fn=lambda agent, episode, **kw: "main")
        assert {row.id.policy_id.rsplit(".", 1)[1] for row in store.list()} == {"main_v2"}
        assert store.stats().hot_bytes == hot - size
    finally:
        algorithm.stop()
