"""The catalog on its own: CatalogServer is a plain class, so most of this drives it directly (no Ray).

Crash safety is tested for real: a catalog in a subprocess is SIGKILLed mid-writes, its database is torn and
overwritten with garbage, its disk fills up (sqlite's page limit, and a file-size limit in a subprocess).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from policystore import catalog as catalog_module
from policystore import catalogdb
from policystore.catalog import CONCURRENCY_GROUPS, VERSION_BLOCK, CatalogServer
from policystore.config import StoreConfig
from policystore.errors import (
    CatalogDatabaseError,
    DiskFullError,
    InvalidMetaError,
    InvalidOptionError,
    InvalidPolicyIdError,
    InvalidWeightsError,
    PolicyStoreError,
    UnknownPolicyError,
    UnknownVersionError,
)
from policystore.format import MAX_META_BYTES
from policystore.ids import SnapshotId
from policystore.wire import DURABLE, Holdings, Summary

ROOT = Path(__file__).resolve().parents[2]


def summary(checksum: str = "crc32c:00000001", meta: dict | None = None, durable: bool = False) -> Summary:
    return Summary(nbytes=100, checksum=checksum, meta=meta or {}, created=1.0, durable=durable)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "catalog" / "catalog.sqlite3"


@pytest.fixture
def open_catalog(db_path: Path):
    opened: list[CatalogServer] = []

    def make(path: Path = db_path, **kwargs) -> CatalogServer:
        catalog = CatalogServer(str(path), StoreConfig(), **kwargs)
        opened.append(catalog)
        return catalog

    yield make
    for catalog in opened:
        try:
            catalog.close()
        except sqlite3.ProgrammingError:
            pass


# ---- versions, latest, errors --------------------------------------------------------------------------------
def test_versions_count_from_one_and_are_never_reused_after_delete(open_catalog):
    catalog = open_catalog()
    assert [catalog.publish("p", "n1", summary()).version for _ in range(3)] == [1, 2, 3]
    assert [e.version for e in catalog.delete("p", 3)] == [3]
    assert catalog.lookup("p").version == 2
    assert {e.version for e in catalog.delete("p")} == {1, 2}
    with pytest.raises(UnknownPolicyError):
        catalog.lookup("p")
    assert catalog.list() == []
    assert catalog.reserve("p", "n1") == 4  # after deleting every version, the counter still moves on
    catalog.close()
    assert open_catalog().publish("p", "n1", summary()).version == 5  # and after a restart


def test_latest_is_the_highest_committed_version_whatever_order_commits_arrive_in(open_catalog):
    catalog = open_catalog()
    big = catalog.reserve("p", "n1")  # a big publish reserves first and commits last
    small = catalog.publish("p", "n2", summary("crc32c:2"))
    assert (big, small.version) == (1, 2)
    assert catalog.lookup("p").version == 2
    catalog.commit("p", big, "n1", summary("crc32c:1"))
    assert catalog.lookup("p").version == 2  # not "last committed"
    assert [e.version for e in catalog.list("p")] == [1, 2]
    catalog.delete("p", 2)
    assert catalog.lookup("p").version == 1


def test_latest_never_goes_back_under_overlapping_publishes_from_many_threads(open_catalog):
    """Durable publishes whose commits land after later versions' (a bigger snapshot takes longer to write): every
    reservation of the first round is committed in the second, after a higher version, whatever the threads'
    interleaving; a reader meanwhile never sees latest go back."""
    catalog = open_catalog()
    stop = threading.Event()
    seen: list[int] = []
    reserved: list[list[int]] = [[] for _ in range(4)]
    published = [0] * 4

    def first_round(i: int) -> None:  # publishes and reservations, interleaved across threads
        rng = random.Random(i)
        for _ in range(20):
            if rng.random() < 0.5:
                catalog.publish("p", f"n{i}", summary())
                published[i] += 1
            else:
                reserved[i].append(catalog.reserve("p", f"n{i}"))

    def second_round(i: int) -> None:  # those reservations committed out of order, among new publishes
        rng = random.Random(100 + i)
        rng.shuffle(reserved[i])
        for version in reserved[i]:
            if rng.random() < 0.5:
                catalog.publish("p", f"n{i}", summary())
                published[i] += 1
            catalog.commit("p", version, f"n{i}", summary())

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.append(catalog.lookup("p").version)
            except UnknownPolicyError:
                pass

    watcher = threading.Thread(target=reader)
    watcher.start()
    for round_ in (first_round, second_round):
        threads = [threading.Thread(target=round_, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if round_ is first_round:
            top = catalog.publish("p", "n0", summary()).version  # above every reservation: each commit lands late
            assert top > max(v for r in reserved for v in r)
    stop.set()
    watcher.join()
    assert seen and all(a <= b for a, b in zip(seen, seen[1:], strict=False))
    total = 1 + sum(published) + sum(map(len, reserved))
    assert [e.version for e in catalog.list("p")] == list(range(1, total + 1))
    assert catalog.lookup("p").version == total


def test_commit_needs_a_reservation_and_a_retried_commit_is_harmless(open_catalog):
    catalog = open_catalog()
    with pytest.raises(UnknownVersionError, match="not reserved"):
        catalog.commit("p", 1, "n1", summary())
    version = catalog.reserve("p", "n1")
    catalog.withdraw("p", version, "n2")  # not this node's publish: nothing happens
    catalog.withdraw("p", version, "n1")
    with pytest.raises(UnknownVersionError, match="aborted"):
        catalog.commit("p", version, "n1", summary())
    version = catalog.reserve("p", "n1")
    first = catalog.commit("p", version, "n1", summary("crc32c:aa"))
    assert catalog.commit("p", version, "n1", summary("crc32c:aa")) == first
    with pytest.raises(UnknownVersionError, match="committed"):
        catalog.commit("p", version, "n1", summary("crc32c:bb"))
    assert catalog.lookup("p", version).summary.checksum == "crc32c:aa"


def test_lookup_errors_name_the_problem(open_catalog):
    catalog = open_catalog()
    with pytest.raises(UnknownPolicyError, match="store is empty"):
        catalog.lookup("nope")
    catalog.publish("p", "n1", summary())
    with pytest.raises(UnknownPolicyError, match=r"known policies: \['p'\]"):
        catalog.lookup("nope")
    with pytest.raises(UnknownVersionError, match="no version 7; it has 1 versions"):
        catalog.lookup("p", 7)
    with pytest.raises(InvalidPolicyIdError):
        catalog.lookup("../etc")
    with pytest.raises(InvalidPolicyIdError):
        catalog.list(3)
    with pytest.raises(InvalidPolicyIdError):
        catalog.lookup("p", True)


@pytest.mark.parametrize(
    "meta, match",
    [
        ({"blob": "x" * MAX_META_BYTES}, "65536-byte limit"),
        (json.loads('{"a":' * 17 + "1" + "}" * 17), "deeper than 16"),
        ({1: "one"}, "keys must be str"),
        ({"x": float("nan")}, "strict JSON"),
        ({"x": object()}, "must be JSON types"),
        (["not", "a", "dict"], "must be a dict"),
    ],
)
def test_bad_meta_is_refused_before_anything_is_stored(open_catalog, meta, match):
    catalog = open_catalog()
    with pytest.raises(InvalidMetaError, match=match):
        catalog.publish("p", "n1", summary(meta=meta))
    version = catalog.reserve("p", "n1")
    with pytest.raises(InvalidMetaError):
        catalog.commit("p", version, "n1", summary(meta=meta))
    assert catalog.list() == []
    assert catalog.publish("p", "n1", summary(meta={"ok": [1, {"deep": 2}]})).summary.meta == {"ok": [1, {"deep": 2}]}
    assert catalog.lookup("p").version == version + 1  # the refused publish took no version


def test_holders_follow_hold_drop_and_delete(open_catalog):
    catalog = open_catalog()
    catalog.publish("p", "n1", summary())
    catalog.update_holders(gained=[(("p", 1), "n2"), (("p", 1), DURABLE), (("p", 1), "n2")])
    assert catalog.lookup("p").holders == ("n1", "n2", DURABLE)
    catalog.update_holders(dropped=[(("p", 1), "n1")])
    assert catalog.lookup("p").holders == ("n2", DURABLE)
    removed = catalog.delete("p", 1)
    assert removed[0].holders == ("n2", DURABLE)  # the caller cleans these copies up
    catalog.update_holders(gained=[(("p", 1), "n3")])  # a late hold of a deleted snapshot changes nothing
    catalog.publish("p", "n1", summary())
    assert catalog.lookup("p").holders == ("n1",)


def test_batched_holder_changes_land_in_one_call_and_bad_ones_write_nothing(open_catalog):
    catalog = open_catalog()
    for pid in ("p", "q"):
        catalog.publish(pid, "n1", summary())
    catalog.update_holders(gained=[(SnapshotId("p", 1), "n2"), (("q", 1), "n2"), (("q", 1), DURABLE)],
                           dropped=[(("p", 1), "n1")])
    assert catalog.lookup("p").holders == ("n2",)
    assert catalog.lookup("q").holders == ("n1", "n2", DURABLE)
    for bad in ([(("q", 0), "n3")], [(("q", 1), "")], [("q", 1, "n3")], [None]):
        with pytest.raises(PolicyStoreError):
            catalog.update_holders(gained=[(("p", 1), "n3"), *bad])
    assert catalog.lookup("p").holders == ("n2",)  # checked before anything is written
    catalog.update_holders(gained=[(("p", 9), "n3")])  # a holder of a version that does not exist: nothing
    assert [e.holders for e in catalog.list()] == [("n2",), ("n1", "n2", DURABLE)]
    calls = catalog.health().calls
    assert calls["update_holders"] == 6 and calls["publish"] == 2 and "hold" not in calls


def test_list_pages_every_entry_exactly_once_in_order(open_catalog):
    catalog = open_catalog()
    rng = random.Random(7)
    for i in range(60):  # interleaved policies, some versions deleted, holders on some
        pid = rng.choice(["a", "b.x", "B", "c-1"])
        sid = catalog.publish(pid, f"n{i % 3}", summary()).id
        if i % 5 == 0:
            catalog.update_holders(gained=[(sid, "n9")])
        if i % 7 == 0:
            catalog.delete(*sid)
    everything = catalog.list()
    assert [e.id for e in everything] == sorted(e.id for e in everything)
    for policy_id in (None, "b.x"):
        expected = catalog.list(policy_id)
        for limit in (1, 3, 7, 1000):
            pages, after = [], None
            while page := catalog.list(policy_id, limit=limit, after=after):
                assert len(page) <= limit
                pages.extend(page)
                after = page[-1].id
            assert pages == expected  # every entry once, in order, with its holders
        assert catalog.list(policy_id, after=("b.x", 3)) == [e for e in expected if e.id > ("b.x", 3)]
    assert catalog.list(after=everything[-1].id) == []
    calls = catalog.health().calls["list"]
    with pytest.raises(UnknownPolicyError):
        catalog.list("nobody", limit=2)
    for limit, after in ((0, None), (-1, None), (True, None), ("2", None), (2.0, None), (None, "a@v1"),
                         (None, ("a",)), (None, ("a", 0)), (None, ("../x", 1)), (None, 5)):
        with pytest.raises(InvalidOptionError):
            catalog.list(limit=limit, after=after)
    assert catalog.health().calls["list"] == calls + 11  # a call of list that calls lookup counts once


# ---- reconcile and adopt -------------------------------------------------------------------------------------
def test_reconcile_discards_what_was_never_committed_and_quarantines_conflicts(open_catalog):
    catalog = open_catalog()
    good = catalog.publish("p", "n1", summary("crc32c:01")).id
    swapped = catalog.publish("p", "n1", summary("crc32c:02")).id
    deleted = catalog.publish("p", "n1", summary("crc32c:03")).id
    catalog.delete(*deleted)
    killed = SnapshotId("p", catalog.reserve("p", "n1"))  # this node died mid-publish
    elsewhere = SnapshotId("p", catalog.reserve("p", "n2"))  # another node is publishing this version now
    old_session = SnapshotId("q", 9)
    gone = catalog.publish("p", "n1", summary("crc32c:06")).id  # n1 no longer has it
    answer = catalog.reconcile("n1", [
        (good, summary("crc32c:01")),
        (swapped, summary("crc32c:01")),  # another version's bytes under this name
        (deleted, summary("crc32c:03")),
        (killed, summary("crc32c:04")),
        (elsewhere, summary("crc32c:05")),
        (old_session, Summary(42, "crc32c:09", {"step": 9}, 5.0, False)),
        (SnapshotId("r", 1), summary(meta={"x": "y" * MAX_META_BYTES})),
        (SnapshotId("r", 2), "crc32c:07"),  # a bare checksum is no report: only summaries are taken
    ])
    assert set(answer.discard) == {deleted, killed}
    assert {sid for sid, _ in answer.quarantine} == {swapped, elsewhere, SnapshotId("r", 1), SnapshotId("r", 2)}
    reasons = dict(answer.quarantine)
    assert "takes a wire.Summary, got str" in reasons[SnapshotId("r", 2)]
    assert "differs from the catalog's crc32c:02" in reasons[swapped]
    assert "being published by node n2" in reasons[elsewhere]
    assert catalog.lookup("p", swapped.version).holders == ()  # its copy is not counted as a copy
    assert catalog.lookup("p", gone.version).holders == ()
    adopted = catalog.lookup("q")
    assert (adopted.version, adopted.summary.nbytes, adopted.summary.meta, adopted.holders) == (9, 42, {"step": 9},
                                                                                              ("n1",))
    assert catalog.reserve("q", "n1") == 10
    catalog.commit("p", elsewhere.version, "n2", summary("crc32c:05"))  # the other node's publish still lands
    with pytest.raises(UnknownVersionError):
        catalog.commit("p", killed.version, "n1", summary())


def test_adopt_takes_the_durable_tiers_league_into_a_new_catalog(open_catalog, tmp_path):
    listed = [(SnapshotId("main", v), summary(f"crc32c:{v:08x}", durable=True)) for v in (1, 2, 5)]
    fresh = open_catalog(tmp_path / "fresh.sqlite3")
    assert fresh.health().new
    answer = fresh.adopt(listed)
    assert answer.added == tuple(sid for sid, _ in listed) and not answer.skipped
    assert fresh.lookup("main").version == 5
    assert fresh.lookup("main", 2).holders == (DURABLE,)
    assert fresh.publish("main", "n1", summary()).version == 6
    # An existing catalog trusts its own record over the durable tier's list.
    catalog = open_catalog()
    catalog.publish("main", "n1", summary("crc32c:00000001"))
    catalog.publish("main", "n1", summary("crc32c:ffffffff"))
    catalog.delete("main", 1)
    catalog.reserve("main", "n1")  # v3, reserved: not adopted either
    answer = catalog.adopt([*listed, (SnapshotId("main", 3), summary("crc32c:3"))])
    assert answer.added == (SnapshotId("main", 5),) and answer.held == ()
    assert len(answer.skipped) == 3
    assert any("v1: deleted" in s for s in answer.skipped) and any("v2: durable checksum" in s for s in answer.skipped)
    catalog.adopt([(SnapshotId("main", 5), summary("crc32c:00000005", durable=True))])
    assert catalog.lookup("main", 5).holders == (DURABLE,)
    # A catalog given a seed adopts from it when (and only when) its database is new; a failing seed is reported.
    seeded = open_catalog(tmp_path / "seeded.sqlite3", seed=lambda: (listed, [], []))
    assert seeded.health().adopted == 3 and seeded.lookup("main").version == 5
    seeded.close()
    assert open_catalog(tmp_path / "seeded.sqlite3", seed=lambda: 1 / 0).health().adopted == 0  # not new: unused

    def unreachable():
        raise OSError("durable tier unreachable")

    failed = open_catalog(tmp_path / "failed.sqlite3", seed=unreachable)
    assert failed.health().adopted == 0 and "durable tier unreachable" in failed.health().problems[0]
    # Only summaries are taken (a mapping of their fields is not one); a bad entry is skipped, said why.
    fields = {"nbytes": 7, "checksum": "crc32c:77", "meta": {"step": 7}, "created": 3.0, "durable": True}
    answer = catalog.adopt([(SnapshotId("side", 1), Summary(**fields)), (SnapshotId("side", 2), fields),
                            (SnapshotId("side", 3), Summary(**{**fields, "nbytes": "big"}))])
    assert answer.added == (SnapshotId("side", 1),) and catalog.lookup("side").summary.meta == {"step": 7}
    assert [s.split(":")[0] for s in answer.skipped] == ["side@v2", "side@v3"]
    assert "takes a wire.Summary, got dict" in answer.skipped[0]


def test_a_new_database_rebuilds_from_the_stores_and_the_durable_tier_never_reusing_a_version(open_catalog, tmp_path):
    durable = [(SnapshotId("p", 1), summary("crc32c:01", durable=True)),
               (SnapshotId("p", 2**63 - 1), summary("crc32c:ff", durable=True)),  # a crafted marker: skipped
               (SnapshotId("p", 3), {"nbytes": "big", "checksum": 3})]  # wrong types: skipped
    stores = [
        Holdings("n1", ((SnapshotId("p", 1), summary("crc32c:01")), (SnapshotId("p", 2), summary("crc32c:02")),
                        (SnapshotId("q", 4), summary("crc32c:04", meta={"step": 4}))),
                 {"p": 7, "q": 4}),  # p@3..7 were handed out and deleted (or are being published) meanwhile
        Holdings("n2", ((SnapshotId("p", 1), summary("crc32c:99")),), {"p": 1, "r": 2**63 - 1}),  # conflicts
    ]

    def holdings():
        return stores, ["the store on node n3 did not report within 30 s"]

    tombstoned = [SnapshotId("gone", 7)]  # deleted: its number stays used
    catalog = open_catalog(tmp_path / "new.sqlite3", holdings=holdings,
                           seed=lambda: (durable, ["ignoring unreadable marker x"], tombstoned))
    health = catalog.health()
    assert health.new and health.adopted == 3 and health.skipped == 5
    problems = "\n".join(health.problems)
    for expected in ("ignoring unreadable marker x", f"p@v{2**63 - 1}", "p@v3", "node n2: p@v1 not taken",
                     "node n2: high-water mark not taken", "node n3 did not report"):
        assert expected in problems
    assert {tuple(e.id): e.holders for e in catalog.list()} == {("p", 1): (DURABLE, "n1"), ("p", 2): ("n1",),
                                                                 ("q", 4): ("n1",)}
    assert catalog.lookup("q").summary.meta == {"step": 4}
    assert catalog.publish("p", "n1", summary()).version == 8  # above everything a store has seen
    assert catalog.reserve("q", "n1") == 5
    assert catalog.publish("gone", "n1", summary()).version == 8  # past the tombstone, never 7 again
    # Whatever the sources do, the catalog starts (and says why it has nothing).
    broken = open_catalog(tmp_path / "broken.sqlite3", seed=lambda: 1 / 0, holdings=lambda: [Holdings("n1", 5, 6)])
    assert broken.health().snapshots == 0 and len(broken.health().problems) == 2
    assert broken.publish("p", "n1", summary()).version == 1


def test_a_repeated_publish_gets_its_own_version_and_withdraw_takes_a_commit_back(open_catalog):
    catalog = open_catalog()
    first = catalog.publish("p", "n1", summary("crc32c:01"), "token-1")
    assert catalog.publish("p", "n1", summary("crc32c:01"), "token-1") == first  # the reply was lost: asked again
    second = catalog.publish("p", "n1", summary("crc32c:02"), "token-2")
    assert second.version == 2 and len(catalog.list()) == 2
    with pytest.raises(InvalidWeightsError):
        catalog.publish("p", "n1", summary(), "t" * 65)
    catalog.withdraw("p", 2, "n1")  # its durable marker could not be written: the publish failed
    assert catalog.lookup("p").version == 1 and [e.version for e in catalog.list()] == [1]
    assert catalog.watch(0, 0).latest == {"p": 1}
    with pytest.raises(UnknownVersionError, match="deleted"):
        catalog.publish("p", "n1", summary("crc32c:02"), "token-2")
    assert catalog.publish("p", "n1", summary()).version == 3


def test_a_restarted_store_aborts_the_reservations_its_killed_predecessor_left(open_catalog):
    catalog = open_catalog()
    left = [SnapshotId("p", catalog.reserve("p", "n1")) for _ in range(2)]  # killed mid-publish, files or not
    other = SnapshotId("p", catalog.reserve("p", "n2"))
    assert catalog.reconcile("n1", [], restarted=False).discard == ()  # a running store re-registering
    assert catalog.health().reserved == 3
    assert set(catalog.reconcile("n1", []).discard) == set(left)
    assert catalog.health().reserved == 1
    catalog.commit("p", other.version, "n2", summary())


# ---- watch ---------------------------------------------------------------------------------------------------
def test_watch_returns_events_after_since_and_resets_when_asked_from_zero(open_catalog):
    catalog = open_catalog()
    first = catalog.watch(0, 0)  # nothing to know yet: a plain (empty) answer, so a watcher never spins on resets
    assert (first.reset, first.latest, first.seq) == (False, {}, 0)
    catalog.publish("a", "n1", summary())
    catalog.publish("b", "n1", summary())
    catalog.publish("a", "n1", summary())
    catalog.delete("b", 1)
    assert catalog.watch(0, 0).reset  # a watcher that knows nothing gets the latest versions
    events = catalog.watch(first.seq, 0, epoch=first.epoch)  # one that saw it empty gets the events
    assert not events.reset and events.seq == 4
    assert [e.id for e in events.committed] == [("a", 1), ("a", 2)]  # b@v1 was deleted since: only its delete
    assert events.deleted == (("b", 1),)
    assert events.latest == {"a": 2}
    assert catalog.watch(events.seq, 0).committed == ()
    again = catalog.watch(2, 0)
    assert [e.id for e in again.committed] == [("a", 2)] and again.deleted == (("b", 1),)
    assert catalog.watch(0, 0).latest == {"a": 2}


def test_a_burst_of_events_comes_in_batches_and_bad_arguments_are_refused(open_catalog, monkeypatch):
    monkeypatch.setattr("policystore.catalog.MAX_EVENTS", 4)
    catalog = open_catalog()
    epoch = catalog.watch(0, 0).epoch
    for _ in range(10):
        catalog.publish("a", "n1", summary())
    seen, since = [], 0
    while since < 10:
        answer = catalog.watch(since, 0, epoch)
        assert not answer.reset and len(answer.committed) <= 4 and answer.latest == {"a": 10}
        seen += [e.version for e in answer.committed]
        since = answer.seq
    assert seen == list(range(1, 11))
    for since, timeout in ((-1, 0), (True, 0), ("3", 0), (0, -1.0), (0, float("nan")), (0, "1")):
        with pytest.raises(PolicyStoreError):
            catalog.watch(since, timeout)


def test_watch_long_poll_wakes_on_a_commit(open_catalog):
    catalog = open_catalog()
    catalog.publish("a", "n1", summary())
    since = catalog.watch(0, 0).seq
    threading.Timer(0.2, lambda: catalog.publish("a", "n2", summary())).start()
    events = catalog.watch(since, 60.0)  # returns with the event, not after 60 s empty
    assert [e.id for e in events.committed] == [("a", 2)] and events.latest == {"a": 2}
    quiet = catalog.watch(events.seq, 0.05)  # nothing happens: an empty answer at the timeout
    assert (quiet.seq, quiet.reset, quiet.committed) == (events.seq, False, ())


def test_watch_resets_a_watcher_behind_the_kept_log_or_from_another_database(open_catalog, db_path, tmp_path,
                                                                               monkeypatch):
    monkeypatch.setattr(catalog_module, "EVENT_LOG_KEEP", 5)
    catalog = open_catalog()
    for _ in range(30):
        catalog.publish("a", "n1", summary())
    head = catalog.watch(0, 0)
    assert head.reset and head.latest == {"a": 30} and head.seq == 30
    assert catalog.watch(1, 0).reset  # those events were pruned
    recent = catalog.watch(head.seq - 3, 0)
    assert not recent.reset and [e.version for e in recent.committed] == [28, 29, 30]
    assert catalog.watch(head.seq + 5, 0).reset  # a seq this database never reached
    assert catalog.watch(head.seq, 0, epoch="another").reset
    catalog.close()
    reopened = open_catalog()  # same database: same epoch, the log continues
    assert reopened.health().epoch == head.epoch and not reopened.health().new
    reopened.publish("a", "n1", summary())
    assert [e.version for e in reopened.watch(head.seq, 0, epoch=head.epoch).committed] == [31]
    other = open_catalog(tmp_path / "other.sqlite3")
    assert other.health().epoch != head.epoch


def test_watch_is_served_beside_other_calls_in_a_ray_actor(tmp_path):
    """The actor as client.py creates it: a long poll in its own concurrency group blocks no other call."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="warning")
    try:
        actor = ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(CatalogServer).options(
            num_cpus=0, max_concurrency=2
        ).remote(str(tmp_path / "db.sqlite3"), StoreConfig())
        first = ray.get(actor.watch.remote(0, 0))
        # more long polls than the default group has threads: they must not hold up the calls below
        polls = [actor.watch.remote(first.seq, 60.0, first.epoch) for _ in range(4)]
        ready, _ = ray.wait(polls, timeout=0.5)
        assert ready == []
        entry = ray.get(actor.publish.remote("a", "n1", summary()), timeout=30)
        assert ray.get(actor.lookup.remote("a"), timeout=30) == entry
        answers = ray.get(polls, timeout=30)
        assert all([e.id for e in a.committed] == [("a", 1)] for a in answers)
    finally:
        ray.shutdown()


# ---- crash safety --------------------------------------------------------------------------------------------
WRITER = textwrap.dedent("""
    import random, sys
    from policystore.catalog import CatalogServer
    from policystore.config import StoreConfig
    from policystore.wire import Summary
    catalog = CatalogServer(sys.argv[1], StoreConfig())
    rng = random.Random(int(sys.argv[2]))
    while True:  # not a wait: writes until the test SIGKILLs this process
        pid = rng.choice("abc")
        s = Summary(1, f"crc32c:{rng.getrandbits(32):08x}", {"pad": "x" * rng.randrange(2000)}, 1.0, rng.random() < .3)
        if rng.random() < 0.5:
            e = catalog.publish(pid, "n1", s)
        else:
            v = catalog.reserve(pid, "n1")
            print("reserved", pid, v, flush=True)
            e = catalog.commit(pid, v, "n1", s)
        print("committed", pid, e.version, e.summary.checksum, flush=True)
        if rng.random() < 0.2:
            print("deleting", pid, e.version, flush=True)
            for d in catalog.delete(pid, e.version):
                print("deleted", pid, d.version, flush=True)
""")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


@pytest.mark.parametrize("seed", [1, 2])
def test_a_catalog_killed_mid_writes_keeps_every_acknowledged_change(db_path, open_catalog, seed):
    db_path.parent.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db_path), str(seed)], stdout=subprocess.PIPE,
                            text=True, env=_env())
    acked = []
    for line in proc.stdout:
        acked.append(line.split())
        if len(acked) >= 150 + 60 * seed:
            break
    proc.send_signal(signal.SIGKILL)
    acked += [line.split() for line in proc.stdout if line.endswith("\n")]  # written before the kill
    proc.wait()
    committed, deleted, reserved, deleting = {}, set(), set(), set()
    for kind, pid, version, *rest in acked:
        if kind == "committed":
            committed[(pid, int(version))] = rest[0]
        elif kind == "deleted":
            deleted.add((pid, int(version)))
        elif kind == "deleting":
            deleting.add((pid, int(version)))
        else:
            reserved.add((pid, int(version)))
    in_flight = deleting - deleted  # a delete the kill interrupted: done or not, but whole
    assert len(in_flight) <= 1
    catalog = open_catalog()
    assert catalog.health().problems == ()
    entries = {tuple(e.id): e.summary.checksum for e in catalog.list()}
    for sid, checksum in committed.items():
        if sid not in deleted and not (sid in in_flight and sid not in entries):
            assert entries[sid] == checksum
    assert not deleted & set(entries)
    assert len(set(entries) - set(committed)) <= 1  # at most the publish in flight at the kill, whole
    for pid in "abc":
        live = [v for p, v in entries if p == pid]
        if live:
            assert catalog.lookup(pid).version == max(live)
        handed_out = [v for p, v in [*committed, *reserved] if p == pid]
        assert catalog.reserve(pid, "n1") > max(handed_out, default=0)  # no version is handed out twice


def _fill(catalog: CatalogServer, policies: int = 3, versions: int = 40) -> dict[tuple[str, int], str]:
    for i in range(policies):
        for _ in range(versions):
            catalog.publish(f"p{i}", "n1", summary(f"crc32c:{random.getrandbits(32):08x}", meta={"pad": "m" * 300}))
    return {tuple(e.id): e.summary.checksum for e in catalog.list()}


def _checkpoint_and_close(catalog: CatalogServer) -> None:
    catalog._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything into the main file, for the damage below
    catalog.close()


def test_a_garbage_database_is_moved_aside_reported_and_a_new_epoch_starts(open_catalog, db_path):
    old = open_catalog()
    _fill(old, 1, 3)
    epoch = old.health().epoch
    _checkpoint_and_close(old)
    db_path.write_bytes(os.urandom(50_000))
    catalog = open_catalog()
    health = catalog.health()
    assert health.new and health.epoch != epoch and health.snapshots == 0
    assert any("damaged" in p and "moved to" in p for p in health.problems)
    assert any(p.startswith("nothing salvaged") or "salvaged 0 committed" in p for p in health.problems)
    aside = [f for f in db_path.parent.iterdir() if ".damaged-" in f.name]
    assert aside and aside[0].read_bytes()[:10] != b"SQLite for"  # kept as it was, never deleted
    assert catalog.watch(3, 0).reset  # a watcher of the old database starts over
    assert catalog.publish("p0", "n1", summary()).version == 1


@pytest.mark.parametrize("seed", [0, 1])
def test_a_torn_or_damaged_database_is_salvaged_and_reported(open_catalog, db_path, seed):
    old = open_catalog()
    entries = _fill(old)
    old.delete("p0", 5)
    _checkpoint_and_close(old)
    data = bytearray(db_path.read_bytes())
    page, rng = 4096, random.Random(seed)
    middle = len(data) // page // 2 * page
    data[middle:middle + 3 * page] = rng.randbytes(3 * page)  # a few pages in the middle overwritten
    db_path.write_bytes(bytes(data[: len(data) - page]))  # and the last page torn off
    catalog = open_catalog()
    health = catalog.health()
    assert health.new and any("damaged" in p for p in health.problems)
    assert any(p.startswith("salvaged") for p in health.problems)
    salvaged = {tuple(e.id): e.summary.checksum for e in catalog.list()}
    assert all(entries[sid] == checksum for sid, checksum in salvaged.items())  # what came back is right
    for pid in ("p0", "p1", "p2"):  # versions continue past anything the old database handed out
        assert catalog.publish(pid, "n1", summary()).version > 40


def test_a_garbage_wal_or_a_foreign_database_does_not_stop_startup(open_catalog, db_path, tmp_path):
    old = open_catalog()
    entries = _fill(old, 1, 5)
    old.close()
    Path(f"{db_path}-wal").write_bytes(os.urandom(9000))  # sqlite ignores frames that fail their checksums
    catalog = open_catalog()
    assert catalog.health().problems == ()
    assert {tuple(e.id): e.summary.checksum for e in catalog.list()} == entries
    foreign = tmp_path / "foreign.sqlite3"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
    catalog = open_catalog(foreign)
    assert any("not a policystore catalog" in p for p in catalog.health().problems)


def test_a_database_from_a_newer_policystore_is_refused_loudly(open_catalog, db_path):
    old = open_catalog()
    old._db.execute("UPDATE info SET value = '99' WHERE key = 'schema'")
    old.close()
    with pytest.raises(CatalogDatabaseError, match="newer policystore"):
        open_catalog()


def test_a_full_disk_rolls_the_change_back_and_leaves_no_phantom_entry(open_catalog):
    catalog = open_catalog()
    catalog.publish("p", "n1", summary())
    pages = catalog._db.execute("PRAGMA page_count").fetchone()[0]
    catalog._db.execute(f"PRAGMA max_page_count = {pages + 8}")
    acked = [1]
    with pytest.raises(DiskFullError, match="disk is full"):
        for i in range(100):
            acked.append(catalog.publish("p", "n1", summary(f"crc32c:{i}", meta={"pad": "x" * 30_000})).version)
    assert [e.version for e in catalog.list()] == acked  # the failed publish left nothing behind
    assert catalog.lookup("p").version == acked[-1]
    catalog._db.execute("PRAGMA max_page_count = 1073741823")  # space again: the catalog carries on
    assert catalog.publish("p", "n1", summary()).version == acked[-1] + 1
    assert catalog.health().problems == ()


FSIZE_WRITER = textwrap.dedent("""
    import resource, signal, sys
    from policystore.catalog import CatalogServer
    from policystore.config import StoreConfig
    from policystore.errors import PolicyStoreError
    from policystore.wire import Summary
    catalog = CatalogServer(sys.argv[1], StoreConfig())
    catalog.publish("p", "n1", Summary(1, "crc32c:0", {}, 1.0, True))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))
    try:
        for i in range(1, 1000):
            s = Summary(1, f"crc32c:{i}", {"pad": "x" * 20_000}, 1.0, i % 2 == 0)
            print("committed", catalog.publish("p", "n1", s).version, flush=True)
    except PolicyStoreError as exc:
        print("error", type(exc).__name__, str(exc).replace(" ", "_")[:200], flush=True)
""")


def test_a_file_size_limit_mid_writes_fails_clearly_and_loses_nothing_acknowledged(db_path, open_catalog):
    db_path.parent.mkdir(parents=True)
    out = subprocess.run([sys.executable, "-c", FSIZE_WRITER, str(db_path)], capture_output=True, text=True,
                         env=_env(), timeout=300)
    lines = [line.split() for line in out.stdout.splitlines()]
    assert lines and lines[-1][0] == "error", out.stderr[-2000:]
    assert lines[-1][1] in ("DiskFullError", "CatalogDatabaseError")
    acked = [1] + [int(line[1]) for line in lines if line[0] == "committed"]
    catalog = open_catalog()
    assert catalog.health().problems == ()
    assert [e.version for e in catalog.list("p")] == acked


# ---- power loss -------------------------------------------------------------------------------------------
def test_after_a_reboot_versions_skip_past_anything_an_unsynced_publish_handed_out(open_catalog, db_path, monkeypatch):
    catalog = open_catalog()
    for _ in range(3):
        catalog.publish("p", "n1", summary())  # the first syncs the block 1..64; the next two need no sync
    epoch = catalog.health().epoch
    catalog.close()
    with sqlite3.connect(db_path) as raw:  # what a power cut may do: the unsynced tail (v2, v3) is gone
        raw.execute("DELETE FROM snapshots WHERE version > 1")
        raw.execute("UPDATE policies SET next = 2, latest = 1")
    monkeypatch.setattr(catalogdb, "boot_id", lambda: "another-boot")
    catalog = open_catalog()
    assert catalog.publish("p", "n1", summary()).version == VERSION_BLOCK + 1  # never 2 or 3 again
    assert catalog.health().epoch != epoch  # watchers that saw v2/v3 events start over


def test_every_catalog_error_is_a_policystore_error():
    for error in (DiskFullError, CatalogDatabaseError, InvalidMetaError):
        assert issubclass(error, PolicyStoreError)
