"""Smoke test: every benchmark's --quick mode runs end to end through its real CLI and writes its results.

Each benchmark starts its own Ray session(s) in a subprocess (they need store configs of their own; ``run_quick``
in conftest.py, which also checks that the run leaves no staging file of its processes behind), so this module
shares none. Figures are not checked against targets here (that is what the benchmarks report); only that
every row is well-formed JSON with its figures, and that the results folder holds JSON, a table and a plot.
"""

from __future__ import annotations

import importlib
import json
import math

import pytest

# benchmark -> keys every row must carry (numbers, finite)
EXPECTED = {
    "memory_scaling": ["workers", "snapshots", "snapshot_mib", "attributable_mib", "copies_per_node",
                       "object_store_used_mib", "system_used_delta_mib", "loadavg_1m", "anon_delta_mib",
                       *(f"anon_delta_{role}_mib" for role in ("store_actors", "learner", "workers", "driver", "ray"))],
    "fetch_latency": ["snapshot_mib", "samples", "p50_ms", "p99_ms", "loadavg_1m"],
    "spill_restore": ["snapshot_mib", "loadavg_1m"],  # plus the keys of its row type, below
    "publish": ["snapshot_mib", "memcpy_ms", "publish_ms", "durable_ms", "publish_x_memcpy"],
    "league_throughput": ["loadavg_1m"],  # plus the keys of its row kind, below
    "watchers": ["readers", "by_push", "by_round_trip", "all_readers_s", "catalog_watchers", "catalog_by_ring",
                 "all_catalog_watchers_s", "store_threads", "catalog_threads"],
    "worker_memory": ["snapshot_mib", "snapshots", "pushed_kib_per_snapshot", "first_load_kib", "kib_per_module",
                      "kib_per_module_beyond_weights", "loadavg_1m"],
    "soak": ["ops", "loadavg_1m"],
    "game_speed": ["games", "native_steps_per_s", "batched_steps_per_s", "net_steps_per_s", "rollout_steps_per_s",
                   "rollout_x_native", "rollout_x_batched", "floor_x_native", "loadavg_1m"],
}
ROW_KEYS = {  # per row type (spill_restore's "row", league_throughput's "bench")
    "ratio": ["lz4_ratio"],
    "restore": ["restore_gbps", "tier_gbps", "raw_read_gbps", "ratio", "tier_ratio", "file_bytes"],
    "league_training": ["workers", "env_steps", "env_steps_per_s", "learner_samples_per_s", "frozen_snapshots",
                        "worker_pss_mib", "store_hot_mib", "private_copies_mib"],
    "forward": ["batch", "hidden", "forward_us"],
    "sample": ["seconds", "catalog_pss_mib", "store_pss_mib", "durable_markers", "durable_data", "durable_tombstones"],
    "growth": ["catalog_pss_mib_per_1000_ops", "store_pss_mib_per_1000_ops", "durable_tombstones_per_1000_ops"],
}
# The quick run, made shorter still where a benchmark's --quick trains for real (the trainer's own tests cover it),
# or where another smoke run already covers a mode (memory_scaling's runs the private copies worker_memory shares).
EXTRA_ARGS = {"league_throughput": ["--seconds", "5", "--modes", "store"], "worker_memory": ["--modes", "store"]}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_help_explains(name, capsys):
    module = importlib.import_module(f"benchmarks.{name}")
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "--quick" in text and "--out" in text
    assert text.count("\n") > 10  # the module docstring says what is measured


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_quick_run_writes_results(name, tmp_path, run_quick):
    out = tmp_path / name
    proc = run_quick(name, "--out", str(out), *EXTRA_ARGS.get(name, []), timeout=300)
    rows = [json.loads(line) for line in proc.stdout.splitlines()]  # stdout is JSON rows and nothing else
    assert rows, "no measured point"
    for row in rows:
        assert row["benchmark"] == name
        keys = EXPECTED[name] + ROW_KEYS.get(row.get("row"), []) + ROW_KEYS.get(row.get("bench"), [])
        for key in keys:
            assert isinstance(row[key], (int, float)) and math.isfinite(row[key]), (key, row)
    record = json.loads((out / "results.json").read_text())
    assert record["rows"] == rows
    assert record["command"].startswith(f"python -m benchmarks.{name}")
    table = (out / "table.md").read_text()
    assert table.count("\n|") >= len(rows) + 1
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if name == "memory_scaling":  # both modes at the same points; the store really holds every snapshot
        assert {r["mode"] for r in rows} == {"private", "store"}
        assert {(r["workers"], r["snapshots"]) for r in rows if r["mode"] == "private"} == {
            (r["workers"], r["snapshots"]) for r in rows if r["mode"] == "store"
        }
        for r in rows:
            assert r["object_store_used_mib"] >= 0.99 * r["snapshots"] * r["snapshot_bytes"] / 2**20
            by_role = [v for k, v in r.items() if k.startswith("anon_delta_") and k != "anon_delta_mib"]
            assert sum(by_role) == pytest.approx(r["anon_delta_mib"], abs=1e-6)  # every process has one role
    if name == "spill_restore":  # pruned weights compress, random ones are stored raw
        ratio = {r["kind"]: r for r in rows if r["row"] == "ratio"}
        assert ratio["pruned"]["lz4_ratio"] < 0.6 and ratio["pruned"]["stored_compressed"]
        assert not ratio["random"]["stored_compressed"]
    if name == "game_speed":  # every game of the issue, through the OpenSpiel path, and the built-in one
        assert [r["game"] for r in rows] == ["openspiel:tic_tac_toe", "openspiel:leduc_poker",
                                             "openspiel:connect_four", "connect4"]
    if name == "league_throughput":  # a training point, then the forward pass called both ways
        assert [r["bench"] for r in rows] == ["league_training"] + ["forward"] * 2
        forward = {(r["mode"], r["path"]) for r in rows if r["bench"] == "forward"}
        assert forward == {("store", "module"), ("store", "act")}
