"""Shared fixtures: one Ray session per test module (Ray takes ~3 s to start on 2 cores)."""

import os
from pathlib import Path

import pytest
import ray

ROOT = Path(__file__).resolve().parents[1]
# Ray workers inherit the driver's environment on a local cluster: let them import test modules and the project.
_paths = (str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH"))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in _paths if p)


@pytest.fixture(scope="module")
def ray_session():
    ray.init(address="local", num_cpus=2, object_store_memory=1_500_000_000, include_dashboard=False,
             logging_level="warning")
    yield
    ray.shutdown()


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
