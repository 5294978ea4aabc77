"""The catalog's commit point and its recovery, on a real local Ray with real files.

A catalog that loses its database while the stores run rebuilds the league from them and from the durable tier,
and never hands a version number out again for other bytes; a kill before the catalog's commit leaves nothing
visible anywhere (cluster, durable listing, ``policystore --dir``, a catalog rebuilt from the durable tier), and a
kill between the commit and its reply leaves the publish whole; one bad commit marker never stops the catalog.
Kills that cannot be timed from outside are injected in the actor's own process (``__ray_call__``), as SIGKILL.
"""

from __future__ import annotations

import functools
import json
import os
import signal
from pathlib import Path

import pytest
import ray
import torch
from helpers import eventually

import policystore
from policystore import cli
from policystore.catalog import CatalogServer
from policystore.config import StoreConfig
from policystore.durable import MARKER_SUFFIX, DurableTier, survey
from policystore.format import pack, parse_header
from policystore.ids import SnapshotId
from policystore.remote import CATALOG_NAME, NAMESPACE, store_name


def weights_of_mib(mib: float, seed: int = 0) -> dict[str, torch.Tensor]:
    return {"w": torch.randn(int(mib * 2**20) // 4, generator=torch.Generator().manual_seed(seed))}


def actor_pid(name: str) -> int:
    actor = ray.get_actor(name, namespace=NAMESPACE)
    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))


def answering(ask):
    """``ask()``, or None while its actor is restarting."""
    try:
        return ask()
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return None


def catalog_health():
    """The catalog's health once it answers (it may be restarting)."""
    catalog = ray.get_actor(CATALOG_NAME, namespace=NAMESPACE)
    return eventually(lambda: answering(lambda: ray.get(catalog.health.remote(), timeout=30)), "the catalog answers")


def same(snapshot, weights) -> bool:
    return torch.equal(snapshot["w"], weights["w"])


@pytest.mark.parametrize("damage", ["deleted", "garbage"])
def test_a_catalog_that_loses_its_database_while_stores_run_rebuilds_the_league(make_store, tmp_path, damage):
    durable_uri = str(tmp_path / "durable") if damage == "garbage" else None  # stores alone, or with markers
    store = make_store(durable_uri=durable_uri)
    weights = {v: weights_of_mib(0.25, seed=v) for v in (1, 2, 3, 4)}
    assert store.publish("p", weights[1], durable=True) == ("p", 1)
    assert store.publish("p", weights[2]) == ("p", 2)
    assert store.publish("p", weights[3]) == ("p", 3)
    if durable_uri:  # the delete then reaches its durable copy (deletes racing the background upload: not here)
        eventually(lambda: "durable" in store.list("p")[2].holders, "p@v3 is in the durable tier")
    store.delete("p", 3)  # its number must never name other bytes, though nothing holds it any more
    assert store.publish("q", weights[4], meta={"step": 4}) == ("q", 1)
    store.flush()
    db = Path(store.config.catalog_db(ray.get_runtime_context().get_session_name()))
    epoch = catalog_health().epoch
    for suffix in ("", "-wal", "-shm"):
        part = Path(f"{db}{suffix}")
        if damage == "deleted":
            part.unlink(missing_ok=True)
        elif part.exists():  # the WAL too: it holds the latest pages, and would be read over the main file
            part.write_bytes(os.urandom(part.stat().st_size or 4096))
    os.kill(actor_pid(CATALOG_NAME), signal.SIGKILL)  # Ray restarts it, without its database

    health = catalog_health()
    assert health.new and health.epoch != epoch and health.adopted == 3
    assert [tuple(s.id) for s in store.list()] == [("p", 1), ("p", 2), ("q", 1)]
    assert same(store.get("p", 1), weights[1]) and same(store.get("p", 2), weights[2])
    assert store.get("q").meta == {"step": 4}
    assert store.publish("p", weights_of_mib(0.25, seed=9)) == ("p", 4)  # above the deleted v3, never v3 again
    assert same(store.get("p", 1), weights[1]) and same(store.get("p", 4), weights_of_mib(0.25, seed=9))


@pytest.mark.parametrize("durable", [False, True])
def test_a_catalog_killed_between_its_commit_and_its_reply_leaves_the_publish_whole(make_store, tmp_path, durable):
    store = make_store(durable_uri=str(tmp_path / "durable"))
    store.publish("warm", weights_of_mib(0.1))

    def die_after_committing(catalog):  # the next answer about "victim" is never sent: SIGKILL after the commit
        entry = catalog._entry

        def dying(sid):
            if sid.policy_id == "victim":
                os.kill(os.getpid(), signal.SIGKILL)
            return entry(sid)

        catalog._entry = dying

    catalog = ray.get_actor(CATALOG_NAME, namespace=NAMESPACE)
    pid = actor_pid(CATALOG_NAME)
    ray.get(catalog.__ray_call__.remote(die_after_committing))
    weights = weights_of_mib(0.25, seed=5)
    assert store.publish("victim", weights, durable=durable) == ("victim", 1)  # the store asked the new catalog
    assert actor_pid(CATALOG_NAME) != pid  # the kill did happen
    assert [s.id.version for s in store.list() if s.id.policy_id == "victim"] == [1]
    assert same(store.get("victim", 1), weights) and store.verify("victim").ok
    if durable:
        assert SnapshotId("victim", 1) in dict(DurableTier.open(str(tmp_path / "durable")).list_committed())
    assert store.publish("victim", weights_of_mib(0.1)) == ("victim", 2)


@pytest.mark.parametrize("where", ["before_commit", "before_marker"])
def test_a_store_killed_mid_durable_publish_leaves_only_what_it_can_serve(make_store, tmp_path, capsys, where):
    uri = str(tmp_path / "durable")
    store = make_store(durable_uri=uri)
    kept = weights_of_mib(0.1, seed=1)
    store.publish("kept", kept, durable=True)

    def die_before_commit(server):  # killed when it is about to ask the catalog to commit
        catalog = server.state.catalog

        class Dying:
            def __getattr__(self, name):
                if name == "commit":
                    os.kill(os.getpid(), signal.SIGKILL)
                return getattr(catalog, name)

        server.state.catalog = Dying()

    def die_before_marker(server):  # killed after the catalog's commit, before the durable marker is written
        def dying(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)

        server.state.durable._put_marker = dying

    actor = ray.get_actor(store_name(store.node_id), namespace=NAMESPACE)
    pid = actor_pid(store_name(store.node_id))
    ray.get(actor.__ray_call__.remote(die_before_commit if where == "before_commit" else die_before_marker))
    weights = weights_of_mib(0.25, seed=7)
    with pytest.raises(policystore.StoreUnavailableError):
        store.publish("victim", weights, durable=True)
    eventually(lambda: answering(lambda: actor_pid(store_name(store.node_id))) not in (None, pid), "the store restarts")
    store.flush()  # its startup reconcile is done
    listed = [tuple(s.id) for s in store.list()]
    tier = DurableTier.open(uri)
    if where == "before_commit":  # never committed: nowhere, and nothing left behind
        assert listed == [("kept", 1)]
        assert catalog_health().reserved == 0
        # Nothing left but the tombstone that keeps the number used (written in the background).
        eventually(lambda: [p.name for p in (tmp_path / "durable" / "victim").glob("*")] in ([], [
            f"{1:010d}.deleted.json"]), "the aborted version's durable leftovers removed")
    else:  # committed: readable (from the node's disk), though the publisher saw an error
        assert listed == [("kept", 1), ("victim", 1)]
        assert same(store.get("victim", 1), weights)
    # The durable tier, `policystore --dir` and a catalog rebuilt from it never show what the cluster does not list
    # (a committed victim may already be there: the restarted store uploads what its disk holds and the tier lacks).
    assert ("kept", 1) in {tuple(sid) for sid, _ in tier.list_committed()} <= set(listed)
    capsys.readouterr()
    assert cli.main(["--dir", uri, "ls", "--json"]) == 0
    assert {(row["policy_id"], row["version"]) for row in json.loads(capsys.readouterr().out)} <= set(listed)
    rebuilt = CatalogServer(str(tmp_path / "rebuilt.sqlite3"), StoreConfig(), seed=functools.partial(survey, uri))
    assert ("kept", 1) in {tuple(e.id) for e in rebuilt.list()} <= set(listed)
    rebuilt.close()
    assert same(store.get("kept", 1), kept)


def test_bad_commit_markers_are_skipped_and_counted_and_never_stop_the_catalog(make_store, tmp_path):
    uri = tmp_path / "durable"
    tier = DurableTier.open(str(uri))
    good = pack({"w": torch.arange(10.0)}, policy_id="p", meta={"step": 1})
    tier.write(SnapshotId("p", 1), good, parse_header(good, name="p@v1"))
    marker = json.loads((uri / "p" / f"{1:010d}{MARKER_SUFFIX}").read_text())
    huge = 2**63 - 1
    (uri / "p" / f"{huge:010d}{MARKER_SUFFIX}").write_text(json.dumps({**marker, "version": huge,
                                                                        "object": f"{huge:010d}.x.safetensors"}))
    (uri / "p" / f"{2:010d}{MARKER_SUFFIX}").write_text('{"policy_id": "p", "vers')
    (uri / "p" / f"{3:010d}{MARKER_SUFFIX}").write_text(json.dumps({**marker, "version": 3, "meta": [1],
                                                                     "object": f"{3:010d}.x.safetensors"}))
    store = make_store(durable_uri=str(uri))  # a new catalog database: rebuilt from these markers
    health = catalog_health()
    assert (health.adopted, health.skipped) == (1, 3)
    problems = "\n".join(health.problems)
    assert f"p@v{huge}" in problems and "p@v3" in problems and f"{2:010d}{MARKER_SUFFIX}" in problems
    assert [tuple(s.id) for s in store.list()] == [("p", 1)]
    assert torch.equal(store.get("p", 1)["w"], torch.arange(10.0))
    assert policystore.connect().publish("p", {"w": torch.ones(3)}) == ("p", 2)
