"""Smoke test: every benchmark's --quick mode runs end to end through its real CLI and writes its results.

Each benchmark starts its own Ray session(s) in a subprocess (they need store configs of their own), so this
module shares none. Figures are not checked against targets here (that is what the benchmarks report); only that
every row is well-formed JSON with its figures, and that the results folder holds JSON, a table and a plot.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# benchmark -> keys every row must carry (numbers, finite)
EXPECTED = {
    "memory_scaling": ["workers", "snapshots", "snapshot_mib", "attributable_mib", "copies_per_node",
                       "object_store_used_mib", "system_used_delta_mib", "loadavg_1m"],
    "fetch_latency": ["snapshot_mib", "samples", "p50_ms", "p99_ms", "loadavg_1m"],
    "spill_restore": ["snapshot_mib", "loadavg_1m"],  # plus the keys of its row type, below
    "publish": ["snapshot_mib", "memcpy_ms", "publish_ms", "durable_ms", "publish_x_memcpy"],
}
SPILL_ROW_KEYS = {
    "ratio": ["lz4_ratio"],
    "restore": ["restore_gbps", "tier_gbps", "raw_read_gbps", "ratio", "tier_ratio", "file_bytes"],
}


def quick_run(name: str, out: Path) -> subprocess.CompletedProcess:
    """``python -m benchmarks.<name> --quick --out <out>``, as CI and users run it."""
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", "--quick", "--out", str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300,
    )


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
def test_quick_run_writes_results(name, tmp_path):
    out = tmp_path / name
    proc = quick_run(name, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]  # stdout is JSON rows and nothing else
    assert rows, "no measured point"
    for row in rows:
        assert row["benchmark"] == name
        keys = EXPECTED[name] + SPILL_ROW_KEYS.get(row.get("row"), [])
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
    if name == "spill_restore":  # pruned weights compress, random ones are stored raw
        ratio = {r["kind"]: r for r in rows if r["row"] == "ratio"}
        assert ratio["pruned"]["lz4_ratio"] < 0.6 and ratio["pruned"]["stored_compressed"]
        assert not ratio["random"]["stored_compressed"]
