"""The durable tier's work, kept off every other path: uploads of spilled snapshots, tombstones of deleted ones.

Object storage can be down, slow or hanging, and nothing else in a store may wait for it: a non-durable publish
is acknowledged once the snapshot is in shared memory and its local spill never depends on the durable tier.
Uploads and tombstones wait here, one at a time on the queue's own thread; one that fails is retried with
exponential backoff (``BACKOFF_S`` doubling up to ``MAX_BACKOFF_S``) until it succeeds or the snapshot is
deleted, so an outage delays the durable copies but loses none (the node's disk holds the snapshots meanwhile).
A restarted store calls ``resume`` to queue its files the durable tier lacks. A tombstone not yet written is
also recorded as an empty file in ``pending_dir`` (named ``<policy_id>@<version>``), so a store killed during an
outage still writes it once it is back.

Every call into the tier made through ``call`` (the queue's own jobs, and a store's durable publishes, reads and
deletes) runs on a small pool of its own threads and is given up after ``timeout_s``: a hanging tier costs the
caller a DurableTierError naming the tier, never a hang, and the thread it left behind is the only thing stuck.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from .durable import DurableTier
from .errors import DurableTierError
from .filenames import policy_of, version_name, version_of
from .format import Header
from .ids import SnapshotId

log = logging.getLogger(__name__)

T = TypeVar("T")
BACKOFF_S = 0.5
MAX_BACKOFF_S = 60.0
_CALL_THREADS = 4  # calls into the tier at once; a hanging tier can hold at most this many threads

UPLOAD, TOMBSTONE, RESUME = "upload", "tombstone", "resume"


@dataclass
class _Job:
    kind: str
    sid: SnapshotId | None  # None for RESUME
    due: float = 0.0
    attempts: int = 0


class DurableQueue:
    """Uploads and tombstones for one store's durable tier, retried until they succeed.

    ``source(sid)``: the snapshot's verified bytes and header from this node's copy, or None if the node no
    longer holds it (deleted: the upload is dropped). ``uploaded(sid)``: called once ``sid`` is committed in the
    tier. ``local()``: the snapshots this node holds, for ``resume``.
    """

    def __init__(self, tier: DurableTier, timeout_s: float, pending_dir: Path, *,
                 source: Callable[[SnapshotId], tuple[np.ndarray, Header] | None],
                 uploaded: Callable[[SnapshotId], None],
                 local: Callable[[], Iterable[SnapshotId]]):
        self.tier = tier
        self.pending_dir = pending_dir
        self.timeout_s = timeout_s
        self._source, self._uploaded, self._local = source, uploaded, local
        self._pool = ThreadPoolExecutor(_CALL_THREADS, thread_name_prefix="policystore-durable-call")
        self._cond = threading.Condition()
        self._jobs: dict[tuple[str, SnapshotId | None], _Job] = {}
        self._running: _Job | None = None
        self.failures = 0  # failed attempts since the store started
        self.last_error: str | None = None  # the last failure, cleared by the next success
        threading.Thread(target=self._work, name="policystore-durable-queue", daemon=True).start()

    # ---- what callers ask for ------------------------------------------------------------------------------
    def upload(self, sid: SnapshotId) -> None:
        """Queue ``sid``'s upload (from this node's copy, once it is on disk)."""
        self._add(_Job(UPLOAD, sid))

    def tombstone(self, sid: SnapshotId) -> None:
        """Queue ``sid``'s deletion from the tier (tombstone, marker, data); its queued upload is dropped."""
        self.cancel(sid)
        try:
            self.pending_dir.mkdir(mode=0o700, exist_ok=True)
            (self.pending_dir / _record_name(sid)).touch(mode=0o600)
        except OSError as exc:  # still queued: only a restart before it is written would forget it
            log.warning("could not record the pending tombstone of %s in %s: %s", sid, self.pending_dir, exc)
        self._add(_Job(TOMBSTONE, sid))

    def cancel(self, sid: SnapshotId) -> None:
        """Drop ``sid``'s queued upload (an upload already running sees the deletion and stops or undoes itself)."""
        with self._cond:
            self._jobs.pop((UPLOAD, sid), None)

    def resume(self) -> None:
        """Queue the tombstones recorded before a restart, and the upload of every snapshot of this node that the
        tier has not committed."""
        try:
            names = os.listdir(self.pending_dir)
        except FileNotFoundError:
            names = []
        for name in names:
            sid = _parse_record(name)
            if sid is None:
                log.warning("ignoring %s in %s: not a pending tombstone", name, self.pending_dir)
            else:
                self._add(_Job(TOMBSTONE, sid))
        self._add(_Job(RESUME, None))

    def call(self, fn: Callable[[], T], what: str, timeout_s: float | None = None) -> T:
        """``fn()`` (a call into the tier) with the deadline (``timeout_s`` if shorter: what the caller's own
        deadline leaves): DurableTierError naming the tier if it takes longer."""
        limit = self.timeout_s if timeout_s is None else min(self.timeout_s, timeout_s)
        future = self._pool.submit(fn)
        try:
            return future.result(timeout=limit)
        except FutureTimeout:
            future.cancel()
            raise DurableTierError(
                f"durable tier {self.tier.uri} did not answer within {limit:g} s while trying to {what} "
                f"({'StoreConfig.durable_timeout_s' if limit == self.timeout_s else 'what the call deadline left'})"
            ) from None

    # ---- what it reports -----------------------------------------------------------------------------------
    def pending(self) -> int:
        """Uploads not yet committed in the tier (queued or running)."""
        with self._cond:
            running = self._running is not None and self._running.kind == UPLOAD
            return sum(job.kind == UPLOAD for job in self._jobs.values()) + running

    def settled(self, deleted: Iterable[SnapshotId]) -> bool:
        """Wait until the tombstone of each of ``deleted`` has been tried once (at most ``timeout_s``, so a tier
        that is down costs a delete one quick failure and a hanging one the deadline); whether all were written."""
        keys = [(TOMBSTONE, sid) for sid in deleted]

        def running() -> bool:
            return self._running is not None and (self._running.kind, self._running.sid) in keys

        with self._cond:
            self._cond.wait_for(lambda: not running() and all(self._jobs[k].attempts for k in keys if k in self._jobs),
                                timeout=self.timeout_s)
            return not running() and not any(k in self._jobs for k in keys)

    # ---- the worker ----------------------------------------------------------------------------------------
    def _add(self, job: _Job) -> None:
        with self._cond:
            self._jobs.setdefault((job.kind, job.sid), job)
            self._cond.notify_all()

    def _next(self) -> _Job:
        """The job due first (tombstones before uploads when both are due), waiting for one."""
        with self._cond:
            while True:
                now = time.monotonic()
                due = [job for job in self._jobs.values() if job.due <= now]
                if due:
                    job = min(due, key=lambda j: (j.kind != TOMBSTONE, j.due))
                    del self._jobs[(job.kind, job.sid)]
                    self._running = job
                    return job
                wake = min((job.due for job in self._jobs.values()), default=now + 60) - now
                self._cond.wait(timeout=max(wake, 0.01))

    def _work(self) -> None:
        while True:
            job = self._next()
            try:
                self._run(job)
                with self._cond:
                    self.last_error = None
            except Exception as exc:
                job.attempts += 1
                job.due = time.monotonic() + min(BACKOFF_S * 2 ** (job.attempts - 1), MAX_BACKOFF_S)
                what = f"{job.kind} {job.sid}" if job.sid is not None else "resume"
                if job.attempts == 1 or job.attempts % 10 == 0:
                    log.warning("durable tier %s: %s failed (attempt %d, retrying): %s",
                                self.tier.uri, what, job.attempts, exc)
                with self._cond:
                    self.failures += 1
                    self.last_error = f"{what}: {exc}"[:500]
                    if job.kind != UPLOAD or (UPLOAD, job.sid) not in self._jobs:
                        self._jobs.setdefault((job.kind, job.sid), job)
            finally:
                with self._cond:
                    self._running = None
                    self._cond.notify_all()

    def _run(self, job: _Job) -> None:
        if job.kind == RESUME:
            committed = self.call(self.tier.committed_ids, f"list {self.tier.uri}")
            for sid in self._local():
                if sid not in committed:
                    self.upload(sid)
            return
        sid = job.sid
        assert sid is not None
        if job.kind == TOMBSTONE:
            self.call(lambda: self.tier.remove(sid), f"delete {sid}")
            (self.pending_dir / _record_name(sid)).unlink(missing_ok=True)
            return
        with self._cond:
            if (TOMBSTONE, sid) in self._jobs:
                return  # deleted since it was queued
        if self.call(lambda: self.tier.deleted(sid), f"check {sid}"):
            return
        found = self._source(sid)
        if found is None:
            return  # this node no longer holds it: deleted, or never committed
        buf, header = found
        self.call(lambda: self.tier.write(sid, buf, header), f"upload {sid}")
        self._uploaded(sid)


def _record_name(sid: SnapshotId) -> str:
    return f"{sid.policy_id}@{version_name(sid.version)}"


def _parse_record(name: str) -> SnapshotId | None:
    policy_id, _, stem = name.rpartition("@")
    version = version_of(stem)
    return SnapshotId(policy_id, version) if version is not None and policy_of(policy_id) is not None else None
