"""``policystore rm`` and ``gc`` on a stopped league's folder, with no cluster running: the command serves the folder
with a private local Ray for the change (the same catalog and store code as online), then stops it. A trainer's run
folder leads to its store, and a folder a running trainer holds is refused."""

import contextlib
import fcntl
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from policystore import cli as policystore_cli
from policystore.cli import EXIT_OK, EXIT_USAGE
from policystore.durable import FLOOR_SUFFIX, TOMBSTONE_SUFFIX, DurableTier
from policystore.filenames import version_name
from policystore.format import pack, parse_header
from policystore.ids import SnapshotId

ROOT = Path(__file__).resolve().parents[2]
LEAGUE = """
import sys, ray, torch, policystore
ray.init(address="local", num_cpus=1, object_store_memory=100_000_000, include_dashboard=False)
store = policystore.connect(policystore.StoreConfig(spill_dir=sys.argv[1]))
for step, meta in enumerate([{}, {"frozen": True}, {}, {}]):
    store.publish("main_0", {"w": torch.full((4,), float(step))}, meta)
store.flush()
policystore.client.shutdown_all()
ray.shutdown()
"""


def cli(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run([sys.executable, "-m", "policystore", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)


def versions(run: Path) -> list[int]:
    """``policystore --dir RUN --json ls``, in this process: an offline listing reads the folder and starts no Ray
    (a process of its own per listing would only add its imports; the commands that change the folder run as
    the user runs them)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert policystore_cli.main(["--dir", str(run), "--json", "ls"]) == EXIT_OK
    return [row["version"] for row in json.loads(out.getvalue())]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A stopped trainer-style run folder: config.json beside store/, where a league of main_0 v1..v4 (v2 frozen)
    ran and stopped."""
    run = tmp_path_factory.mktemp("offline") / "run"
    (run / "store").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    subprocess.run([sys.executable, "-c", LEAGUE, str(run / "store")], cwd=ROOT, check=True, timeout=300)
    return run


def test_gc_and_rm_change_a_stopped_league_offline(run):
    assert versions(run) == [1, 2, 3, 4]  # --dir on the run folder reads its store
    result = cli("--dir", str(run), "gc", "--keep-last", "1", "--keep-meta", "frozen")
    assert result.returncode == EXIT_OK, result.stderr
    assert versions(run) == [2, 4]
    result = cli("--dir", str(run / "store"), "rm", "main_0", "2")
    assert result.returncode == EXIT_OK, result.stderr
    assert versions(run) == [4]
    assert not list(Path(run / "store" / "main_0").glob("0*2.*"))  # its file is gone, not only its listing


def test_a_folder_a_running_trainer_holds_is_refused(run):
    before = versions(run)
    with open(run / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = cli("--dir", str(run), "rm", "main_0", "4")
    assert result.returncode == EXIT_USAGE and "a trainer runs in" in result.stderr
    assert versions(run) == before


def test_gc_on_a_durable_tier_folds_the_tombstones_of_its_deletes(tmp_path):
    """Each delete leaves a tombstone in the durable tier; gc folds them into the policy's floor, so the tier does
    not keep a file per deleted version, and the deleted versions stay deleted."""
    durable = tmp_path / "durable"
    tier = DurableTier.open(str(durable))
    for version in (1, 2, 3, 4):
        buf = pack({"w": np.full(4, version, dtype=np.float32)}, policy_id="main_0", meta={})
        tier.write(SnapshotId("main_0", version), buf, parse_header(buf, name=f"main_0@v{version}"))
    result = cli("--dir", str(durable), "--json", "gc", "--keep-last", "1")
    assert result.returncode == EXIT_OK, result.stderr
    out = json.loads(result.stdout)
    assert out["deleted"] == ["main_0@v1", "main_0@v2", "main_0@v3"] and out["tombstones_folded"] >= 3
    names = sorted(p.name for p in (durable / "main_0").iterdir())
    assert not [n for n in names if n.endswith(TOMBSTONE_SUFFIX)], names
    assert [n for n in names if n.endswith(FLOOR_SUFFIX)] == [version_name(3, FLOOR_SUFFIX)], names
    assert versions(durable) == [4]
