"""The cluster model's simulation (benchmarks.cluster_model): pure arithmetic, no Ray."""

from __future__ import annotations

import math

import pytest

from benchmarks.cluster_model import Costs, League, catalog_load, spread

NIC = Costs(call_s=1e-3, catalog_call_s=4e-4, stream_bps=3e9, node_bps=3e9, fabric_bps=math.inf,
            checksum_bps=20e9, copy_bps=8e9)


def test_star_sends_every_copy_from_the_publisher():
    s = spread("star", 16, 100e6, NIC)
    assert s.max_served == 15
    assert s.max_sent_bytes == 15 * 100e6
    assert s.total_s > 15 * 100e6 / NIC.node_bps  # the publisher's NIC sends them one after the other


@pytest.mark.parametrize("nodes", [8, 64, 300])
def test_tree_reaches_every_node_in_about_log_rounds_with_bounded_serving(nodes):
    tree = spread("tree", nodes, 220e6, NIC, max_serving=2, max_served=3)
    assert tree.max_served <= 3
    assert tree.rounds <= 2 * math.log2(nodes)
    assert tree.total_s < spread("star", nodes, 220e6, NIC).total_s


def test_a_machine_wide_fabric_limit_makes_the_shape_matter_less():
    """On one machine every transfer shares the same cores: a tree cannot beat the fabric's total rate."""
    shared = Costs(**{**NIC.__dict__, "fabric_bps": 3e9})
    tree = spread("tree", 8, 256e6, shared)
    assert tree.total_s >= 7 * 256e6 / shared.fabric_bps


def test_holder_delay_slows_the_tree():
    assert spread("tree", 64, 64e6, NIC, holder_delay_s=0.5).total_s > spread("tree", 64, 64e6, NIC).total_s


def test_catalog_load_counts_one_hold_batch_per_node_per_interval():
    league = League(nodes=100, learners=10, publish_every_s=1.0, hold_batch_s=1.0)
    load = catalog_load(league, NIC)
    # 10 snapshots/s x (1 publish + a watch answer per node, which carries the entry: no lookup) + 100 hold batches/s
    assert load["catalog_calls_per_s"] == pytest.approx(10 * (1 + 100) + 100)
    assert load["headroom"] == pytest.approx((1 / NIC.catalog_call_s) / load["catalog_calls_per_s"])


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown mode"):
        spread("gossip", 4, 1e6, NIC)


@pytest.mark.parametrize("nodes", [8, 300, 1000])
def test_a_chain_costs_about_one_copy_and_every_node_sends_at_most_one(nodes):
    chain = spread("chain", nodes, 220e6, NIC)
    one_copy = 220e6 / NIC.stream_bps
    assert chain.max_served == 1 and chain.max_sent_bytes == 220e6
    assert one_copy < chain.total_s < one_copy + nodes * 2 * 2 * NIC.call_s + 220e6 / NIC.copy_bps
    # faster than Ray's broadcast, whose publisher sends every other node a copy (simulated only at 8 nodes: the
    # simulation of n transfers at once costs n^2 steps)
    ray_s = spread("ray", nodes, 220e6, NIC).total_s if nodes <= 8 else (nodes - 1) * 220e6 / NIC.node_bps
    assert chain.total_s < ray_s


def test_a_pipelined_tree_carries_its_fanout_on_every_uplink():
    tree = spread("chain", 64, 100e6, NIC, fanout=2)
    assert tree.max_sent_bytes == 2 * 100e6
    assert tree.total_s > 2 * 100e6 / NIC.node_bps  # each uplink carries two copies at once


def test_nodes_sharing_one_machines_cores_make_the_chain_cpu_bound_as_nodes_grow():
    """The testbed: every hop's receive and forward comes out of the same cores, less what the idle nodes use."""
    shared = Costs(**{**NIC.__dict__, "stream_bps": 62.5e6, "node_bps": 62.5e6, "hop_cpu_s_per_byte": 5e-9,
                      "cores": 2.0, "idle_cores_per_node": 0.05})
    links = Costs(**{**shared.__dict__, "cores": math.inf, "hop_cpu_s_per_byte": 0.0})
    assert spread("chain", 4, 64e6, shared).total_s == pytest.approx(spread("chain", 4, 64e6, links).total_s)
    cpu_bound = spread("chain", 16, 64e6, shared).total_s
    assert cpu_bound == pytest.approx(15 * 64e6 * 5e-9 / (2.0 - 16 * 0.05), rel=0.05)
    assert cpu_bound > 2 * spread("chain", 16, 64e6, links).total_s


def test_a_node_of_its_own_forwards_no_faster_than_its_relay_threads():
    cpu = Costs(**{**NIC.__dict__, "hop_cpu_s_per_byte": 2e-9, "relay_cores": 2.0})  # 1 GB/s < the 3 GB/s NIC
    assert spread("chain", 300, 220e6, cpu).total_s > 220e6 / 1e9 > spread("chain", 300, 220e6, NIC).total_s - 0.2
