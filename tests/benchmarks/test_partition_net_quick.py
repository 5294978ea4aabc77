"""The partition scenarios' --quick run, through their real CLI, on 4 Ray nodes in network namespaces: a reader
node's link, the head's (the catalog's) link and a learner's link mid-publish each go down for 8 s. Readers keep
reading what their node holds; calls that need the catalog fail within their deadline with a PolicyStoreError;
the cut node catches up; nothing acknowledged is lost and no version is handed out twice.

It needs root with CAP_NET_ADMIN (CI runs as root) and skips with the reason otherwise."""

from __future__ import annotations

MUST_BE_ZERO = ("reads_failed", "hung", "unclear", "lost", "half_visible", "reused", "not_caught_up")


def test_quick_partitions_keep_readers_playing_fail_clearly_and_lose_nothing(quick_on_testbed):
    rows = {r["scenario"]: r for r in quick_on_testbed("benchmarks.partition_net", 600)}
    assert set(rows) == {"node", "head", "learner"}
    for row in rows.values():
        # the benchmark's must-be-zero counts (its docstring says what each counts)
        assert {k: row[k] for k in MUST_BE_ZERO} == dict.fromkeys(MUST_BE_ZERO, 0), row
        assert row["listed"] >= row["acked"] > 0 and row["failed_calls"] > 0, row  # the cut-off calls failed
        assert row["fail_s"] <= 2 * row["deadline_s"] + 2, row  # a deadline, never a hang
    assert rows["node"]["reads_ok"] > 0 and rows["head"]["reads_ok"] > 0
    assert rows["node"]["caught_up_s"] is not None and rows["head"]["caught_up_s"] is not None
