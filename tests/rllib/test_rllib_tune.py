"""Two trials of one league config under Ray Tune, running at once: separate leagues, each trains and restores.

examples/rllib_tune_league.py in a short form (2 iterations, tiny modules, 1 EnvRunner per trial). A barrier in
the first ``on_train_result`` holds each trial until both have frozen a copy, so the two leagues are live at the
same time under the same module ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import safetensors.numpy
from helpers import eventually

pytest.importorskip("ray.rllib")

from ray.experimental.internal_kv import _internal_kv_list, _internal_kv_put  # noqa: E402
from ray.rllib.algorithms.algorithm import Algorithm  # noqa: E402
from ray.rllib.callbacks.callbacks import RLlibCallback  # noqa: E402
from ray.rllib.utils import force_list  # noqa: E402

from examples.rllib_tune_league import parse_args, run_trials, tune_config  # noqa: E402
from policystore.rllib import frozen_modules, league_name  # noqa: E402

pytestmark = pytest.mark.rllib
BARRIER = "test-tune-barrier."


class BothTrialsAtOnce(RLlibCallback):
    """Waits in the first iteration until every trial of the grid has got there (a deadline, not a sleep)."""

    def on_train_result(self, *, algorithm: Any, result: dict, **kwargs: Any) -> None:
        if algorithm.iteration != 1:
            return
        _internal_kv_put(f"{BARRIER}{league_name(algorithm)}".encode(), b"1", namespace="test")
        eventually(lambda: len(_internal_kv_list(BARRIER.encode(), namespace="test")) >= 2,
                   "the other trial reaching its first iteration", 300, every_s=0.2)


def checkpoint_bytes(path: str) -> dict[str, dict[str, bytes]]:
    """Frozen module id -> its tensors' bytes, as the checkpoint holds them."""
    folder = Path(path) / "env_runner" / "policystore"
    index = json.loads((folder / "league.json").read_text())
    return {
        item["module_id"]: {k: v.tobytes() for k, v in safetensors.numpy.load_file(folder / item["file"]).items()}
        for item in index["frozen"]
    }


def held_bytes(runner) -> dict[str, dict[str, bytes]]:
    return {
        mid: {k: v.numpy().tobytes() for k, v in runner.module[mid].state_dict().items()}
        for mid in runner.frozen_modules()
    }


def test_two_tune_trials_keep_separate_leagues_and_restore(ray_session, tmp_path):
    args = parse_args(["--iters", "2", "--hidden", "16", "--batch", "200", "--storage", str(tmp_path)])
    config = tune_config(args)
    config.callbacks(callbacks_class=[*force_list(config.callbacks_class), BothTrialsAtOnce])
    results = run_trials(args, config)
    assert results.num_errors == 0, [r.error for r in results]
    leagues = [r.metrics["policystore"] for r in results]
    assert len(leagues) == 2 and leagues[0]["league"] != leagues[1]["league"]
    for league in leagues:  # the same module ids, each a snapshot of its own league
        assert sorted(league["frozen"]) == ["main_v1", "main_v2"]
        assert all(sid.startswith(f"{league['league']}.main_v") for sid in league["frozen"].values())

    for result in results:
        saved = checkpoint_bytes(result.checkpoint.path)
        assert set(saved) == {"main_v1", "main_v2"}
        algorithm = Algorithm.from_checkpoint(result.checkpoint.path)
        try:
            assert league_name(algorithm) not in {league["league"] for league in leagues}
            assert set(frozen_modules(algorithm)) == set(saved)
            held = algorithm.env_runner_group.foreach_env_runner(held_bytes, local_env_runner=True)
            assert held == [saved] * 2
            sampled = algorithm.train()["env_runners"]["num_module_steps_sampled"]
            assert algorithm.env_runner_group.num_healthy_remote_workers() == 1
            assert sampled.get("main_v1", 0) + sampled.get("main_v2", 0) > 0
        finally:
            algorithm.stop()
    # Two trials from one seed grid froze different weights under the same ids.
    first, second = (checkpoint_bytes(r.checkpoint.path) for r in results)
    assert first["main_v1"] != second["main_v1"]
