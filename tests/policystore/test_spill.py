"""The disk tier on real files (no Ray): what it serves, what it refuses, and that it cannot be led outside its root."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import lz4.frame
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policystore.errors import CorruptSnapshotError, DiskFullError, SnapshotFolderError
from policystore.format import META_VERSION, Expected, pack, parse_header
from policystore.ids import SnapshotId
from policystore.snapfile import MAX_LZ4_RATIO, SpillFile
from policystore.spill import QUARANTINE, DiskTier


def packed(policy_id: str, seed: int = 0, *, compressible: bool = False) -> np.ndarray:
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(256, 64, generator=gen)
    if compressible:  # pruned: mostly zeros, compresses about 3x
        weight = weight * (torch.rand(256, 64, generator=gen) > 0.8)
    return pack({"w": weight, "b": torch.randn(64, generator=gen)}, policy_id=policy_id, meta={"seed": seed})


def spill(tier: DiskTier, sid: SnapshotId, buf: np.ndarray) -> SpillFile:
    return tier.commit(tier.write_temp(sid, buf, parse_header(buf, name=str(sid))), sid)


def find(tier: DiskTier, sid: SnapshotId) -> SpillFile | None:
    """The committed file of ``sid``, raw or compressed, if there is one (regular files only, as the tier reads)."""
    for compressed in (False, True):
        path = tier.path_for(sid, compressed)
        if path.is_file() and not path.is_symlink():
            return SpillFile(path, compressed, path.stat().st_size)
    return None


def expect(sid: SnapshotId, buf: np.ndarray) -> Expected:
    return Expected(sid.policy_id, sid.version, parse_header(buf, name="x").checksum)


def same_data(a: np.ndarray, b: np.ndarray) -> bool:
    ha, hb = parse_header(a, name="a"), parse_header(b, name="b")
    return bytes(a[ha.data_offset:]) == bytes(b[hb.data_offset:]) and ha.checksum == hb.checksum


@pytest.fixture
def tier(tmp_path: Path) -> DiskTier:
    return DiskTier(tmp_path / "spill", compress=True)  # the lz4 path too


@pytest.mark.parametrize("compressible", [False, True])
def test_round_trip_records_the_version_and_private_modes(tier, compressible):
    sid = SnapshotId("p", 7)
    buf = packed("p", compressible=compressible)
    file = spill(tier, sid, buf)
    assert file.compressed == compressible and file == find(tier, sid)
    out = tier.read(file, str(sid), expect=expect(sid, buf))
    assert same_data(out, buf)
    assert parse_header(out, name="out").metadata[META_VERSION] == "7"
    assert stat.S_IMODE(os.stat(file.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tier.root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(file.path.parent).st_mode) == 0o700
    if not compressible:  # a raw file is served as a read-only map, not a private copy
        assert not out.flags.writeable


@pytest.mark.parametrize("mib", [0, 9])  # small files are checked before put, large ones while put copies
def test_restore_hands_put_the_verified_buffer_and_drops_it_when_damaged(tier, mib):
    sid = SnapshotId("p", 1)
    buf = pack({"w": torch.randn(mib * 2**18 + 100)}, policy_id="p")
    file = spill(tier, sid, buf)
    assert tier.restore(file, str(sid), expect=expect(sid, buf), put=lambda b: ("put", len(b)))[0] == "put"
    raw = bytearray(file.path.read_bytes())
    raw[-1] ^= 0xFF
    file.path.write_bytes(raw)
    calls = []
    with pytest.raises(CorruptSnapshotError, match="checksum mismatch"):
        tier.restore(file, str(sid), expect=expect(sid, buf), put=calls.append)
    assert len(calls) <= 1 and find(tier, sid) is None  # moved aside, and put's result was never returned


@pytest.mark.parametrize("case", ["other_version", "other_policy", "recorded_checksum"])
def test_a_valid_file_of_another_snapshot_is_refused_and_quarantined(tier, case):
    good, other = SnapshotId("p", 1), SnapshotId("p", 2)
    good_buf, other_buf = packed("p", 1), packed("p", 2)
    good_file = spill(tier, good, good_buf)
    if case == "other_version":  # v1's file copied over v2's place: self-consistent, but the wrong snapshot
        spill(tier, other, other_buf)
        shutil.copy(good_file.path, tier.path_for(other, False))
        victim, wanted = other, expect(other, other_buf)
    elif case == "other_policy":
        victim = SnapshotId("q", 1)
        (tier.root / "q").mkdir(mode=0o700)
        shutil.copy(good_file.path, tier.path_for(victim, False))
        victim_buf = packed("q", 1)
        wanted = expect(victim, victim_buf)
    else:  # the file is whole, but it is not what the catalog recorded at publish
        victim, wanted = good, Expected("p", 1, parse_header(other_buf, name="x").checksum)
    file = find(tier, victim)
    with pytest.raises(CorruptSnapshotError):
        tier.read(file, str(victim), expect=wanted)
    assert find(tier, victim) is None
    [record] = tier.quarantined()
    assert Path(record.path).exists() and Path(record.path).parent == tier.root / QUARANTINE
    assert str(file.path) in record.reason
    if case != "recorded_checksum":  # the good copy is untouched and still served
        assert same_data(tier.read(good_file, str(good), expect=expect(good, good_buf)), good_buf)


def test_a_file_without_its_version_is_refused(tier):
    sid = SnapshotId("p", 3)
    buf = packed("p")  # the packed buffer as it is: it does not say which version it is
    (tier.root / "p").mkdir(mode=0o700)
    tier.path_for(sid, False).write_bytes(buf.tobytes())
    file = find(tier, sid)
    with pytest.raises(CorruptSnapshotError, match="version None, not 3"):
        tier.read(file, str(sid), expect=expect(sid, buf))
    assert find(tier, sid) is None and len(tier.quarantined()) == 1


def test_symlinks_are_never_followed(tier, tmp_path):
    outside = DiskTier(tmp_path / "elsewhere")
    sid = SnapshotId("p", 1)
    buf = packed("p")
    target = spill(outside, sid, buf)
    # a symlinked snapshot file, and a symlinked policy folder, both pointing at a valid file outside the root
    (tier.root / "p").mkdir(mode=0o700)
    os.symlink(target.path, tier.path_for(sid, False))
    os.symlink(target.path.parent, tier.root / "q")
    assert find(tier, sid) is None
    with pytest.raises(CorruptSnapshotError):
        tier.read(SpillFile(tier.path_for(sid, False), False, 0), str(sid), expect=expect(sid, buf))
    linked = SpillFile(tier.root / "q" / target.path.name, False, 0)
    with pytest.raises(CorruptSnapshotError):
        tier.read(linked, "q@v1")
    tier.remove(linked)
    tier.remove(SpillFile(tier.path_for(sid, False), False, 0))
    result = tier.scan()
    assert result.entries == [] and tier.quarantined() == []
    assert target.path.exists() and same_data(outside.read(target, "outside"), buf)  # nothing outside was touched
    with pytest.raises(CorruptSnapshotError, match="not a file of the spill folder"):
        tier.read(target, "outside")


def test_scan_survives_junk_adopts_only_valid_files_and_quarantines_damaged_ones(tier, tmp_path):
    root = tier.root
    good = {SnapshotId("p", 1): packed("p", 1), SnapshotId("p", 2): packed("p", 2, compressible=True),
            SnapshotId("q-1.x", 5): packed("q-1.x", 5)}
    for sid, buf in good.items():
        spill(tier, sid, buf)
    p = root / "p"
    os.symlink(tmp_path / "nowhere", root / "dangling")
    os.symlink(tmp_path / "nowhere", p / "0000000009.safetensors")  # a dangling snapshot-named symlink
    (p / ".tmp-leftover-dir").mkdir()  # a temp *folder*: left alone
    (p / ".tmp-abc").write_bytes(b"half a file")  # an unfinished temp file: removed
    (p / "notes.txt").write_text("hello")
    (p / "0000000000.safetensors").write_bytes(b"version zero")
    os.mkfifo(p / "0000000017.safetensors")  # opening it for reading would block
    (root / "not an id!").mkdir()
    (root / "..x").mkdir()
    (root / "stray-file").write_bytes(b"x")
    bad = {
        "0000000010.safetensors": (2**62).to_bytes(8, "little") + b"{}",  # absurd header length
        "0000000011.safetensors": (4000).to_bytes(8, "little") + b"[" * 4000,  # deeply nested JSON
        "0000000012.safetensors": (16).to_bytes(8, "little") + b"\xff" * 16,  # not UTF-8
        "0000000013.safetensors.lz4": b"not an lz4 frame at all",
        "0000000014.safetensors.lz4": _lz4_claiming(3 << 30, b"\0" * 4096),  # claims 3 GiB
        "0000000015.safetensors": b"",
    }
    for name, data in bad.items():
        (p / name).write_bytes(data)
    shutil.copy(p / "0000000001.safetensors", p / "0000000016.safetensors")  # misplaced: holds v1
    if os.geteuid() == 0:  # planted by another user before the folder was private: not adopted, not moved
        shutil.copy(root / "q-1.x" / "0000000005.safetensors", p / "0000000018.safetensors")
        os.chown(p / "0000000018.safetensors", 65534, 65534)
        planted = root / "r"
        planted.mkdir()
        shutil.copy(p / "0000000001.safetensors", planted / "0000000001.safetensors")
        os.chown(planted, 65534, 65534)
    result = tier.scan()
    assert {e.id for e in result.entries} == set(good)
    assert len(tier.quarantined()) == len(bad) + 1
    assert all(Path(q.path).parent == root / QUARANTINE for q in tier.quarantined())
    skipped = "\n".join(result.skipped)
    for name in ("dangling", "0000000009.safetensors", ".tmp-leftover-dir", "notes.txt", "not an id!", "..x",
                 "stray-file", "0000000000.safetensors", "0000000017.safetensors",
                 *(["0000000018.safetensors", f"{root / 'r'}: owned by uid 65534"] if os.geteuid() == 0 else [])):
        assert name in skipped
    assert not (p / ".tmp-abc").exists() and (p / ".tmp-leftover-dir").is_dir()
    again = tier.scan()  # a second start finds the same snapshots and nothing new to move
    assert {e.id for e in again.entries} == set(good) and len(tier.quarantined()) == len(bad) + 1
    for sid, buf in good.items():
        assert same_data(tier.read(find(tier, sid), str(sid), expect=expect(sid, buf)), buf)


def _lz4_claiming(size: int, data: bytes) -> bytes:
    """An lz4 frame whose header records ``size`` bytes but which holds only ``data``."""
    comp = lz4.frame.LZ4FrameCompressor(block_linked=False)
    return comp.begin(size) + comp.compress(data) + b"\0\0\0\0"


def test_lz4_frames_claiming_more_than_they_can_honestly_hold_are_refused_with_bounded_memory(tmp_path):
    """A 6.6 MB file claiming 3 GiB: refused before anything of that size is allocated (checked in a child
    process, whose peak memory is its own)."""
    tier = DiskTier(tmp_path / "spill", compress=True)
    (tier.root / "p").mkdir(mode=0o700)
    bomb = tier.root / "p" / "0000000001.safetensors.lz4"
    bomb.write_bytes(_lz4_claiming(3 << 30, os.urandom(6_600_000)))
    code = f"""
import resource, sys
from policystore.snapfile import SpillFile
from policystore.spill import DiskTier
from policystore.errors import CorruptSnapshotError
tier = DiskTier({str(tier.root)!r})
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    tier.read(SpillFile(tier.root / "p" / "0000000001.safetensors.lz4", True, {bomb.stat().st_size}), "bomb")
except CorruptSnapshotError as exc:
    print("refused:", exc)
print("grew_kib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2]).stdout
    assert "refused:" in out and f"more than {MAX_LZ4_RATIO}x" in out
    assert int(out.split("grew_kib")[1]) < 64 * 1024


def test_the_writer_stores_raw_what_would_compress_past_the_readers_bound(tier):
    sid = SnapshotId("zeros", 1)
    buf = pack({"w": torch.zeros(1 << 20)}, policy_id="zeros")  # 4 MiB of zeros: lz4 would shrink it ~250x
    file = spill(tier, sid, buf)
    assert not file.compressed
    assert same_data(tier.read(file, str(sid), expect=expect(sid, buf)), buf)


@pytest.mark.parametrize("compressible", [False, True])
@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_files_are_refused_and_quarantined(tier, compressible, damage):
    sid = SnapshotId("p", 1)
    buf = packed("p", compressible=compressible)
    file = spill(tier, sid, buf)
    raw = bytearray(file.path.read_bytes())
    if damage == "flip":
        raw[len(raw) * 2 // 3] ^= 0x55
    else:
        del raw[len(raw) * 2 // 3 :]
    file.path.write_bytes(raw)
    with pytest.raises(CorruptSnapshotError):
        tier.read(SpillFile(file.path, compressible, len(raw)), str(sid), expect=expect(sid, buf))
    assert find(tier, sid) is None and len(tier.quarantined()) == 1


def test_a_spill_root_owned_by_another_user_or_a_symlink_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    if os.geteuid() == 0:
        os.chown(theirs, 65534, 65534)
    else:
        theirs = Path("/")  # owned by root, not by this user
    with pytest.raises(SnapshotFolderError, match="belongs to uid"):
        DiskTier(theirs)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o777)
    os.chmod(mine, 0o777)
    os.symlink(mine, tmp_path / "link")
    with pytest.raises(SnapshotFolderError, match="symlink"):
        DiskTier(tmp_path / "link")
    DiskTier(mine)
    assert stat.S_IMODE(os.stat(mine).st_mode) == 0o700  # an open spill folder is made private


def test_the_writer_refuses_a_buffer_of_another_snapshot(tier):
    buf = packed("p")
    with pytest.raises(CorruptSnapshotError, match="policy 'p', not 'q'"):
        tier.write_temp(SnapshotId("q", 1), buf, parse_header(buf, name="x"))
    assert not (tier.root / "q").exists() or not any((tier.root / "q").iterdir())
    restored = tier.read(spill(tier, SnapshotId("p", 1), buf), "p@v1")  # a restored buffer records its version
    with pytest.raises(CorruptSnapshotError, match="version '1', not 2"):
        tier.write_temp(SnapshotId("p", 2), restored, parse_header(restored, name="x"))
    assert same_data(tier.read(spill(tier, SnapshotId("p", 1), restored), "p@v1"), buf)  # its own place: fine


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=2048), compressed=st.booleans(), prefix=st.sampled_from([b"", b"valid"]))
def test_any_bytes_on_disk_are_served_exactly_or_refused(tmp_path, data, compressed, prefix):
    tier = DiskTier(tmp_path / f"fuzz-{os.urandom(4).hex()}")
    sid = SnapshotId("p", 1)
    if prefix:  # a valid file with random bytes spliced in
        good = bytearray(packed("p").tobytes())
        at = len(data) % len(good)
        good[at : at + len(data)] = data
        data = bytes(good[: len(good)])
    (tier.root / "p").mkdir(mode=0o700)
    path = tier.path_for(sid, compressed)
    path.write_bytes(lz4.frame.compress(data) if compressed and len(data) % 2 else data)
    result = tier.scan()
    assert len(result.entries) + len(tier.quarantined()) == 1
    if result.entries:
        try:
            out = tier.read(result.entries[0].file, str(sid))
        except CorruptSnapshotError:
            return
        assert parse_header(out, name="out").checksum  # served only what verifies


@pytest.mark.parametrize("mib", [0, 9])
@pytest.mark.parametrize("error", [RuntimeError("object store full"), OSError(5, "EIO"), CorruptSnapshotError("x")])
def test_a_failing_put_is_not_the_files_fault(tier, mib, error):
    sid = SnapshotId("p", 1)
    buf = pack({"w": torch.randn(mib * 2**18 + 100)}, policy_id="p")
    file = spill(tier, sid, buf)

    def put(_):
        raise error

    with pytest.raises(type(error)):
        tier.restore(file, str(sid), expect=expect(sid, buf), put=put)
    assert find(tier, sid) == file and tier.quarantined() == []


def test_running_out_of_space_mid_write_leaves_no_partial_file(tiny_disk):
    disk = DiskTier(tiny_disk, compress=False)
    buf = pack({"w": torch.randn(1 << 20)}, policy_id="big")  # 4 MiB on a 3 MiB file system
    with pytest.raises(DiskFullError, match="disk full while spilling big"):
        disk.write_temp(SnapshotId("big", 1), buf, parse_header(buf, name="big"), "big")
    assert list(tiny_disk.iterdir()) == []  # nor the policy's folder, made for it


def test_a_policys_folder_goes_with_its_last_file_even_while_spills_of_it_race_the_deletes(tier):
    buf = packed("p")
    first, second = spill(tier, SnapshotId("p", 1), buf), spill(tier, SnapshotId("p", 2), buf)
    tier.remove(first)
    assert (tier.root / "p").is_dir()  # another file still in it
    tier.remove(second)
    assert not (tier.root / "p").exists()
    # threads spilling and deleting the same policy at once: every spill lands (its folder made again when a delete
    # removed it meanwhile), and once all are deleted nothing is left
    errors: list[BaseException] = []

    def churn(start: int) -> None:
        try:
            for version in range(start, start + 400, 4):
                tier.remove(spill(tier, SnapshotId("p", version), buf))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(start,)) for start in range(3, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(os.listdir(tier.root)) == []
