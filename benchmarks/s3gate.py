"""A real S3-compatible server (moto's server mode, on loopback) behind a switchable proxy, for fault injection:
``up`` forwards, ``down`` refuses connections, ``hang`` accepts connections and never answers, ``errors`` answers
every request with HTTP 500. The durable tier's faults in the chaos benchmark are these switches, and so are those of
the store's durable-tier tests (``tests/policystore/test_durable.py``)."""

from __future__ import annotations

import errno
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

MODES = ("up", "down", "hang", "errors")
_ERROR_REPLY = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class S3Gate:
    """moto on a free loopback port with one bucket (or the server already at ``server_port``), reached through
    the proxy at ``port``."""

    def __init__(self, bucket: str = "league", server_port: int | None = None):
        import pyarrow.fs as pafs

        for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                            ("AWS_DEFAULT_REGION", "us-east-1")):
            os.environ.setdefault(name, value)
        self.bucket, self.server_port, self._server = bucket, server_port, None
        if server_port is None:
            # below the ephemeral range: no other socket is given the port before moto binds it, and the wait for
            # moto to listen on it cannot connect to itself
            with _listener_below_ephemeral_range() as s:
                self.server_port = s.getsockname()[1]
            self._server = _start_server(self.server_port)
            pafs.S3FileSystem(access_key="testing", secret_key="testing", region="us-east-1", scheme="http",
                              endpoint_override=f"127.0.0.1:{self.server_port}", allow_bucket_creation=True
                              ).create_dir(bucket)
        self.mode = "up"
        self.hung = 0  # connections accepted in ``hang`` mode and left unanswered
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []  # connections piped or refused: their threads close them
        self._hung: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.port = 0
        self._listen()

    def uri(self, prefix: str, *, direct: bool = False) -> str:
        """The durable_uri of ``prefix`` through the proxy (``direct``: to the server itself). Credentials ride in
        the URI: Ray workers need not share this process's environment."""
        port = self.server_port if direct else self.port
        return (f"s3://testing:testing@{self.bucket}/{prefix}?endpoint_override=127.0.0.1:{port}&scheme=http"
                "&region=us-east-1")

    def set(self, mode: str) -> None:
        """Switch the proxy; connections made before the switch are cut, so no client carries on over them."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        with self._lock:
            self.mode = mode
            sockets, self._sockets = self._sockets, []
            hung, self._hung = self._hung, []
        close_all(sockets)
        for s in hung:
            s.close()
        if mode == "down" and self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept (close alone does not)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        elif mode != "down" and self._listener is None:
            self._listen()

    def close(self) -> None:
        self.set("down")
        if self._server is not None:
            self._server.stdin.close()
            try:
                self._server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()

    def _listen(self) -> None:
        if self.port:
            self._listener = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR: the same port again
        else:
            self._listener = _listener_below_ephemeral_range()
            self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            with self._lock:
                mode = self.mode
                self._sockets.append(client)
            if mode == "down":  # accepted just as the listener closed
                client.close()
                continue
            if mode == "hang":
                with self._lock:
                    self.hung += 1
                    self._sockets.remove(client)
                    self._hung.append(client)  # no thread uses it: closed by the next switch
                continue  # held open, never read, never answered
            if mode == "errors":
                threading.Thread(target=self._refuse, args=(client,), daemon=True).start()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.server_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.append(upstream)
            connect(client, upstream)

    @staticmethod
    def _refuse(client: socket.socket) -> None:
        try:
            if client.recv(1 << 16):
                client.sendall(_ERROR_REPLY)
        except OSError:
            pass
        finally:
            client.close()


_SERVER = """
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False)
server.start()
sys.stdin.read()  # until the parent closes the pipe, or dies
server.stop()
"""


def _listener_below_ephemeral_range() -> socket.socket:
    """A loopback listener on a port below the kernel's ephemeral range. The gate closes its port while ``down`` and
    takes it again on ``up``; a port in that range could meanwhile become the local end of any outgoing connection
    on the machine, even a client's own connection to the closed port (TCP's self-connect), and ``up`` would fail."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    ports = range(max(1024, low // 2), low)
    for port in random.sample(ports, min(200, len(ports))):
        try:
            return socket.create_server(("127.0.0.1", port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
    raise RuntimeError(f"no free loopback port below the ephemeral range (which starts at {low})")


def _start_server(port: int) -> subprocess.Popen:
    """moto's S3 server in a process of its own (not a thread of this one): a client that crashes or corrupts
    memory under a fault takes down only itself, and the server's work does not compete for this process's GIL.
    It ends with its parent (its stdin closes)."""
    server = subprocess.Popen([sys.executable, "-c", _SERVER, str(port)], stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(f"moto's S3 server did not start on port {port} (exit {server.poll()})") from None
            time.sleep(0.1)


def close_all(sockets: list[socket.socket]) -> None:
    """Shut every socket down: a peer or a thread blocked on one of them wakes up with EOF or an error. They are
    closed by the threads that use them (``connect``), never here: a socket closed while another thread is about to
    call ``recv`` or ``send`` on it frees its descriptor number for the next socket or file this process opens,
    and that call would then read or write someone else's connection."""
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _copy(src: socket.socket, dst: socket.socket, forward: Callable[[bytes], bool]) -> None:
    """Copy ``src`` to ``dst`` until either end closes or ``forward(data)`` says stop; then shut both down (which
    ends the copy the other way too)."""
    try:
        while (data := src.recv(1 << 16)) and forward(data):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        close_all([src, dst])


def connect(a: socket.socket, b: socket.socket, forward: Callable[[bytes], bool] = bool) -> None:
    """Pipe ``a`` and ``b`` both ways on daemon threads; ``forward`` sees what goes from ``a`` to ``b``. Once both
    ways have ended, the thread that copies ``a`` to ``b`` closes the two sockets (no other thread uses them then)."""
    def run() -> None:
        back = threading.Thread(target=_copy, args=(b, a, bool), daemon=True)
        back.start()
        _copy(a, b, forward)
        back.join()
        a.close()
        b.close()

    threading.Thread(target=run, daemon=True).start()
