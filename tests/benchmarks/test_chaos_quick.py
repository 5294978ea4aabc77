"""The chaos benchmark's --quick run, through its real CLI: faults of every kind, and none of the counts that must
stay zero moves (acknowledged durable snapshots lost, non-durable ones lost outside the documented bound, wrong or
torn reads, versions going backwards, version numbers reused, deleted snapshots (through the store or the catalog)
a fresh catalog would list again, listed snapshots that cannot be read).

It starts its own multi-node cluster in a subprocess, so this module shares no Ray session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from policystore import staging

ROOT = Path(__file__).resolve().parents[2]


def test_quick_chaos_run_loses_nothing_acknowledged_and_serves_nothing_wrong(tmp_path):
    out = tmp_path / "chaos"
    orphans = set(staging.orphans())
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.chaos", "--quick", "--seed", "1", "--out", str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=900,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert set(staging.orphans()) <= orphans, "the run left the staging files of its killed workers in /dev/shm"
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    summary = next(r for r in rows if r["kind"] == "summary")
    faults = {r["kind"]: r for r in rows if r["kind"] != "summary"}
    assert summary["durable_acked"] > 0 and summary["nondurable_acked"] > 0 and summary["reads"] > 0
    assert sum(f["injected"] for f in faults.values()) >= 3, faults
    assert summary["durable_lost"] == 0, summary["durable_lost_ids"]
    assert summary["nondurable_unexplained"] == 0
    assert summary["wrong_reads"] == 0
    assert summary["backwards"] == 0
    assert summary["deleted_resurrected"] == 0 and summary["racing_deletes"] >= 0 and summary["catalog_deletes"] >= 0
    assert summary["versions_reused"] == 0
    assert summary["visible_unreadable"] == 0, summary["visible_unreadable_ids"]
    record = json.loads((out / "results.json").read_text())
    assert record["rows"] == rows and (out / "table.md").exists()
