"""A league's snapshots over a job's life on real RLlib PPO (1 EnvRunner, two-agent CartPole): what the league lets go
of leaves memory and the job's disk tier, mistakes are refused in the driver before anything changes, and the job's
end removes its store and disk tier (but what is durable).

The tests run in file order on one Algorithm; the last one stops it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import textwrap
from pathlib import Path

import pytest
from helpers import eventually

pytest.importorskip("ray.rllib")

import ray  # noqa: E402
from ray.rllib.callbacks.callbacks import RLlibCallback  # noqa: E402
from ray.rllib.utils.metrics import (  # noqa: E402
    ENV_RUNNER_RESULTS,
    EPISODE_MODULE_RETURN_MEAN,
    NUM_MODULE_STEPS_SAMPLED_LIFETIME,
)

from examples.rllib_cartpole_league import opponent_mapping, ppo_config  # noqa: E402
from policystore.errors import PolicyStoreError  # noqa: E402
from policystore.remote import NAMESPACE, catalog_name, running, store_name  # noqa: E402
from policystore.rllib import (  # noqa: E402
    LeagueError,
    NotSetUpError,
    add_frozen,
    frozen_modules,
    league_name,
    league_store,
    registry,  # noqa: E402
    remove_frozen,
    set_matchmaking,
)

pytestmark = pytest.mark.rllib
HIDDEN = 256  # two layers: a 0.27 MiB snapshot, well above Ray's inline-object size, so it lives in the object store


@pytest.fixture(scope="module")
def algo(ray_session):
    algorithm = ppo_config(env_runners=1, hidden=HIDDEN).build_algo()
    yield algorithm
    if not getattr(algorithm, "_policystore_test_stopped", False):
        algorithm.stop()


def spill_files(algorithm) -> set[str]:
    """Snapshot files in the league's disk tier (module id of each), after every pending spill is written."""
    store = league_store(algorithm)
    store.flush()
    folder = Path(store.stats().spill_dir)
    return {p.parent.name.rsplit(".", 1)[1] for p in folder.rglob("*.safetensors*")}


def listed(algorithm) -> set[str]:
    return {row.id.policy_id.rsplit(".", 1)[1] for row in league_store(algorithm).list()}


def object_store_used_bytes() -> int:
    """Bytes of live objects in this node's object store, as Ray's plasma store counts them."""
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    reply = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address))
    return int(reply.store_stats.object_store_bytes_used)


def runner_pid(algorithm) -> int:
    return algorithm.env_runner_group.foreach_env_runner(lambda runner: os.getpid(), local_env_runner=False)[0]


def test_the_job_disk_tier_is_in_the_algorithms_log_dir(algo):
    assert league_store(algo).stats().spill_dir.startswith(os.path.join(algo.logdir, "policystore-spill"))


def test_a_churning_league_keeps_only_its_live_opponents(algo):
    live: list[str] = []
    for i in range(1, 6):  # cap 2, one freeze per step
        live.append(f"v{i}")
        add_frozen(algo, live[-1], "main", new_agent_to_module_mapping_fn=opponent_mapping(live[-1]))
        if len(live) > 2:
            remove_frozen(algo, live.pop(0))
    assert set(frozen_modules(algo)) == set(live) == {"v4", "v5"}
    assert listed(algo) == set(live) and spill_files(algo) == set(live)
    store = league_store(algo)
    assert store.stats().hot_bytes == sum(row.nbytes for row in store.list())

    # Once every EnvRunner has dropped it, nothing maps the removed snapshot: the object store frees its bytes.
    size = next(row.nbytes for row in store.list() if row.id.policy_id.endswith(".v4"))
    before = object_store_used_bytes()
    remove_frozen(algo, "v4")
    eventually(lambda: object_store_used_bytes() <= before - size, "the removed snapshot's bytes freed", 60)
    assert listed(algo) == spill_files(algo) == {"v5"}


def test_the_league_store_calls_leave_no_task_records_in_rays_gcs(algo):
    """Ray's GCS keeps a record of every actor task (up to 100,000): a league calls its store from every EnvRunner
    for every opponent it freezes and removes, so with records on, Ray's own memory grew with every opponent the
    league ever had."""
    league = league_name(algo)
    for name in (store_name(ray.get_runtime_context().get_node_id(), league), catalog_name(league)):
        handle = running(name)
        assert handle is not None, name
        assert handle._ray_enable_task_events is False, name
        assert not any(handle._ray_method_enable_task_events.values()), name


def test_kept_and_durable_snapshots_stay(algo):
    add_frozen(algo, "kept", "main")
    add_frozen(algo, "durable", "main", durable=True)
    remove_frozen(algo, "kept", keep=True)
    remove_frozen(algo, "durable")
    assert {"kept", "durable"} <= listed(algo) and {"kept", "durable"} <= spill_files(algo)
    assert "kept" not in frozen_modules(algo) and "durable" not in frozen_modules(algo)


def test_refreezing_an_id_lets_go_of_its_old_snapshot(algo):
    old = frozen_modules(algo)["v5"]
    new = add_frozen(algo, "v5", "main", new_agent_to_module_mapping_fn=opponent_mapping("v5"))
    assert new.version > old.version
    assert [row.id for row in league_store(algo).list(old.policy_id)] == [new]


def test_a_removed_opponent_leaves_no_per_module_records(algo):
    """RLlib records every module id it has played (lifetime counters too) in each EnvRunner and the Algorithm, and
    reports all of them in every result, and each process's store client keeps the build callable of every policy it
    loaded: a churning league forgets its removed opponents'."""
    def played(stats: dict) -> set[str]:
        return {mid for key in (NUM_MODULE_STEPS_SAMPLED_LIFETIME, EPISODE_MODULE_RETURN_MEAN)
                for mid in stats.get(key, {})}

    add_frozen(algo, "played", "main", new_agent_to_module_mapping_fn=opponent_mapping("played"))
    assert "played" in played(algo.train()[ENV_RUNNER_RESULTS])
    remove_frozen(algo, "played", new_agent_to_module_mapping_fn=opponent_mapping("v5"))
    runners = algo.env_runner_group.foreach_env_runner(lambda runner: played(runner.metrics.peek()))
    assert runners and all("played" not in ids for ids in runners)  # the driver's local EnvRunner and the remote one
    assert "played" not in played(algo.metrics.peek().get(ENV_RUNNER_RESULTS, {}))
    # Nor does any process's store client keep its module's build callable (the spec and a skeleton module).
    policy = f"{league_name(algo)}.played"
    eventually(lambda: not any(algo.env_runner_group.foreach_env_runner(
        lambda runner: policy in runner._policystore_settings().store()._session.builders)),
        "the removed module's build callable let go in every EnvRunner", 30)


def test_mistakes_are_refused_in_the_driver_and_change_nothing(algo):
    version, pid = registry.read(league_name(algo)).version, runner_pid(algo)
    with pytest.raises(LeagueError, match=r"'main_v0' is one of this Algorithm's RLlib modules.*new id"):
        add_frozen(algo, "main_v0", "main")  # an RLlib module (here one it does not train)
    with pytest.raises(LeagueError, match=r"'main' is one of this Algorithm's RLlib modules"):
        add_frozen(algo, "main", "v5")
    with pytest.raises(LeagueError, match=r"maps agent 1 to module 'v9'.*nothing was changed"):
        set_matchmaking(algo, opponent_mapping("v9"))
    with pytest.raises(LeagueError, match=r"maps agent 1 to module 'v5'"):
        remove_frozen(algo, "v5")  # the current matchmaking still plays it
    with pytest.raises(LeagueError, match=r"maps agent 1 to module 'v6'"):
        add_frozen(algo, "v7", "main", new_agent_to_module_mapping_fn=opponent_mapping("v6"))
    assert registry.read(league_name(algo)).version == version and "v7" not in listed(algo)
    # No EnvRunner met the mistake: the same process trains on, healthy.
    result = algo.train()
    assert algo.env_runner_group.num_healthy_remote_workers() == 1 and runner_pid(algo) == pid
    assert result["env_runners"]["num_module_steps_sampled"].get("v5", 0) > 0


def test_another_architecture_under_a_frozen_id_is_refused(algo):
    import dataclasses

    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    small = dataclasses.replace(RLModuleSpec.from_module(algo.get_module("main")), load_state_path=None,
                                model_config=DefaultModelConfig(fcnet_hiddens=[8]))
    algo.add_module("small", small, new_should_module_be_updated=["main"])
    try:
        with pytest.raises(LeagueError, match=r"frozen module 'v5' has another architecture than 'small'"):
            add_frozen(algo, "v5", "small")
        # The same weights published around the league, straight to its store under v5's id: refused there too.
        store, policy_id = league_store(algo), f"{league_name(algo)}.v5"
        before = [row.id for row in store.list(policy_id)]
        weights = {k: v.detach().clone() for k, v in algo.get_module("small").state_dict().items()}
        with pytest.raises(LeagueError, match=r"frozen module 'v5'.*do not fit its architecture.*add_frozen"):
            store.publish(policy_id, weights)
        assert [row.id for row in store.list(policy_id)] == before
    finally:
        algo.remove_module("small", new_should_module_be_updated=["main"])


def test_callbacks_replaced_after_set_up_fail_build_in_the_driver(ray_session):
    class MyCallback(RLlibCallback):
        pass

    config = ppo_config(env_runners=1, hidden=8).callbacks(MyCallback)  # replaces PolicyStoreCallback
    with pytest.raises(NotSetUpError, match=r"call it after config.callbacks"):
        config.build_algo()


def test_the_league_goes_on_after_its_store_actor_dies(algo):
    league, node = league_name(algo), ray.get_runtime_context().get_node_id()
    frozen = {mid: sid for mid, sid in frozen_modules(algo).items()}
    spill_files(algo)  # everything on disk: the restarted store rebuilds from its disk tier
    ray.kill(ray.get_actor(store_name(node, league), namespace=NAMESPACE), no_restart=False)
    eventually(lambda: {row.id for row in league_store(algo).list()} >= set(frozen.values()),
               "the restarted store listing the league's snapshots", ignore=(PolicyStoreError,))
    add_frozen(algo, "v6", "main", new_agent_to_module_mapping_fn=opponent_mapping("v6"))
    result = algo.train()
    assert result["env_runners"]["num_module_steps_sampled"].get("v6", 0) > 0
    assert algo.env_runner_group.num_healthy_remote_workers() == 1


def test_a_write_into_shared_weights_is_named_in_the_driver(algo, caplog):
    """A write by a route torch does not see kills the EnvRunner (SIGSEGV, by design): the driver's log names the
    EnvRunner and the module at the call that met the death; the snapshot is unchanged."""
    sid = frozen_modules(algo)["v5"]

    def write(runner):  # through the raw pointer: torch's guard and numpy's read-only flag never see it
        ctypes.memset(next(iter(runner.module["v5"].parameters())).data_ptr(), 0, 8)

    with caplog.at_level(logging.ERROR, logger="policystore.rllib.faults"):
        assert algo.env_runner_group.foreach_env_runner(write, local_env_runner=False) == []
    assert re.search(r"EnvRunner 1 \(pid \d+\) was killed by SIGSEGV: it wrote into the shared weights of frozen "
                     r"module 'v5' \(snapshot " + re.escape(str(sid)), caplog.text), caplog.text
    assert not list(Path(algo.logdir, "policystore-faults").glob("*.txt"))  # reported once, then cleared
    league_store(algo).verify(sid.policy_id, sid.version)  # raises if the write had reached the snapshot
    # Ray restarts the EnvRunner (tests/rllib/test_rllib_league.py shows one back with its frozen modules); the job
    # ends in the next test without waiting for it.


def test_the_jobs_end_removes_its_store_and_disk_tier_but_what_it_keeps(algo):
    store, league = league_store(algo), league_name(algo)
    folder = Path(store.stats().spill_dir)
    node = ray.get_runtime_context().get_node_id()

    def store_running() -> bool:
        return any(a["name"] == store_name(node, league) for a in ray.util.list_named_actors(all_namespaces=True))

    assert store_running()
    algo.stop()
    algo._policystore_test_stopped = True
    assert not store_running()
    kept = {p.parent.name.rsplit(".", 1)[1] for p in folder.rglob("*.safetensors*")}
    assert kept == {"kept", "durable"}  # the rest was deleted, the store stopped
    shutil.rmtree(os.path.join(algo.logdir, "policystore-spill"))  # what the test kept on purpose


def test_the_package_docstring_example_runs(ray_session):
    """The example a user reads first (``help(policystore.rllib)``) is run as written."""
    import policystore.rllib as adapter

    example = textwrap.dedent(adapter.__doc__.split("::\n", 1)[1].split("\nSee docs/rllib.md", 1)[0])
    assert "add_frozen(" in example and "remove_frozen(" in example
    exec(compile(example, "policystore.rllib docstring", "exec"), {})  # noqa: S102 - the docs' own code
