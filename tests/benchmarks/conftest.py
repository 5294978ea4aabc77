"""What the network testbed's --quick tests share: the testbed's check (they skip with its reason without root and
CAP_NET_ADMIN; CI runs as root) and one run of a scenario through its real CLI under a tag of its own, which must
succeed and leave nothing behind (namespaces, links, its folder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _module(name: str, *args: str, timeout: int) -> subprocess.CompletedProcess:
    """``python -m name *args``; past ``timeout`` it gets SIGTERM, on which a testbed removes what it built (a
    SIGKILL, subprocess.run's way, would leave its namespaces and Ray nodes running), then fails the test."""
    proc = subprocess.Popen([sys.executable, "-m", name, *args], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
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
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="session")
def testbed_reason() -> None:
    """Skips the test, saying why, where the testbed cannot run (checked once per session)."""
    check = _module("benchmarks.netbed", "--check", timeout=60)
    if check.returncode:
        pytest.skip(check.stdout.strip())


@pytest.fixture
def quick_on_testbed(testbed_reason, tmp_path) -> Callable[[str, int], list[dict]]:
    """``run(module, timeout_s)``: the JSON rows of ``python -m <module> --quick`` on its own testbed."""
    def run(module: str, timeout_s: int) -> list[dict]:
        tag = f"q{uuid.uuid4().hex[:3]}"
        result = _module(module, "--quick", "--tag", tag, "--out", str(tmp_path / "out"), timeout=timeout_s)
        assert result.returncode == 0, result.stderr[-4000:]
        assert json.loads(_module("benchmarks.netbed", "--leftovers", tag, timeout=60).stdout) == []
        return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]

    return run
