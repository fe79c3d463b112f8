"""Issue 27: nothing a link holder sends may use up the server's file descriptors.

A real server runs with a low fd limit (256, soft and hard, as a unit's ``LimitNOFILE`` sets it). One client
(127.0.0.2: the loopback range is all ours) then opens more connections than the limit, each sending a login
form's body one byte a second (far below ``min_body_rate_kb``), or holding a WebSocket to a gallery without a
password. Before the connection gate, such a flood took every descriptor: ``/healthz`` went unanswered and
every failed ``accept`` logged an EMFILE traceback. Now the client gets ``connections_per_client`` connections
and a 429 for each more, the slow bodies end with 408, ``/healthz`` (from 127.0.0.1) and a guest from another
address (127.0.0.3) are served throughout, and the descriptors come back when the attack ends.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from .harness import ServerProcess, create_token, write_config
from .hostile import Watch, tree_rss_mb

pytestmark = pytest.mark.system

FD_LIMIT = 256
PER_CLIENT = 40
ATTACK_CONNECTIONS = 300  # more than the server's fd limit
WINDOW_S = 3  # body_rate_window_seconds: the default 30 s, shortened so that the attack sees several rounds
ATTACK_S = 12
ATTACKER, GUEST = "127.0.0.2", "127.0.0.3"
SETTLE_S = 60  # a hang guard for the descriptors to come back, not a bound on speed


@dataclass
class Tally:
    statuses: dict[int, int]
    closed_without_answer: int = 0
    connect_failed: int = 0
    attacker_open_peak: int = 0
    fds_peak: int = 0

    def add(self, status: int) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1


async def start_server(tmp_path: Path) -> tuple[ServerProcess, str, int]:
    data_dir = tmp_path / "data"
    config = write_config(tmp_path / "picpeak.toml", connections_per_client=PER_CLIENT,
                          body_rate_window_seconds=WINDOW_S, workers=1)
    token = await trio.to_thread.run_sync(create_token, data_dir, config)
    server = ServerProcess(data_dir, config, nofile=FD_LIMIT)
    await trio.to_thread.run_sync(server.start)
    async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {token}"},
                                 timeout=120) as admin:
        created = await admin.post("/api/admin/galleries", json={"name": "Open"})
        assert created.status_code == 201, created.text
        gallery = created.json()
        assert (await admin.post(f"/api/admin/galleries/{gallery['id']}/publish")).status_code == 200
    return server, gallery["slug"], int(server.url.rsplit(":", 1)[1])


async def connect_from(source: str, port: int) -> trio.SocketStream:
    """A connection to the server from ``source`` (another loopback address: another client to the server)."""
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
    try:
        await sock.bind((source, 0))
        await sock.connect(("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def server_sockets_from(pid: int, port: int, source: str) -> int:
    """Connections from ``source`` that the server holds open now: /proc/net/tcp rows on the server's port
    from that address whose socket is one of the server's descriptors. Counted by inode: the file is read in
    pieces while it changes, and a row can come twice."""
    local = f"0100007F:{port:04X}"
    remote = "".join(f"{int(part):02X}" for part in reversed(source.split("."))) + ":"
    held = socket_inodes(pid)
    found = set()
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = row.split()
        if fields[1] == local and fields[2].startswith(remote) and fields[9] in held:
            found.add(fields[9])
    return len(found)


async def sample(server: ServerProcess, port: int, tally: Tally) -> None:
    while True:
        with contextlib.suppress(FileNotFoundError):
            tally.fds_peak = max(tally.fds_peak, open_fds(server.pid))
            tally.attacker_open_peak = max(tally.attacker_open_peak,
                                           server_sockets_from(server.pid, port, ATTACKER))
        await trio.sleep(0.1)


async def slow_body(port: int, tally: Tally, watch: Watch, until: float) -> None:
    """Login forms of 100,000 bytes sent one byte a second, again and again, as the issue's attacker did."""
    head = (f"POST /admin/login HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\n").encode()
    while trio.current_time() < until:
        try:
            stream = await connect_from(ATTACKER, port)
        except OSError:
            tally.connect_failed += 1
            await trio.sleep(0.5)
            continue
        answer = b""
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            async with stream:
                await stream.send_all(head)
                while trio.current_time() < until and b"\r\n" not in answer:
                    with trio.move_on_after(1):
                        data = await stream.receive_some(4096)
                        if not data:
                            break
                        answer += data
                        continue
                    await stream.send_all(b"a")
        if b"\r\n" in answer:
            status = status_of(answer)
            tally.add(status)
            watch.saw(status)
            if status == 429:
                await trio.sleep(0.5)
        elif trio.current_time() < until:
            tally.closed_without_answer += 1
            await trio.sleep(0.5)


async def websocket_from(source: str, port: int, slug: str) -> tuple[trio.SocketStream, int]:
    """A WebSocket handshake to the gallery's feed; the stream and the status it was answered with."""
    stream = await connect_from(source, port)
    await stream.send_all((f"GET /ws/g/{slug} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                           "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    answer = b""
    while b"\r\n" not in answer:
        data = await stream.receive_some(4096)
        if not data:
            raise trio.BrokenResourceError("closed before answering")
        answer += data
    return stream, status_of(answer)


async def guest_page(url: str, slug: str) -> int:
    """The gallery page for a guest on another address, as a real browser would ask for it."""
    transport = httpx.AsyncHTTPTransport(local_address=GUEST)
    async with httpx.AsyncClient(base_url=url, transport=transport, timeout=60) as guest:
        return (await guest.get(f"/g/{slug}")).status_code


async def wait_for_fds(server: ServerProcess, at_most: int) -> int:
    with trio.move_on_after(SETTLE_S):
        while open_fds(server.pid) > at_most:
            await trio.sleep(0.2)
    return open_fds(server.pid)


def check_log(server: ServerProcess) -> None:
    text = "".join(server.output)
    assert f"fd limit {FD_LIMIT}, connections at most 160, per client {PER_CLIENT}" in text, server.log_tail()
    assert "EMFILE" not in text and "Too many open files" not in text, server.log_tail()
    assert "connections refused:" in text  # the summary line, not a line per refusal


async def test_slow_bodies_from_one_client_cannot_take_the_descriptors(tmp_path: Path, capsys: Any) -> None:
    server, slug, port = await start_server(tmp_path)
    try:
        fds_before, rss_before = open_fds(server.pid), tree_rss_mb(server.pid)
        tally = Tally(statuses={})
        watch = Watch(server, "slow bodies")
        async with watch.during(), trio.open_nursery() as nursery:
            nursery.start_soon(sample, server, port, tally)
            until = trio.current_time() + ATTACK_S
            async with trio.open_nursery() as attack:
                for _ in range(ATTACK_CONNECTIONS):
                    attack.start_soon(slow_body, port, tally, watch, until)
                await trio.sleep(ATTACK_S / 2)
                guest_status = await guest_page(server.url, slug)
            nursery.cancel_scope.cancel()
        fds_after = await wait_for_fds(server, fds_before + 5)
        rss_after = tree_rss_mb(server.pid)
        watch.line(capsys, fd_limit=FD_LIMIT, per_client=PER_CLIENT, attack_connections=ATTACK_CONNECTIONS,
                   fds_before=fds_before, fds_peak=tally.fds_peak, fds_after=fds_after,
                   attacker_open_peak=tally.attacker_open_peak, refused_429=tally.statuses.get(429, 0),
                   too_slow_408=tally.statuses.get(408, 0), closed_without_answer=tally.closed_without_answer,
                   rss_before_mb=f"{rss_before:.0f}", rss_after_mb=f"{rss_after:.0f}", guest_page=guest_status)
        watch.check()
        assert set(tally.statuses) <= {408, 429}, tally.statuses
        assert tally.statuses.get(408, 0) > 0, "no slow body was ended"
        assert tally.statuses.get(429, 0) > 0, "the per-client cap never refused"
        # One more than the cap can be seen: a connection accepted and not yet refused.
        assert tally.attacker_open_peak <= PER_CLIENT + 1
        assert tally.fds_peak < FD_LIMIT
        assert guest_status == 200
        assert fds_after <= fds_before + 5
        assert rss_after <= rss_before + 30, (rss_before, rss_after)
        check_log(server)
    finally:
        server.kill()


async def test_websockets_from_one_client_cannot_take_the_descriptors(tmp_path: Path, capsys: Any) -> None:
    server, slug, port = await start_server(tmp_path)
    try:
        fds_before, rss_before = open_fds(server.pid), tree_rss_mb(server.pid)
        tally = Tally(statuses={})
        watch = Watch(server, "websockets")
        held: list[trio.SocketStream] = []

        async with watch.during(), trio.open_nursery() as nursery:
            nursery.start_soon(sample, server, port, tally)
            async with trio.open_nursery() as attack:
                for _ in range(ATTACK_CONNECTIONS):
                    attack.start_soon(hold_websocket, ATTACKER, port, slug, tally, held, watch)
            rss_held = tree_rss_mb(server.pid)
            guest_status = await guest_page(server.url, slug)
            guest_ws, guest_ws_status = await websocket_from(GUEST, port, slug)
            await guest_ws.aclose()
            await trio.sleep(2)  # the watch asks /healthz while the sockets are held
            for stream in held:
                await stream.aclose()
            nursery.cancel_scope.cancel()
        fds_after = await wait_for_fds(server, fds_before + 5)
        rss_after = tree_rss_mb(server.pid)
        watch.line(capsys, fd_limit=FD_LIMIT, per_client=PER_CLIENT, attack_connections=ATTACK_CONNECTIONS,
                   fds_before=fds_before, fds_peak=tally.fds_peak, fds_after=fds_after,
                   attacker_open_peak=tally.attacker_open_peak, accepted_101=tally.statuses.get(101, 0),
                   refused_429=tally.statuses.get(429, 0), closed_without_answer=tally.closed_without_answer,
                   rss_before_mb=f"{rss_before:.0f}", rss_held_mb=f"{rss_held:.0f}", rss_after_mb=f"{rss_after:.0f}",
                   guest_page=guest_status, guest_websocket=guest_ws_status)
        watch.check()
        assert tally.statuses.get(101, 0) == PER_CLIENT, tally.statuses
        assert tally.statuses.get(429, 0) + tally.closed_without_answer == ATTACK_CONNECTIONS - PER_CLIENT
        assert tally.attacker_open_peak <= PER_CLIENT + 1
        assert tally.fds_peak < FD_LIMIT
        assert (guest_status, guest_ws_status) == (200, 101)
        assert fds_after <= fds_before + 5
        assert rss_after <= rss_before + 30, (rss_before, rss_after)
        check_log(server)
    finally:
        server.kill()


async def test_websockets_from_many_clients_fill_the_total_cap_with_clean_refusals(tmp_path: Path,
                                                                                   capsys: Any) -> None:
    """Ten clients (127.0.1.1-10) of 40 WebSockets each: 400 connections against a total of 160 that 256
    descriptors allow. The rest are answered 503 with Retry-After, not EMFILE; while the server is full,
    ``/healthz`` is refused the same way (a load balancer then sees a full server, which it is), so this
    attack's watch is not asked for a clean ``/healthz``: once the sockets close, everything is served again."""
    server, slug, port = await start_server(tmp_path)
    try:
        fds_before = open_fds(server.pid)
        tally = Tally(statuses={})
        watch = Watch(server, "websockets from many clients")
        held: list[trio.SocketStream] = []

        async with watch.during(), trio.open_nursery() as nursery:
            nursery.start_soon(sample, server, port, tally)
            async with trio.open_nursery() as attack:
                for n in range(10 * PER_CLIENT):
                    attack.start_soon(hold_websocket, f"127.0.1.{n % 10 + 1}", port, slug, tally, held, None)
            nursery.cancel_scope.cancel()
        # The watch's own /healthz took a place now and then, so a handshake that came meanwhile was refused and
        # the server may hold one WebSocket less than it could. With the watch stopped, one more client tops it
        # up until it refuses: then it is full, and only then is /healthz asked.
        topped_up = 0
        while True:
            stream, status = await websocket_from("127.0.1.11", port, slug)
            if status != 101:
                await stream.aclose()
                break
            held.append(stream)
            topped_up += 1
        full_health = await answer_status(port)
        for stream in held:
            await stream.aclose()
        fds_after = await wait_for_fds(server, fds_before + 5)
        health_after = await answer_status(port)
        guest_status = await guest_page(server.url, slug)
        watch.line(capsys, fd_limit=FD_LIMIT, total_cap=160, fds_before=fds_before, fds_peak=tally.fds_peak,
                   fds_after=fds_after, accepted_101=tally.statuses.get(101, 0),
                   refused_503=tally.statuses.get(503, 0), closed_without_answer=tally.closed_without_answer,
                   topped_up=topped_up, healthz_while_full=full_health, healthz_after=health_after,
                   guest_page_after=guest_status)
        assert server.tracebacks() == [], server.tracebacks()[:3]
        assert set(tally.statuses) == {101, 503}, tally.statuses
        assert tally.statuses[101] <= 160 and tally.closed_without_answer == 0
        assert status == 503 and tally.statuses[101] + topped_up == 160
        assert tally.fds_peak < FD_LIMIT
        assert full_health == 503
        assert (health_after, guest_status) == (200, 200)
        assert fds_after <= fds_before + 5
        text = "".join(server.output)
        assert "EMFILE" not in text and "Too many open files" not in text
    finally:
        server.kill()


async def hold_websocket(source: str, port: int, slug: str, tally: Tally, held: list[trio.SocketStream],
                         watch: Watch | None) -> None:
    """One WebSocket handshake from ``source``: its answer tallied (and told to ``watch``, where 5xx count
    against the server), the connection held open when accepted, else closed."""
    try:
        stream, status = await websocket_from(source, port, slug)
    except (OSError, trio.BrokenResourceError):
        tally.closed_without_answer += 1
        return
    tally.add(status)
    if watch is not None:
        watch.saw(status)
    if status == 101:
        held.append(stream)
    else:
        await stream.aclose()


async def answer_status(port: int) -> int:
    """``GET /healthz`` from 127.0.0.1: the status, or the gate's refusal."""
    stream = await connect_from("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
                              .encode())
        answer = b""
        while b"\r\n" not in answer:
            chunk = await stream.receive_some(4096)
            assert chunk, "closed without an answer"
            answer += chunk
    return status_of(answer)
