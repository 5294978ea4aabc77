"""Shared fixtures: one Ray session per pytest process, shared by the modules that use it (Ray takes 3-5 s to start
and stop on 2 cores)."""

import contextlib
import gc
import getpass
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import pytest
import ray
import torch

from policystore import session, staging

ROOT = Path(__file__).resolve().parents[1]
# Ray workers inherit the driver's environment on a local cluster: let them import the project and test modules
# (pytest imports each by its file name from its own folder, one folder per package under test).
_TEST_DIRS = [ROOT / "tests", *sorted(p for p in (ROOT / "tests").iterdir() if p.is_dir() and any(p.glob("test_*.py")))]
_paths = (str(ROOT), *map(str, _TEST_DIRS), os.environ.get("PYTHONPATH"))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in _paths if p)


_EXIT_STATUS = pytest.StashKey[int]()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """End pytest's process once the session has reported, without the interpreter's finalization: a run whose
    tests had all passed and whose summary was printed once died there with SIGSEGV (exit 139, no Python
    traceback), after Ray sessions had mapped and unmapped the object store many times in this one process. The
    exit status is the session's own; the cause in finalization is still to be found."""
    if _EXIT_STATUS in config.stash:
        session.close()  # its staging file: os._exit skips the finalizer that would remove it
        if not hasattr(config, "workerinput"):  # the run's own: pytest's per-user folder, emptied by the retention,
            with contextlib.suppress(OSError):  # and the staging folder the workers' processes left in /dev/shm
                Path(tempfile.gettempdir(), f"pytest-of-{getpass.getuser()}").rmdir()
            staging.remove_orphans()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(config.stash[_EXIT_STATUS])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    """Shortly before pytest-timeout fails a stuck test (its stack shows only this process's side), print the
    Python stack of every Ray worker process on the machine: the call that never returns waits on one of them."""
    limit = item.config.getini("timeout")
    capture = item.config.pluginmanager.getplugin("capturemanager")
    timer = threading.Timer(max(float(limit or 0) - 30, 1), _print_ray_stacks, (capture,)) if limit else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    yield
    if timer is not None:
        timer.cancel()


def _print_ray_stacks(capture) -> None:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    with capture.global_and_fixture_disabled():  # to the terminal: the timeout ends the process, captures and all
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if cmdline.startswith("ray::"):  # Ray's workers name themselves so (idle ones "ray::IDLE")
                dump = subprocess.run([py_spy, "dump", "--pid", str(proc.info["pid"])], capture_output=True,
                                      text=True, timeout=30, check=False)
                print(f"--- Ray process {proc.info['pid']}: {cmdline[:120]}\n{dump.stdout}{dump.stderr}",
                      file=sys.stderr)


# Seconds the long test files (or tests) take on 2 cores: a quiet whole-suite run's --durations (2 workers) summed
# per file, less what a later change to a file's scenario took out (an estimate until the next such run).
# pytest-xdist hands whole files to its two workers (--dist loadfile: a module's shared Ray session, Algorithm or
# cluster stays on one worker) in the order set here, the longest first, so that both workers end together instead
# of one finishing alone with a long file picked up last. What is not listed is short and comes after, in
# collection order. Only the order depends on these figures: refresh them when a file grows.
LONG = {
    "tests/policystore/test_durable.py": 105,
    "tests/policystore/test_cluster.py": 100,
    "tests/benchmarks/test_benchmarks_smoke.py::test_quick_run_writes_results[memory_scaling]": 85,
    "tests/trainer/test_trainer_e2e.py": 75,
    "tests/policystore/test_watch.py": 75,
    "tests/policystore/test_cli_offline.py": 64,
    "tests/benchmarks/test_partition_net_quick.py": 57,
    "tests/rllib/test_rllib_league.py": 56,
    "tests/rllib/test_rllib_memory.py": 50,
    "tests/rllib/test_rllib_tune.py": 50,
    "tests/benchmarks/test_chaos_quick.py": 46,
    "tests/benchmarks/test_benchmarks_smoke.py::test_quick_run_writes_results[league_throughput]": 46,
    "tests/trainer/test_own_games.py": 42,
    "tests/workers/test_workers_rollout.py": 40,
    "tests/test_package.py": 40,
    "tests/rllib/test_rllib_restore.py": 37,
    "tests/benchmarks/test_fanout_net_quick.py": 35,
    "tests/policystore/test_protect.py": 34,
    "tests/policystore/test_catalog_recovery.py": 34,
    "tests/rllib/test_rllib_lifecycle.py": 30,
    "tests/rllib/test_rllib_stock.py": 30,
    "tests/rllib/test_rllib_nim.py": 30,
    "tests/policystore/test_tenancy.py": 25,
    "tests/policystore/test_client.py": 28,
    "tests/benchmarks/test_benchmarks_smoke.py::test_quick_run_writes_results[publish]": 27,
    "tests/policystore/test_metrics.py": 25,
    "tests/policystore/test_remote.py": 23,
    "tests/test_docs.py": 24,
    "tests/policystore/test_reader.py": 23,
    "tests/policystore/test_server.py": 20,
    "tests/policystore/test_idle_catalog.py": 19,
    "tests/benchmarks/test_benchmarks_smoke.py::test_quick_run_writes_results": 18,  # the other benchmarks
}
# Files whose tests share nothing (each runs its own subprocess): handed out test by test, so that a file of
# several long runs is spread over both workers.
INDEPENDENT = {"tests/benchmarks/test_benchmarks_smoke.py"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """The long files first (LONG), then the files of the shared Ray session; the sort is stable: a file's tests
    keep their order."""
    def expected_s(item: pytest.Item) -> float:
        return max((s for key, s in LONG.items() if item.nodeid.startswith(key)), default=0.0)

    _SHARED_RAY_MODULES.update(item.nodeid.split("::", 1)[0] for item in items if "ray_session" in item.fixturenames)
    # among files of the same expected time, those of the shared Ray session first: a worker that takes them one
    # after another keeps its session
    items.sort(key=lambda item: (-expected_s(item), item.nodeid.split("::", 1)[0] not in _SHARED_RAY_MODULES))


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, in the collection order above (xdist would hand out the files with the most tests first,
    and so the long single-test files last), with the tests of INDEPENDENT files handed out one by one."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LongestFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return nodeid if path in INDEPENDENT else path

    config.option.loadscopereorder = False
    return LongestFirst(config, log)


@pytest.fixture(autouse=True)
def _same_random_state():
    """Every test starts from one random state: an unseeded net, draw or deal must not pass or fail by which tests
    ran before it on the same worker."""
    random.seed(0)
    torch.manual_seed(0)
    np.random.seed(0)


# Modules that ask for the shared Ray session (``ray_session``, directly or through another fixture): set at
# collection. Any other module that may use Ray finds none running (_no_shared_ray_in_other_modules).
_SHARED_RAY_MODULES: set[str] = set()
_MAY_USE_RAY = re.compile(r"\bray\b|policystore\.trainer|subprocess", re.IGNORECASE)  # its source says so


def _end_ray() -> None:
    """``ray.shutdown()`` once this process's follower threads have ended (a Ray call of theirs during the
    shutdown would end the pytest process)."""
    session.close()
    ray.shutdown()


@pytest.fixture(scope="session")
def _shared_ray():
    """The pytest process's shared Ray session, while one is up ({"session": its name}); ended with the run."""
    shared: dict[str, str] = {}
    yield shared
    if shared and ray.is_initialized():
        _end_ray()


@pytest.fixture(scope="module")
def ray_session(_shared_ray):
    """One Ray session per pytest process, shared by the modules that use it one after another (a start and a
    shutdown cost 3-5 s on 2 cores). Each module still starts as on a fresh session: no policystore actor of any
    league, no store folder or catalog database of the session's default root, nothing cached in this process
    (_forget_policystore_state after each module)."""
    if not (_shared_ray and ray.is_initialized()
            and ray.get_runtime_context().get_session_name() == _shared_ray["session"]):
        if ray.is_initialized():
            _end_ray()
        ray.init(address="local", num_cpus=2, object_store_memory=1_500_000_000, include_dashboard=False,
                 logging_level="warning")
        _shared_ray["session"] = ray.get_runtime_context().get_session_name()
    yield
    if ray.is_initialized() and ray.get_runtime_context().get_session_name() == _shared_ray.get("session"):
        _forget_policystore_state(_shared_ray["session"])
        if _all_cpus_free_within(10.0):
            return
    # a test ended the session or started another, or something of this module still holds CPUs: the next module
    # starts a session of its own
    _shared_ray.clear()
    _end_ray()


def _all_cpus_free_within(seconds: float) -> bool:
    """Whether every CPU of the session is free again (the module's actors, their handles dropped, are gone)."""
    gc.collect()
    deadline = time.monotonic() + seconds
    while ray.available_resources().get("CPU", 0.0) < ray.cluster_resources().get("CPU", 0.0) - 1e-6:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _forget_policystore_state(session_name: str) -> None:
    """What a new Ray session would leave behind of policystore: its actors (stores and catalogs of every league,
    killed for good), the session's default spill root (a later default-league store must not rebuild from it)
    and this process's per-league state."""
    from policystore import remote, session
    from policystore.config import StoreConfig

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == remote.NAMESPACE]
    for name in names:
        remote.kill(name)
    with session._session_lock:
        for state in session._sessions.values():
            state.close()
        session._sessions.clear()
    shutil.rmtree(StoreConfig.default_root(session_name), ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def _no_shared_ray_in_other_modules(request, _shared_ray):
    """A module that does not use the shared session but may use Ray (its own ``ray.init``, a cluster, a trainer
    or a subprocess that starts one) runs with no shared session up, as it would alone."""
    if _shared_ray and request.node.nodeid not in _SHARED_RAY_MODULES \
            and _MAY_USE_RAY.search(Path(request.node.path).read_text()):
        _shared_ray.clear()
        if ray.is_initialized():
            _end_ray()


@pytest.fixture
def make_store(ray_session, tmp_path):
    """A fresh node store with the given StoreConfig fields (spill_dir defaults to a per-test temp dir)."""
    import policystore

    def make(**fields):
        policystore.client.shutdown_all()
        fields.setdefault("spill_dir", str(tmp_path / "spill"))
        return policystore.connect(policystore.StoreConfig(**fields))

    yield make
    policystore.client.shutdown_all()


@dataclass(frozen=True)
class S3Server:
    port: int
    bucket: str


@pytest.fixture(scope="module")
def s3_server():
    """A real S3-compatible server (moto's server mode) on a free loopback port, with one bucket."""
    from benchmarks.s3gate import S3Gate

    gate = S3Gate()
    yield S3Server(gate.server_port, gate.bucket)
    gate.close()
