"""The network testbed's --quick run, through its real CLI: 3 Ray nodes in their own network namespaces behind
shaped links; one snapshot reaches both other nodes by every way, each node's store holds a verified copy of its
own, every node's link carried the bytes, and the testbed leaves nothing behind (namespaces, links, its folder,
Ray's cluster record).

It needs root with CAP_NET_ADMIN (CI runs as root) and skips with the reason otherwise."""

from __future__ import annotations

from pathlib import Path

RECORD = Path("/tmp/ray/ray_current_cluster")


def test_quick_network_fanout_gives_every_node_its_own_copy_and_leaves_nothing(quick_on_testbed):
    rows = quick_on_testbed("benchmarks.fanout_net", 300)
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
    # no record of the testbed's cluster (its subnet, benchmarks.netbed.SUBNET) in Ray's default temp folder; other
    # test files' local Rays may write and remove their own record meanwhile, so only the testbed's is checked
    assert "10.213.41." not in (RECORD.read_text() if RECORD.exists() else "")
