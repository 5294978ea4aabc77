"""StoreMetrics end to end: recorded in an actor, exported by Ray's metrics agent, scraped over loopback."""

import re
import socket
import urllib.request

import pytest
import ray
from helpers import eventually

from policystore.errors import PolicyStoreError, UnknownMetricError
from policystore.metrics import GAUGES, StoreMetrics

SCRAPE_TIMEOUT_S = 120  # metrics leave the worker on the report interval (shortened below); the agent serves them


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def metrics_port():
    # a port found free may be taken (by the other test worker's Ray) before this Ray binds it: then its node never
    # comes up, and a second try with another port does
    for attempt in range(2):
        port = _free_port()
        try:
            ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="warning",
                     _metrics_export_port=port, _system_config={"metrics_report_interval_ms": 1000})
            break
        except Exception:
            ray.shutdown()
            if attempt:
                raise
    yield port
    ray.shutdown()


@ray.remote(num_cpus=0.1)
class _Recorder:
    """Stands in for a store actor: records through StoreMetrics the way the server does."""

    def __init__(self, node_id: str):
        self.metrics = StoreMetrics(node_id)

    def record(self) -> None:
        self.metrics.count("hits", 3)
        self.metrics.count("publishes")
        self.metrics.observe("get_latency", 0.002)
        self.metrics.observe("restore_latency", 1.5)
        self.metrics.set_gauges(hot_bytes=4096, hot_snapshots=2, disk_bytes=0, disk_snapshots=0, durable_pending=1)

    def bad(self, kind: str) -> str:
        try:
            {"count": lambda: self.metrics.count("hitz"), "observe": lambda: self.metrics.observe("get", 1.0),
             "gauge": lambda: self.metrics.set_gauges(hot_bytes=1, hot_byte=2)}[kind]()
        except UnknownMetricError as exc:
            return str(exc)
        return "no error"


def _samples(body: str, node_id: str) -> dict[str, float]:
    """metric name (with Prometheus suffix and le label for buckets) -> value, for series tagged with node_id."""
    found = {}
    for line in body.splitlines():
        match = re.match(r"(ray_policystore_\w+)\{(.*)\} (\S+)$", line)
        if match and f'node_id="{node_id}"' in match.group(2):
            le = re.search(r'le="([^"]+)"', match.group(2))
            found[match.group(1) + (f"[{le.group(1)}]" if le else "")] = float(match.group(3))
    return found


def test_store_metrics_reach_the_prometheus_endpoint(metrics_port):
    node_id = ray.get_runtime_context().get_node_id()
    recorder = _Recorder.remote(node_id)
    ray.get(recorder.record.remote())
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    expected = (
        [f"ray_policystore_{g}" for g in GAUGES]
        + [f"ray_policystore_{c}_total" for c in ("hits", "publishes")]
        + [f"ray_policystore_{h}_seconds_count" for h in ("get_latency", "restore_latency")]
    )

    def scraped() -> dict[str, float] | None:
        try:
            samples = _samples(urllib.request.urlopen(url, timeout=10).read().decode(), node_id)
        except OSError:
            return None  # the agent may not listen yet
        return samples if all(name in samples for name in expected) else None

    samples = eventually(scraped, f"{expected} exported at {url}", SCRAPE_TIMEOUT_S, every_s=1)
    assert samples["ray_policystore_hits_total"] == 3
    assert samples["ray_policystore_hot_bytes"] == 4096
    assert samples["ray_policystore_hot_snapshots"] == 2
    assert samples["ray_policystore_get_latency_seconds_count"] == 1
    # 2 ms lands in the 2.5 ms bucket, not the 1 ms one; 1.5 s of restore lands under 2.5 s.
    assert samples["ray_policystore_get_latency_seconds_bucket[0.001]"] == 0
    assert samples["ray_policystore_get_latency_seconds_bucket[0.0025]"] == 1
    assert samples["ray_policystore_restore_latency_seconds_bucket[1.0]"] == 0
    assert samples["ray_policystore_restore_latency_seconds_bucket[2.5]"] == 1


@pytest.mark.parametrize("kind", ["count", "observe", "gauge"])
def test_unknown_metric_names_raise(metrics_port, kind):
    recorder = _Recorder.remote("n1")
    message = ray.get(recorder.bad.remote(kind))
    assert message.startswith("unknown policystore"), message
    assert issubclass(UnknownMetricError, PolicyStoreError)

