"""Default spill folders of ended Ray sessions are removed when a store starts; those of live sessions stay. Real
processes stand for live sessions (a process naming the session on its command line, as Ray's GCS and raylet do),
and a real store start does the sweep."""

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import ray

import policystore
from policystore import leftovers
from policystore.config import StoreConfig, staging_dir

BASE = Path(StoreConfig.default_root("x")).parent


def _ended_name() -> str:
    """A session name no Ray ever used (any store starting on this machine may sweep its folder, not only ours)."""
    return f"session_2000-01-01_00-00-00_{random.randrange(10**6):06d}_{os.getpid()}"


def _session_folder(name: str) -> Path:
    folder = BASE / name / "node"
    folder.mkdir(parents=True)
    (folder / "main_0").mkdir()
    (folder / "main_0" / "0000000001.safetensors").write_bytes(b"x" * 100)
    return folder.parent


def test_ended_sessions_go_live_ones_stay(tmp_path):
    ended = _session_folder(_ended_name())
    live_name = _ended_name()
    live = _session_folder(live_name)
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", f"--session-name={live_name}"],
                              stdin=subprocess.PIPE)
    try:
        assert live_name in leftovers.live_sessions()
        removed = leftovers.sweep()
        assert not ended.exists()  # by this sweep, or by a store that started meanwhile
        assert live.exists() and live not in removed
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    leftovers.sweep()
    assert not live.exists()  # its process is gone: the session ended


def test_a_store_start_sweeps_ended_sessions_and_keeps_its_own():
    ended = _session_folder(_ended_name())
    ray.init(address="local", num_cpus=1, object_store_memory=100_000_000, include_dashboard=False,
             logging_level="warning")
    try:
        store = policystore.connect(policystore.StoreConfig())
        store.publish("main_0", {"w": __import__("torch").ones(2)})
        own = Path(StoreConfig.default_root(ray.get_runtime_context().get_session_name()))
        deadline = time.monotonic() + 60
        while ended.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not ended.exists()
        assert own.is_dir()  # this session's folder, in use
        staged = list(staging_dir().glob(f"{os.getpid()}-*"))
        assert staged  # this driver's staging file, kept from publish to publish
    finally:
        policystore.client.shutdown_all()
        leftovers.shutdown_ray()
    assert not any(p.exists() for p in staged)  # a driver ending its Ray leaves no staging file behind
    deadline = time.monotonic() + 30  # the session ended with ray.shutdown: a sweep takes its folder
    while own.exists() and time.monotonic() < deadline:
        leftovers.sweep()
        time.sleep(0.5)
    assert not own.exists()


def test_staging_files_of_gone_publishers_go_and_then_their_folder(tmp_path):
    """Ray kills its workers when a session stops, so a publisher cannot remove its own staging file: a driver's
    ``shutdown_ray`` (and every store start) removes the files whose process is gone, then the emptied folder."""
    from policystore import staging

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    folder = tmp_path / "staging"
    folder.mkdir()
    (folder / f"{gone.pid}-abc").write_bytes(b"x")
    (folder / f"{os.getpid()}-def").write_bytes(b"x")  # a live publisher's: it may be publishing right now
    (folder / "not-a-pid").write_bytes(b"x")  # not ours to judge
    staging.remove_orphans(folder)
    assert sorted(p.name for p in folder.iterdir()) == [f"{os.getpid()}-def", "not-a-pid"]
    (folder / f"{os.getpid()}-def").unlink()
    (folder / "not-a-pid").unlink()
    (folder / f"{gone.pid}-ghi").write_bytes(b"x")
    staging.remove_orphans(folder)
    assert not folder.exists()


def test_a_publisher_removing_the_last_staging_file_removes_the_folder_too(tmp_path):
    """A process ending (``policystore.close``, or its exit) removes its staging file; if it was the last one, the
    folder in /dev/shm goes with it, so nothing is left behind when no store runs anymore to sweep it."""
    from policystore.staging import StagingFile

    folder = tmp_path / "staging"
    folder.mkdir()

    def staged(name: str) -> StagingFile:
        path = folder / name
        return StagingFile(path, os.open(path, os.O_RDWR | os.O_CREAT, 0o600))

    first, second = staged(f"{os.getpid()}-a"), staged(f"{os.getpid()}-b")
    first.alloc(4096)[:] = 1
    first.remove()
    assert [p.name for p in folder.iterdir()] == [f"{os.getpid()}-b"]  # another publisher's file keeps it
    second.remove()
    assert not folder.exists()
