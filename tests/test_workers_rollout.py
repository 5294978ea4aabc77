"""Learner shards and rollout workers on a real local Ray with the real node store."""

import numpy as np
import pytest
import ray
import torch

import policystore
from trainer.connect4 import COLS, NUM_PLANES, ROWS
from trainer.league import League, LeagueConfig
from trainer.learner import LearnerShard
from trainer.ppo import PPOConfig
from trainer.run import serve_snapshot_requests
from workers.rollout import RolloutWorker, WorkerConfig

HIDDEN = 16
PPO_SMALL = PPOConfig(batch=256, minibatch=128, epochs=1)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    ray.init(address="local", num_cpus=2, object_store_memory=512 * 2**20, include_dashboard=False)
    yield policystore.connect(policystore.StoreConfig(spill_dir=str(tmp_path_factory.mktemp("spill"))))
    ray.shutdown()


def shard(name: str, checkpoints, **options):
    return ray.remote(LearnerShard).options(num_cpus=0.1, **options).remote(
        name, str(checkpoints), PPO_SMALL, HIDDEN, 0)


def random_batch(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(n)
    return {"planes": rng.random((n, NUM_PLANES, ROWS, COLS)) < 0.2, "legal": np.ones((n, COLS), bool),
            "actions": rng.integers(0, COLS, n), "logp": np.full(n, -np.log(COLS), np.float32),
            "advantages": rng.standard_normal(n).astype(np.float32), "returns": np.zeros(n, np.float32)}


def weights(snap) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in snap.items()}


def test_learner_publishes_versions_snapshots_and_resets(store, tmp_path):
    learner = shard("lrn_main", tmp_path)
    assert ray.get(learner.stats.remote())["device"] == "cpu"
    initial = weights(store.get("lrn_main"))
    assert store.get("lrn_main").id.version == 1
    assert ray.get(learner.add.remote(random_batch(100))) == 0          # below the batch size: no update
    for _ in range(3):
        ray.get(learner.add.remote(random_batch(300)))
    latest = store.get("lrn_main")
    assert latest.id.version == 4 and latest.meta["updates"] == 3
    assert not torch.equal(latest["policy.weight"], initial["policy.weight"])
    # Only the newest two live versions stay in the store.
    assert [i.id.version for i in store.list() if i.id.policy_id == "lrn_main"] == [3, 4]
    sid = ray.get(learner.snapshot.remote("lrn_main.s0"))
    frozen = store.get("lrn_main.s0")
    assert sid == frozen.id and frozen.meta["frozen"] is True
    assert all(torch.equal(frozen[k], latest[k]) for k in latest)
    assert any(i.id == sid and i.on_disk for i in store.list())         # durable: on disk at return
    ray.get(learner.reset.remote())
    reset = store.get("lrn_main")
    assert reset.id.version == 5 and all(torch.equal(reset[k], initial[k]) for k in initial)
    assert all(torch.equal(frozen[k], latest[k]) for k in latest)       # the snapshot is untouched


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_learner_trains_on_a_fractional_gpu_and_publishes_host_copies(store, tmp_path):
    learner = shard("lrn_gpu", tmp_path, num_gpus=0.5)
    assert ray.get(learner.stats.remote())["device"] == "cuda"
    ray.get(learner.add.remote(random_batch(300)))
    snap = store.get("lrn_gpu")
    assert snap.id.version == 2 and all(t.device.type == "cpu" for t in snap.values())


def start_league(store, tmp_path, mode: str):
    config = LeagueConfig(main_exploiters=1, league_exploiters=0)
    league = ray.remote(League).options(num_cpus=0).remote(config, 0)
    names = ray.get(league.trainable.remote())
    learners = {n: shard(n, tmp_path / mode) for n in names}
    # Both parametrized leagues publish under the same ids in this module's store: versions just grow.
    serve_snapshot_requests(league, learners)
    worker = ray.remote(RolloutWorker).options(num_cpus=0.1).remote(
        league, learners, WorkerConfig(games_per_match=64, hidden=HIDDEN, weights=mode), 0)
    return league, learners, worker


@pytest.mark.parametrize("mode", ["store", "private"])
def test_worker_plays_league_matches_and_feeds_learners(store, tmp_path, mode):
    league, learners, worker = start_league(store, tmp_path, mode)
    stats = ray.get(worker.run.remote(3.0))
    assert stats["matches"] >= 3 and stats["steps"] > 0
    summary = ray.get(league.summary.remote())
    assert sum(r["steps"] for r in summary if r["kind"] != "historical") == stats["steps"]
    samples = ray.get([learner.stats.remote() for learner in learners.values()])
    assert sum(s["updates"] for s in samples) > 0                       # trajectories reached the learners
    modules = ray.get(worker.module_report.remote())
    assert modules
    if mode == "store":
        # Every policy the worker played, frozen opponents included, is a view into the node store.
        assert all(m["shared"] for m in modules)
    else:
        assert not any(m["shared"] for m in modules)
