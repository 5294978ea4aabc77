"""Tenancy on a real local Ray: drivers in different Ray namespaces (separate processes joining one cluster) each
get their own league: they cannot see, publish into or delete each other's snapshots by accident. Naming a
league explicitly reaches it (there is no authentication), and a job that names no namespace keeps using the
cluster's default league as before."""

import json
import subprocess
import sys

import pytest
import ray

import policystore
from policystore.remote import NAMESPACE, catalog_name, store_name

DRIVER = """
import json, sys
import ray, torch
import policystore
from policystore.errors import UnknownPolicyError

address, namespace, league, action = sys.argv[1:5]
ray.init(address=address, namespace=namespace or None, logging_level="error", log_to_driver=False)
store = policystore.connect(league=league or None)
out = {"league": store.league, "spill_dir": store.stats().spill_dir}
if action == "publish":
    out["published"] = [store.publish("main_0", {"w": torch.full((4,), float(v))}).version for v in (1, 2)]
elif action == "intrude":
    out["seen"] = [i.id.version for i in store.list()]
    try:
        store.get("main_0")
        out["get"] = "served"
    except UnknownPolicyError:
        out["get"] = "unknown"
    out["published"] = store.publish("main_0", {"w": torch.full((4,), 9.0)}).version
    out["deleted"] = [list(sid) for sid in store.delete("main_0")]
out["versions"] = [i.id.version for i in store.list() if i.id.policy_id == "main_0"] if action != "intrude" else []
out["latest"] = store.get("main_0")["w"].tolist() if out["versions"] else None
print("RESULT " + json.dumps(out))
"""


def drive(address: str, namespace: str, action: str, league: str = "") -> dict:
    done = subprocess.run([sys.executable, "-c", DRIVER, address, namespace, league, action], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


@pytest.fixture
def cluster(ray_session):
    yield ray.get_runtime_context().gcs_address
    for league in ("job_a", "job_b"):
        policystore.client.shutdown_all(league=league)
    policystore.client.shutdown_all()


def test_two_jobs_in_different_namespaces_do_not_collide(cluster):
    a = drive(cluster, "job_a", "publish")
    assert a["league"] == "job_a" and a["published"] == [1, 2] and a["latest"] == [2.0] * 4

    b = drive(cluster, "job_b", "intrude")  # same policy id, another job: its own league
    assert b["league"] == "job_b" and b["seen"] == [] and b["get"] == "unknown"
    assert b["published"] == 1 and b["deleted"] == [["main_0", 1]]
    assert b["spill_dir"] != a["spill_dir"]

    again = drive(cluster, "job_a", "read")  # job_a's league is untouched
    assert again["versions"] == [1, 2] and again["latest"] == [2.0] * 4

    anonymous = drive(cluster, "", "read")  # no namespace: the cluster's default league, which is empty here
    assert anonymous["league"] == "default" and anonymous["versions"] == []

    named = drive(cluster, "job_b", "read", league="job_a")  # naming a league reaches it: no authentication
    assert named["league"] == "job_a" and named["latest"] == [2.0] * 4

    names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE}
    node = ray.get_runtime_context().get_node_id()
    assert {catalog_name("job_a"), catalog_name("job_b"), store_name(node, "job_a"), store_name(node, "job_b")} <= names


def test_league_names_are_checked_and_must_agree(ray_session):
    with pytest.raises(policystore.ConfigError, match="invalid league"):
        policystore.connect(league="../x")
    with pytest.raises(policystore.ConfigError, match="disagrees"):
        policystore.connect(policystore.StoreConfig(league="one"), league="two")
