"""Restore into a fresh Ray session in the same Python process, with the old Algorithm still alive.

The old Algorithm's local EnvRunner keeps views of the old session's snapshots in this process; a restore must
not take them as proof that the new session's (empty) store holds the league: it re-publishes what the store of
the current session does not list with the checkpoint's checksum, every EnvRunner (the driver's local one, which
still holds the old session's copies, included) plays the checkpoint's bytes, and the restored job trains.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray.rllib")

import ray  # noqa: E402
from ray.rllib.algorithms.algorithm import Algorithm  # noqa: E402

from examples.rllib_nim_league import build_config, league_mapping, parse_args  # noqa: E402
from policystore.rllib import add_frozen, frozen_modules, league_name, league_store  # noqa: E402

pytestmark = pytest.mark.rllib
SHORT = ["--env-runners", "1", "--hidden", "16", "--batch", "200", "--win-rate-threshold", "2"]  # no auto-freeze


def start_ray() -> None:
    ray.init(address="local", num_cpus=2, object_store_memory=500_000_000, include_dashboard=False,
             logging_level="warning")


def listed(algorithm) -> dict[str, str]:
    """Frozen module id -> checksum, as the store of the current session lists the snapshot."""
    store = league_store(algorithm)
    rows = {row.id: row.checksum for row in store.list()}
    return {mid: rows.get(sid) for mid, sid in frozen_modules(algorithm).items()}


def held_bytes(runner) -> dict[str, dict[str, bytes]]:
    return {
        mid: {k: v.numpy().tobytes() for k, v in runner.module[mid].state_dict().items()}
        for mid in runner.frozen_modules()
    }


_CHILD = "POLICYSTORE_TEST_RESTORE_CHILD"
ROOT = Path(__file__).resolve().parents[2]


def test_restore_in_a_new_session_republishes_while_the_old_algorithm_lives(tmp_path):
    """Runs in a fresh interpreter: the scenario is a whole process's life (two Ray sessions, the first one's
    objects still alive), which the suite's long-lived process, after dozens of sessions of its own, is not."""
    if os.environ.get(_CHILD):
        scenario(tmp_path)
        return
    test = f"{Path(__file__).name}::test_restore_in_a_new_session_republishes_while_the_old_algorithm_lives"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__).parent / test)],
        cwd=ROOT, env={**os.environ, _CHILD: "1"}, capture_output=True, text=True, timeout=900,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]


def scenario(tmp_path: Path) -> None:
    start_ray()
    try:
        old = build_config(parse_args(SHORT)).build_algo()
        old.train()
        for module_id in ("main_v1", "main_v2"):
            add_frozen(old, module_id, "main",
                       new_agent_to_module_mapping_fn=league_mapping(["main_v1", "main_v2"][: int(module_id[-1])]))
        saved_checksums = listed(old)
        saved_bytes = held_bytes(old.env_runner)
        assert set(saved_bytes) == {"main_v1", "main_v2"} and None not in saved_checksums.values()
        path = old.save_to_path(tmp_path / "ckpt")
    finally:
        ray.shutdown()  # `old` stays alive on purpose: its local EnvRunner still views the old session's snapshots

    start_ray()
    try:
        restored = Algorithm.from_checkpoint(path)
        try:
            assert league_name(restored) != league_name(old)  # its own league, re-published in this session
            now = listed(restored)  # re-published, not skipped (new pack metadata: new checksums)
            assert set(now) == set(saved_checksums) and None not in now.values()
            runners = restored.env_runner_group.foreach_env_runner(held_bytes, local_env_runner=True)
            assert runners == [saved_bytes] * 2
            result = restored.train()
            assert restored.env_runner_group.num_healthy_remote_workers() == 1
            sampled = result["env_runners"]["num_module_steps_sampled"]
            assert sampled.get("main_v1", 0) + sampled.get("main_v2", 0) > 0  # the frozen modules were played
            assert np.isfinite(result["learners"]["main"]["total_loss"])
            assert restored.env_runner_group.foreach_env_runner(held_bytes, local_env_runner=True) == runners
        finally:
            restored.stop()
    finally:
        ray.shutdown()
    assert old.env_runner.frozen_modules().keys() == {"main_v1", "main_v2"}  # kept alive to the end
