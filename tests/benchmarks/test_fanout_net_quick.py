"""The network testbed's --quick run, through its real CLI: 3 Ray nodes in their own network namespaces behind
shaped links; one snapshot reaches both other nodes by every way, each node's store holds a verified copy of its
own, every node's link carried the bytes, and the testbed leaves nothing behind (namespaces, links, its folder,
Ray's cluster record).

It needs root with CAP_NET_ADMIN (CI runs as root) and skips with the reason otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def netbed(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.netbed", *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=60)


CHECK = netbed("--check")
REASON = CHECK.stdout.strip() if CHECK.returncode else None
RECORD = Path("/tmp/ray/ray_current_cluster")


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_quick_network_fanout_gives_every_node_its_own_copy_and_leaves_nothing(tmp_path):
    tag = f"t{uuid.uuid4().hex[:3]}"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.fanout_net", "--quick", "--tag", tag, "--out", str(tmp_path / "out")],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    fanout = {r["way"]: r for r in rows if r["row"] == "fanout"}
    assert set(fanout) == {"one_link", "ray_get", "policystore"}
    assert fanout["policystore"]["verified"] is True and fanout["policystore"]["nodes"] == 3
    for row in fanout.values():
        assert row["total_s"] > 0 and row["x_one_link"] > 0 and row["x_ray_get"] > 0
    size = fanout["policystore"]["snapshot_mib"]
    moved = {r["way"]: r for r in rows if r["row"] == "bytes"}
    # the shaped links carried the copies: each reader's node received the snapshot over its own link
    assert all(mib >= size for mib in moved["policystore"]["recv_mib"][1:]), moved["policystore"]
    assert all(mib >= size for mib in moved["ray_get"]["recv_mib"][1:]), moved["ray_get"]
    assert json.loads(netbed("--leftovers", tag).stdout) == []
    # no record of the testbed's cluster (its subnet, benchmarks.netbed.SUBNET) in Ray's default temp folder; other
    # test files' local Rays may write and remove their own record meanwhile, so only the testbed's is checked
    assert "10.213.41." not in (RECORD.read_text() if RECORD.exists() else "")
