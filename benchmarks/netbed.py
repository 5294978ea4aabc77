"""An emulated cluster on one machine: one Ray node per network namespace, every link shaped, so that transfers
cost what they cost on a cluster's network instead of what two shared cores and loopback decide.

``Testbed`` builds N namespaces (``ip netns``) on one bridge of its own, a veth pair per node with ``tbf`` at the
given rate on both ends (the namespace's ``eth0`` is the node's uplink, the bridge port its downlink), addresses on
one private /24, then starts one Ray node per namespace (``ip netns exec NS ray start ...``; the head, then the
others at once), each with a temp folder of its own inside the testbed's and a small object store. Scenarios
run their driver inside the head's namespace (``Testbed.run``). Leaving (also on an error, Ctrl-C or SIGTERM)
removes exactly what it built: the namespaces' processes (``ip netns pids``), the namespaces, the bridge, the temp
folder (Ray's ``ray_current_cluster`` record is in it). It never runs ``ray stop`` (that stops every Ray on the
machine) and never touches an address outside its /24.

It needs root with CAP_NET_ADMIN, ``ip`` and ``tc``, and the ``sch_tbf`` qdisc; ``unavailable()`` says why not.
The scenarios are ``benchmarks.fanout_net`` (and its ``--quick`` smoke run in the suite).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from policystore.memory import MiB

ROOT = Path(__file__).resolve().parents[1]
START_ATTEMPTS = 3
PORT = 6379  # every node has its own namespace, so the same port never collides
# The /24 every testbed uses: private and unrouted (the bridge has no address in the root namespace).
SUBNET = "10.213.41"
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}


def unavailable() -> str | None:
    """Why no testbed can be built here (None: it can)."""
    if sys.platform != "linux":
        return "the network testbed needs Linux network namespaces"
    if os.geteuid() != 0:
        return "the network testbed needs root (network namespaces, veth pairs and tc qdiscs)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the network testbed needs the {tool!r} command (iproute2)"
    probe = f"psnbp-{uuid.uuid4().hex[:4]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace (CAP_NET_ADMIN?): {made.stderr.strip()}"
    try:
        for argv in (["ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1"],
                     ["tc", "-n", probe, "qdisc", "add", "dev", "p0", "root", "tbf", "rate", "100mbit",
                      "burst", "64kb", "latency", "100ms"]):
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                return f"`{' '.join(argv)}` failed: {done.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def sh(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")


@dataclass
class Testbed:
    """``nodes`` Ray nodes behind links of ``rate_mbit`` each (both directions); use as a context manager."""

    nodes: int
    rate_mbit: float
    object_store_mib: int = 256
    num_cpus: float = 1
    extra_env: dict[str, str] = field(default_factory=dict)  # for every node and driver (Ray's settings)
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:4])
    temp_dir: Path | None = None
    _built: list[str] = field(default_factory=list)  # namespaces made, in order
    _bridge: str | None = None

    @property
    def namespaces(self) -> list[str]:
        return [f"psnb-{self.tag}-{i}" for i in range(self.nodes)]

    def ip(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    @property
    def address(self) -> str:
        return f"{self.ip(0)}:{PORT}"

    def __enter__(self) -> Testbed:
        if self.nodes < 2 or self.nodes > 200:
            raise ValueError(f"a testbed has 2 to 200 nodes, not {self.nodes}")
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed run still leaves through __exit__
        self._restore_sigterm = previous
        try:
            self.temp_dir = Path(tempfile.mkdtemp(prefix=f"psnb-{self.tag}-"))
            self._network()
            self._ray()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _network(self) -> None:
        self._bridge = f"psnb-{self.tag}"
        sh("ip", "link", "add", self._bridge, "type", "bridge")
        sh("ip", "link", "set", self._bridge, "up")
        for i, ns in enumerate(self.namespaces):
            sh("ip", "netns", "add", ns)
            self._built.append(ns)
            port = f"{self._bridge}-{i}"
            sh("ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", port, "master", self._bridge, "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            self.shape(port, None)
            self.shape("eth0", ns)

    def shape(self, dev: str, ns: str | None) -> None:
        """``tbf`` at the testbed's rate on one end of a link."""
        burst = max(64, int(self.rate_mbit / 8 / 1000 * 1024 * 2))  # about 2 ms of traffic, at least 64 KiB
        sh("tc", *(("-n", ns) if ns else ()), "qdisc", "add", "dev", dev, "root", "tbf",
           "rate", f"{self.rate_mbit}mbit", "burst", f"{burst}kb", "latency", "200ms")

    def env(self) -> dict[str, str]:
        """The environment of every process of the testbed (its nodes, its drivers)."""
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        return {**os.environ, **RAY_ENV, **self.extra_env, "PYTHONPATH": path}

    def _ray(self) -> None:
        """The head first, then every other node at once: each ``ray start`` mostly waits (its CLI's imports, the
        raylet's registration), so joining them one after the other cost a testbed of 4 nodes 3 such waits more.
        Every node has a temp folder of its own: Ray names a node's sockets and logs by the first free index in its
        folder, which two nodes starting at once in one folder both take (the second raylet's bind fails)."""
        self._start(0)
        retries = threading.Lock()
        with ThreadPoolExecutor(self.nodes - 1) as pool:  # raises the first node's error that failed
            list(pool.map(self._start, range(1, self.nodes), [retries] * (self.nodes - 1)))

    def _start(self, i: int, retries: threading.Lock | None = None) -> None:
        """``ray start`` on node ``i``, up to START_ATTEMPTS times; after a failure (a loaded machine: Ray gives a
        raylet 30 s to register) the retries of every node go one at a time, as they do with ``retries``."""
        ray = str(Path(sys.executable).with_name("ray"))
        common = ["--temp-dir", str(self.temp_dir / f"node{i}"), "--disable-usage-stats",
                  "--include-log-monitor=false",  # one process less per node: the drivers take no worker output
                  f"--num-cpus={self.num_cpus}", f"--object-store-memory={self.object_store_mib * MiB}"]
        ns = self.namespaces[i]
        role = ["--head", f"--port={PORT}", "--include-dashboard=false"] if i == 0 else [f"--address={self.address}"]
        for attempt in range(START_ATTEMPTS):  # a loaded head's GCS can miss a joining node's deadline
            with retries if retries is not None and attempt else contextlib.nullcontext():
                done = subprocess.run(["ip", "netns", "exec", ns, ray, "start", *role,
                                       f"--node-ip-address={self.ip(i)}", *common],
                                      env=self.env(), capture_output=True, text=True, timeout=180)
                if done.returncode == 0:
                    return
                self._kill(ns)
        raise RuntimeError(f"ray start on node {i} ({ns}) failed {START_ATTEMPTS} times, last: "
                           f"{done.stderr.strip()[-2000:]}")

    def popen(self, argv: Sequence[str], node: int = 0, env_extra: dict[str, str] | None = None,
              **kwargs) -> subprocess.Popen:
        """Start ``argv`` (a driver) inside node ``node``'s namespace, with the testbed's environment,
        ``NETBED_ADDRESS`` (the cluster's address) and ``NETBED_TEMP_DIR`` (its folder, removed with it)."""
        env = {**self.env(), "NETBED_ADDRESS": self.address, "NETBED_TEMP_DIR": str(self.temp_dir),
               **(env_extra or {})}
        return subprocess.Popen(["ip", "netns", "exec", self.namespaces[node], *argv], env=env, cwd=ROOT, **kwargs)

    def drive(self, argv: Sequence[str], env_extra: dict[str, str] | None = None) -> Iterator[dict]:
        """Run a scenario's driver (``argv``) in the head's namespace and yield the JSON rows it prints; the
        driver is ended if the caller stops early (an error, Ctrl-C, SIGTERM), before the testbed goes."""
        driver = self.popen(argv, env_extra=env_extra, stdout=subprocess.PIPE, text=True)
        try:
            for line in driver.stdout:
                if line.startswith("{"):
                    row = json.loads(line)
                    row.pop("benchmark", None)
                    row.pop("loadavg_1m", None)  # the caller's Results adds its own
                    yield row
            if driver.wait():
                raise RuntimeError(f"the driver in the testbed failed ({driver.returncode}); see its log above")
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()

    def link(self, node: int, up: bool) -> None:
        """Cut node ``node`` off the network (or bring it back): its ``eth0`` down or up."""
        sh("ip", "-n", self.namespaces[node], "link", "set", "eth0", "up" if up else "down")

    def link_bytes(self, node: int) -> tuple[int, int]:
        """(sent, received) bytes on node ``node``'s uplink since it was built."""
        stats = Path(f"/sys/class/net/{self._bridge}-{node}/statistics")
        # the bridge port's counters, seen from the bridge: what it transmits the node received
        return int((stats / "rx_bytes").read_text()), int((stats / "tx_bytes").read_text())

    def __exit__(self, *exc: object) -> None:
        self._kill(*self._built)
        for ns in reversed(self._built):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._built.clear()
        if self._bridge is not None:
            for i in range(self.nodes):  # gone with their namespaces; a half-built one may be left
                subprocess.run(["ip", "link", "del", f"{self._bridge}-{i}"], capture_output=True)
            subprocess.run(["ip", "link", "del", self._bridge], capture_output=True)
            self._bridge = None
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None
        if hasattr(self, "_restore_sigterm"):
            signal.signal(signal.SIGTERM, self._restore_sigterm)

    @staticmethod
    def pids(ns: str) -> list[int]:
        done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        return [int(p) for p in done.stdout.split()]

    def _kill(self, *namespaces: str, grace_s: float = 5.0) -> None:
        """End every process in ``namespaces`` (only those: they are this testbed's), politely first; all the
        namespaces at once, so that their processes' exits overlap."""
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            for pid in (pid for ns in namespaces for pid in self.pids(ns)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait_s
            while any(self.pids(ns) for ns in namespaces) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not any(self.pids(ns) for ns in namespaces):
                return


def cpu_seconds(namespaces: Sequence[str]) -> float:
    """CPU seconds (user and system) used so far by the processes now running in ``namespaces``: what the
    testbed's nodes cost the machine's cores, which a real cluster's nodes would each pay on their own."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for ns in namespaces:
        for pid in Testbed.pids(ns):
            with contextlib.suppress(OSError, IndexError, ValueError):
                # fields after the command's closing parenthesis: utime and stime are the 12th and 13th
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
    return total / tick


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine spent on anything but idling (``/proc/stat``), so far."""
    cpu = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(x) for x in cpu[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def leftovers(tag: str) -> list[str]:
    """What a testbed with ``tag`` left behind (for tests: should be nothing)."""
    found = []
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [line.split()[0] for line in names.splitlines() if line.startswith(f"psnb-{tag}")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [line.split(":")[1].strip() for line in links.splitlines() if f"psnb-{tag}" in line]
    found += [str(p) for p in Path(tempfile.gettempdir()).glob(f"psnb-{tag}-*")]
    return found


def main(argv: list[str] | None = None) -> None:
    """``--check``: print why no testbed can be built here (exit 3), or nothing; ``--leftovers TAG``: print what a
    testbed with that tag left behind, as a JSON list (for tests, which import no benchmark module)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.netbed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="can a testbed be built here?")
    parser.add_argument("--leftovers", metavar="TAG", help="what the testbed tagged TAG left behind")
    args = parser.parse_args(argv)
    if args.leftovers:
        print(json.dumps(leftovers(args.leftovers)))
    if args.check and (reason := unavailable()):
        print(reason)
        sys.exit(3)


if __name__ == "__main__":
    main()
