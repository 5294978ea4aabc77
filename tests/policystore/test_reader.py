"""policystore.reader, the Ray-free reader of spill and durable folders: on files a real store wrote, and bad ones."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from policystore.errors import (
    CorruptSnapshotError,
    InvalidPolicyIdError,
    ReadOnlyWeightsError,
    SnapshotFolderError,
    UnknownPolicyError,
    UnknownVersionError,
)
from policystore.format import pack, parse_header
from policystore.ids import SnapshotId
from policystore.reader import open_folder
from policystore.spill import DiskTier

ROOT = Path(__file__).resolve().parents[2]


def weights(seed: int, *, pruned: bool = False) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(128, 64, generator=gen)
    if pruned:
        w = w * (torch.rand(128, 64, generator=gen) > 0.8)
    return {"w": w, "b": torch.randn(64, generator=gen), "steps": torch.tensor(seed)}


def same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_reads_what_a_real_store_wrote(make_store, tmp_path):
    store = make_store(spill_dir=str(tmp_path / "spill"), compress=True)  # raw and lz4 files alike
    published = {("p", 1): weights(1), ("p", 2): weights(2), ("q", 1): weights(3, pruned=True)}
    for (pid, _), w in published.items():
        store.publish(pid, w, meta={"seed": int(w["steps"])})
    store.flush()
    folder = open_folder(store.stats().spill_dir)

    infos = {tuple(i.id): i for i in folder.list()}
    recorded = {tuple(i.id): i for i in store.list()}
    assert infos.keys() == published.keys()
    assert all(infos[k].checksum == recorded[k].checksum and infos[k].meta == recorded[k].meta for k in infos)
    assert infos[("q", 1)].compressed and not infos[("p", 1)].compressed
    assert [i.id.version for i in folder.list("p")] == [1, 2]

    latest = folder.get("p")
    assert latest.id == SnapshotId("p", 2) and same(dict(latest), published[("p", 2)])
    assert same(dict(folder.get("p", 1)), published[("p", 1)])
    with pytest.raises(ReadOnlyWeightsError):
        latest["w"].add_(1)
    mine = folder.tensors("q")
    assert same(mine, published[("q", 1)]) and type(mine["w"]) is torch.Tensor
    mine["w"].add_(1)  # a private copy: the file is unchanged
    assert same(dict(folder.get("q")), published[("q", 1)])
    assert folder.verify() == []

    # and without Ray: a fresh process that never starts it reads the same bytes
    code = f"""
import sys, torch
from policystore.reader import open_folder
snap = open_folder({str(folder.path)!r}).get("p", 2)
import ray
print("ray_started", ray.is_initialized(), "checksum", snap.checksum, "w", tuple(snap["w"].shape))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    expected = f"ray_started False checksum {recorded[('p', 2)].checksum} w (128, 64)"
    assert expected in out.stdout, out.stderr[-2000:]


@pytest.fixture
def spill_folder(tmp_path) -> tuple[Path, dict[SnapshotId, np.ndarray]]:
    tier = DiskTier(tmp_path / "spill", compress=True)
    bufs = {SnapshotId("p", v): pack(weights(v), policy_id="p", meta={"v": v}) for v in (1, 2, 3)}
    for sid, buf in bufs.items():
        tier.commit(tier.write_temp(sid, buf, parse_header(buf, name=str(sid))), sid)
    return tier.root, bufs


def test_bad_files_are_reported_never_served_and_never_touched(spill_folder, tmp_path):
    root, bufs = spill_folder
    p = root / "p"
    raw = bytearray((p / "0000000002.safetensors").read_bytes())
    raw[-3] ^= 0x10
    (p / "0000000002.safetensors").write_bytes(raw)  # damaged data
    shutil.copy(p / "0000000001.safetensors", p / "0000000004.safetensors")  # v1's bytes in v4's place
    outside = tmp_path / "outside.safetensors"
    shutil.copy(p / "0000000003.safetensors", outside)
    os.symlink(outside, p / "0000000005.safetensors")  # a link to a valid file: never followed
    os.symlink(tmp_path / "nowhere", root / "dangling")
    (root / "junk file").write_text("x")
    before = sorted((str(f), f.lstat().st_size) for f in root.rglob("*"))

    folder = open_folder(root)
    assert [i.id.version for i in folder.list()] == [1, 2, 3]  # v2's header is fine: only reading finds it
    problems = folder.verify()
    assert len(problems) == 2
    assert any("0000000002" in line and "checksum" in line for line in problems)
    assert any("0000000004" in line and "version" in line for line in problems)
    with pytest.raises(CorruptSnapshotError):
        folder.get("p", 2)
    with pytest.raises(CorruptSnapshotError, match="version"):
        folder.get("p")  # the highest version on disk is v4, which is not whole: refused, not silently v3
    with pytest.raises(UnknownVersionError):
        folder.get("p", 5)
    assert same(dict(folder.get("p", 3)), weights(3))
    assert folder.verify("p", 3) == []
    assert sorted((str(f), f.lstat().st_size) for f in root.rglob("*")) == before  # nothing moved or deleted


@pytest.mark.parametrize("size", [0, 4096], ids=["emptied", "cut short"])
def test_views_survive_another_process_truncating_their_file(spill_folder, size):
    """A shared map of the file would kill the reader with SIGBUS on its next read of a lost page: the views hold
    a private copy, and the damaged file is refused afterwards."""
    root, _ = spill_folder
    path = root / "p" / "0000000002.safetensors"
    crc = zlib.crc32(path.read_bytes())
    code = f"""
import subprocess, zlib
from policystore.errors import CorruptSnapshotError
from policystore.reader import open_folder
folder = open_folder({str(root)!r})
snap = folder.get("p", 2)
subprocess.run(["truncate", "-s", "{size}", {str(path)!r}], check=True)
print("crc", zlib.crc32(snap.buffer), "sum", float(snap["w"].double().sum()), flush=True)
try:
    folder.get("p", 2)
except CorruptSnapshotError as exc:
    print("refused", exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, f"rc {out.returncode}: {out.stderr[-2000:]}"
    assert path.stat().st_size == size
    w = weights(2)["w"].double().sum().item()
    assert f"crc {crc} sum {w}" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "refused" in out.stdout, out.stdout


def test_durable_folder_layout(tmp_path):
    """A file:// durable folder: commit markers name immutable data objects and the checksum they must have."""
    root = tmp_path / "durable"
    (root / "p").mkdir(parents=True)
    bufs = {}
    for v in (1, 2, 3):
        buf = bufs[v] = pack(weights(v), policy_id="p", meta={"v": v})
        header = parse_header(buf, name="x")
        name = f"{v:010d}.{os.urandom(8).hex()}.safetensors"
        (root / "p" / name).write_bytes(buf.tobytes())
        marker = {"policy_id": "p", "version": v, "object": name, "nbytes": len(buf), "checksum": header.checksum,
                  "meta": {"v": v}, "created": 1.0, "layout": 1}
        if v == 3:
            marker["checksum"] = "crc32c:00000000"  # the marker and the data disagree
        (root / "p" / f"{v:010d}.commit.json").write_text(json.dumps(marker))
    (root / "p" / f"{4:010d}.{os.urandom(8).hex()}.safetensors").write_bytes(bufs[1].tobytes())  # no marker
    (root / "p" / f"{5:010d}.commit.json").write_text('{"policy_id": "p", "version": 5, "object": "../../etc/x"')
    folder = open_folder(root)
    assert [(i.id.version, i.meta) for i in folder.list()] == [(1, {"v": 1}), (2, {"v": 2})]
    assert same(dict(folder.get("p", 2)), weights(2))
    assert same(folder.tensors("p", 1), weights(1))
    problems = folder.verify()
    assert len(problems) == 2 and any("v3" in line for line in problems) and any("v5" in line for line in problems)
    with pytest.raises(CorruptSnapshotError):
        folder.get("p")  # v5 is committed but unusable: refused rather than silently serving v2


def test_durable_versions_past_ten_digits_are_read_as_the_durable_tier_lists_them(tmp_path):
    """The reader takes marker names as the durable tier does: a version of 11 digits is a snapshot, not junk."""
    from policystore.durable import DurableTier

    tier = DurableTier.open(str(tmp_path / "durable"))
    sid = SnapshotId("p", 10**10)
    buf = pack(weights(1), policy_id="p")
    tier.write(sid, buf, parse_header(buf, name="x"))
    assert [s for s, _ in tier.list_committed()] == [sid]
    folder = open_folder(tmp_path / "durable")
    assert [i.id for i in folder.list()] == [sid] and folder.verify() == []
    assert same(folder.tensors("p"), weights(1))


def test_bad_requests_raise_clear_errors(spill_folder, tmp_path):
    root, _ = spill_folder
    folder = open_folder(root)
    with pytest.raises(UnknownPolicyError, match="policies here: \\['p'\\]"):
        folder.get("nope")
    with pytest.raises(InvalidPolicyIdError):
        folder.get("../p")
    with pytest.raises(SnapshotFolderError):
        open_folder(tmp_path / "missing")
    with open_folder(root) as again:
        assert len(again.list()) == 3
