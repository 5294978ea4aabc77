"""policystore.rllib on real RLlib PPO (2 EnvRunners, two-agent CartPole): one Algorithm for the whole module.

The tests run in file order and grow one league: freeze, train, broadcast, kill an EnvRunner, remove, learn,
checkpoint and restore (beside it and into it, while it runs), and a league the EnvRunners cannot play.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import eventually

pytest.importorskip("ray.rllib")

import ray  # noqa: E402
from ray.rllib.algorithms.algorithm import Algorithm  # noqa: E402
from ray.rllib.core.rl_module.rl_module import RLModuleSpec  # noqa: E402

import policystore  # noqa: E402
from examples.rllib_cartpole_league import opponent_mapping, ppo_config  # noqa: E402
from policystore.rllib import (  # noqa: E402
    LeagueError,
    NotFrozenError,
    add_frozen,
    frozen_modules,
    league_name,
    league_store,
    remove_frozen,
    set_matchmaking,
)

pytestmark = pytest.mark.rllib


@pytest.fixture(scope="module")
def algo(ray_session):
    algorithm = ppo_config(env_runners=2, hidden=16).build_algo()
    yield algorithm
    algorithm.stop()


def freeze(algorithm, *module_ids: str) -> None:
    """Freeze copies of main; agent 1 then plays the newest one."""
    for module_id in module_ids:
        if module_id not in frozen_modules(algorithm):
            add_frozen(algorithm, module_id, "main", new_agent_to_module_mapping_fn=opponent_mapping(module_id))


def stored_bytes(algorithm) -> dict[str, dict[str, bytes]]:
    """Every frozen snapshot's bytes as the node store holds them (after verifying its checksum)."""
    store = league_store(algorithm)
    out = {}
    for module_id, sid in frozen_modules(algorithm).items():
        store.verify(sid.policy_id, sid.version)
        out[module_id] = {k: v.numpy().tobytes() for k, v in store.get(sid.policy_id, sid.version).items()}
    return out


def held_views(runner) -> dict[str, tuple]:
    """On an EnvRunner: for each frozen module, the snapshot it views and whether all its tensors are views."""
    return {
        mid: (
            tuple(runner.module[mid].policystore_snapshot.id),
            all(isinstance(t, policystore.SharedTensor) for t in runner.module[mid].state_dict().values()),
        )
        for mid in runner.frozen_modules()
    }


def held_bytes(runner) -> dict[str, dict[str, bytes]]:
    return {
        mid: {k: v.numpy().tobytes() for k, v in runner.module[mid].state_dict().items()}
        for mid in runner.frozen_modules()
    }


def all_runners(algorithm, func):
    return algorithm.env_runner_group.foreach_env_runner(func, local_env_runner=True)


def kill_env_runner(algorithm, index: int = 1):
    """SIGKILL remote EnvRunner ``index``; returns its actor once Ray has restarted it (before RLlib notices)."""
    actor = algorithm.env_runner_group._worker_manager._actors[index]
    old_pid = ray.get(actor.apply.remote(lambda runner: os.getpid()))
    ray.kill(actor, no_restart=False)
    eventually(lambda: ray.get(actor.apply.remote(lambda runner: os.getpid()), timeout=10) != old_pid,
               "Ray restarting the EnvRunner", 60, every_s=0.5,
               ignore=(ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError))
    return actor


def test_frozen_modules_are_store_views_and_stay_off_the_learners(algo):
    freeze(algo, "main_v1", "main_v2")
    league = {mid: (tuple(sid), True) for mid, sid in frozen_modules(algo).items()}
    assert set(league) == {"main_v1", "main_v2"}
    views = all_runners(algo, held_views)
    assert len(views) == 3 and all(v == league for v in views)  # local + 2 remote EnvRunners
    learner_modules = algo.learner_group.foreach_learner(lambda learner: sorted(learner.module.keys()))
    assert [r.get() for r in learner_modules] == [["main", "main_v0"]]

    result = algo.train()  # PPO's GAE would raise KeyError('main_v2') without the learner-connector piece
    sampled = result["env_runners"]["num_module_steps_sampled"]
    assert sampled.get("main_v2", 0) > 0 and sampled.get("main", 0) > 0
    assert "main" in result["learners"] and "main_v2" not in result["learners"]


def test_rllib_broadcast_paths_never_write_into_views(algo):
    freeze(algo, "main_v1", "main_v2")
    before = stored_bytes(algo)
    assert all_runners(algo, held_bytes) == [before] * 3

    algo.train()  # sync_weights after the update
    algo.env_runner_group.sync_weights(from_worker_or_learner_group=algo.learner_group, inference_only=True)
    algo.add_module("extra", RLModuleSpec.from_module(algo.get_module("main")))  # broadcasts every module
    algo.remove_module("extra")  # and again
    algo.set_state(algo.get_state())  # full round trip: Learner state, then sync to every EnvRunner
    store = league_store(algo)
    forged = {"rl_module": {}, "weights_seq_no": 0}
    for mid, sid in frozen_modules(algo).items():
        snap = store.get(sid.policy_id, sid.version)
        forged["rl_module"][mid] = {k: np.full(tuple(v.shape), 7.0, np.float32) for k, v in snap.items()}
    all_runners(algo, lambda runner: runner.set_state(forged))  # a state that names the frozen ids outright

    assert stored_bytes(algo) == before
    assert all_runners(algo, held_bytes) == [before] * 3
    # Without the EnvRunner's filter RLlib's own load would hit the views; the store's guard refuses it.
    with pytest.raises(policystore.ReadOnlyWeightsError):
        algo.env_runner.module["main_v1"].set_state(forged["rl_module"]["main_v1"])
    assert stored_bytes(algo) == before


def test_killed_env_runner_comes_back_with_frozen_modules_and_matchmaking(algo):
    freeze(algo, "main_v1", "main_v2")
    league = {mid: (tuple(sid), True) for mid, sid in frozen_modules(algo).items()}
    before = stored_bytes(algo)
    actor = kill_env_runner(algo)  # Ray restarts it from its original config; RLlib has not touched it yet
    assert ray.get(actor.apply.remote(held_views)) == league
    # The original config maps agent 1 to main_v0; the league's current matchmaking maps it to main_v2.
    assert ray.get(actor.apply.remote(lambda runner: runner.config.policy_mapping_fn(1, None))) == "main_v2"

    algo.train()  # RLlib's restore_env_runners syncs the restarted runner from the local one
    assert algo.env_runner_group.num_healthy_remote_workers() == 2
    assert all_runners(algo, held_views) == [league] * 3
    assert stored_bytes(algo) == before


def test_remove_frozen_drops_the_module_everywhere(algo):
    freeze(algo, "main_v1", "main_v2")
    remove_frozen(algo, "main_v1", new_agent_to_module_mapping_fn=opponent_mapping("main_v2"))
    assert set(frozen_modules(algo)) == {"main_v2"}
    assert all("main_v1" not in keys for keys in all_runners(algo, lambda runner: list(runner.module.keys())))
    algo.train()
    with pytest.raises(NotFrozenError, match="main_v1"):
        remove_frozen(algo, "main_v1")


def test_training_updates_main_everywhere_and_never_the_frozen_views(algo):
    # Whether a few iterations of PPO raise the return is up to chance; what the store must not break is the
    # mechanics: the Learner updates main, the update reaches every EnvRunner, the frozen views stay bitwise.
    freeze(algo, "main_v2", "main_v3")
    frozen = stored_bytes(algo)

    def main_bytes(runner):
        return {k: v.numpy().tobytes() for k, v in runner.module["main"].state_dict().items()}

    def learner_bytes():
        return {k: np.asarray(v).tobytes() for k, v in algo.learner_group.get_weights(["main"])["main"].items()}

    runners_before, learner_before = all_runners(algo, main_bytes), learner_bytes()
    result = algo.train()
    assert np.isfinite(result["learners"]["main"]["total_loss"])
    assert learner_bytes() != learner_before
    # Every EnvRunner got new weights for main (RLlib sends them with the next sample, so not always the newest).
    assert all(after != before for after, before in zip(all_runners(algo, main_bytes), runners_before, strict=True))
    assert stored_bytes(algo) == frozen and all_runners(algo, held_bytes) == [frozen] * 3


def test_checkpoint_restore_keeps_frozen_snapshots_bitwise(algo, tmp_path):
    freeze(algo, "main_v2", "main_v3")
    saved = stored_bytes(algo)
    path = algo.save_to_path(tmp_path / "ckpt")
    store = league_store(algo)
    for sid in frozen_modules(algo).values():  # the store forgets them: only the checkpoint can bring them back
        store.delete(sid.policy_id)

    restored = Algorithm.from_checkpoint(path)
    try:
        assert stored_bytes(restored) == saved
        assert all_runners(restored, held_bytes) == [saved] * 3
        restored.train()
        assert all_runners(restored, held_bytes) == [saved] * 3
        assert stored_bytes(restored) == saved
    finally:
        restored.stop()


def refreeze(algorithm) -> None:
    """Fresh snapshots of main_v2 and main_v3 (an earlier test deleted theirs from the store), main_v3 played."""
    for module_id in ("main_v2", "main_v3"):
        add_frozen(algorithm, module_id, "main", new_agent_to_module_mapping_fn=opponent_mapping("main_v3"),
                   new_should_module_be_updated=["main"])


def agent_1_plays(runner) -> str:
    return runner.config.policy_mapping_fn(1, None)


def trainable(algorithm) -> list[bool]:
    """Whether the Learner updates main and main_v0."""
    found = algorithm.learner_group.foreach_learner(
        lambda learner: [learner.should_module_be_updated(m) for m in ("main", "main_v0")]
    )
    return [r.get() for r in found][0]


def train_healthy(algorithm) -> dict:
    """A train() that every remote EnvRunner took part in (after a failure Ray first restarts the dead ones)."""
    def healthy_train() -> dict | None:
        healthy_before = algorithm.env_runner_group.num_healthy_remote_workers() == 2
        result = algorithm.train()
        return result if healthy_before and algorithm.env_runner_group.num_healthy_remote_workers() == 2 else None

    return eventually(healthy_train, "EnvRunners back healthy", 180, every_s=0)


@pytest.mark.parametrize("how", ["restore_from_path", "restore"])
def test_restore_into_the_live_algorithm_brings_back_the_checkpoints_league(algo, tmp_path, how):
    refreeze(algo)
    saved = stored_bytes(algo)
    path = algo.save_to_path(tmp_path / "ckpt")
    # The league moves on: a new copy, agent 1's opponent leaves, main_v0 trains too.
    add_frozen(algo, "main_v4", "main", new_agent_to_module_mapping_fn=opponent_mapping("main_v4"),
               new_should_module_be_updated=["main", "main_v0"])
    remove_frozen(algo, "main_v3", new_agent_to_module_mapping_fn=opponent_mapping("main_v4"))
    assert trainable(algo) == [True, True]

    getattr(algo, how)(path)
    assert set(frozen_modules(algo)) == {"main_v2", "main_v3"}
    assert stored_bytes(algo) == saved
    assert all_runners(algo, held_bytes) == [saved] * 3
    assert all_runners(algo, agent_1_plays) == ["main_v3"] * 3  # the checkpoint's matchmaking
    assert algo.config.policy_mapping_fn(1, None) == "main_v3"  # what the next checkpoint's config carries
    assert trainable(algo) == [True, False]  # the checkpoint's policies_to_train
    result = train_healthy(algo)
    sampled = result["env_runners"]["num_module_steps_sampled"]
    assert sampled.get("main_v3", 0) > 0 and "main_v4" not in sampled
    assert all_runners(algo, held_bytes) == [saved] * 3


def test_an_algorithm_restored_beside_the_live_one_gets_a_league_of_its_own(algo, tmp_path):
    refreeze(algo)
    saved, live = stored_bytes(algo), dict(frozen_modules(algo))
    path = algo.save_to_path(tmp_path / "ckpt")

    restored = Algorithm.from_checkpoint(path)
    try:
        assert league_name(restored) != league_name(algo)
        assert all(sid.policy_id.startswith(f"{league_name(restored)}.") for sid in frozen_modules(restored).values())
        assert stored_bytes(restored) == saved
        assert all_runners(restored, held_bytes) == [saved] * 3
        assert all_runners(restored, agent_1_plays) == ["main_v3"] * 3
        # Each league moves on alone.
        add_frozen(restored, "main_v8", "main", new_agent_to_module_mapping_fn=opponent_mapping("main_v8"))
        assert frozen_modules(algo) == live and all_runners(algo, agent_1_plays) == ["main_v3"] * 3
        assert "main_v8" in train_healthy(restored)["env_runners"]["num_module_steps_sampled"]
        assert "main_v8" not in train_healthy(algo)["env_runners"]["num_module_steps_sampled"]
        assert all_runners(algo, held_bytes) == [saved] * 3
    finally:
        restored.stop()


def test_a_mapping_to_a_module_the_env_runners_lack_is_refused_when_set(algo):
    refreeze(algo)
    pids = algo.env_runner_group.foreach_env_runner(lambda runner: os.getpid(), local_env_runner=False)
    with pytest.raises(LeagueError) as error:
        set_matchmaking(algo, opponent_mapping("main_v7"))  # no such module
    assert "'main_v7'" in str(error.value) and "nothing was changed" in str(error.value)

    set_matchmaking(algo, opponent_mapping("main_v3"))
    assert train_healthy(algo)["env_runners"]["num_module_steps_sampled"].get("main_v3", 0) > 0
    assert algo.env_runner_group.foreach_env_runner(lambda runner: os.getpid(), local_env_runner=False) == pids


def test_a_frozen_module_whose_snapshot_is_gone_raises_in_train(algo):
    sid = add_frozen(algo, "main_v5", "main", new_agent_to_module_mapping_fn=opponent_mapping("main_v5"))
    league_store(algo).delete(sid.policy_id, version=sid.version)
    kill_env_runner(algo)  # comes back without main_v5: the store no longer has it
    with pytest.raises(LeagueError) as error:
        for _ in range(4):
            algo.train()
    message = str(error.value)
    assert "'main_v5'" in message and repr(league_name(algo)) in message and "could not be attached" in message
