"""The durable tier on real storage: local folders (plain paths and file://) and a real S3-compatible server
(moto, in server mode, on loopback), including the server going away in the middle of an upload."""

import functools
import json
import os
import pickle
import signal
import socket
import threading

import numpy as np
import pyarrow.fs as pafs
import pytest
import ray
import torch
from helpers import RESTARTING, eventually

import policystore
from benchmarks.s3gate import S3Gate, close_all, connect
from policystore import cli
from policystore.catalog import CatalogServer
from policystore.config import StoreConfig
from policystore.durable import MARKER_SUFFIX, DurableTier, survey
from policystore.errors import (
    CorruptSnapshotError,
    DurableTierError,
    InvalidWeightsError,
    PolicyStoreError,
    SnapshotLostError,
    UnknownVersionError,
)
from policystore.format import Expected, pack, parse_header
from policystore.ids import SnapshotId
from policystore.remote import CATALOG_NAME, NAMESPACE, store_name
from policystore.wire import Summary


def _snapshot(policy_id: str, n: int = 1000, seed: int = 0, meta=None) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    return pack({"w": torch.randn(n, generator=g), "b": torch.arange(7, dtype=torch.int64)}, policy_id=policy_id,
                meta=meta or {"step": seed})


def _write(tier: DurableTier, sid: SnapshotId, buf: np.ndarray) -> None:
    tier.write(sid, buf, parse_header(buf, name=str(sid)))


@pytest.fixture(params=["plain", "file"])
def local_uri(request, tmp_path):
    root = tmp_path / "durable"
    return str(root) if request.param == "plain" else f"file://{root}"


def test_round_trip_and_rebuild_from_the_uri(local_uri):
    tier = DurableTier.open(local_uri)
    bufs = {SnapshotId("main_0", v): _snapshot("main_0", seed=v) for v in (1, 2)}
    bufs[SnapshotId("exploiter", 5)] = _snapshot("exploiter", seed=5, meta={"frozen": True})
    for sid, buf in bufs.items():
        _write(tier, sid, buf)
    fresh = DurableTier.open(local_uri)  # what a new cluster pointed at the same URI sees
    listed = fresh.list_committed()
    assert pickle.loads(pickle.dumps(functools.partial(survey, local_uri)))() == (listed, [], [])  # a catalog's seed
    assert [sid for sid, _ in listed] == sorted(bufs)
    for sid, summary in listed:
        header = parse_header(bufs[sid], name=str(sid))
        assert summary == Summary(header.nbytes, header.checksum, header.user_meta, summary.created, durable=True)
        assert sid in dict(fresh.list_committed())
        got = fresh.read(sid, Expected(*sid, header.checksum))
        assert np.array_equal(got, bufs[sid])
    assert dict(listed)[SnapshotId("exploiter", 5)].meta == {"frozen": True}


def test_rewrite_is_idempotent_and_a_conflict_is_refused(tmp_path):
    tier = DurableTier.open(str(tmp_path))
    sid = SnapshotId("p", 1)
    buf = _snapshot("p")
    _write(tier, sid, buf)
    _write(tier, sid, buf)  # another node spilling the same fetched snapshot
    with pytest.raises(DurableTierError, match="already committed"):
        _write(tier, sid, _snapshot("p", seed=9))
    assert np.array_equal(tier.read(sid), buf)
    assert len(list((tmp_path / "p").glob("*.safetensors"))) == 1


def test_half_written_or_uncommitted_objects_are_never_snapshots(tmp_path):
    tier = DurableTier.open(str(tmp_path))
    buf = _snapshot("p")
    # A data object whose upload died (no marker), and an unfinished marker temp file.
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "0000000001.deadbeef.safetensors").write_bytes(buf[: len(buf) // 2].tobytes())
    (tmp_path / "p" / ".tmp-123").write_bytes(b'{"policy_id": "p"')
    assert tier.list_committed() == []
    assert SnapshotId("p", 1) not in dict(tier.list_committed())
    with pytest.raises(SnapshotLostError, match="not committed"):
        tier.read(SnapshotId("p", 1))


@pytest.mark.parametrize("damage", ["truncate", "flip", "missing", "torn_marker", "foreign_marker", "expect"])
def test_damage_is_detected_on_read(tmp_path, damage):
    tier = DurableTier.open(str(tmp_path))
    sid = SnapshotId("p", 3)
    buf = _snapshot("p", n=50_000)
    _write(tier, sid, buf)
    marker = tmp_path / "p" / f"0000000003{MARKER_SUFFIX}"
    data = tmp_path / "p" / json.loads(marker.read_text())["object"]
    if damage == "truncate":
        data.write_bytes(data.read_bytes()[:-100])
    elif damage == "flip":
        raw = bytearray(data.read_bytes())
        raw[-5000] ^= 0x40
        data.write_bytes(bytes(raw))
    elif damage == "missing":
        data.unlink()
    elif damage == "torn_marker":
        marker.write_text(marker.read_text()[:40])
    elif damage == "foreign_marker":  # a marker copied from another version
        raw = json.loads(marker.read_text())
        marker.write_text(json.dumps({**raw, "version": 4}))
    if damage in ("torn_marker", "foreign_marker"):
        assert tier.list_committed() == []
        with pytest.raises(SnapshotLostError):
            tier.read(sid)
        return
    expect = Expected("p", 3, "crc32c:00000000" if damage == "expect" else parse_header(buf, name="x").checksum)
    with pytest.raises(CorruptSnapshotError):
        tier.read(sid, expect)


def test_bad_input_is_refused_before_anything_is_stored(tmp_path):
    tier = DurableTier.open(str(tmp_path))
    buf = _snapshot("p")
    with pytest.raises(InvalidWeightsError, match="packed for 'p'"):
        tier.write(SnapshotId("q", 1), buf, parse_header(buf, name="x"))
    changed = buf.copy()
    changed[-1] ^= 1  # the shared copy written to after publish: caught while uploading
    with pytest.raises(CorruptSnapshotError, match="checksum mismatch"):
        tier.write(SnapshotId("p", 1), changed, parse_header(buf, name="x"))
    assert tier.list_committed() == [] and list((tmp_path / "p").glob("*.safetensors")) == []
    for uri in ("nosuch://bucket/x", ""):
        with pytest.raises(DurableTierError):
            DurableTier.open(uri)


def test_remove_uncommits_and_deletes_leftovers(tmp_path):
    tier = DurableTier.open(str(tmp_path))
    sid = SnapshotId("p", 2)
    _write(tier, sid, _snapshot("p"))
    (tmp_path / "p" / "0000000002.leftover.safetensors").write_bytes(b"partial")
    _write(tier, SnapshotId("p", 20), _snapshot("p", seed=20))
    tier.remove(sid)
    assert sid not in dict(tier.list_committed())
    assert [s for s, _ in tier.list_committed()] == [SnapshotId("p", 20)]
    assert sorted(p.name for p in (tmp_path / "p").iterdir() if not p.name.startswith("0000000020.")) == [
        "0000000002.deleted.json"]  # only its tombstone is left
    tier.remove(sid)  # removing twice is fine


@pytest.mark.parametrize("late", ["marker_kept", "write_after"])
def test_a_tombstone_keeps_a_snapshot_deleted_whatever_lands_after_it(tmp_path, late):
    """An upload still on its way when the snapshot is deleted (a node's background spill, a write past its
    deadline) never brings it back: not to readers, not to a catalog rebuilt from the URI, not to open_folder."""
    import policystore

    tier = DurableTier.open(str(tmp_path))
    sid, buf = SnapshotId("p", 3), _snapshot("p", seed=3)
    if late == "marker_kept":  # a writer killed after its marker landed beside the tombstone
        _write(tier, sid, buf)
        marker = (tmp_path / "p" / f"0000000003{MARKER_SUFFIX}").read_bytes()
        tier.remove(sid)
        (tmp_path / "p" / f"0000000003{MARKER_SUFFIX}").write_bytes(marker)
    else:
        tier.remove(sid)
        with pytest.raises(DurableTierError, match="deleted"):
            _write(tier, sid, buf)
    fresh = DurableTier.open(str(tmp_path))
    assert fresh.list_committed() == [] and fresh.committed_ids() == set()
    assert fresh.deleted_ids() == {sid}
    with pytest.raises(SnapshotLostError, match="deleted|not committed"):
        fresh.read(sid)
    assert policystore.open_folder(str(tmp_path)).list() == []


def test_a_write_that_finds_its_snapshot_deleted_on_the_way_undoes_itself(tmp_path, monkeypatch):
    tier = DurableTier.open(str(tmp_path))
    sid, buf = SnapshotId("p", 4), _snapshot("p", seed=4)
    put_marker = tier._put_marker

    def deleted_meanwhile(*args):  # the delete lands between the data upload and the commit marker
        DurableTier.open(str(tmp_path)).remove(sid)
        put_marker(*args)

    monkeypatch.setattr(tier, "_put_marker", deleted_meanwhile)
    with pytest.raises(DurableTierError, match="deleted while"):
        _write(tier, sid, buf)
    assert [p.name for p in (tmp_path / "p").iterdir()] == ["0000000004.deleted.json"]


def test_the_marker_is_written_only_after_the_catalogs_commit(tmp_path):
    """``before_marker`` (the catalog's commit) runs once the data object is stored; if it fails, nothing of the
    snapshot stays: no marker names a version the catalog did not commit."""
    tier = DurableTier.open(str(tmp_path))
    buf = _snapshot("p")
    seen = []

    def commit():
        seen.append(sorted(p.name.split(".")[-1] for p in (tmp_path / "p").iterdir()))
        raise RuntimeError("the catalog refused the commit")

    with pytest.raises(RuntimeError, match="refused"):
        tier.write(SnapshotId("p", 1), buf, parse_header(buf, name="p@v1"), before_marker=commit)
    assert seen == [["safetensors"]]  # the data object, no marker yet
    assert tier.list_committed() == [] and list((tmp_path / "p").iterdir()) == []
    tier.write(SnapshotId("p", 1), buf, parse_header(buf, name="p@v1"), before_marker=lambda: seen.append("ok"))
    assert seen[-1] == "ok" and SnapshotId("p", 1) in dict(tier.list_committed())
    # Unreadable markers are skipped and said, for a catalog to count.
    (tmp_path / "p" / f"{2:010d}{MARKER_SUFFIX}").write_text("garbage")
    listed, skipped, deleted = survey(str(tmp_path))
    assert [sid for sid, _ in listed] == [SnapshotId("p", 1)]
    assert deleted == [] and len(skipped) == 1 and f"{2:010d}{MARKER_SUFFIX}" in skipped[0]


# ---- S3: a real S3-compatible server on loopback (the s3_server fixture in conftest.py) ---------------------------

def _s3(port: int, **options) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(
        access_key="testing", secret_key="testing", region="us-east-1", scheme="http",
        endpoint_override=f"127.0.0.1:{port}", connect_timeout=2, request_timeout=10,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=2), **options,
    )


def test_s3_round_trip_and_rebuild(s3_server, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    uri = f"s3://{s3_server.bucket}/rt?endpoint_override=127.0.0.1:{s3_server.port}&scheme=http&region=us-east-1"
    tier = DurableTier.open(uri)
    buf = _snapshot("main_0", n=300_000, meta={"frozen": True})
    _write(tier, SnapshotId("main_0", 1), buf)
    fresh = DurableTier.open(uri)
    [(sid, summary)] = fresh.list_committed()
    assert sid == SnapshotId("main_0", 1) and summary.meta == {"frozen": True}
    assert np.array_equal(fresh.read(sid, Expected(*sid, summary.checksum)), buf)
    fresh.remove(sid)
    assert fresh.list_committed() == [] and sid not in dict(tier.list_committed())


class _DyingProxy:
    """A TCP proxy in front of the S3 server that dies once ``cut_after`` bytes went upstream: it drops every
    connection mid-stream and stops listening, as a server that goes away does."""

    def __init__(self, target_port: int, cut_after: int):
        self.target_port, self.cut_after = target_port, cut_after
        self.sent, self.dead = 0, False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:  # not a wait: serves connections until the listener is closed
            try:
                client, _ = self._listener.accept()
            except OSError:
                self._listener.close()
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._sockets += [client, upstream]
            connect(client, upstream, self._count)

    def _count(self, data: bytes) -> bool:
        """Whether ``data`` (on its way upstream) still goes through; past ``cut_after`` bytes the proxy dies."""
        with self._lock:
            self.sent += len(data)
            over = self.sent > self.cut_after
        if over:
            self.die()
        return not over

    def die(self) -> None:
        with self._lock:
            self.dead = True
            sockets, self._sockets = self._sockets, []
        close_all([self._listener, *sockets])  # each is closed by the thread that uses it


SIZE = 24 * 1024 * 1024  # large enough for a multipart upload


@pytest.fixture(scope="module")
def big():
    return pack({"w": torch.ones(SIZE // 4)}, policy_id="big")


@pytest.fixture(scope="module")
def upload_bytes(s3_server, big):
    """Bytes a whole write sends upstream (data, size check, marker), measured through a proxy that never dies."""
    proxy = _DyingProxy(s3_server.port, cut_after=1 << 62)
    _write(DurableTier(_s3(proxy.port), f"{s3_server.bucket}/measure"), SnapshotId("big", 1), big)
    proxy.die()
    return proxy.sent


# Where the server goes away: during the data upload, or in the last request (the commit marker's PUT).
CUTS = {"early": lambda total: total // 10, "middle": lambda total: total * 6 // 10,
        "marker": lambda total: total - 100, "never": lambda total: 2 * total}


@pytest.mark.parametrize("cut", list(CUTS))
def test_s3_server_going_away_mid_upload(s3_server, big, upload_bytes, cut):
    """The write fails with a clear DurableTierError or completes; either way a fresh reader sees the snapshot
    whole or not at all, and the write succeeds once the server is back."""
    sid = SnapshotId("big", 1)
    prefix = f"{s3_server.bucket}/cut-{cut}"
    proxy = _DyingProxy(s3_server.port, cut_after=CUTS[cut](upload_bytes))
    tier = DurableTier(_s3(proxy.port), prefix)
    try:
        _write(tier, sid, big)
        completed = True
    except PolicyStoreError as exc:
        assert isinstance(exc, DurableTierError), exc
        assert str(sid) in str(exc)
        completed = False
    assert completed == (cut == "never") and proxy.dead == (cut != "never")
    proxy.die()
    direct = DurableTier(_s3(s3_server.port), prefix)  # the server is reachable again
    # committed (only the reply to the marker's PUT was lost): then whole and verified
    if sid in dict(direct.list_committed()):
        assert cut in ("marker", "never")
        assert np.array_equal(direct.read(sid), big)
    else:
        assert direct.list_committed() == []
        with pytest.raises(SnapshotLostError):
            direct.read(sid)
        _write(direct, sid, big)
    assert np.array_equal(DurableTier(_s3(s3_server.port), prefix).read(sid), big)


# ---- a store against a durable tier that is down, hanging or back (a switchable proxy before the S3 server) ------
MiB = 1024 * 1024


def _in_time(fn, timeout: float = 120.0):
    """``fn()`` on a thread, failing the test (instead of hanging it) if it does not return."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(_catch(fn)), daemon=True)
    thread.start()
    thread.join(timeout)
    assert out, f"{fn} still blocked after {timeout} s"
    value, error = out[0]
    if error is not None:
        raise error
    return value


def _catch(fn):
    try:
        return fn(), None
    except BaseException as exc:
        return None, exc


def _s3_uri(server, port: int, prefix: str) -> str:
    # credentials in the URI: the store actor's process may have started before the fixture set the environment
    return (f"s3://testing:testing@{server.bucket}/{prefix}?endpoint_override=127.0.0.1:{port}&scheme=http"
            "&region=us-east-1")


def _weights(v: int) -> dict[str, torch.Tensor]:
    return {"w": torch.randn(MiB // 4, generator=torch.Generator().manual_seed(v))}


def _store_pid(store) -> int:
    actor = ray.get_actor(store_name(store.stats().node_id), namespace=NAMESPACE)
    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))


def test_a_durable_outage_loses_no_acknowledged_snapshot(make_store, s3_server, tmp_path):
    """Object store down: non-durable publishes are committed on the node's disk (no temp files left, the hot tier
    within its capacity), survive a store kill, and reach the durable tier once it is back; the backlog shows in
    stats."""
    gate = S3Gate(s3_server.bucket, server_port=s3_server.port)
    gate.set("down")
    uri = _s3_uri(s3_server, gate.port, "outage")
    store = make_store(durable_uri=uri, hot_capacity_bytes=3 * MiB, durable_timeout_s=20)
    versions = range(1, 9)
    for v in versions:
        assert store.publish("out", _weights(v)).version == v
    store.flush()
    stats = store.stats()
    assert stats.hot_bytes <= stats.hot_capacity_bytes and stats.disk_snapshots == len(versions)
    assert sorted(p.name[:10] for p in (tmp_path / "spill" / "out").iterdir()) == [f"{v:010d}" for v in versions]
    stats = eventually(lambda: (s := store.stats()).durable_failures and s, "a failed upload", ignore=RESTARTING)
    assert stats.durable_pending == len(versions) and "could not connect" in stats.durable_error.lower()
    assert "testing:testing" not in stats.durable_error  # credentials in the URI are never shown
    os.kill(_store_pid(store), signal.SIGKILL)  # Ray restarts it; it rebuilds from its disk
    policystore.clear_cache()
    for v in versions:
        got = eventually(functools.partial(store.get, "out", v), f"out@v{v} readable", ignore=RESTARTING)
        assert torch.equal(got["w"], _weights(v)["w"])
    gate.set("up")
    direct = DurableTier.open(_s3_uri(s3_server, s3_server.port, "outage"))
    wanted = {SnapshotId("out", v) for v in versions}
    eventually(lambda: direct.committed_ids() == wanted, "the uploads after the outage", 240, ignore=RESTARTING)
    eventually(lambda: store.stats().durable_pending == 0, "an empty backlog", ignore=RESTARTING)
    for sid in wanted:
        assert torch.equal(torch.from_numpy(direct.read(sid)[-MiB:].copy()).view(torch.float32),
                           _weights(sid.version)["w"])
    gate.set("down")


def test_a_hanging_durable_tier_blocks_no_read_and_no_non_durable_publish(make_store, s3_server):
    """An object store that accepts connections and never answers: a durable publish fails after the deadline,
    naming the tier, and meanwhile reads (of an unknown version of that policy too) and non-durable publishes
    go on; what was stored stays, and reaches the tier once it answers again."""
    gate = S3Gate(s3_server.bucket, server_port=s3_server.port)
    store = make_store(durable_uri=_s3_uri(s3_server, gate.port, "hang"), hot_capacity_bytes=3 * MiB,
                       durable_timeout_s=10)
    assert store.publish("h", _weights(1), durable=True).version == 1
    gate.set("hang")
    hung = gate.hung
    stuck: list = []
    publisher = threading.Thread(target=lambda: stuck.append(_catch(
        functools.partial(store.publish, "h", _weights(2), durable=True))), daemon=True)
    publisher.start()
    eventually(lambda: gate.hung > hung, "the durable publish reaching the tier")  # nothing else calls it
    with pytest.raises(UnknownVersionError):
        _in_time(functools.partial(store.get, "h", 99))
    assert publisher.is_alive()  # answered while the durable publish of the same policy waits for the tier
    publisher.join(120)
    assert stuck and isinstance(stuck[0][1], DurableTierError), stuck
    assert f"durable tier s3://{s3_server.bucket}/hang?endpoint_override=127.0.0.1:{gate.port}" in str(stuck[0][1])
    assert "did not answer within 10 s" in str(stuck[0][1])
    for v in (3, 4, 5, 6):  # version 2 was aborted: numbers are never reused
        assert _in_time(functools.partial(store.publish, "h", _weights(v))).version == v
    _in_time(store.flush)
    policystore.clear_cache()
    for v in (1, 3, 4, 5, 6):
        assert torch.equal(_in_time(functools.partial(store.get, "h", v))["w"], _weights(v)["w"])
    report = _in_time(lambda: store.verify("h", 1))
    assert report.disk and report.durable is None and any("did not answer" in p for p in report.problems)
    assert [r.id.version for r in store.list("h")] == [1, 3, 4, 5, 6]  # nothing stored was lost
    gate.set("up")
    direct = DurableTier.open(_s3_uri(s3_server, s3_server.port, "hang"))
    wanted = {SnapshotId("h", v) for v in (1, 3, 4, 5, 6)}
    eventually(lambda: direct.committed_ids() == wanted, "the uploads after the hang", 240, ignore=RESTARTING)
    # the publish that failed stays out, whatever its upload did
    assert SnapshotId("h", 2) not in dict(direct.list_committed())
    gate.set("down")


def test_a_delete_during_an_outage_reaches_the_durable_tier_after_a_store_restart(make_store, s3_server):
    gate = S3Gate(s3_server.bucket, server_port=s3_server.port)
    store = make_store(durable_uri=_s3_uri(s3_server, gate.port, "late-delete"), durable_timeout_s=20)
    gone = store.publish("late", _weights(1), durable=True)
    kept = store.publish("late", _weights(2), durable=True)
    gate.set("down")
    assert store.delete("late", 1) == [gone]
    assert store.stats().durable_error  # its tombstone waits for the tier
    os.kill(_store_pid(store), signal.SIGKILL)
    eventually(lambda: store.stats().durable_error, "the restarted store trying again", ignore=RESTARTING)
    gate.set("up")
    direct = DurableTier.open(_s3_uri(s3_server, s3_server.port, "late-delete"))
    eventually(lambda: direct.deleted_ids() == {gone}, "the tombstone after the restart", 240, ignore=RESTARTING)
    assert direct.committed_ids() == {kept}
    gate.set("down")


def test_deleted_snapshots_never_come_back(make_store, tmp_path):
    """A delete right after a non-durable publish drops its queued spill and upload, and tombstones it in the
    durable tier: a fresh catalog on the same durable URI neither lists nor serves it."""
    uri = str(tmp_path / "durable")
    store = make_store(durable_uri=uri)
    kept = []
    for v in range(1, 31):
        sid = store.publish("gone", _weights(v), durable=v % 5 == 0)
        if v % 3:
            assert store.delete("gone", sid.version) == [sid]
        else:
            kept.append(sid)
    store.flush()
    eventually(lambda: store.stats().durable_pending == 0, "an empty backlog", ignore=RESTARTING)
    assert {sid for sid, _ in DurableTier.open(uri).list_committed()} == set(kept)
    policystore.client.shutdown_all()
    fresh = policystore.connect(policystore.StoreConfig(spill_dir=str(tmp_path / "fresh"), durable_uri=uri))
    assert [r.id for r in fresh.list("gone")] == kept
    with pytest.raises(UnknownVersionError):
        fresh.get("gone", 1)
    assert torch.equal(fresh.get("gone", kept[-1].version)["w"], _weights(kept[-1].version)["w"])
    assert [i.id for i in policystore.open_folder(uri).list()] == kept


@pytest.mark.parametrize("damage", ["flipped", "removed"])
def test_a_damaged_spill_file_heals_from_the_durable_copy(make_store, tmp_path, damage):
    store = make_store(durable_uri=str(tmp_path / "durable"), hot_capacity_bytes=2 * MiB, compress=False)
    sid = store.publish("heal", _weights(1), durable=True)
    for v in (2, 3, 4):  # push v1 out of memory: it is on disk only
        store.publish("other", _weights(v))
    store.flush()
    assert {r.id: r.tier for r in store.list("heal")}[sid] == "disk"
    path = tmp_path / "spill" / "heal" / "0000000001.safetensors"
    if damage == "flipped":
        with open(path, "r+b") as f:
            f.seek(-7, os.SEEK_END)
            byte = f.read(1)
            f.seek(-7, os.SEEK_END)
            f.write(bytes([byte[0] ^ 0xFF]))
    else:
        path.unlink()
    policystore.clear_cache()
    for _ in range(3):  # every get, not only the first
        assert torch.equal(store.get("heal", 1)["w"], _weights(1)["w"])
        policystore.clear_cache()
    eventually(lambda: path.exists(), "the spill file written again")
    report = store.verify("heal", 1)
    assert (report.disk, report.durable, report.problems) == (True, True, ())
    assert len(store.stats().quarantined) == (damage == "flipped")


def test_a_damaged_spill_file_found_by_verify_is_replaced(make_store, tmp_path):
    store = make_store(durable_uri=str(tmp_path / "durable"), compress=False)
    store.publish("v", _weights(1), durable=True)
    path = tmp_path / "spill" / "v" / "0000000001.safetensors"
    with open(path, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        f.write(b"\0\1\2")
    with pytest.raises(CorruptSnapshotError, match="v@v1 \\(disk copy\\): checksum mismatch.*moved to"):
        store.verify("v", 1)
    eventually(lambda: store.verify("v", 1).disk is True, "the spill file written again from memory",
               ignore=RESTARTING)
    assert torch.equal(store.get("v", 1)["w"], _weights(1)["w"])


def test_a_delete_through_the_catalog_leaves_a_tombstone_before_it_answers(make_store, tmp_path, capsys):
    """The catalog actor's own delete (reachable by name from any driver): the durable tier has the tombstone when
    the call returns, so `policystore --dir`, open_folder and a catalog rebuilt from the tier never list it again."""
    uri = str(tmp_path / "durable")
    store = make_store(durable_uri=uri)
    gone = store.publish("cat", _weights(1), durable=True)
    kept = store.publish("cat", _weights(2), durable=True)
    catalog = ray.get_actor(CATALOG_NAME, namespace=NAMESPACE)
    assert [e.id for e in ray.get(catalog.delete.remote("cat", 1))] == [gone]
    tier = DurableTier.open(uri)
    assert tier.deleted_ids() == {gone} and tier.committed_ids() == {kept}  # written before the answer
    assert cli.main(["--dir", uri, "ls", "--json"]) == 0
    assert [(r["policy_id"], r["version"]) for r in json.loads(capsys.readouterr().out)] == [tuple(kept)]
    with policystore.open_folder(uri) as folder:
        assert [i.id for i in folder.list()] == [kept]
    rebuilt = CatalogServer(str(tmp_path / "rebuilt.sqlite3"), StoreConfig(), seed=functools.partial(survey, uri))
    assert [e.id for e in rebuilt.list()] == [kept]
    rebuilt.close()
    eventually(lambda: {p.name.partition(".")[2] for p in (tmp_path / "durable" / "cat").glob(f"{1:010d}.*")}
               == {"deleted.json"}, "its marker and data removed, its tombstone kept")
    assert [r.id for r in store.list("cat")] == [kept]


def test_a_delete_through_the_catalog_is_refused_while_the_durable_tier_is_down(make_store, s3_server):
    gate = S3Gate(s3_server.bucket, server_port=s3_server.port)
    store = make_store(durable_uri=_s3_uri(s3_server, gate.port, "cat-down"), durable_timeout_s=10)
    sid = store.publish("down", _weights(1), durable=True)
    gate.set("down")
    catalog = ray.get_actor(CATALOG_NAME, namespace=NAMESPACE)
    with pytest.raises(DurableTierError, match="nothing was deleted"):
        ray.get(catalog.delete.remote("down", 1), timeout=60)
    assert [r.id for r in store.list("down")] == [sid]
    gate.set("up")
    ray.get(catalog.delete.remote("down", 1), timeout=60)
    assert DurableTier.open(_s3_uri(s3_server, s3_server.port, "cat-down")).deleted_ids() == {sid}
    gate.set("down")


def test_a_hanging_durable_tier_holds_up_nothing_else_of_the_same_process(make_store, s3_server):
    """One process: while its durable publish waits on a tier that never answers, its non-durable publish, get and
    list go on (the staging file is not held across the durable call); the durable publish and verify end with
    DurableTierError naming the tier within the client's own deadline, though durable_timeout_s is longer."""
    gate = S3Gate(s3_server.bucket, server_port=s3_server.port)
    store = make_store(durable_uri=_s3_uri(s3_server, gate.port, "hang-same"), hot_capacity_bytes=3 * MiB,
                       call_timeout_s=12)  # durable_timeout_s keeps its default, 60 s
    assert store.publish("s", _weights(1), durable=True).version == 1
    gate.set("hang")
    hung = gate.hung
    stuck: list = []
    publisher = threading.Thread(target=lambda: stuck.append(_catch(
        functools.partial(store.publish, "s", _weights(2), durable=True))), daemon=True)
    publisher.start()
    eventually(lambda: gate.hung > hung, "the durable publish reaching the tier")
    assert _in_time(functools.partial(store.publish, "s", _weights(3))).version == 3  # v2 is reserved
    assert torch.equal(_in_time(functools.partial(store.get, "s", 3))["w"], _weights(3)["w"])
    assert [r.id.version for r in _in_time(functools.partial(store.list, "s"))] == [1, 3]
    assert publisher.is_alive()  # all of it answered while the durable publish waits for the tier
    publisher.join(120)
    assert stuck and isinstance(stuck[0][1], DurableTierError), stuck
    assert f"durable tier s3://{s3_server.bucket}/hang-same" in str(stuck[0][1])
    report = _in_time(lambda: store.verify("s", 1))
    assert report.disk and report.durable is None and any("did not answer" in p for p in report.problems)
    gate.set("down")


def test_a_local_durable_folder_is_private_like_the_spill_tier(tmp_path):
    """Folders 0700 and files 0600 (markers, data objects, tombstones), an existing open root made private too."""
    root = tmp_path / "durable"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    tier = DurableTier.open(str(root))
    _write(tier, SnapshotId("p", 1), _snapshot("p", seed=1))
    _write(tier, SnapshotId("p", 2), _snapshot("p", seed=2))
    tier.remove(SnapshotId("p", 1))
    paths = [root, *root.rglob("*")]
    kinds = {p.name.split(".")[-2] for p in paths if p.is_file()}  # markers, tombstones, data (a token)
    assert {"commit", "deleted"} <= kinds and any(p.suffix == ".safetensors" for p in paths)
    for path in paths:
        assert path.stat().st_mode & 0o777 == (0o700 if path.is_dir() else 0o600), path


def test_tombstones_fold_into_a_floor_that_keeps_every_delete_in_force(tmp_path):
    root = tmp_path / "durable"
    tier = DurableTier.open(str(root))
    bufs = {v: _snapshot("p", seed=v) for v in range(1, 6)}
    for v, buf in bufs.items():
        _write(tier, SnapshotId("p", v), buf)
    for v in (1, 2, 3):
        tier.remove(SnapshotId("p", v))
    assert tier.compact("p", 3) == 3 and tier.compact("p", 2) == 0  # three tombstones gone; a floor never lowers
    names = {p.name for p in (root / "p").iterdir()}
    assert {n for n in names if not n.endswith(".safetensors")} == {"0000000003.floor", "0000000004.commit.json",
                                                                     "0000000005.commit.json"}
    assert sorted(n[:10] for n in names if n.endswith(".safetensors")) == ["0000000004", "0000000005"]
    assert tier.committed_ids() == {SnapshotId("p", 4), SnapshotId("p", 5)} and tier.floor("p") == 3
    assert tier.deleted(SnapshotId("p", 2)) and not tier.deleted(SnapshotId("p", 4))
    with pytest.raises(DurableTierError, match="deleted"):  # a late upload of a deleted version is refused
        _write(tier, SnapshotId("p", 2), bufs[2])
    entries, skipped, deleted = survey(str(root))  # what a rebuilt catalog learns: counters move past the floor
    assert [sid for sid, _ in entries] == [SnapshotId("p", 4), SnapshotId("p", 5)] and SnapshotId("p", 3) in deleted
    with policystore.open_folder(root) as folder:
        assert [i.id.version for i in folder.list("p")] == [4, 5]


def test_the_catalog_folds_tombstones_only_below_what_is_live(make_store, tmp_path):
    uri = str(tmp_path / "durable")
    store = make_store(durable_uri=uri)
    for v in range(1, 7):
        store.publish("f", _weights(v), durable=True)
    for v in (1, 2, 4):
        store.delete("f", v)
    catalog = ray.get_actor(CATALOG_NAME, namespace=NAMESPACE)
    assert ray.get(catalog.compact_tombstones.remote(), timeout=60) == {"f": 2}  # v3 is live: the floor stays at 2
    tier = DurableTier.open(uri)
    assert tier.floor("f") == 2 and tier.deleted_ids() == {SnapshotId("f", 2), SnapshotId("f", 4)}
    assert tier.committed_ids() == {SnapshotId("f", v) for v in (3, 5, 6)}
    rebuilt = CatalogServer(str(tmp_path / "rebuilt.sqlite3"), StoreConfig(), seed=functools.partial(survey, uri))
    assert [e.id.version for e in rebuilt.list()] == [3, 5, 6]
    rebuilt.close()
    assert [r.id.version for r in store.list("f")] == [3, 5, 6]
