"""Chaos benchmark: publish and read through the public API while processes and nodes are killed at random.

On a ray.cluster_utils.Cluster of --nodes nodes (one machine, each node with its own raylet and object store),
for --minutes: learners on the head node publish a new version every --publish-ms (every --durable-every-th one
durable, the rest non-durable) and delete old non-durable ones (and about one in --race-every non-durable ones at
once, after a newer one, racing its background spill and upload); --readers reader threads on every node (spread over
--procs reader processes per node, fractional CPUs) get the latest or a listed version, recompute a CRC-32C of the
tensors they read and check it against the digest the learner recorded in the snapshot's meta and in the ledger,
and now and then call verify(). An injector (seeded by --seed) SIGKILLs a node's store, the catalog, a reader
process or a learner in the middle of a publish, removes a worker node and adds it back, deletes the catalog's
database (or writes garbage over it and its WAL) while the stores run, then SIGKILLs the catalog, and takes the
durable tier (a real S3-compatible server, moto on loopback, behind a switchable proxy: ``s3gate.py``) down,
hanging or answering every request with an error for 2 to 6 s, and fills the stores' spill disk (a tmpfs of
--spill-mib mounted for the run; the fault is skipped without root) from another writer for 2 to 6 s (both 1 to 2 s
with --quick, which injects at least 4 faults in a 3 s warm-up and 15 s of traffic). Learners
delete through both paths: the store's ``delete`` and the catalog actor's own (as any driver can call it).

Rows: one per fault kind (how many were injected, recovery time p50/p99/max in seconds) and one summary row:
  durable_lost       acknowledged durable snapshots that cannot be read back afterwards (must be 0)
  nondurable_lost    acknowledged non-durable ones lost; nondurable_unexplained counts those lost without a kill of
                     their publishing node's store after their publish (must be 0: that is the documented bound)
  wrong_reads        reads whose bytes did not match what the learner recorded (must be 0)
  backwards          a reader saw an older latest version than it had seen before (must be 0)
  versions_reused    snapshot ids acknowledged or read with two different digests: a version number handed out
                     again for other bytes (must be 0)
  read_success       successful reads / attempted reads; availability = reader time not inside a stall > 1 s
  longest_stall_s    the longest gap between two successful reads of one reader slot (across its restarts)
  deleted_resurrected  deleted snapshots a fresh catalog on the same durable tier would list (must be 0);
                     racing_deletes counts the deletes issued at once after their publish, catalog_deletes those
                     made through the catalog actor
  visible_unreadable   snapshots list() shows after the run (acknowledged or not) that cannot be read back whole
                     (must be 0), less visible_lost_nondurable: listed non-durable ones no node holds any more
                     (lost within the documented bound; list() still shows them, with no holder)
Recovery: store kill -> first read of a new version on that node; catalog kill -> first acknowledged publish and
first new-version read after it (the same for the catalog's database lost); reader kill -> that reader's next
successful read; learner kill -> its next acknowledged publish; node cycle -> first new-version read on the node
after it is added back; durable tier down, hanging or failing -> the first acknowledged durable publish after
it answers again; spill disk full -> the first acknowledged publish after the space is back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c
import psutil
import ray

from . import harness
from .harness import MiB
from .s3gate import S3Gate

log = logging.getLogger("benchmarks.chaos")

FAULTS = ("store_kill", "catalog_kill", "reader_kill", "learner_kill", "node_cycle", "catalog_db_loss",
          "durable_down", "durable_hang", "durable_errors", "disk_full")
DURABLE_FAULTS = {"durable_down": "down", "durable_hang": "hang", "durable_errors": "errors"}
HEAD = "chaos_node_0"
STALL_S = 1.0  # a gap between successful reads longer than this counts as unavailable time
THIN_S = 0.1  # readers report at most one success timestamp per this interval
KEEP_NONDURABLE = 20  # learners delete non-durable versions older than this many behind their latest


def digest(tensors: Any) -> str:
    """CRC-32C over every tensor's bytes, in name order: what a reader recomputes from what it was served."""
    crc = 0
    for name in sorted(tensors):
        tensor = tensors[name]
        crc = crc32c.crc32c(name.encode(), crc)
        crc = crc32c.crc32c(memoryview(tensor.detach().contiguous().numpy()).cast("B"), crc)
    return f"{crc:08x}"


@ray.remote(num_cpus=0, resources={HEAD: 0.01})
class Monitor:
    """Collects acknowledgements from learners and read reports from readers (on the head node, never killed)."""

    def __init__(self) -> None:
        self.acks: dict[tuple[str, int], dict[str, Any]] = {}
        self.deleted: set[tuple[str, int]] = set()
        self.confirmed: set[tuple[str, int]] = set()  # deletes that returned
        self.racing = 0
        self.via_catalog = 0
        self.slots: dict[str, dict[str, Any]] = {}
        self.fresh: dict[int, list[float]] = {}  # node index -> times of first reads of a version in a process
        self.digests: dict[tuple[str, int], str] = {}  # the first digest acknowledged or read for each id
        self.reused: set[tuple[str, int]] = set()  # ids that came with another digest later

    def _digest(self, key: tuple[str, int], sha: str) -> None:
        if self.digests.setdefault(key, sha) != sha:
            self.reused.add(key)

    def ack(self, learner: int, pid: str, version: int, sha: str, durable: bool, t: float) -> None:
        self._digest((pid, version), sha)
        self.acks[(pid, version)] = {"learner": learner, "digest": sha, "durable": durable, "t": t}

    def deleting(self, pid: str, version: int) -> None:
        self.deleted.add((pid, version))

    def deleted_done(self, pid: str, version: int, racing: bool, via_catalog: bool) -> None:
        self.confirmed.add((pid, version))
        self.racing += racing
        self.via_catalog += via_catalog

    def report(self, slot: str, node: int, batch: dict[str, Any]) -> None:
        state = self.slots.setdefault(slot, {"node": node, "ok": 0, "failed": 0, "errors": {}, "wrong": 0,
                                             "backwards": 0, "corrupt_refused": 0, "deleted": 0, "ok_times": [],
                                             "seen": {}})
        for key in ("ok", "failed", "wrong", "backwards", "corrupt_refused", "deleted"):
            state[key] += batch[key]
        for name, n in batch["errors"].items():
            state["errors"][name] = state["errors"].get(name, 0) + n
        state["ok_times"] += batch["ok_times"]
        state["seen"].update({(pid, v): sha for pid, v, sha in batch["seen"]})
        for pid, v, sha in batch["seen"]:
            self._digest((pid, v), sha)
        self.fresh.setdefault(node, []).extend(batch["fresh_times"])

    def dump(self) -> dict[str, Any]:
        return {"acks": self.acks, "deleted": self.deleted, "slots": self.slots, "fresh": self.fresh,
                "confirmed": self.confirmed, "racing": self.racing, "via_catalog": self.via_catalog,
                "reused": self.reused}


class Learner:
    """Publishes random weights in a loop; records each acknowledged publish (Ray actor, restarted when killed)."""

    def __init__(self, index: int, monitor: Any, state_file: str, tensor_bytes: int) -> None:
        import policystore

        self.index, self.monitor, self.state_file = index, monitor, state_file
        self.pid = f"learner-{index}"
        self.numel = tensor_bytes // 4
        from policystore.remote import CATALOG_NAME, NAMESPACE

        self.store = policystore.connect()
        self.catalog = ray.get_actor(CATALOG_NAME, namespace=NAMESPACE)
        self.deletes = 0
        self.nondurable: list[int] = []
        Path(f"{state_file}.pid").write_text(str(os.getpid()))

    def ready(self) -> bool:
        return True

    def _state(self, text: str) -> None:
        Path(self.state_file).write_text(text)

    def _delete(self, version: int, racing: bool) -> None:
        ray.get(self.monitor.deleting.remote(self.pid, version))
        self.deletes += 1
        via_catalog = self.deletes % 2 == 1  # every other delete (the first too) through the catalog actor
        if via_catalog:
            ray.get(self.catalog.delete.remote(self.pid, version), timeout=120)
        else:
            self.store.delete(self.pid, version)
        self.monitor.deleted_done.remote(self.pid, version, racing, via_catalog)

    def _publish(self, durable: bool) -> int:
        """Publish random weights; record the acknowledgement; returns the version."""
        import torch

        weights = {"w": torch.randn(self.numel // 2), "b": torch.randn(self.numel // 2)}
        sha = digest(weights)
        self._state("publishing")
        sid = self.store.publish(self.pid, weights, meta={"digest": sha}, durable=durable)
        self._state("idle")
        self.monitor.ack.remote(self.index, sid.policy_id, sid.version, sha, durable, time.time())
        return sid.version

    def run(self, until: float, period_s: float, durable_every: int, race_every: int) -> int:
        rng = random.Random(time.time_ns() ^ os.getpid())
        count = 0
        while time.time() < until:
            durable = rng.randrange(durable_every) == 0
            version = self._publish(durable)
            count += 1
            if not durable and rng.randrange(race_every) == 0:
                # a newer version at once (so the latest never goes back), then the delete, while the first one's
                # background spill and upload are still queued
                self.nondurable.append(self._publish(False))
                count += 1
                self._delete(version, racing=True)
            elif not durable:
                self.nondurable.append(version)
            while len(self.nondurable) > KEEP_NONDURABLE:
                self._delete(self.nondurable.pop(0), racing=False)
            time.sleep(period_s)
        return count


class Reader:
    """Reader threads on one node: get, recompute the digest, check, report (Ray actor, restarted when killed)."""

    def __init__(self, slots: list[str], node: int, monitor: Any, learners: int, gap_s: float, pid_file: str) -> None:
        self.slots, self.node, self.monitor, self.gap_s = slots, node, monitor, gap_s
        Path(pid_file).write_text(str(os.getpid()))
        import policystore

        self.pids = [f"learner-{i}" for i in range(learners)]
        self.seen_versions: set[tuple[str, int]] = set()  # per process: a first read of a version is "fresh"
        self.lock = threading.Lock()
        policystore.connect()  # this node's store is up before the clock starts

    def ready(self) -> bool:
        return True

    def run(self, until: float) -> None:
        threads = [threading.Thread(target=self._loop, args=(slot, until), daemon=True) for slot in self.slots]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _loop(self, slot: str, until: float) -> None:
        import policystore

        rng = random.Random(hash(slot) ^ time.time_ns())
        latest: dict[str, int] = {}
        batch = _empty_batch()
        last_report = last_ok = 0.0
        store = None
        versions: dict[str, list[int]] = {}
        while time.time() < until:
            pid = rng.choice(self.pids)
            try:
                store = store or policystore.connect()
                if rng.random() < 0.1 or not versions.get(pid):
                    versions[pid] = [info.id.version for info in store.list(pid)]
                explicit = rng.random() < 0.3 and versions[pid]
                snap = store.get(pid, rng.choice(versions[pid]) if explicit else None)
                sha = digest(snap)
                if sha != snap.meta.get("digest"):
                    batch["wrong"] += 1
                    log.error("%s read %s with digest %s, recorded %s", slot, snap.id, sha, snap.meta.get("digest"))
                latest.setdefault(pid, 0)  # this policy exists: an UnknownPolicyError from now on is a failure
                if not explicit:
                    if snap.id.version < latest[pid]:
                        batch["backwards"] += 1
                    latest[pid] = max(latest.get(pid, 0), snap.id.version)
                if rng.random() < 0.05:
                    store.verify(pid, snap.id.version)
                now = time.time()
                batch["ok"] += 1
                batch["seen"].add((pid, snap.id.version, sha))
                with self.lock:
                    fresh = (pid, snap.id.version) not in self.seen_versions
                    self.seen_versions.add((pid, snap.id.version))
                if fresh:
                    batch["fresh_times"].append(now)
                if now - last_ok >= THIN_S:
                    batch["ok_times"].append(now)
                    last_ok = now
            except policystore.CorruptSnapshotError:
                batch["corrupt_refused"] += 1  # the store refused bad bytes: not a wrong read
            except policystore.UnknownVersionError:
                batch["deleted"] += 1  # a listed version the learner deleted since: expected, not a failure
                versions.pop(pid, None)
            except policystore.UnknownPolicyError:
                if pid in latest:  # it was there before: a failure; else the learner has not published yet
                    batch["failed"] += 1
                    batch["errors"]["UnknownPolicyError"] = batch["errors"].get("UnknownPolicyError", 0) + 1
            except Exception as exc:  # an unavailable store or catalog, a deleted version, a lost snapshot...
                batch["failed"] += 1
                batch["errors"][type(exc).__name__] = batch["errors"].get(type(exc).__name__, 0) + 1
            if time.time() - last_report >= 1.0:
                self._report(slot, batch)
                batch, last_report = _empty_batch(), time.time()
            time.sleep(self.gap_s)
        self._report(slot, batch)

    def _report(self, slot: str, batch: dict[str, Any]) -> None:
        batch["seen"] = sorted(batch["seen"])
        ray.get(self.monitor.report.remote(slot, self.node, batch))


def _empty_batch() -> dict[str, Any]:
    return {"ok": 0, "failed": 0, "wrong": 0, "backwards": 0, "corrupt_refused": 0, "deleted": 0, "errors": {},
            "ok_times": [], "fresh_times": [], "seen": set()}


@dataclass
class Fault:
    kind: str
    t: float
    target: str  # node index, reader process or learner index
    node: int | None = None
    back_t: float | None = None  # node cycle: when the node was added back; durable faults: when it answered again


class Chaos:
    """The cluster, the actors on it, and the injector."""

    def __init__(self, args: Any, s3: S3Gate) -> None:
        from ray.cluster_utils import Cluster

        self.args, self.rng, self.s3 = args, random.Random(args.seed), s3
        self.node_args = {"num_cpus": 4, "object_store_memory": args.store_mib * MiB}
        self.cluster = Cluster(initialize_head=True, head_node_args={
            **self.node_args, "resources": {HEAD: 1000}, "include_dashboard": False,
        })
        self.nodes = {0: self.cluster.head_node}
        for k in range(1, args.nodes):
            self.nodes[k] = self.cluster.add_node(**self.node_args, resources={f"chaos_node_{k}": 1000})
        ray.init(address=self.cluster.address, logging_level=logging.WARNING, log_to_driver=False)
        import policystore

        self.disk = _mount_tmpfs(args.spill_mib)
        self.store = policystore.connect(policystore.StoreConfig(
            durable_uri=s3.uri("chaos"), spill_dir=str(self.disk) if self.disk is not None else None))
        self.monitor = Monitor.remote()
        self.state_dir = Path(tempfile.mkdtemp(prefix=f"chaos-state-{os.getpid()}-"))
        self.learners = [
            ray.remote(Learner).options(num_cpus=0.1, resources={HEAD: 0.01}, max_restarts=-1, max_task_retries=0)
            .remote(i, self.monitor, str(self.state_dir / f"learner-{i}"), args.tensor_kib * 1024)
            for i in range(args.learners)
        ]
        per_proc = -(-args.readers // args.procs)
        self.readers: dict[str, tuple[Any, int]] = {}
        for k in range(args.nodes):
            for p in range(args.procs):
                slots = [f"n{k}p{p}t{t}" for t in range(per_proc)]
                actor = ray.remote(Reader).options(
                    num_cpus=0.05, resources={f"chaos_node_{k}": 1}, max_restarts=-1, max_task_retries=0,
                ).remote(slots, k, self.monitor, args.learners, args.read_gap_ms / 1000,
                         str(self.state_dir / f"n{k}p{p}.pid"))
                self.readers[f"n{k}p{p}"] = (actor, k)
        self.faults: list[Fault] = []
        ray.get([a.ready.remote() for a in self.learners] + [a.ready.remote() for a, _ in self.readers.values()],
                timeout=600)

    # --- processes -------------------------------------------------------------------------------------------
    def _processes(self, title: str, node: int | None = None) -> list[psutil.Process]:
        """Live worker processes whose title starts with ``title`` (``ray::Class``), on one node or any."""
        found = []
        for k, ray_node in self.nodes.items():
            if node is not None and k != node:
                continue
            try:
                raylet = psutil.Process(ray_node.all_processes["raylet"][0].process.pid)
                children = raylet.children(recursive=True)
            except (psutil.NoSuchProcess, KeyError, IndexError):
                continue
            for proc in children:
                with contextlib.suppress(psutil.Error):
                    if " ".join(proc.cmdline()).startswith(title):
                        found.append(proc)
        return found

    def _kill(self, title: str, node: int | None = None, pid: int | None = None) -> bool:
        procs = [p for p in self._processes(title, node) if pid is None or p.pid == pid]
        for proc in procs[:1]:
            with contextlib.suppress(psutil.Error):
                os.kill(proc.pid, signal.SIGKILL)
                return True
        return False

    # --- faults ----------------------------------------------------------------------------------------------
    def inject(self, kind: str) -> None:
        now = time.time()
        if kind == "store_kill":
            node = self.rng.randrange(self.args.nodes)
            if self._kill("ray::StoreServer", node):
                self.faults.append(Fault(kind, now, f"node {node}", node))
            else:
                log.warning("no store process on node %d to kill", node)
        elif kind == "catalog_kill":
            if self._kill("ray::CatalogServer"):
                self.faults.append(Fault(kind, now, "catalog"))
        elif kind == "reader_kill":
            name = self.rng.choice(sorted(self.readers))
            pid = self._pid(name)
            if pid is not None and self._kill("ray::Reader", self.readers[name][1], pid):
                self.faults.append(Fault(kind, now, name, self.readers[name][1]))
        elif kind == "learner_kill":
            index = self.rng.randrange(self.args.learners)
            self._kill_learner_mid_publish(index)
        elif kind == "node_cycle" and self.args.nodes > 1:
            self._cycle_node(self.rng.randrange(1, self.args.nodes))
        elif kind in DURABLE_FAULTS:
            self.s3.set(DURABLE_FAULTS[kind])
            time.sleep(self.rng.uniform(*self.args.fault_hold_s))
            self.s3.set("up")
            self.faults.append(Fault(kind, now, DURABLE_FAULTS[kind], back_t=time.time()))
        elif kind == "catalog_db_loss":
            self._lose_catalog_db()
        elif kind == "disk_full" and self.disk is not None:
            self._fill_disk(now)

    def _lose_catalog_db(self) -> None:
        """Delete the catalog's database, or write garbage over it and its WAL, while the stores run; then SIGKILL
        the catalog, which restarts without it and must rebuild the league from the stores and the durable tier."""
        db = Path(self.store.config.catalog_db(ray.get_runtime_context().get_session_name()))
        garbage = self.rng.random() < 0.5
        for suffix in ("", "-wal", "-shm"):
            part = Path(f"{db}{suffix}")
            with contextlib.suppress(OSError):
                if garbage:
                    part.write_bytes(os.urandom(max(part.stat().st_size, 4096)))
                else:
                    part.unlink()
        if self._kill("ray::CatalogServer"):
            self.faults.append(Fault("catalog_db_loss", time.time(), "garbage" if garbage else "deleted"))

    def _fill_disk(self, now: float) -> None:
        """Another writer takes every free byte of the spill disk for 2 to 6 s (--quick: 1 to 2), then frees it."""
        filler = self.disk / "filler"
        chunk = b"\0" * (4 * MiB)
        with contextlib.suppress(OSError), open(filler, "wb") as f:
            while True:
                f.write(chunk)
                f.flush()
        time.sleep(self.rng.uniform(*self.args.fault_hold_s))
        filler.unlink(missing_ok=True)
        self.faults.append(Fault("disk_full", now, "spill disk", back_t=time.time()))

    def _pid(self, name: str) -> int | None:
        """The process id an actor wrote when it (re)started."""
        with contextlib.suppress(OSError, ValueError):
            return int((self.state_dir / f"{name}.pid").read_text())
        return None

    def _kill_learner_mid_publish(self, index: int) -> None:
        """Wait (up to 5 s) until the learner is inside publish(), then SIGKILL it."""
        state = self.state_dir / f"learner-{index}"
        deadline = time.time() + 5
        while time.time() < deadline:
            with contextlib.suppress(OSError):
                if state.read_text() == "publishing":
                    pid = self._pid(f"learner-{index}")
                    if pid is not None and self._kill("ray::Learner", 0, pid):
                        self.faults.append(Fault("learner_kill", time.time(), str(index), 0))
                    return
            time.sleep(0.002)

    def _cycle_node(self, k: int) -> None:
        removed = time.time()
        self.cluster.remove_node(self.nodes.pop(k), allow_graceful=False)
        time.sleep(self.rng.uniform(1, 3))
        self.nodes[k] = self.cluster.add_node(**self.node_args, resources={f"chaos_node_{k}": 1000})
        self.faults.append(Fault("node_cycle", removed, f"node {k}", k, back_t=time.time()))

    # --- the run ---------------------------------------------------------------------------------------------
    def run(self, seconds: float) -> None:
        """Start every learner and reader loop, inject faults (node cycles need the main thread) until the end."""
        until = time.time() + seconds
        supervisor = threading.Thread(target=self._supervise, args=(until,), daemon=True)
        supervisor.start()
        time.sleep(self.args.warmup_s)
        schedule = list(FAULTS)
        self.rng.shuffle(schedule)  # every kind at least once, then at random
        # A slow machine may land fewer faults in a short window than it should: go on until --min-faults have landed
        # (past the loops' end at worst, when the read-back after the run still has to find everything).
        while time.time() < until - 5 or (len(self.faults) < self.args.min_faults and time.time() < until + 120):
            kind = schedule.pop(0) if schedule else self.rng.choice(FAULTS)
            log.info("injecting %s", kind)
            try:
                self.inject(kind)
            except Exception:
                log.exception("injecting %s failed", kind)
            time.sleep(self.rng.uniform(0.5, 1.5) * self.args.fault_every_s)
        supervisor.join()

    def _start(self, kind: str, who: Any, until: float) -> Any:
        if kind == "learner":
            return self.learners[who].run.remote(until, self.args.publish_ms / 1000, self.args.durable_every,
                                                 self.args.race_every)
        return self.readers[who][0].run.remote(until)

    def _supervise(self, until: float) -> None:
        """Run every actor's loop, and run it again when a kill interrupts it (Ray restarts the actor)."""
        runs = {self._start("learner", i, until): ("learner", i) for i in range(len(self.learners))}
        runs |= {self._start("reader", name, until): ("reader", name) for name in self.readers}
        while runs:
            done, _ = ray.wait(list(runs), num_returns=1, timeout=1.0)
            for ref in done:
                kind, who = runs.pop(ref)
                try:
                    ray.get(ref)
                except Exception as exc:
                    log.debug("%s %s stopped (%s); running it again", kind, who, type(exc).__name__)
                    if time.time() < until - 1:
                        time.sleep(0.2)
                        runs[self._start(kind, who, until)] = (kind, who)

    def check_ledger(self, acks: dict, deleted: set) -> dict[tuple[str, int], str]:
        """Read back every acknowledged, undeleted snapshot: "ok", "wrong" or the error that stopped it."""
        outcome = {}
        for (pid, version) in sorted(acks):
            if (pid, version) in deleted:
                continue
            try:
                snap = self.store.get(pid, version)
                outcome[(pid, version)] = "ok" if digest(snap) == acks[(pid, version)]["digest"] else "wrong"
            except Exception as exc:
                outcome[(pid, version)] = type(exc).__name__
        return outcome

    def unreadable_visible(self) -> tuple[dict[str, str], dict[str, str]]:
        """Every snapshot ``list()`` shows afterwards (acknowledged or not: a learner killed between the commit and
        its reply leaves a committed, unacknowledged one), read back. Returns (id -> why it could not be read
        whole, id -> why for non-durable ones no node holds any more: lost within the documented bound, its store
        died before it reached another copy)."""
        from policystore import SnapshotLostError
        from policystore.wire import DURABLE

        unreadable, lost_nondurable = {}, {}
        for info in self.store.list():
            try:
                snap = self.store.get(*info.id)
                if digest(snap) != snap.meta.get("digest"):
                    unreadable[str(info.id)] = "wrong bytes"
            except Exception as exc:
                bound = DURABLE not in info.holders and isinstance(exc, SnapshotLostError)
                (lost_nondurable if bound else unreadable)[str(info.id)] = type(exc).__name__
        return unreadable, lost_nondurable

    def resurrected(self, confirmed: set, settle_s: float = 60.0) -> int:
        """Deleted snapshots the durable tier still has committed: what a fresh catalog on it would list. A delete
        during a durable fault near the end may still have its tombstone queued for retry: wait up to
        ``settle_s`` for the count to reach 0."""
        from policystore.durable import DurableTier

        tier = DurableTier.open(self.s3.uri("chaos", direct=True))
        deadline = time.time() + settle_s
        while True:
            count = len({tuple(sid) for sid in tier.committed_ids()} & confirmed)
            if not count or time.time() > deadline:
                return count
            time.sleep(1.0)

    def close(self) -> None:
        from policystore import leftovers

        # the driver's followers end first (a Ray call during the shutdown ends the process), the nodes last; then
        # the staging files of the workers they killed go
        leftovers.shutdown_ray(stop=self.cluster.shutdown)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        if self.disk is not None:
            subprocess.run(["umount", "-l", str(self.disk)], check=False)
            with contextlib.suppress(OSError):
                self.disk.rmdir()


def _mount_tmpfs(mib: int) -> Path | None:
    """A tmpfs of ``mib`` MiB for the stores' spill folders (the disk_full fault fills it), or None without root."""
    _remove_orphans()
    where = Path(tempfile.mkdtemp(prefix=f"chaos-spill-{os.getpid()}-"))
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=0700", "tmpfs", str(where)],
                      capture_output=True, check=False).returncode:
        log.warning("cannot mount a tmpfs for the spill disk (needs root): the disk_full fault is skipped")
        where.rmdir()
        return None
    return where


def _remove_orphans() -> None:
    """The spill mounts and state folders of chaos drivers that died before their cleanup (their pid is in the
    name, and gone)."""
    for folder in Path(tempfile.gettempdir()).glob("chaos-*-*-*"):
        kind, _, rest = folder.name.removeprefix("chaos-").partition("-")
        pid = rest.partition("-")[0]
        if kind not in ("spill", "state") or not pid.isdigit() or psutil.pid_exists(int(pid)):
            continue
        if kind == "spill":
            subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)
        shutil.rmtree(folder, ignore_errors=True)


def first_after(times: list[float], t: float) -> float | None:
    later = [x for x in times if x >= t]
    return min(later) - t if later else None


def analyse(chaos: Chaos, data: dict[str, Any], outcome: dict,
            visible: tuple[dict[str, str], dict[str, str]], run_s: float) -> tuple[list[dict], dict]:
    acks, slots, fresh = data["acks"], data["slots"], data["fresh"]
    ack_times = {i: sorted(a["t"] for a in acks.values() if a["learner"] == i) for i in range(chaos.args.learners)}
    all_acks = sorted(a["t"] for a in acks.values())
    durable_acks = sorted(a["t"] for a in acks.values() if a["durable"])
    all_fresh = sorted(t for times in fresh.values() for t in times)
    recovery: dict[str, list[float | None]] = {kind: [] for kind in FAULTS}
    for fault in chaos.faults:
        if fault.kind == "store_kill":
            value = first_after(fresh.get(fault.node, []), fault.t)
        elif fault.kind in ("catalog_kill", "catalog_db_loss"):
            a = first_after(all_acks, fault.t)
            r = None if a is None else first_after(all_fresh, fault.t + a)
            value = None if r is None else a + r
        elif fault.kind == "reader_kill":
            times = sorted(t for s, st in slots.items() if s.startswith(fault.target + "t") for t in st["ok_times"])
            value = first_after(times, fault.t)
        elif fault.kind == "learner_kill":
            value = first_after(ack_times[int(fault.target)], fault.t)
        elif fault.kind in DURABLE_FAULTS:
            value = first_after(durable_acks, fault.back_t)
        elif fault.kind == "disk_full":
            value = first_after(all_acks, fault.back_t)
        else:
            value = first_after(fresh.get(fault.node, []), fault.back_t)
        recovery[fault.kind].append(value)
    rows = []
    for kind in FAULTS:
        values = [v for v in recovery[kind] if v is not None]
        stats = harness.percentiles(values, scale=1) if values else {}
        rows.append({"kind": kind, "injected": len(recovery[kind]), "recovered": len(values),
                     "recovery_p50_s": stats.get("p50"), "recovery_p99_s": stats.get("p99"),
                     "recovery_max_s": max(values) if values else None})
    # acknowledged snapshots read back afterwards
    lost = {key: why for key, why in outcome.items() if why != "ok"}
    durable_lost = [k for k in lost if acks[k]["durable"] and lost[k] != "wrong"]
    nondurable_lost = [k for k in lost if not acks[k]["durable"] and lost[k] != "wrong"]
    head_store_kills = [f.t for f in chaos.faults if f.kind == "store_kill" and f.node == 0]
    unexplained = [k for k in nondurable_lost if not any(t >= acks[k]["t"] for t in head_store_kills)]
    lag = [min(t for t in head_store_kills if t >= acks[k]["t"]) - acks[k]["t"]
           for k in nondurable_lost if k not in unexplained]
    # reads: wrong bytes, versions backwards, availability and stalls
    seen_wrong = sum(1 for st in slots.values() for key, sha in st["seen"].items()
                     if key in acks and acks[key]["digest"] != sha)
    ok = sum(st["ok"] for st in slots.values())
    failed = sum(st["failed"] for st in slots.values())
    stalls, unavailable = [], 0.0
    for st in slots.values():
        times = sorted(st["ok_times"])
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        stalls += gaps
        unavailable += sum(g for g in gaps if g > STALL_S)
    errors: dict[str, int] = {}
    for st in slots.values():
        for name, n in st["errors"].items():
            errors[name] = errors.get(name, 0) + n
    summary = {
        "kind": "summary",
        "durable_acked": sum(1 for a in acks.values() if a["durable"]),
        "durable_lost": len(durable_lost),
        "nondurable_acked": sum(1 for a in acks.values() if not a["durable"]),
        "nondurable_lost": len(nondurable_lost),
        "nondurable_unexplained": len(unexplained),
        "nondurable_lost_max_publish_to_kill_s": max(lag) if lag else None,
        "wrong_reads": sum(st["wrong"] for st in slots.values()) + seen_wrong + sum(
            1 for why in outcome.values() if why == "wrong"),
        "backwards": sum(st["backwards"] for st in slots.values()),
        "versions_reused": len(data["reused"]),
        "corrupt_refused": sum(st["corrupt_refused"] for st in slots.values()),
        "deleted_version_reads": sum(st["deleted"] for st in slots.values()),
        "reads": ok,
        "read_failures": failed,
        "read_success": ok / max(ok + failed, 1),
        "availability": 1 - unavailable / max(run_s * len(slots), 1e-9),
        "longest_stall_s": max(stalls) if stalls else None,
        "racing_deletes": data["racing"],
        "catalog_deletes": data["via_catalog"],
        "deleted_resurrected": chaos.resurrected(data["confirmed"]),
        "visible_unreadable": len(visible[0]),
        "visible_lost_nondurable": len(visible[1]),
        "faults": len(chaos.faults),
        "errors": errors,
        "durable_lost_ids": [f"{p}@v{v}: {lost[(p, v)]}" for p, v in durable_lost][:20],
        "visible_unreadable_ids": [f"{sid}: {why}" for sid, why in visible[0].items()][:20],
    }
    return rows, summary


def main() -> None:
    parser = harness.make_parser("chaos", __doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long faults are injected")
    parser.add_argument("--seed", type=int, default=0, help="seeds the injector's choices")
    parser.add_argument("--nodes", type=int, default=3, help="Ray nodes on this machine (>= 3 for node cycles)")
    parser.add_argument("--readers", type=int, default=16, help="reader threads per node")
    parser.add_argument("--procs", type=int, default=16, help="reader processes per node (threads are spread)")
    parser.add_argument("--learners", type=int, default=2)
    parser.add_argument("--publish-ms", type=float, default=300.0, help="pause between a learner's publishes")
    parser.add_argument("--durable-every", type=int, default=5, help="about one publish in this many is durable")
    parser.add_argument("--race-every", type=int, default=10,
                        help="about one non-durable publish in this many is deleted at once")
    parser.add_argument("--read-gap-ms", type=float, default=200.0, help="pause between a reader's reads")
    parser.add_argument("--fault-every-s", type=float, default=8.0, help="mean time between faults")
    parser.add_argument("--min-faults", type=int, default=0,
                        help="keep injecting past the end (up to 2 minutes) until this many faults have landed")
    parser.add_argument("--tensor-kib", type=int, default=256, help="snapshot size (above Ray's inline limit)")
    parser.add_argument("--store-mib", type=int, default=256, help="object store per node")
    parser.add_argument("--spill-mib", type=int, default=512, help="the spill disk (a tmpfs) every node shares")
    args = parser.parse_args()
    args.warmup_s, args.fault_hold_s = 5.0, (2.0, 6.0)  # the durable tier's and the spill disk's faults last
    if args.quick:  # every fault lands while the learners and readers still run: 4 of them in about 11 s
        args.minutes, args.procs, args.fault_every_s, args.read_gap_ms = 0.25, 2, 1.2, 250.0
        args.min_faults = max(args.min_faults, 4)
        args.warmup_s, args.fault_hold_s = 3.0, (1.0, 2.0)
    harness.setup_logging(args.verbose)
    # Ray workers import this code as the driver does (the nodes' processes inherit the environment)
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    results = harness.Results("chaos", args, {k: v for k, v in vars(args).items() if k != "out"})
    s3 = S3Gate()
    chaos = None
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # unwind: the cluster goes too
    try:
        chaos = Chaos(args, s3)
        seconds = args.minutes * 60 + args.warmup_s
        started = time.time()
        chaos.run(seconds)
        run_s = time.time() - started
        log.info("faults over; reading back every acknowledged snapshot")
        data = ray.get(chaos.monitor.dump.remote())
        outcome = chaos.check_ledger(data["acks"], data["deleted"])
        rows, summary = analyse(chaos, data, outcome, chaos.unreadable_visible(), run_s)
        for row in rows:
            results.emit(row)
        results.emit(summary)
    finally:
        if chaos is not None:
            chaos.close()
        s3.close()
    notes = [
        f"summary: durable lost {summary['durable_lost']} of {summary['durable_acked']}; non-durable lost "
        f"{summary['nondurable_lost']} of {summary['nondurable_acked']} ({summary['nondurable_unexplained']} "
        f"outside the bound); wrong reads {summary['wrong_reads']}; backwards {summary['backwards']}; "
        f"versions reused {summary['versions_reused']}; "
        f"deleted resurrected {summary['deleted_resurrected']} ({summary['racing_deletes']} racing deletes, "
        f"{summary['catalog_deletes']} through the catalog); "
        f"visible but unreadable {summary['visible_unreadable']}; "
        f"read success {summary['read_success']:.4f}, availability {summary['availability']:.4f}, longest stall "
        f"{summary['longest_stall_s']} s over {summary['reads']} reads",
    ]
    results.finish(["kind", "injected", "recovered", "recovery_p50_s", "recovery_p99_s", "recovery_max_s"],
                   notes=notes)


if __name__ == "__main__":
    main()
