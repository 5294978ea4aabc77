"""Node-to-node transfer of snapshot bytes: a pipelined fan-out over plain TCP streams between the stores.

A new snapshot spreads as a chain (or, with ``fanout`` > 1, a tree) in which every node forwards the bytes it
has received as soon as they land, not after its whole copy: n nodes take about one copy's time plus a short fill
per hop, where a store-and-forward tree pays a whole copy per level and a star (every node from the publisher)
n copies on the publisher's link. Every node's uplink carries at most ``fanout`` copies.

Control: a fetching store asks a holder's store to ``route`` it (an actor call). A holder that serves fewer than
``fanout`` nodes of that snapshot serves the requester itself; else it points it at the oldest node it routed that
still has a free slot (breadth first: with ``fanout`` 1 that is the chain's end), whose copy may still be landing.
Data: the requester connects to the holder's ``Relay`` (one listening socket per store), names the snapshot and an
offset, and receives the bytes from there as they land at the holder. The listening socket serves only requests
that carry the holder's ticket, a random secret it hands out with ``route`` (an actor call, so through Ray's own
authentication): whoever can reach the port but cannot call the store reads nothing. A source that fails or stalls
mid-way costs no bytes already received: the requester resumes at its offset from the next holder, and as a last
resort asks a holder to serve it beyond its share (``force``).

Bytes only: the receiving store parses, checksums and ``ray.put``s its own copy (``server._own_copy``), so a node's
copy never depends on its source. No pickle: a request is a length-prefixed key and an offset; an answer is the
snapshot's length, then its bytes.
"""

from __future__ import annotations

import hmac
import logging
import random
import secrets
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .errors import PolicyStoreError, SnapshotLostError, brief
from .ids import SnapshotId

log = logging.getLogger(__name__)

FANOUT = 1  # nodes a holder serves directly per snapshot: 1 is a chain (every uplink carries one copy)
STALL_S = 30.0  # a source that sends nothing for this long is given up (its bytes so far are kept)
# How long a node serving its landing copy waits for more of it: its own fetch gives up on a stalled source (and
# fails the landing, which ends the streams it serves) well before this; downstream nodes wait for it rather than
# all leaving a stalled chain for the same holder at once.
LANDING_WAIT_S = 120.0
SEND_SLICE = 4 << 20  # the most bytes one send hands the kernel (the rest as more lands)
# A landing copy wakes the nodes it serves once per this many new bytes (or at its end), not on every receive:
# fewer wake-ups and larger sends where the CPU, not the link, is short; each hop then trails by up to this much
# (4 ms at 500 Mbit/s, 0.1 ms at 25 Gbit/s).
WAKE_BYTES = 256 << 10
TICKET_BYTES = 16
_REQUEST = struct.Struct(f"!{TICKET_BYTES}sHQ")  # the holder's ticket, key length, offset
_ANSWER = struct.Struct("!q")  # total bytes; -1: not here (followed by a reason of at most 1 KiB)


class TransferError(PolicyStoreError):
    """A node-to-node transfer failed (the source died, stalled or had no copy); the fetch tries another."""


@dataclass(frozen=True)
class Route:
    """A holder's answer to ``route``: stream from ``address`` (host, port) showing ``ticket``, or ask node
    ``instead``."""

    address: tuple[str, int] | None = None
    instead: str | None = None
    ticket: bytes = b""


def key(sid: SnapshotId) -> str:
    return f"{sid.policy_id}@{sid.version}"


class Landing:
    """One snapshot's bytes as they arrive on this node: the buffer, how much of it has landed, and whether the
    transfer failed. Servers of downstream nodes read from it while it fills."""

    def __init__(self) -> None:
        self.buf: np.ndarray | None = None
        self.filled = 0
        self.error: str | None = None
        self._told = 0  # what the waiting servers were last woken for
        self._cond = threading.Condition()

    def start(self, nbytes: int) -> None:
        with self._cond:
            if self.buf is None:
                self.buf = np.empty(nbytes, dtype=np.uint8)
            elif self.buf.nbytes != nbytes:
                raise TransferError(f"sources disagree on the snapshot's size ({self.buf.nbytes} != {nbytes})")
            self._cond.notify_all()

    def landed(self, nbytes: int) -> None:
        with self._cond:
            self.filled += nbytes
            if self.filled - self._told >= WAKE_BYTES or self.filled == self.buf.nbytes:
                self._told = self.filled
                self._cond.notify_all()

    def fail(self, reason: str) -> None:
        with self._cond:
            self.error = reason
            self._cond.notify_all()

    def wait(self, beyond: int, timeout_s: float) -> int:
        """How much has landed, once that is more than ``beyond`` bytes (or everything); TransferError if the
        transfer failed or nothing came within ``timeout_s``."""
        with self._cond:
            ready = self._cond.wait_for(
                lambda: self.error is not None or (self.buf is not None and (
                    self.filled > beyond or self.filled == self.buf.nbytes)), timeout_s)
            if self.error is not None:
                raise TransferError(self.error)
            if not ready:
                raise TransferError(f"nothing landed beyond byte {beyond} for {timeout_s:.0f} s")
            return self.filled


@dataclass
class _Routes:
    """Per snapshot: the nodes this store serves directly, and those it routed with the slots they have left."""

    served: list[str] = field(default_factory=list)
    open: deque = field(default_factory=deque)  # [node, free slots], oldest first


class Relay:
    """A store's end of the transfer: a listening socket that serves its copies (whole, or landing), the routing
    of requesters, and the fetch of a copy from other nodes. ``copy_of(sid)`` returns this node's whole copy of
    ``sid`` (its bytes, readable while held) or None; ``on_served()`` is called after each stream sent whole."""

    def __init__(self, host: str, copy_of: Callable[[SnapshotId], np.ndarray | None], fanout: int = FANOUT,
                 on_served: Callable[[], None] = lambda: None):
        self.fanout = fanout
        self._copy_of = copy_of
        self._on_served = on_served
        self._lock = threading.Lock()
        self._landing: dict[str, Landing] = {}
        self._routes: dict[SnapshotId, _Routes] = {}
        self.sent_bytes = 0
        self.served = 0  # downstream streams this store completed
        self.resumed = 0  # sources this store's fetches left mid-way (or found without a copy) for another
        self._listener = socket.create_server((host, 0), backlog=256)
        self.address: tuple[str, int] = (host, self._listener.getsockname()[1])
        self.ticket = secrets.token_bytes(TICKET_BYTES)
        threading.Thread(target=self._accept, name="policystore-relay", daemon=True).start()

    # ---- routing -------------------------------------------------------------------------------------------
    def route(self, sid: SnapshotId, requester: str, force: bool = False) -> Route:
        """Serve ``requester`` from here, or name the node it should ask (see the module's docstring)."""
        with self._lock:
            routes = self._routes.setdefault(sid, _Routes())
            if requester in routes.served or force or len(routes.served) < self.fanout:
                if requester not in routes.served:
                    routes.served.append(requester)
                    routes.open.append([requester, self.fanout])
                return self.here()
            while routes.open and (routes.open[0][1] <= 0 or routes.open[0][0] == requester):
                routes.open.popleft()
            if not routes.open:  # every node it knows of is full: serve beyond the share rather than loop
                return self.here()
            slot = routes.open[0]
            slot[1] -= 1
            routes.open.append([requester, self.fanout])
            return Route(instead=slot[0])

    def here(self) -> Route:
        """The answer that sends a requester to this store's socket."""
        return Route(address=self.address, ticket=self.ticket)

    def served_most(self) -> int:
        """The most nodes this store served directly for one snapshot."""
        with self._lock:
            return max((len(r.served) for r in self._routes.values()), default=0)

    def forget(self, sid: SnapshotId) -> None:
        with self._lock:
            self._routes.pop(sid, None)

    # ---- fetching ------------------------------------------------------------------------------------------
    def fetch(self, sid: SnapshotId, holders: Sequence[str], ask: Callable[[str, bool], Route],
              problems: list[str]) -> np.ndarray | None:
        """This node's bytes of ``sid``, streamed from the holders (``ask(node, force)`` is that node store's
        ``route``), or None (``problems`` says why). Downstream nodes are served from it as it lands."""
        landing = Landing()
        with self._lock:
            self._landing[key(sid)] = landing
        try:
            todo = list(holders)
            random.shuffle(todo)
            asked: set[str] = set()
            full: list[str] = []  # holders that pointed elsewhere: asked again, with force, as a last resort
            while todo or full:
                force = not todo
                node = todo.pop(0) if todo else full.pop(0)
                if node in asked and not force:
                    continue
                asked.add(node)
                try:
                    route = ask(node, force)
                    if route.address is None:
                        full.append(node)
                        if route.instead not in asked:
                            todo.insert(0, route.instead)
                        continue
                    self._receive(sid, route, landing)
                    return landing.buf
                except Exception as exc:  # dead, stalled, no copy: the next holder, from the same offset
                    problems.append(f"node {node}: {type(exc).__name__}: {brief(exc)}")
                    self.resumed += 1
                    log.info("fetching %s from node %s failed at byte %d (%s); trying another source", sid, node,
                             landing.filled, problems[-1])
            landing.fail(f"no holder of {sid} could send it: {'; '.join(problems)}")
            return None
        except BaseException as exc:
            landing.fail(f"{type(exc).__name__}: {brief(exc)}")
            raise
        finally:
            with self._lock:
                if self._landing.get(key(sid)) is landing:
                    del self._landing[key(sid)]

    def _receive(self, sid: SnapshotId, route: Route, landing: Landing) -> None:
        with socket.create_connection(route.address, timeout=STALL_S) as conn:
            name = key(sid).encode()
            conn.sendall(_REQUEST.pack(route.ticket, len(name), landing.filled) + name)
            total = _ANSWER.unpack(_read(conn, _ANSWER.size))[0]
            if total < 0:
                raise SnapshotLostError(_read(conn, 1024, exact=False).decode(errors="replace"))
            landing.start(total)
            view = memoryview(landing.buf)
            while landing.filled < total:
                n = conn.recv_into(view[landing.filled:])
                if not n:
                    raise TransferError(f"the source closed the stream at byte {landing.filled} of {total}")
                landing.landed(n)

    # ---- serving -------------------------------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="policystore-relay-send", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(STALL_S)
                ticket, length, offset = _REQUEST.unpack(_read(conn, _REQUEST.size))
                name = _read(conn, length).decode(errors="replace")  # read whole: a refusal must reach the peer
                if not hmac.compare_digest(ticket, self.ticket):
                    conn.sendall(_ANSWER.pack(-1) + b"refused: a request without this store's ticket")
                    return
                with self._lock:
                    landing = self._landing.get(name)
                if landing is not None:
                    self._send_landing(conn, landing, offset)
                else:
                    policy_id, _, version = name.rpartition("@")
                    buf = self._copy_of(SnapshotId(policy_id, int(version)))
                    if buf is None:
                        reason = f"no copy of {name} here".encode()[:1024]
                        conn.sendall(_ANSWER.pack(-1) + reason)
                        return
                    conn.sendall(_ANSWER.pack(buf.nbytes))
                    self._send(conn, memoryview(buf), offset, buf.nbytes)
                    del buf
                with self._lock:
                    self.served += 1
                self._on_served()
            except Exception as exc:  # the requester went away or this copy failed: it resumes elsewhere
                log.info("a stream to a peer ended early: %s: %s", type(exc).__name__, brief(exc))

    def _send_landing(self, conn: socket.socket, landing: Landing, offset: int) -> None:
        landing.wait(-1, LANDING_WAIT_S)  # its size is known once its own source answered
        total = landing.buf.nbytes
        conn.sendall(_ANSWER.pack(total))
        view = memoryview(landing.buf)
        pos = offset
        while pos < total:
            filled = landing.wait(pos, LANDING_WAIT_S)
            pos = self._send(conn, view, pos, filled)

    def _send(self, conn: socket.socket, view: memoryview, start: int, end: int) -> int:
        pos = start
        while pos < end:
            step = min(end, pos + SEND_SLICE)
            conn.sendall(view[pos:step])
            pos = step
        with self._lock:
            self.sent_bytes += end - start
        return end

    def close(self) -> None:
        self._listener.close()


def _read(conn: socket.socket, n: int, exact: bool = True) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            if exact:
                raise TransferError(f"the peer closed the connection after {len(out)} of {n} bytes")
            break
        out += chunk
    return bytes(out)
