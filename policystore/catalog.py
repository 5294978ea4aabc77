"""The cluster catalog: which snapshots exist, their versions, and which nodes hold a copy.

One small actor per cluster (``policystore-catalog``) is the single source of truth for names and versions, so
``list()`` and ``get(pid)`` agree on every node as soon as ``publish`` returns. It never sees snapshot bytes:
the per-node stores are the data plane and fetch from each other (or from the durable tier) directly.

Publishing is two-phase, so a store killed mid-publish leaves the snapshot complete or absent, never partial:
``reserve`` hands out the next version (invisible), the store makes its copies (and, for durable publishes, its
files), then ``commit`` makes the version visible. Every change is appended to a JSON-lines journal (reserve and
commit fsync'd) that a restarted catalog replays.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import uuid
from collections import deque
from pathlib import Path
from typing import Any

import ray

from .config import StoreConfig
from .errors import UnknownPolicyError, UnknownVersionError
from .ids import SnapshotId, check_policy_id, check_version
from .wire import CatalogEntry, CatalogEvents, Summary

log = logging.getLogger(__name__)


class CatalogServer:
    """Run as a Ray actor (see ``client.connect``). Entries: pid -> {version -> summary + holders}."""

    def __init__(self, journal_path: str, config: StoreConfig):
        self.config = config  # the cluster's store settings: stores started later, anywhere, use them
        self._lock = threading.RLock()
        self._committed: dict[str, dict[int, dict[str, Any]]] = {}  # versions in increasing order
        self._reserved: dict[tuple[str, int], str] = {}  # (pid, version) -> reserving node
        self._next: dict[str, int] = {}
        self._changed = threading.Condition(self._lock)
        self._seq = 0
        self._events: deque[tuple[int, str, Any]] = deque(maxlen=4096)  # (seq, "commit"|"delete", payload)
        self._epoch = uuid.uuid4().hex
        self._path = Path(journal_path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        if self._path.exists():
            self._replay()
        self._journal = open(self._path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the actor
        log.info("catalog: %d snapshots from %s", sum(map(len, self._committed.values())), self._path)

    def store_config(self) -> StoreConfig:
        return self.config

    # ---- journal -------------------------------------------------------------------------------------------
    def _replay(self) -> None:
        for line in self._path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                log.warning("catalog journal: skipping a torn line")  # a crash mid-append
                continue
            self._apply(record)

    def _record(self, record: dict[str, Any], sync: bool) -> None:
        self._apply(record)
        if record["op"] in ("commit", "delete"):
            self._seq += 1
            sid = SnapshotId(record["pid"], record["v"])
            self._events.append((self._seq, record["op"], self._entry(*sid) if record["op"] == "commit" else sid))
            self._changed.notify_all()
        self._journal.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._journal.flush()
        if sync:
            os.fsync(self._journal.fileno())

    def _apply(self, r: dict[str, Any]) -> None:
        op, pid = r["op"], r.get("pid")
        key = (pid, r.get("v"))
        if op == "reserve":
            self._reserved[key] = r["node"]
            self._next[pid] = max(self._next.get(pid, 1), r["v"] + 1)
        elif op == "commit":
            self._reserved.pop(key, None)
            self._committed.setdefault(pid, {})[r["v"]] = {**r["summary"], "holders": [r["node"]]}
            self._next[pid] = max(self._next.get(pid, 1), r["v"] + 1)
        elif op == "abort":
            self._reserved.pop(key, None)
        elif op in ("hold", "drop"):
            entry = self._committed.get(pid, {}).get(r["v"])
            if entry is not None:
                holders = [n for n in entry["holders"] if n != r["node"]]
                entry["holders"] = [*holders, r["node"]] if op == "hold" else holders
        elif op == "delete":
            versions = self._committed.get(pid, {})
            versions.pop(r["v"], None)
            if not versions:
                self._committed.pop(pid, None)

    # ---- publish -------------------------------------------------------------------------------------------
    def reserve(self, policy_id: str, node_id: str) -> int:
        check_policy_id(policy_id)
        with self._lock:
            version = self._next.get(policy_id, 1)
            self._record({"op": "reserve", "pid": policy_id, "v": version, "node": node_id}, sync=True)
            return version

    def commit(self, policy_id: str, version: int, node_id: str, summary: Summary) -> CatalogEntry:
        with self._lock:
            if (policy_id, version) not in self._reserved:
                raise UnknownVersionError(f"{policy_id}@v{version} was not reserved (or was aborted)")
            record = {"op": "commit", "pid": policy_id, "v": version, "node": node_id,
                      "summary": dataclasses.asdict(summary)}
            self._record(record, True)
            return self._entry(policy_id, version)

    def publish(self, policy_id: str, node_id: str, summary: Summary) -> CatalogEntry:
        """reserve + commit in one call (a non-durable publish: nothing to make durable in between)."""
        with self._lock:
            return self.commit(policy_id, self.reserve(policy_id, node_id), node_id, summary)

    @ray.method(concurrency_group="watch")
    def watch(self, since: int, timeout_s: float) -> CatalogEvents:
        """Commits and deletes after event ``since``; waits up to ``timeout_s`` for one when there is none yet."""
        with self._lock:
            self._changed.wait_for(lambda: self._seq > since, timeout=timeout_s)
            oldest = self._events[0][0] if self._events else self._seq + 1
            if since <= 0 or since + 1 < oldest or since > self._seq:
                latest = {pid: next(reversed(v)) for pid, v in self._committed.items()}
                return CatalogEvents(self._seq, True, latest=latest, epoch=self._epoch)
            committed, deleted = [], []
            for seq, op, payload in self._events:
                if seq > since:
                    (committed if op == "commit" else deleted).append(payload)
            touched = {e.id.policy_id for e in committed} | {sid.policy_id for sid in deleted}
            latest = {pid: next(reversed(self._committed[pid])) if self._committed.get(pid) else 0 for pid in touched}
            return CatalogEvents(self._seq, False, tuple(committed), tuple(deleted), latest, self._epoch)

    def abort(self, policy_id: str, version: int) -> None:
        with self._lock:
            self._record({"op": "abort", "pid": policy_id, "v": version}, sync=False)

    # ---- holders -------------------------------------------------------------------------------------------
    def hold(self, policy_id: str, version: int, node_id: str) -> None:
        with self._lock:
            self._record({"op": "hold", "pid": policy_id, "v": version, "node": node_id}, sync=False)

    def drop(self, policy_id: str, version: int, node_id: str) -> None:
        with self._lock:
            self._record({"op": "drop", "pid": policy_id, "v": version, "node": node_id}, sync=False)

    def reconcile(self, node_id: str, held: list[tuple[SnapshotId, str]]) -> list[SnapshotId]:
        """A (re)started store reports what its disk holds; returns what it must discard.

        Discarded: versions reserved but never committed (a publish killed midway) and versions deleted or
        conflicting with the catalog. Versions the catalog has never seen (a spill dir from an earlier
        session) are adopted. Committed versions the node claimed but no longer has lose it as a holder.
        """
        discard = []
        with self._lock:
            held_keys = set()
            for (pid, version), checksum in held:
                held_keys.add((pid, version))
                entry = self._committed.get(pid, {}).get(version)
                if (pid, version) in self._reserved:
                    self._record({"op": "abort", "pid": pid, "v": version}, sync=False)
                    discard.append(SnapshotId(pid, version))
                elif entry is None and version < self._next.get(pid, 1):
                    discard.append(SnapshotId(pid, version))  # deleted while this store was away
                elif entry is None:
                    self._record({"op": "reserve", "pid": pid, "v": version, "node": node_id}, sync=False)
                    summary = {"nbytes": 0, "checksum": checksum, "meta": {}, "created": 0.0, "durable": False}
                    self._record({"op": "commit", "pid": pid, "v": version, "node": node_id, "summary": summary}, True)
                elif entry["checksum"] != checksum:
                    log.error("catalog: %s@v%d on node %s conflicts with the catalog; discarded", pid, version, node_id)
                    discard.append(SnapshotId(pid, version))
                elif node_id not in entry["holders"]:
                    self._record({"op": "hold", "pid": pid, "v": version, "node": node_id}, sync=False)
            for pid, versions in self._committed.items():
                for version, entry in versions.items():
                    if node_id in entry["holders"] and (pid, version) not in held_keys:
                        self._record({"op": "drop", "pid": pid, "v": version, "node": node_id}, sync=False)
        return discard

    # ---- read ----------------------------------------------------------------------------------------------
    def _entry(self, policy_id: str, version: int) -> CatalogEntry:
        e = self._committed[policy_id][version]
        summary = Summary(e["nbytes"], e["checksum"], e["meta"], e.get("created", 0.0), e["durable"])
        return CatalogEntry(SnapshotId(policy_id, version), summary, tuple(e["holders"]))

    def lookup(self, policy_id: str, version: int | None = None) -> CatalogEntry:
        """The committed entry (latest when ``version`` is None): version, summary and holders."""
        with self._lock:
            versions = self._committed.get(check_policy_id(policy_id))
            if not versions:
                known = sorted(self._committed)
                more = " ..." if len(known) > 20 else ""
                hint = f"; known policies: {known[:20]}{more}" if known else " (the store is empty)"
                raise UnknownPolicyError(f"unknown policy {policy_id!r}{hint}")
            if version is None:
                version = next(reversed(versions))
            entry = versions.get(check_version(version))
            if entry is None:
                have = list(versions)
                raise UnknownVersionError(
                    f"policy {policy_id!r} has no version {version}; it has {len(have)} versions "
                    f"({have[:10]}{' ...' if len(have) > 10 else ''}, latest {have[-1]})"
                )
            return self._entry(policy_id, version)

    def list(self, policy_id: str | None = None) -> list[CatalogEntry]:
        with self._lock:
            if policy_id is not None and policy_id not in self._committed:
                self.lookup(policy_id)  # raises the right error
            return [
                self._entry(pid, v)
                for pid, versions in sorted(self._committed.items())
                if policy_id is None or pid == policy_id
                for v in versions
            ]

    def delete(self, policy_id: str, version: int | None = None) -> list[CatalogEntry]:
        """Remove one version or all of them; returns the removed entries (with their holders to clean up)."""
        with self._lock:
            if version is None:
                self.lookup(policy_id)  # raises the right error for an unknown policy
                entries = [self._entry(policy_id, v) for v in self._committed[policy_id]]
            else:
                entries = [self.lookup(policy_id, version)]
            for entry in entries:
                self._record({"op": "delete", "pid": policy_id, "v": entry.version}, sync=True)
        return entries
