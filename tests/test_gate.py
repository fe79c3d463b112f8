"""The connection gate (web/gate.py) on real sockets, and the request body's minimum rate (web/asgi.py)."""

from __future__ import annotations

import logging
import resource

import pytest
import trio

from picpeak_lite.web import gate
from picpeak_lite.web.asgi import BodyRate


def test_the_plan_keeps_a_reserve_of_descriptors() -> None:
    assert gate.plan(1024, total=0, per_client=256) == gate.Plan(fd_limit=1024, total=1024 - 128, per_client=256)
    assert gate.plan(256, total=0, per_client=40) == gate.Plan(fd_limit=256, total=160, per_client=40)
    # A total set above what the descriptors allow would only end in EMFILE: it is lowered.
    assert gate.plan(256, total=1000, per_client=40).total == 160
    assert gate.plan(65536, total=500, per_client=256).total == 500
    # The per-client cap is never above the total, and a tiny limit still leaves a few connections.
    assert gate.plan(100, total=0, per_client=256) == gate.Plan(fd_limit=100, total=gate.MIN_CONNECTIONS,
                                                                per_client=gate.MIN_CONNECTIONS)
    assert gate.plan(65536, total=0, per_client=256).describe() == (
        "fd limit 65536, connections at most 57344, per client 256")


def test_the_soft_fd_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if hard != resource.RLIM_INFINITY and hard > 64:
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        in_force = gate.raise_fd_limit()
        assert in_force == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert in_force == (hard if hard != resource.RLIM_INFINITY else max(soft, 65536))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_counts_per_client_and_in_total() -> None:
    connections = gate.Gate(gate.Plan(fd_limit=256, total=3, per_client=2), uncapped=frozenset({"10.0.0.9"}))
    assert connections.admit("10.0.0.1") is None
    assert connections.admit("10.0.0.1") is None
    assert connections.admit("10.0.0.1") == gate.OVER_CLIENT_CAP
    assert connections.admit("10.0.0.9") is None  # a trusted proxy: only the total counts
    assert connections.admit("10.0.0.2") == gate.OVER_TOTAL_CAP
    connections.release("10.0.0.1")
    assert connections.admit("10.0.0.2") is None
    assert (connections.open, connections.peak) == (3, 3)
    assert (connections.refused_client, connections.refused_total) == (1, 1)
    assert dict(connections.per_client) == {"10.0.0.1": 1, "10.0.0.9": 1, "10.0.0.2": 1}


async def connect_from(source: str, port: int) -> trio.SocketStream:
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
    await sock.bind((source, 0))
    await sock.connect(("127.0.0.1", port))
    return trio.SocketStream(sock)


async def answer_of(stream: trio.SocketStream) -> bytes:
    answer = b""
    while chunk := await stream.receive_some(4096):
        answer += chunk
    return answer


async def test_a_listener_refuses_past_the_caps_with_summary_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="picpeak_lite.web.gate")
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
    await sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    connections = gate.Gate(gate.Plan(fd_limit=256, total=2, per_client=1))
    listener = gate.GatedListener(sock, connections)
    async with listener:
        first = await connect_from("127.0.0.2", port)
        admitted = await listener.accept()
        second = await connect_from("127.0.0.2", port)  # over its client's cap: 429
        third = await connect_from("127.0.0.3", port)   # another client: let in
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listener.accept)  # refuses the second, returns the third
            refused = await answer_of(second)
        assert refused.startswith(b"HTTP/1.1 429 Too Many Requests\r\n") and b"Retry-After: 5\r\n" in refused
        fourth = await connect_from("127.0.0.4", port)  # over the total: 503
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listener.accept)
            full = await answer_of(fourth)
            # Closing a connection gives its slot back: the fifth is let in and ends the accept above.
            await admitted.aclose()
            await admitted.aclose()  # twice: counted once
            fifth = await connect_from("127.0.0.5", port)
        assert full.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") and b"Retry-After: 5\r\n" in full
        assert connections.open == 2 and connections.per_client["127.0.0.2"] == 0
        for stream in (first, second, third, fourth, fifth):
            await stream.aclose()
    # The first refusal is reported at once; the next ones wait for the interval to end (the server's
    # reporting task calls ``report`` every REPORT_EVERY seconds: forced here).
    connections.report(force=True)
    connections.report(force=True)  # nothing new: no line
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(";")[0] for line in lines] == [
        "connections refused: 1 over the per-client cap (1), 0 over the total cap (2)",
        "connections refused: 0 over the per-client cap (1), 1 over the total cap (2)"]


def test_the_body_rate_counts_windows_of_the_clients_time() -> None:
    rate = BodyRate(1000, 30)  # 1 KB/s over 30 s windows: each 30 s of waiting must bring 30,000 bytes
    assert rate.deadline() == 30
    rate.waited(10, 20_000)
    assert rate.deadline() == 20  # the window goes on: 10,000 bytes more are due in 20 s
    rate.waited(15, 10_000)
    assert rate.deadline() == 30  # this window's share arrived: a new one starts
    rate.waited(31, 100)
    assert rate.deadline() == 0  # a byte that came after the window ran out ends the body at once
    assert BodyRate(0, 30).deadline() == float("inf")  # min_body_rate_kb = 0: no minimum


def test_an_ipv6_client_is_its_64_and_a_mapped_one_its_ipv4() -> None:
    """One IPv6 subscriber holds a whole /64: counting single addresses there would cap nobody."""
    assert gate.client_of("2001:db8:1:2:aaaa::1") == gate.client_of("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert gate.client_of("2001:db8:1:3::1") == "2001:db8:1:3::/64"
    assert gate.client_of("::ffff:192.0.2.7") == "192.0.2.7"
    assert gate.client_of("192.0.2.7") == "192.0.2.7"
    assert gate.client_of("fe80::1%eth0") == "fe80::/64"
    assert gate.client_of("not an address") == "not an address"
