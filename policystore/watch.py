"""The push: how a node's store tells the processes that read from it what changed, without them asking per get.

Store side, ``Feed``: numbered events (a policy's latest version changed; a snapshot became hot on the node, with
its header and object ref; a snapshot stopped being hot; a snapshot was deleted) that ``StoreServer.watch`` hands
out. ``Doorbell``: hosted in the store's (and the catalog's) own process, where followers wait for news, one
coroutine each, so no follower holds a thread of the store or catalog (``hosting.py``). Reader side,
``Follower``: one daemon thread per process and node store that waits on the doorbell and asks the store what
changed when it rings, holding the pushed refs of the policies the process opened (so a get of a pushed version
is one ``ray.get``, no actor call) and dropping them when the store says a snapshot is gone (so eviction frees the
memory). Snapshots of other policies cost a follower their latest version number only; opening one is one store
call (never a catalog call when the node holds it).

Staleness: the store stamps what it hands out with ``as_of``, its ``time.monotonic()`` before the catalog call
whose answer it has applied: every commit made before ``as_of`` is in the feed. A reader on the same node (same
clock) trusts its pushed "latest" only while ``now - as_of <= max_staleness_s``; so ``get(pid)`` never misses a
version committed more than ``max_staleness_s`` before it, and past that bound it asks the store instead.
Nothing here imports torch: the store actor uses the feed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import ray

from . import remote
from .config import DEFAULT_LEAGUE, StoreConfig
from .format import Header, parse_head
from .ids import SnapshotId
from .protect import open_shared
from .remote import store_name
from .snapshot import Snapshot
from .wire import FeedEpoch, HotSnapshot, Ring, StoreEvents

log = logging.getLogger(__name__)

_KEEP_EVENTS = 4096  # a watcher further behind than this gets a reset (the whole state) instead
_JOIN_S = 2.0  # a stopped follower's wait wakes at once: it ends within the call it may be in


@dataclass(frozen=True)
class _Latest:
    """A policy's newest committed version changed (0: none left)."""

    seq: int
    policy_id: str
    version: int


@dataclass(frozen=True)
class _Hot:
    """A snapshot became hot on the node (the log keeps no ref: an evicted snapshot's memory must be freeable)."""

    seq: int
    sid: SnapshotId


@dataclass(frozen=True)
class _Gone:
    """A snapshot stopped being hot on the node: evicted, or ``deleted`` cluster-wide."""

    seq: int
    sid: SnapshotId
    deleted: bool


@dataclass(frozen=True)
class _NewEpoch:
    """The feed's epoch changed (a new catalog database): its followers reset."""

    seq: int


_Event = _Latest | _Hot | _Gone | _NewEpoch


class Feed:
    """A node store's league state and its change log, for ``StoreServer.watch`` (thread-safe)."""

    def __init__(self) -> None:
        # a restarted store is a new feed, and so is a new catalog (once known): either way its followers reset
        self.epoch = FeedEpoch(uuid.uuid4().hex)
        self._cond = threading.Condition()
        self._seq = 0
        self._log: deque[_Event] = deque(maxlen=_KEEP_EVENTS)
        self._latest: dict[str, int] = {}
        self._hot: dict[SnapshotId, HotSnapshot] = {}
        self._as_of = -math.inf  # no catalog answer applied yet: nobody may trust "latest"
        self._closed = False

    # ---- what the store reports ------------------------------------------------------------------------------
    def _emit(self, kind: type[_Event], *fields: object) -> None:
        """Log the next event, of ``kind`` (caller holds the condition's lock), and wake the waiters."""
        self._seq += 1
        self._log.append(kind(self._seq, *fields))
        self._cond.notify_all()

    def set_latest(self, policy_id: str, version: int) -> None:
        """The newest committed version of a policy (0: none left)."""
        with self._cond:
            if self._latest.get(policy_id, 0) != version:
                if version:
                    self._latest[policy_id] = version
                else:
                    self._latest.pop(policy_id, None)
                self._emit(_Latest, policy_id, version)

    def raise_latest(self, policy_id: str, version: int) -> None:
        """A commit seen first-hand (this store's own publish): latest only ever moves up this way."""
        with self._cond:
            if version > self._latest.get(policy_id, 0):
                self._latest[policy_id] = version
                self._emit(_Latest, policy_id, version)

    def replace_latest(self, latest: dict[str, int]) -> None:
        """The catalog's whole view (after a reset): policies it no longer has are reported as gone."""
        for pid in [p for p in self._latest if p not in latest]:
            self.set_latest(pid, 0)
        for pid, version in latest.items():
            self.set_latest(pid, version)

    def hot(self, snap: HotSnapshot) -> None:
        with self._cond:
            self._hot[snap.id] = snap
            self._emit(_Hot, snap.id)

    def gone(self, sid: SnapshotId) -> None:
        with self._cond:
            if self._hot.pop(sid, None) is not None:
                self._emit(_Gone, sid, False)

    def deleted(self, sid: SnapshotId) -> None:
        with self._cond:
            self._hot.pop(sid, None)
            self._emit(_Gone, sid, True)

    def catalog_epoch(self, epoch: str) -> None:
        """The catalog's epoch (a new database numbers versions anew): followers reset and drop what they hold."""
        with self._cond:
            if self.epoch.catalog != epoch:
                self.epoch = FeedEpoch(self.epoch.store, epoch)
                self._emit(_NewEpoch)

    def heard_until(self, as_of: float) -> None:
        """Everything the catalog committed before ``as_of`` (store clock) is in the feed."""
        with self._cond:
            if as_of > self._as_of:
                self._as_of = as_of
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ---- what readers ask ------------------------------------------------------------------------------------
    def latest(self, policy_id: str, max_staleness_s: float) -> int | None:
        """The latest version if the feed is fresh and knows the policy, else None (ask the catalog)."""
        with self._cond:
            if time.monotonic() - self._as_of > max_staleness_s:
                return None
            return self._latest.get(policy_id)

    def ring(self) -> Ring:
        """What the store's doorbell should say now."""
        with self._cond:
            return Ring(self._seq, self._as_of, self.epoch)

    def next_ring(self, last: Ring | None, timeout_s: float) -> Ring:
        """The doorbell's next word: as soon as it differs from ``last`` (news, or a newer ``as_of``), else after
        ``timeout_s`` (a heartbeat). It names the policies the news since
        ``last`` is about, so that the doorbell wakes early only the followers of those."""
        def moved() -> bool:
            return last is None or (self._seq, self._as_of, self.epoch) != (last.seq, last.as_of, last.epoch)

        with self._cond:
            self._cond.wait_for(lambda: moved() or self._closed, timeout=timeout_s)
            anew = last is None or last.epoch != self.epoch
            since = 0 if anew else last.seq
            news = list(itertools.takewhile(lambda e: e.seq > since, reversed(self._log)))  # newest first
            lost = self._seq > since and (not news or news[-1].seq > since + 1)  # older than the log keeps
            everyone = anew or lost or any(isinstance(e, _NewEpoch) or (isinstance(e, _Gone) and e.deleted)
                                           for e in news)
            touched = () if everyone else tuple(dict.fromkeys(
                e.policy_id if isinstance(e, _Latest) else e.sid.policy_id for e in news))
            return Ring(self._seq, self._as_of, self.epoch, touched, everyone)

    def _wanted(self, sid: SnapshotId, follows: Collection[str]) -> bool:
        """Whether a follower gets ``sid``'s ref pushed: only for a policy it follows (one it has opened), and only
        the newest version (a reader pays for what it plays, not for the node's hot set)."""
        return sid.policy_id in follows and sid.version >= self._latest.get(sid.policy_id, 0)

    def watch(self, since: int, timeout_s: float, follows: Collection[str] = (), adopt: Sequence[str] = ()
              ) -> StoreEvents:
        """Changes after event ``since`` (a reset with the whole state when ``since`` is 0, unknown or too old);
        waits up to ``timeout_s`` for one. Hot snapshots (refs) only of the policies in ``follows``; ``adopt``: the
        ones followed since the last call, whose newest hot snapshot comes with this answer."""
        follows = frozenset(follows)
        with self._cond:
            self._cond.wait_for(lambda: self._seq > since or self._closed, timeout=max(0.0, timeout_s))
            oldest = self._log[0].seq if self._log else self._seq + 1
            if since <= 0 or since > self._seq or since + 1 < oldest:
                return StoreEvents(self._seq, True, self._as_of, dict(self._latest),
                                   tuple(s for s in self._hot.values() if self._wanted(s.id, follows)),
                                   epoch=self.epoch)
            latest: dict[str, int] = {}
            hot: dict[SnapshotId, None] = {}  # ordered set
            gone: set[SnapshotId] = set()
            deleted: set[SnapshotId] = set()
            for event in self._log:
                if event.seq <= since:
                    continue
                if isinstance(event, _Latest):
                    latest[event.policy_id] = event.version
                elif isinstance(event, _Hot):
                    hot[event.sid] = None
                elif isinstance(event, _Gone):
                    hot.pop(event.sid, None)
                    if event.sid.policy_id in follows:
                        gone.add(event.sid)
                    if event.deleted:
                        deleted.add(event.sid)
            adopted = set(adopt)
            hot.update(dict.fromkeys(sid for sid in self._hot if sid.policy_id in adopted))
            # a reader applies gone before hot: a snapshot evicted then restored ends up with its new ref
            current = tuple(self._hot[sid] for sid in hot if sid in self._hot and self._wanted(sid, follows))
            return StoreEvents(self._seq, False, self._as_of, latest, current, tuple(gone), tuple(deleted),
                               self.epoch)


class Doorbell:
    """Where followers wait for news of one store or catalog: hosted inside that actor's own process
    (``hosting.py``), each waiter one coroutine on the actor's ``bell`` event loop, never a thread of it; followers
    call the store or catalog itself only when there is news (or reads to report).

    The actor rings it with its feed's ``Ring`` whenever that changes, from one thread of its own (``ring`` is
    thread-safe and never waits). A doorbell not rung yet knows nothing ("" epoch): its waiters time out and ask
    their store (the first ring comes at once).

    ``settle_s``: the waiters a ring wakes wake that much later, each with the newest ring then: the call that
    rang answers its caller before they call the actor back, and rings in between wake them once."""

    def __init__(self, settle_s: float = 0.0) -> None:
        self._settle_s = settle_s
        self._lock = threading.Lock()  # rung from the actor's threads, waited on from its event loop
        self._ring = _SILENT
        self._about: dict[str, int] = {}  # policy -> the last event about it
        self._for_all = 0  # the last event about everyone
        self._waiting = 0
        self._news: set[asyncio.Future] = set()  # the waiters to wake at the next news
        # a catalog's beats (rings whose ``as_of`` moved): how many arrived, whether the last followed its
        # predecessor (as_of + 1: the same catalog sent it after that one was taken), and who waits for the next
        self._beats = 0
        self._in_turn = False
        self._beat: set[asyncio.Future] = set()

    def ring(self, ring: Ring) -> None:
        with self._lock:
            last, self._ring = self._ring, ring
            if ring.epoch != last.epoch:  # another feed (numbered anew), or news this doorbell missed: for everyone
                self._about = {}
            if ring.everyone or ring.epoch != last.epoch:
                self._for_all = ring.seq
            self._about.update(dict.fromkeys(ring.touched, ring.seq))
            woken: set[asyncio.Future] = set()
            if ring.as_of != last.as_of:
                self._beats += 1
                self._in_turn = ring.as_of == last.as_of + 1
                woken, self._beat = self._beat, set()
            if (ring.seq, ring.epoch) != (last.seq, last.epoch):
                woken |= self._news
                self._news = set()
        for waiter in woken:  # each on the loop it waits on (this may be another thread)
            loop = waiter.get_loop()
            loop.call_soon_threadsafe(loop.call_later, self._settle_s, _wake, waiter)

    def _quiet(self, since: int, epoch: FeedEpoch | str, follows: Collection[str] | None) -> bool:
        """Whether the doorbell holds no news for a follower that has heard up to ``since`` in ``epoch`` and
        follows ``follows`` (None: every policy); caller holds the lock."""
        ring = self._ring
        if ring.epoch not in ("", epoch):
            return False
        if ring.seq <= since:
            return True
        if follows is None:
            return False
        return self._for_all <= since and all(self._about.get(pid, 0) <= since for pid in follows)

    async def _until(self, deadline: float, done: Callable[[], bool], beats: bool = False) -> bool:
        """Wait until ``done()`` (asked under the lock after every ring) or the loop's ``deadline``; whether done.
        ``beats``: a beat wakes it too, not only news."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if done():
                    return True
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                waiter = loop.create_future()
                self._news.add(waiter)
                if beats:
                    self._beat.add(waiter)
            try:
                await asyncio.wait_for(waiter, remaining)
            except asyncio.TimeoutError:
                return False
            finally:  # a waiter that timed out (or was cancelled) is no longer anyone's to wake
                with self._lock:
                    self._news.discard(waiter)
                    self._beat.discard(waiter)

    async def wait(self, since: int, epoch: FeedEpoch | str, timeout_s: float,
                   follows: Collection[str] | None = None) -> Ring:
        """The ring, once it names an event after ``since`` or another epoch than ``epoch`` (the caller's), or
        after ``timeout_s`` (a heartbeat: a store's ``as_of`` moves on while nothing happens). ``follows``: the
        policies the caller follows; news about others waits for the heartbeat (a reader pays for the snapshots it
        plays, not one call per publish of the league's other policies)."""
        deadline = asyncio.get_running_loop().time() + min(max(float(timeout_s), 0.0), 60.0)
        with self._lock:
            self._waiting += 1
        try:
            await self._until(deadline, lambda: not self._quiet(since, epoch, follows))
        finally:
            with self._lock:
                self._waiting -= 1
        return self._ring

    async def after_beats(self, since: int, epoch: str, timeout_s: float) -> tuple[Ring, bool]:
        """A catalog's ring once it names an event after ``since`` (or another epoch), or once it is a beat the
        catalog sent after this call arrived: then True, and the ring is the catalog's own word that it had no
        news after ``since`` at a time later than the caller's call (``as_of`` may move to the call's start),
        though the caller never called the catalog. False after ``timeout_s`` (the catalog is stuck, gone or cut
        off: nothing is proven). The catalog beats once per taken beat (``catalog._beat``), so the second beat to
        arrive after this call, if it follows the first in turn, was sent after this call arrived."""
        deadline = asyncio.get_running_loop().time() + min(max(float(timeout_s), 0.0), 60.0)
        with self._lock:
            arrived = self._beats
            self._waiting += 1
        proven = False

        def done() -> bool:
            nonlocal proven
            if not self._quiet(since, epoch, None):
                return True
            proven = self._beats >= arrived + 2 and self._in_turn
            return proven

        try:
            await self._until(deadline, done, beats=True)
        finally:
            with self._lock:
                self._waiting -= 1
        return self._ring, proven

    def waiters(self) -> int:
        """Followers waiting now."""
        return self._waiting


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


_SILENT = Ring(0, -math.inf, "")  # a doorbell nobody has rung yet


@dataclass(frozen=True)
class PushState:
    """What one process has been pushed by one node store (``PolicyStore.push_state()``)."""

    following: bool  # a follower thread runs (only for the store of the process's own node)
    fresh: bool  # within max_staleness_s: get(pid) of latest needs no actor call
    age_s: float  # now - the store's as_of of the last answer (inf before the first)
    latest: dict[str, int]
    hot: tuple[SnapshotId, ...]  # snapshots this process holds a pushed ref to
    catalog_epoch: str = ""  # the catalog database the pushed versions belong to ("" until the store knows it)
    follows: tuple[str, ...] = ()  # policies this process opened: only theirs are pushed with refs


class Pushed:
    """A snapshot the store pushed to this process: its ref and parsed header; once the follower has mapped it
    ahead (off the read path), the ``snapshot`` itself, and what ``ready`` made of it (a module built ahead)."""

    __slots__ = ("ref", "header", "snapshot", "ahead")

    def __init__(self, ref: ray.ObjectRef, header: Header):
        self.ref = ref
        self.header = header
        self.snapshot: Snapshot | None = None
        self.ahead: object = None


class Follower:
    """Reader side: follows one node store from a daemon thread (waiting on the store's doorbell, calling the store
    when there is news); thread-safe lookups for the read path. Pushed refs only of the policies this process
    follows (the ones it opened), and of each only the newest: what it never opened costs it a version number.

    A pushed snapshot is mapped ahead on the follower's thread as soon as it lands (``ray.get`` and the page
    protection, then ``ready``, which may build what the process will want of it), so a read of it is a lookup."""

    def __init__(self, node_id: str, config: StoreConfig, on_deleted: Callable[[SnapshotId], None],
                 on_catalog: Callable[[str], None], ready: Callable[[Snapshot], object] | None = None,
                 held: Callable[[SnapshotId], Snapshot | None] | None = None):
        self._name = store_name(node_id, config.league or DEFAULT_LEAGUE)
        self._on_catalog = on_catalog  # told the catalog's epoch: a new one numbers versions anew
        self._actor: ray.actor.ActorHandle | None = None  # looked up by name: a store started anew is found
        self._poll_s = config.poll_s
        self._max_staleness_s = config.max_staleness_s
        self._on_deleted = on_deleted
        self._ready = ready
        self._held = held  # what the process already opened: a push of it is neither mapped nor built again
        self._map_timeout_s = config.call_timeout_s
        self._lock = threading.Lock()
        self._latest: dict[str, int] = {}
        self._hot: dict[SnapshotId, Pushed] = {}
        self._as_of = -math.inf
        self._epoch: FeedEpoch | None = None
        self._seq = 0
        self._used: set[SnapshotId] = set()  # opened since the last call to the store (its LRU learns with the next)
        self._follows: set[str] = set()  # policies opened here: their new versions are pushed with refs
        self._reads: set[str] = set()  # policies read here (not only published): their pushes are mapped ahead
        self._adopt: set[str] = set()  # followed since the last call to the store
        self._stopped = concurrent.futures.Future()  # completed by stop(): also wakes the thread's wait at once
        self._thread = threading.Thread(target=self._run, name=f"policystore-follow-{node_id[:12]}", daemon=True)
        self._thread.start()

    def latest(self, policy_id: str) -> int | None:
        """The pushed latest version, or None when the push is older than max_staleness_s or knows nothing."""
        if time.monotonic() - self._as_of > self._max_staleness_s:
            return None
        return self._latest.get(policy_id)

    def hot(self, sid: SnapshotId) -> Pushed | None:
        return self._hot.get(sid)

    def reads(self, policy_id: str) -> bool:
        """Whether this process has read ``policy_id`` (its pushes are mapped ahead, its own publishes kept)."""
        return policy_id in self._reads

    def take_ahead(self, sid: SnapshotId) -> object:
        """What ``ready`` made of pushed ``sid`` (None: nothing yet), handed out once."""
        with self._lock:
            pushed = self._hot.get(sid)
            if pushed is None:
                return None
            ahead, pushed.ahead = pushed.ahead, None
            return ahead

    def unmap(self) -> None:
        """Let go of what was mapped ahead (``clear_cache``): the next read of each pushed snapshot maps it anew."""
        with self._lock:
            for pushed in self._hot.values():
                pushed.snapshot = pushed.ahead = None

    def own(self, sid: SnapshotId, ref: ray.ObjectRef, head: bytes) -> None:
        """This process published ``sid`` and holds its ref (the store's reply): read it as if pushed, and follow
        its policy (the push drops it when the store lets go of it)."""
        pushed = Pushed(ref, parse_head(head, name=str(sid)))
        self.used(sid, read=False)
        with self._lock:
            if any(s.policy_id == sid.policy_id and s.version > sid.version for s in self._hot):
                return  # a newer version was pushed meanwhile
            for old in [s for s in self._hot if s.policy_id == sid.policy_id]:
                del self._hot[old]
            pushed = self._hot.setdefault(sid, pushed)
        # mapped as soon as Ray has it, on Ray's thread (the follower's may be waiting on its doorbell)
        ref.future().add_done_callback(functools.partial(self._mapped, sid, pushed))

    def _mapped(self, sid: SnapshotId, pushed: Pushed, future: concurrent.futures.Future) -> None:
        """``pushed`` arrived (``future`` holds what ``ray.get`` returns): map it for the read path."""
        try:
            snap = Snapshot(sid, open_shared(future.result(), what=str(sid)), pushed.ref, pushed.header)
        except Exception as exc:  # gone meanwhile, or not protectable: the read path copes
            log.debug("policystore: %s not mapped ahead: %s", sid, exc)
            return
        with self._lock:
            if self._hot.get(sid) is pushed and pushed.snapshot is None:
                pushed.snapshot = snap

    def used(self, sid: SnapshotId, read: bool = True) -> None:
        """This process opened a snapshot (no store call on the read path of a pushed one: the next call to the
        store says so), or published it (``read`` False); from now on its policy's new versions are pushed with
        their refs, and, once it was read here, mapped ahead."""
        with self._lock:
            self._used.add(sid)
            if read:
                self._reads.add(sid.policy_id)
            if sid.policy_id not in self._follows:
                self._follows.add(sid.policy_id)
                self._adopt.add(sid.policy_id)

    def take_used(self) -> tuple[SnapshotId, ...]:
        """The snapshots opened since the last call to the store, now to be told to it."""
        with self._lock:
            used, self._used = self._used, set()
        return tuple(used)

    def drop(self, sid: SnapshotId, deleted: bool = False) -> None:
        """Let go of a pushed ref (found dead or damaged); ``deleted``: also stop calling it the latest version."""
        with self._lock:
            self._hot.pop(sid, None)
            if deleted and self._latest.get(sid.policy_id) == sid.version:
                del self._latest[sid.policy_id]

    def state(self) -> PushState:
        with self._lock:
            age = time.monotonic() - self._as_of
            return PushState(self._thread.is_alive(), age <= self._max_staleness_s, age, dict(self._latest),
                             tuple(self._hot), self._epoch.catalog if self._epoch else "", tuple(sorted(self._follows)))

    def stop(self) -> None:
        """Stop following and drop every pushed ref; the thread ends after the call it may be in (``join``)."""
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # stopped twice
            self._stopped.set_result(True)
        with self._lock:
            self._hot.clear()
            self._latest.clear()
            self._as_of = -math.inf

    def join(self, timeout_s: float = _JOIN_S) -> None:
        """Wait for the stopped thread to end: before ``ray.shutdown()``, none of its Ray calls may be under way (a
        call that reaches Ray while the core worker is being destroyed ends the whole process)."""
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        failures = 0
        session = remote.session_name()
        news = True
        limit = self._poll_s * 4 + 10
        while not self._stopped.done() and remote.session_name() == session:
            try:
                if self._actor is None:
                    self._actor = remote.find(self._name, background=True)
                if news or self._used or self._adopt:
                    if not self._call_store(session, limit):
                        return
                with self._lock:
                    follows = tuple(self._follows)
                bell = remote.send_in_background(self._actor, "bell_wait", self._seq, self._epoch or "", self._poll_s,
                                                 follows)
                ring = self._wait(bell, session, limit, "bell_wait")
                if ring is None:
                    return
                news = not self._heard(ring)
            except Exception as exc:  # store restarting or gone, Ray shutting down: reads fall back meanwhile
                if self._stopped.done() or remote.session_name() != session:
                    return
                if remote.died(exc):
                    self._actor = None  # stopped for good (or not there yet): find its successor
                news = True
                failures += 1
                if failures == 1 or failures % 100 == 0:
                    log.info("policystore: following the store failed (%s); reads ask it directly meanwhile",
                             type(exc).__name__)
                concurrent.futures.wait([self._stopped], timeout=min(0.05 * failures, 1.0))
                continue
            failures = 0

    def _call_store(self, session: str | None, timeout_s: float) -> bool:
        """Ask the store what changed (an answer at once: the waiting is the doorbell's). False: stopped."""
        with self._lock:
            follows, adopt = tuple(self._follows), tuple(self._adopt)
        call = remote.send_in_background(self._actor, "watch", self._seq if self._epoch else 0, 0, self.take_used(),
                                         follows, adopt)
        events = self._wait(call, session, timeout_s, "watch")
        if events is None or self._stopped.done():
            return False
        with self._lock:
            self._adopt.difference_update(adopt)
        self._apply(events)
        if events.hot:
            self._map_ahead(session)
        return not self._stopped.done()

    def _heard(self, ring: Ring) -> bool:
        """Whether the doorbell's ring holds no news for this follower; if so its ``as_of`` is this follower's too
        (it has every event up to that ring's)."""
        with self._lock:
            if self._epoch is None or ring.epoch != self._epoch or ring.seq > self._seq:
                return False
            self._as_of = max(self._as_of, ring.as_of)
            return True

    def _wait(self, ref: ray.ObjectRef, session: str | None, timeout_s: float, method: str) -> object | None:
        """A remote call's answer, waited for without blocking inside Ray (``remote.get``'s ``stop``). None: stopped
        or Ray shut down."""
        return remote.get(ref, timeout_s, f"the {remote.describe(self._name)}", method,
                          stop=lambda: self._stopped.done() or remote.session_name() != session, wake=self._stopped)

    def _map_ahead(self, session: str | None) -> None:
        """Map the pushed snapshots not mapped yet (newest first), off the read path: a read of one is then a
        lookup. One that does not arrive, or cannot be protected, is left to the read path (which asks the store)."""
        with self._lock:
            todo = [(sid, p) for sid, p in self._hot.items() if p.snapshot is None and sid.policy_id in self._reads]
        for sid, pushed in sorted(todo, key=lambda item: -item[0].version):
            held = self._held(sid) if self._held is not None else None
            if held is not None and held._header.metadata == pushed.header.metadata:  # (it records the checksum)
                pushed.snapshot = held  # opened already (it asked the store): nothing to do ahead
                continue
            try:
                value = remote.get(pushed.ref, self._map_timeout_s, f"the pushed copy of {sid}",
                                   stop=lambda: self._stopped.done() or remote.session_name() != session,
                                   wake=self._stopped)
                if value is None:
                    return
                snap = Snapshot(sid, open_shared(value, what=str(sid)), pushed.ref, pushed.header)
                ahead = self._ready(snap) if self._ready is not None else None
            except Exception as exc:  # gone meanwhile, stuck, or not protectable: the read path copes
                log.debug("policystore: %s not mapped ahead: %s", sid, exc)
                continue
            with self._lock:
                if self._hot.get(sid) is pushed:
                    pushed.snapshot, pushed.ahead = snap, ahead

    def _apply(self, events: StoreEvents) -> None:
        if not events.reset and events.epoch != self._epoch:
            self._epoch = None  # a different store answered (restarted): ask for its whole state
            return
        parsed = {}
        for snap in events.hot:  # parsed here, off the read path (the header says the snapshot's size)
            try:
                parsed[snap.id] = Pushed(snap.refs[0], parse_head(snap.header, name=str(snap.id)))
            except Exception as exc:  # never trust a header unchecked; such a snapshot is read with a round trip
                log.warning("policystore: ignoring pushed %s: %s", snap.id, exc)
        if events.reset and events.epoch.catalog:
            self._on_catalog(events.epoch.catalog)
        with self._lock:
            if events.reset:
                self._hot, self._latest = {}, {}
                self._epoch = events.epoch
            for sid in events.gone:
                self._hot.pop(sid, None)
            newest = {sid.policy_id: sid.version for sid in sorted(parsed)}
            for sid in [s for s in self._hot if s.version < newest.get(s.policy_id, 0)]:
                del self._hot[sid]  # superseded before this process opened it: let go of it
            for sid, pushed in parsed.items():  # one held already (maybe mapped) is kept: within an epoch a
                if sid.version == newest[sid.policy_id]:  # new ref of a sid comes after its gone
                    self._hot.setdefault(sid, pushed)
            for pid, version in events.latest.items():
                if version:
                    self._latest[pid] = version
                else:
                    self._latest.pop(pid, None)
            self._seq = events.seq
            self._as_of = events.as_of
        for sid in events.deleted:
            self._on_deleted(sid)
