"""The ``policystore`` command joins a cluster the way ``ray.init()`` does, token authentication included, and
fails in seconds with one line naming the fix when it cannot: a real cluster with a token of its own, started by
another process (as a user's job would), and the command run as a user runs it (a subprocess, without the
``RAY_AUTH_MODE`` that a test's own ``ray.init`` would leave in its environment)."""

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from policystore.cli import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]
HEAD = """
import sys, ray, torch, policystore
for attempt in range(3):  # a node start can time out on an overloaded machine: that is not what is tested here
    try:
        ray.init(address="local", num_cpus=1, object_store_memory=200_000_000, include_dashboard=False)
        break
    except Exception:
        if attempt == 2:
            raise
store = policystore.connect(policystore.StoreConfig(spill_dir=sys.argv[1]))
store.publish("main_0", {"w": torch.ones(4)}, {"step": 1})
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # until the test closes it
policystore.client.shutdown_all()
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    return {**env, **extra}


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory):
    """(GCS address, token): a cluster started by another process with token authentication and a token of its own
    (not the one in ~/.ray/auth_token)."""
    tmp = tmp_path_factory.mktemp("head")
    token = secrets.token_hex(32)
    with open(tmp / "head.log", "w") as log:
        head = subprocess.Popen([sys.executable, "-c", HEAD, str(tmp / "spill")], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT,
                                env=_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token))
    try:
        address = head.stdout.readline().strip()
        assert address, f"the head process did not start: {(tmp / 'head.log').read_text()[-3000:]}"
        yield address, token
    finally:
        head.stdin.close()
        head.wait(timeout=120)


def cli(*argv: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "policystore", *argv], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env=_env(**env))
    return result, time.monotonic() - start


def test_joins_with_the_token_from_the_environment_or_a_token_file(token_cluster, tmp_path):
    address, token = token_cluster
    result, _ = cli("--address", address, "--json", "ls", RAY_AUTH_TOKEN=token)
    assert result.returncode == EXIT_OK, result.stderr
    assert [(r["policy_id"], r["version"]) for r in json.loads(result.stdout)] == [("main_0", 1)]
    assert "InvalidAuthToken" not in result.stderr
    (tmp_path / "token").write_text(token)
    result, _ = cli("--json", "ls", RAY_ADDRESS=address, RAY_AUTH_TOKEN_PATH=str(tmp_path / "token"))
    assert result.returncode == EXIT_OK, result.stderr
    # no address at all: the cluster `ray start` started on this machine, as `ray status` finds it (Ray's temp
    # folder here is the test's own, so no other job on the machine sees this record)
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(address)
    result, _ = cli("--json", "du", RAY_TMPDIR=str(tmp_path), RAY_AUTH_TOKEN=token)
    assert result.returncode == EXIT_OK, result.stderr
    assert json.loads(result.stdout)["total"]["versions"] == 1
    result, _ = cli("du", RAY_TMPDIR=str(tmp_path / "nothing"))
    assert result.returncode == EXIT_USAGE and "--address" in result.stderr


def test_quiet_by_default_verbose_on_request(token_cluster, tmp_path):
    """Reading a snapshot maps its pages read-only: said at INFO, so only -v prints it."""
    address, token = token_cluster
    quiet, _ = cli("--address", address, "export", "main_0", "-o", str(tmp_path / "a.safetensors"),
                   RAY_AUTH_TOKEN=token)
    assert quiet.returncode == EXIT_OK, quiet.stderr
    assert quiet.stderr.strip() == "", quiet.stderr
    verbose, _ = cli("--address", address, "-v", "export", "main_0", "-o", str(tmp_path / "b.safetensors"),
                     RAY_AUTH_TOKEN=token)
    assert verbose.returncode == EXIT_OK, verbose.stderr
    assert "mapped read-only in this process" in verbose.stderr


def test_a_wrong_or_missing_token_fails_in_seconds_with_one_line(token_cluster, tmp_path):
    address, _ = token_cluster
    result, seconds = cli("--address", address, "ls", RAY_AUTH_TOKEN="0" * 64)
    assert result.returncode == EXIT_PROBLEM
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # one line
    assert "refused this machine's token" in result.stderr and "RAY_AUTH_TOKEN" in result.stderr
    assert seconds < 15  # ray.init alone retries for ~20 s, a warning per try
    result, _ = cli("--address", address, "ls", RAY_AUTH_MODE="disabled")
    assert result.returncode == EXIT_PROBLEM
    assert "RAY_AUTH_MODE=disabled" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("address", ["nonsense", "local", "host:port", "127.0.0.1:99999", "http://127.0.0.1:6379"])
def test_a_bad_address_is_a_usage_error(address):
    result, _ = cli("--address", address, "ls")
    assert result.returncode == EXIT_USAGE, result.stderr
    assert "expected the head node's GCS address HOST:PORT" in result.stderr
    result, _ = cli("ls", RAY_ADDRESS=address)
    assert result.returncode == EXIT_USAGE and "RAY_ADDRESS" in result.stderr
