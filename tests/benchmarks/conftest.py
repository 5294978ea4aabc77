"""What the benchmarks' --quick tests share: a run through the real CLI that must succeed and leave no staging file
of its processes in /dev/shm; the network testbed's check (its tests skip with its reason without root and
CAP_NET_ADMIN; CI runs as root) and one run of a scenario under a tag of its own, which must leave nothing behind
(namespaces, links, its folder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from policystore import staging

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _module(name: str, *args: str, timeout: int) -> tuple[subprocess.CompletedProcess, set[int]]:
    """``python -m name *args``, and the pids of every process seen below it while it ran (its Ray nodes and
    workers). Past ``timeout`` it gets SIGTERM, on which a testbed removes what it built (a SIGKILL, subprocess.run's
    way, would leave its namespaces and Ray nodes running), then fails the test."""
    proc = subprocess.Popen([sys.executable, "-m", name, *args], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    watcher = threading.Thread(target=_watch_below, args=(proc, seen), daemon=True)
    watcher.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"python -m {name} took more than {timeout} s; its stderr ends: {err[-4000:]}")
    watcher.join()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), seen


def _watch_below(proc: subprocess.Popen, seen: set[int]) -> None:
    while proc.poll() is None:
        try:
            seen.update(child.pid for child in psutil.Process(proc.pid).children(recursive=True))
        except psutil.Error:
            pass
        time.sleep(0.2)


@pytest.fixture
def run_quick() -> Callable[..., subprocess.CompletedProcess]:
    """``run(benchmark, *args, timeout=...)``: ``python -m benchmarks.<benchmark> --quick *args``, which must exit 0
    and leave no staging file of its processes in /dev/shm (Ray kills its workers when the session ends, so only
    the driver ending its session can remove theirs). Only its own processes count: the other test process's Ray
    sessions start and end meanwhile."""
    def run(benchmark: str, *args: str, timeout: int) -> subprocess.CompletedProcess:
        result, pids = _module(f"benchmarks.{benchmark}", "--quick", *args, timeout=timeout)
        assert result.returncode == 0, result.stderr[-4000:]
        left = [name for name in staging.orphans() if staging.publisher_of(name) in pids]
        assert not left, f"the run left the staging files of its workers in /dev/shm: {left}"
        return result

    return run


@pytest.fixture(scope="session")
def testbed_reason() -> None:
    """Skips the test, saying why, where the testbed cannot run (checked once per session)."""
    check, _ = _module("benchmarks.netbed", "--check", timeout=60)
    if check.returncode:
        pytest.skip(check.stdout.strip())


@pytest.fixture
def quick_on_testbed(testbed_reason, tmp_path) -> Callable[[str, int], list[dict]]:
    """``run(module, timeout_s)``: the JSON rows of ``python -m <module> --quick`` on its own testbed."""
    def run(module: str, timeout_s: int) -> list[dict]:
        tag = f"q{uuid.uuid4().hex[:3]}"
        result, _ = _module(module, "--quick", "--tag", tag, "--out", str(tmp_path / "out"), timeout=timeout_s)
        assert result.returncode == 0, result.stderr[-4000:]
        assert json.loads(_module("benchmarks.netbed", "--leftovers", tag, timeout=60)[0].stdout) == []
        return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]

    return run
