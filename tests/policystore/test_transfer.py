"""The node-to-node transfer (policystore.transfer) on loopback, without Ray: routing builds a chain (or a
breadth-first tree), a node serves the bytes it is still receiving, a transfer resumes at its offset from another
source when one fails mid-way, and a source without a copy is an error the fetch moves past."""

from __future__ import annotations

import threading

import numpy as np
from helpers import eventually

from policystore.ids import SnapshotId
from policystore.transfer import Landing, Relay, Route, key

SID = SnapshotId("p", 3)


def payload(n: int = 3 << 20) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)


def relay(copy=None, fanout: int = 1) -> Relay:
    return Relay("127.0.0.1", lambda sid: copy if sid == SID else None, fanout)


def test_routes_form_a_chain_and_a_breadth_first_tree():
    chain = relay()
    assert chain.route(SID, "b") == chain.here()
    assert chain.route(SID, "c") == Route(instead="b")
    assert chain.route(SID, "d") == Route(instead="c")
    assert chain.route(SID, "b") == chain.here()  # asked again: the same answer
    assert chain.route(SID, "e", force=True) == chain.here()
    assert chain.served_most() == 2
    tree = relay(fanout=2)
    answers = [tree.route(SID, n) for n in "bcdefgh"]
    assert answers[:2] == [tree.here()] * 2
    assert [a.instead for a in answers[2:]] == ["b", "b", "c", "c", "d"]


def test_a_node_serves_what_it_is_still_receiving():
    """Node b's copy lands a mebibyte at a time; node c, streaming from b, holds each one before the next lands."""
    data = payload()
    b, c = relay(), relay()
    landing = Landing()  # b's own fetch, driven by hand
    landing.start(data.nbytes)
    b._landing[key(SID)] = landing
    got: list = []
    fetch = threading.Thread(target=lambda: got.append(
        c.fetch(SID, ["b"], lambda _n, _f: b.here(), [])))
    fetch.start()
    step = 1 << 20
    for pos in range(0, data.nbytes, step):
        end = min(pos + step, data.nbytes)
        landing.buf[pos:end] = data[pos:end]
        landing.landed(end - pos)
        eventually(lambda end=end: getattr(c._landing.get(key(SID)), "filled", data.nbytes) >= end,
                   f"c holds the first {end} bytes before more land at b")
    fetch.join()
    assert np.array_equal(got[0], data)
    eventually(lambda: b.served == 1, "b counts its stream once it is sent")


def test_a_failed_source_costs_no_bytes_already_received():
    data = payload()
    whole, broken, fetcher = relay(copy=data), relay(), relay()
    half = Landing()  # a source whose own transfer fails after 1 MiB
    half.start(data.nbytes)
    half.buf[: 1 << 20] = data[: 1 << 20]
    half.landed(1 << 20)
    broken._landing[key(SID)] = half
    threading.Timer(0.3, half.fail, args=("its source died",)).start()
    sources = iter([broken, whole])
    problems: list[str] = []
    got = fetcher.fetch(SID, ["broken", "whole"], lambda _n, _f: next(sources).here(), problems)
    assert np.array_equal(got, data)
    # resumed at the offset it had (counted once the sending thread's last sendall returns: the fetch may be done)
    eventually(lambda: whole.sent_bytes == data.nbytes - (1 << 20), "the whole source sends only what was missing")
    assert len(problems) == 1 and "closed the stream" in problems[0]


def test_a_source_without_a_copy_is_skipped_and_none_is_an_error_not_a_wait():
    empty, fetcher = relay(), relay()
    problems: list[str] = []
    assert fetcher.fetch(SID, ["empty"], lambda _n, _f: empty.here(), problems) is None
    assert "SnapshotLostError" in problems[0] and "no copy of p@3" in problems[0]


def test_a_request_without_the_holders_ticket_reads_nothing():
    """The socket is reachable by anyone on the network; only a store that got the ticket through ``route`` (an
    actor call) is served."""
    data = payload(1 << 20)
    holder, fetcher = relay(copy=data), relay()
    problems: list[str] = []
    forged = Route(address=holder.address, ticket=bytes(len(holder.ticket)))
    assert fetcher.fetch(SID, ["holder"], lambda _n, _f: forged, problems) is None
    assert holder.sent_bytes == 0 and "ticket" in problems[0]
    assert np.array_equal(fetcher.fetch(SID, ["holder"], lambda _n, _f: holder.here(), []), data)
