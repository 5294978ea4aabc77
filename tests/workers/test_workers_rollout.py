"""Learner shards, the league actor and rollout workers on a real local Ray with the real node store."""

import numpy as np
import pytest
import ray
import torch
from helpers import eventually

from policystore.league.connect4 import COLS, NUM_PLANES, ROWS
from policystore.league.constants import FROZEN_META_KEY, HISTORICAL
from policystore.league.games import CONNECT4
from policystore.league.matchmaking import LeagueConfig
from policystore.trainer.league_actor import LeagueActor
from policystore.trainer.learner import LearnerShard
from policystore.trainer.ppo import PPOConfig
from policystore.workers.modules import SnapshotModules
from policystore.workers.rollout import RolloutWorker, WorkerConfig

HIDDEN = 16
PPO_SMALL = PPOConfig(batch=256, minibatch=128, epochs=1)


@pytest.fixture
def store(make_store):
    """A fresh node store per test: learners publish under the same player names in every test."""
    return make_store()


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
    assert ray.get(learner.add.remote(random_batch(100))) == (0, 1)     # below the batch size: no update
    answers = [ray.get(learner.add.remote(random_batch(300))) for _ in range(3)]
    assert answers == [(1, 2), (2, 3), (3, 4)]                          # each answer names the newest version
    # published by another process: this one's "latest" catches up by push, within the store's staleness bound
    eventually(lambda: store.get("lrn_main").id.version == 4, "v4 pushed to the driver")
    latest = store.get("lrn_main")
    assert latest.id.version == 4 and latest.meta["updates"] == 3
    assert not torch.equal(latest["policy.weight"], initial["policy.weight"])
    # Only the newest two live versions stay in the store.
    assert [i.id.version for i in store.list() if i.id.policy_id == "lrn_main"] == [3, 4]
    sid = ray.get(learner.snapshot.remote("lrn_main.s0"))
    frozen = store.get("lrn_main.s0")
    assert sid == frozen.id and frozen.meta[FROZEN_META_KEY] is True
    assert all(torch.equal(frozen[k], latest[k]) for k in latest)
    assert any(i.id == sid and i.on_disk for i in store.list())         # durable: on disk at return
    ray.get(learner.reset.remote())
    eventually(lambda: store.get("lrn_main").id.version == 5, "the reset's v5 pushed to the driver")
    reset = store.get("lrn_main")
    assert reset.id.version == 5 and all(torch.equal(reset[k], initial[k]) for k in initial)
    assert all(torch.equal(frozen[k], latest[k]) for k in latest)       # the snapshot is untouched


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_learner_trains_on_a_fractional_gpu_and_publishes_host_copies(store, tmp_path):
    learner = shard("lrn_gpu", tmp_path, num_gpus=0.5)
    assert ray.get(learner.stats.remote())["device"] == "cuda"
    ray.get(learner.add.remote(random_batch(300)))
    eventually(lambda: store.get("lrn_gpu").id.version == 2, "v2 pushed to the driver")
    snap = store.get("lrn_gpu")
    assert snap.id.version == 2 and all(t.device.type == "cpu" for t in snap.values())


def start_league(tmp_path, mode: str, first_run_steps: int = 1_000_000):
    config = LeagueConfig(main_exploiters=1, league_exploiters=0, first_run_steps=first_run_steps)
    league = ray.remote(LeagueActor).options(num_cpus=0).remote(config, 0)
    names = ray.get(league.trainable.remote())
    learners = {n: shard(n, tmp_path / mode) for n in names}
    assert ray.get(league.serve.remote(learners)) == ["main_0.s0"]  # published before any match needs it
    return league, learners, rollout_worker(league, learners, mode)


def rollout_worker(league, learners, mode: str):
    return ray.remote(RolloutWorker).options(num_cpus=0.1).remote(
        league, learners, WorkerConfig(games_per_match=64, hidden=HIDDEN, weights=mode), 0)


def test_workers_play_league_matches_and_feed_learners_with_views_or_private_copies(store, tmp_path):
    """Two workers on one league at once, one per way to hold weights: both feed the learners; the store worker's
    policies are all views into the node store, the private one's are all its own copies."""
    league, learners, viewer = start_league(tmp_path, "store")
    copier = rollout_worker(league, learners, "private")
    played = dict(zip(("store", "private"), ray.get([w.run.remote(3.0) for w in (viewer, copier)]), strict=True))
    assert all(stats["matches"] >= 1 and stats["steps"] > 0 for stats in played.values()), played
    summary = ray.get(league.summary.remote())
    assert sum(r["steps"] for r in summary if r["kind"] != HISTORICAL) == sum(s["steps"] for s in played.values())
    samples = ray.get([learner.stats.remote() for learner in learners.values()])
    assert sum(s["updates"] for s in samples) > 0                       # trajectories reached the learners
    views, copies = ray.get([viewer.module_report.remote(), copier.module_report.remote()])
    assert views and copies
    # Every policy the store worker played, frozen opponents included, is a view into the node store.
    assert all(m["shared"] for m in views)
    assert not any(m["shared"] for m in copies)


def test_league_has_learners_publish_its_snapshots_without_the_driver(store, tmp_path):
    # Budgets of a few hundred steps: the league asks for snapshots during the first matches.
    league, learners, worker = start_league(tmp_path, "store", first_run_steps=2_000)

    def snapshots():
        return [r for r in ray.get(league.summary.remote()) if r["kind"] == HISTORICAL]

    # However few matches a loaded machine allows a second, the league asks for a snapshot within a few of them.
    eventually(lambda: ray.get(worker.run.remote(1.0)) and len(snapshots()) > 1, "a snapshot asked for in play")
    added = ray.get(league.settle.remote())
    assert set(added) <= {r["name"] for r in snapshots()}
    for row in snapshots():  # every snapshot in the league is a frozen, durable policy in the store
        snap = store.get(row["name"])
        assert snap.meta[FROZEN_META_KEY] is True and snap.meta["player"] == row["parent"]
        assert any(i.id == snap.id and i.on_disk for i in store.list(row["name"]))


def test_worker_plays_a_scripted_league_member_without_a_net(store, tmp_path):
    config = LeagueConfig(main_exploiters=0, league_exploiters=0, scripted=("winblock",), scripted_share=0.5)
    league = ray.remote(LeagueActor).options(num_cpus=0).remote(config, 0)
    learners = {"main_0": shard("main_0", tmp_path)}
    ray.get(league.serve.remote(learners))
    worker = ray.remote(RolloutWorker).options(num_cpus=0.1).remote(
        league, learners, WorkerConfig(games_per_match=64, hidden=HIDDEN), 0)
    match = ray.get(league.next_match.remote("main_0"))
    while not match.scripted:
        match = ray.get(league.next_match.remote("main_0"))
    assert match.opponent == "winblock" and not match.frozen
    result = ray.get(worker.play_match.remote(match))
    assert (result.opponent, result.wins + result.draws + result.losses) == ("winblock", 64)
    ray.get(league.report.remote(result))
    players, _, played = ray.get(league.payoff_matrix.remote())
    assert played[players.index("main_0"), players.index("winblock")] == 64
    # The scripted player is no store policy: the worker built no module for it.
    assert {m["policy"] for m in ray.get(worker.module_report.remote())} == {"main_0"}


def test_snapshot_modules_serve_a_named_version_held_without_asking_for_latest(store):
    """A worker that knows a learner's newest version (from the learner's answer) plays the module it holds for it;
    a version deleted before it was read gives way to the latest."""
    build = lambda: CONNECT4.net(HIDDEN)  # noqa: E731
    for _ in range(2):
        store.publish("mod_p", build().state_dict())
    modules = SnapshotModules(store, build)
    v2 = modules.get("mod_p", frozen=False, version=2)
    store.publish("mod_p", build().state_dict())                        # v3: the store's latest now
    assert modules.get("mod_p", frozen=False, version=2) is v2          # held: no lookup of "latest"
    eventually(lambda: modules.get("mod_p", frozen=False) is not v2, "v3 pushed to the driver")
    store.delete("mod_p", version=1)
    fallback = modules.get("mod_p", frozen=False, version=1)            # gone before it was read: the latest
    assert fallback is modules.get("mod_p", frozen=False) and ("mod_p", 1) not in dict(modules.items())
