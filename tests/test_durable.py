"""The durable tier on real storage: local folders (plain paths and file://) and a real S3-compatible server
(moto, in server mode, on loopback), including the server going away in the middle of an upload."""

import functools
import json
import pickle
import socket
import threading
from collections import namedtuple

import numpy as np
import pyarrow.fs as pafs
import pytest
import torch

from policystore.durable import MARKER_SUFFIX, DurableTier, survey
from policystore.errors import (
    CorruptSnapshotError,
    DurableTierError,
    InvalidWeightsError,
    PolicyStoreError,
    SnapshotLostError,
)
from policystore.format import pack, parse_header
from policystore.ids import SnapshotId
from policystore.wire import Summary

Expected = namedtuple("Expected", "policy_id version checksum")  # the shape of the catalog's record


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
    assert pickle.loads(pickle.dumps(functools.partial(survey, local_uri)))() == (listed, [])  # a catalog's seed
    assert [sid for sid, _ in listed] == sorted(bufs)
    for sid, summary in listed:
        header = parse_header(bufs[sid], name=str(sid))
        assert Summary(**summary) == Summary(header.nbytes, header.checksum, header.user_meta,
                                             summary["created"], durable=True)
        assert fresh.find(sid)
        got = fresh.read(sid, Expected(*sid, header.checksum))
        assert np.array_equal(got, bufs[sid])
    assert dict(listed)[SnapshotId("exploiter", 5)]["meta"] == {"frozen": True}


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
    assert not tier.find(SnapshotId("p", 1))
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
        assert not tier.find(sid) and tier.list_committed() == []
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
    assert not tier.find(sid)
    assert [s for s, _ in tier.list_committed()] == [SnapshotId("p", 20)]
    assert sorted(p.name.split(".")[0] for p in (tmp_path / "p").iterdir()) == ["0000000020", "0000000020"]
    tier.remove(sid)  # removing twice is fine


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
    assert seen[-1] == "ok" and tier.find(SnapshotId("p", 1))
    # Unreadable markers are skipped and said, for a catalog to count.
    (tmp_path / "p" / f"{2:010d}{MARKER_SUFFIX}").write_text("garbage")
    listed, skipped = survey(str(tmp_path))
    assert [sid for sid, _ in listed] == [SnapshotId("p", 1)]
    assert len(skipped) == 1 and f"{2:010d}{MARKER_SUFFIX}" in skipped[0]


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
    assert sid == SnapshotId("main_0", 1) and summary["meta"] == {"frozen": True}
    assert np.array_equal(fresh.read(sid, Expected(*sid, summary["checksum"])), buf)
    fresh.remove(sid)
    assert fresh.list_committed() == [] and not tier.find(sid)


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
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, upward: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if upward:
                    with self._lock:
                        self.sent += len(data)
                        over = self.sent > self.cut_after
                    if over:
                        self.die()
                        return
                dst.sendall(data)
        except OSError:
            pass

    def die(self) -> None:
        with self._lock:
            self.dead = True
            sockets, self._sockets = self._sockets, []
        self._listener.close()
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


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
    if direct.find(sid):  # committed (only the reply to the marker's PUT was lost): then whole and verified
        assert cut in ("marker", "never")
        assert np.array_equal(direct.read(sid), big)
    else:
        assert direct.list_committed() == []
        with pytest.raises(SnapshotLostError):
            direct.read(sid)
        _write(direct, sid, big)
    assert np.array_equal(DurableTier(_s3(s3_server.port), prefix).read(sid), big)
