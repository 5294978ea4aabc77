"""The one actor the fan-out benchmarks place on each node (``benchmarks.scale``, ``benchmarks.fanout_net``):
it publishes or reads through its node's store, or puts/gets a raw Ray object, and reads its node's link counters.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import ray


@ray.remote(num_cpus=0.01)
class Probe:
    """One process on one node: publishes or reads through the node's store, or puts/gets a raw object."""

    def ping(self) -> None:
        return None

    def node(self) -> str:
        """Also connects to the node's store, so that the timed fetches start warm."""
        import policystore

        policystore.connect()
        return ray.get_runtime_context().get_node_id()

    def publish(self, policy_id: str, nbytes: int, value: int) -> int:
        import policystore

        weights = {"w": np.full(nbytes // 4, value, dtype=np.float32)}
        return policystore.connect().publish(policy_id, weights).version

    def fetch(self, policy_id: str, version: int) -> float:
        """Seconds for one ``get`` of a version (the handle is taken before the clock starts)."""
        import policystore

        store = policystore.connect()
        start = time.perf_counter()
        snap = store.get(policy_id, version)
        assert snap.id.version == version
        return time.perf_counter() - start

    def verify(self, policy_id: str, version: int) -> bool:
        """Whether this node's hot copy matches the checksum recorded at publish."""
        import policystore

        return policystore.connect().verify(policy_id, version).hot is True

    def put(self, nbytes: int, value: int) -> list:
        self.obj = np.full(nbytes // 4, value, dtype=np.float32)
        return [ray.put(self.obj)]

    def drop(self) -> None:
        self.obj = None

    def get(self, refs: list) -> float:
        start = time.perf_counter()
        array = ray.get(refs[0])
        assert array.nbytes > 0
        return time.perf_counter() - start

    def link_bytes(self) -> tuple[int, int]:
        """(sent, received) bytes on this node's link (a ``benchmarks.netbed`` namespace's eth0)."""
        stats = Path("/sys/class/net/eth0/statistics")
        return int((stats / "tx_bytes").read_text()), int((stats / "rx_bytes").read_text())


def probe_on(node: str) -> ray.actor.ActorHandle:
    """A ``Probe`` pinned to ``node``."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return Probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
