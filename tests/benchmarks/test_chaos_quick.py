"""The chaos benchmark's --quick run, through its real CLI: faults of every kind, and none of the counts that must
stay zero moves (acknowledged durable snapshots lost, non-durable ones lost outside the documented bound, wrong or
torn reads, versions going backwards, version numbers reused, deleted snapshots (through the store or the catalog)
a fresh catalog would list again, listed snapshots that cannot be read), and it leaves no staging file of its
killed workers behind.

It starts its own multi-node cluster in a subprocess, so this module shares no Ray session.
"""

from __future__ import annotations

import json


def test_quick_chaos_run_loses_nothing_acknowledged_and_serves_nothing_wrong(tmp_path, run_quick):
    out = tmp_path / "chaos"
    run = run_quick("chaos", "--seed", "1", "--out", str(out), timeout=900)
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
