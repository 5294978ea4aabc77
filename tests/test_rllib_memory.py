"""EnvRunner memory as frozen snapshots are added: stock RLlib against RLlib with the store (real PPO, PSS).

No absolute thresholds: the relation between the two growths is what must hold.
"""

from __future__ import annotations

import pytest

pytest.importorskip("ray.rllib")

import ray  # noqa: E402

from benchmarks.rllib_memory import init_ray, measure  # noqa: E402

pytestmark = pytest.mark.rllib
ENV_RUNNERS, FROZEN, HIDDEN = 2, 6, 1024  # 6 snapshots of about 4 MiB each


def measured(mode: str) -> list[dict]:
    """One fresh Ray session per mode (object-store pages touched by the other mode would look free)."""
    init_ray(object_store_bytes=1_000_000_000)
    try:
        return list(measure(mode, ENV_RUNNERS, [0, FROZEN], HIDDEN))
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def rows():
    return {mode: measured(mode) for mode in ("rllib", "rllib+store")}


def test_env_runner_memory_stays_flat_with_the_store(rows):
    stock, store = rows["rllib"][-1], rows["rllib+store"][-1]
    one_copy_each = ENV_RUNNERS * FROZEN * stock["module_mib"]
    # Stock RLlib: about one private copy of every frozen module in every EnvRunner (the premise).
    assert stock["env_runner_mib"] > 0.8 * one_copy_each, rows
    # The store: EnvRunners only map the node's single copy (their PSS share of it), nothing private.
    assert store["env_runner_mib"] < 0.5 * stock["env_runner_mib"], rows


def test_the_node_holds_about_one_copy_with_the_store(rows):
    stock, store = rows["rllib"][-1], rows["rllib+store"][-1]
    # One copy in the object store, plus what does not shrink with K: freed publish-argument pages that plasma keeps
    # resident and per-runner module objects. At K = 6-8 python -m benchmarks.rllib_memory measures 1.6-2.2 copies
    # with the store and 7-9 without (docs/rllib.md); the bound is deliberately generous, the ratio is the claim.
    assert store["copies_per_node"] < 3.0, rows
    assert stock["copies_per_node"] > 2 * store["copies_per_node"], rows
