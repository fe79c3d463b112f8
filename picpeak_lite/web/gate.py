"""Open connections are a bounded resource: at most so many in all and so many per client address.

Every connection (a slow upload, a WebSocket, a keep-alive) holds a file descriptor until it closes. With the
fd limit of a plain systemd unit (1024), 1,100 sockets from one client that sent a body at one byte per 50 s
took every descriptor: ``accept`` failed with EMFILE (trio logs each failure with its traceback) and
``/healthz`` went unanswered. :class:`GatedListener` wraps the listening socket hypercorn serves:

* a connection past the per-client cap (``connections_per_client``) is answered a minimal ``429``, one past the
  total cap (from the fd limit, see :func:`plan`) a ``503``, both with ``Retry-After``, and closed at once,
  from the accept loop, without a task; its descriptor is given back before the next ``accept``;
* ``accept`` failing for want of descriptors (EMFILE/ENFILE/ENOBUFS/ENOMEM: files, SQLite and children took
  the headroom) waits a moment and tries again;
* both are logged as one summary line per :data:`REPORT_EVERY` seconds, never one line (or traceback) each.

The client is the peer address (for IPv6 its /64, :func:`client_of`). Behind a reverse proxy every connection comes
from the proxy: peers listed in ``trusted_proxies`` are not capped per client (only in total), and the proxy is
where per-client limits belong (``limit_conn`` in nginx). Slow senders are ended by the body's minimum rate
(``web/asgi.py``), which frees their slots.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import resource
import socket
from collections import Counter
from dataclasses import dataclass

import trio

log = logging.getLogger(__name__)

# accept(2) errors that mean "no descriptors or buffers just now", not a broken listener (trio's own list).
CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
CAPACITY_PAUSE = 0.1
REPORT_EVERY = 10.0
# Descriptors kept free of connections: the database (a few per connection, WAL and shm), files being
# uploaded or sent, the workers' reads, the image and video children's pipes, log files. At least this many, or
# an eighth of the limit when that is more.
RESERVED_FDS = 96
# A limit that leaves fewer connections than this is too small to serve anyone properly; the plan keeps at
# least this many (and says so in the startup line).
MIN_CONNECTIONS = 32



def _answer(status: str, sentence: str) -> bytes:
    body = sentence.encode() + b"\n"
    return (f"HTTP/1.1 {status}\r\nRetry-After: 5\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


# Past the per-client cap the client is over its share (429); past the total cap the server is full (503).
OVER_CLIENT_CAP = _answer("429 Too Many Requests",
                          "Too many open connections from your address; close some and try again soon.")
OVER_TOTAL_CAP = _answer("503 Service Unavailable", "The server has too many open connections; try again soon.")


@dataclass(frozen=True)
class Plan:
    """What the gate allows: the fd limit in force, the connections at most, the connections per client."""

    fd_limit: int
    total: int
    per_client: int

    def describe(self) -> str:
        return f"fd limit {self.fd_limit}, connections at most {self.total}, per client {self.per_client}"


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (as far as the process may without privileges) and return
    the soft limit now in force. A unit without ``LimitNOFILE`` starts at 1024 with a hard limit far above."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        # Not allowed (or above the kernel's nr_open): keep what we have.
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return int(soft)


def plan(fd_limit: int, *, total: int, per_client: int) -> Plan:
    """The caps for ``fd_limit``: ``total`` 0 means all the descriptors but the reserved ones; a total set
    higher than that is lowered to it (it could only end in EMFILE). ``per_client`` is at most the total."""
    room = max(MIN_CONNECTIONS, fd_limit - max(RESERVED_FDS, fd_limit // 8))
    cap = room if total <= 0 else min(total, room)
    return Plan(fd_limit=fd_limit, total=cap, per_client=min(per_client, cap))


def client_of(host: str) -> str:
    """The client a connection is counted for: its IPv4 address, or its IPv6 /64. One IPv6 subscriber is given
    a whole /64 (18 billion billion addresses), so counting single IPv6 addresses would cap nobody; an
    IPv4-mapped IPv6 peer is its IPv4 address."""
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return host


class GatedStream(trio.abc.HalfCloseableStream):
    """A connection the gate let in (a ``trio.SocketStream``, which cannot be subclassed); closing it gives its
    slot back, once however often it is closed. hypercorn reads ``socket`` for the peer's address.

    Ending a connection (``send_eof``, then ``aclose``) does not wait for anything. hypercorn ends one from
    whichever task sees the end, and two cases went wrong on a plain ``SocketStream``: an answer given before
    the client finished its body (a 408 for a body that came too slowly, a 413) is ended by the request's own
    task while it is being cancelled, so the checkpoint in ``send_eof`` raised and the connection stayed open
    for as long as the client kept sending; and an EOF sent while a response was still being sent (its client
    hung up after the status line) raised trio's ``BusyResourceError``, a traceback. So ``send_eof`` shuts the
    write side at once, or leaves it to ``aclose`` (which stops any send under way) when a send is running."""

    def __init__(self, stream: trio.SocketStream, gate: Gate, client: str) -> None:
        self._stream = stream
        self.socket = stream.socket
        self._gate: Gate | None = gate
        self._client = client
        self._sending = trio.Lock()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        async with self._sending:
            await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        async with self._sending:
            await self._stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        if self._sending.locked() or self.socket.did_shutdown_SHUT_WR:
            return
        with contextlib.suppress(OSError):  # the client went already: aclose follows
            self.socket.shutdown(trio.socket.SHUT_WR)
        await trio.lowlevel.cancel_shielded_checkpoint()  # a schedule point that a cancellation cannot end

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self._stream.receive_some(max_bytes)

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            if self._gate is not None:
                self._gate.release(self._client)
                self._gate = None


class Gate:
    """The counts of open connections, in total and per client address, and the refusals to report."""

    def __init__(self, plan: Plan, *, uncapped: frozenset[str] = frozenset()) -> None:
        self.plan = plan
        self.uncapped = uncapped
        self.open = 0
        self.peak = 0
        self.per_client: Counter[str] = Counter()
        self.refused_client = 0
        self.refused_total = 0
        self.starved = 0  # accepts that failed for want of descriptors
        self._last_report = -REPORT_EVERY

    def admit(self, client: str) -> bytes | None:
        """None when ``client`` may have one more connection (counted from now), else the refusal to send."""
        if client not in self.uncapped and self.per_client[client] >= self.plan.per_client:
            self.refused_client += 1
            return OVER_CLIENT_CAP
        if self.open >= self.plan.total:
            self.refused_total += 1
            return OVER_TOTAL_CAP
        self.open += 1
        self.peak = max(self.peak, self.open)
        self.per_client[client] += 1
        return None

    def release(self, client: str) -> None:
        self.open -= 1
        self.per_client[client] -= 1
        if self.per_client[client] <= 0:
            del self.per_client[client]

    def report(self, *, force: bool = False) -> None:
        """One line for the refusals since the last one, at most every :data:`REPORT_EVERY` seconds."""
        if not (self.refused_client or self.refused_total or self.starved):
            return
        now = trio.current_time()
        if not force and now - self._last_report < REPORT_EVERY:
            return
        self._last_report = now
        log.warning("connections refused: %d over the per-client cap (%d), %d over the total cap (%d); "
                    "%d accepts waited for a free descriptor; %d open now",
                    self.refused_client, self.plan.per_client, self.refused_total, self.plan.total,
                    self.starved, self.open)
        self.refused_client = self.refused_total = self.starved = 0


class GatedListener(trio.abc.Listener[GatedStream]):
    """hypercorn's listener with the gate in front: see the module docstring."""

    def __init__(self, sock: trio.socket.SocketType, gate: Gate) -> None:
        self.socket = sock
        self.gate = gate

    async def accept(self) -> GatedStream:
        while True:
            try:
                sock, address = await self.socket.accept()
            except OSError as error:
                if error.errno in (errno.EBADF, errno.ENOTSOCK):
                    raise trio.ClosedResourceError from None
                if error.errno in CAPACITY_ERRNOS:
                    self.gate.starved += 1
                    self.gate.report()
                    await trio.sleep(CAPACITY_PAUSE)
                    continue
                if error.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue  # the client went before we took it
                raise
            host = address[0] if isinstance(address, tuple) else str(address)
            client = host if host in self.gate.uncapped else client_of(host)
            refusal = self.gate.admit(client)
            if refusal is None:
                return GatedStream(trio.SocketStream(sock), self.gate, client)
            _refuse(sock, refusal)
            self.gate.report()

    async def aclose(self) -> None:
        self.socket.close()
        await trio.lowlevel.checkpoint()


def _refuse(sock: trio.socket.SocketType, answer: bytes) -> None:
    """Answer 429 or 503 without waiting (the few bytes fit any socket buffer) and close, so the descriptor is free
    before the next accept and no task is held for a client that is over its share."""
    raw = socket.socket(fileno=sock.detach())
    try:
        raw.send(answer, socket.MSG_DONTWAIT)
        raw.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # it went already, or its buffer is full: closing is the answer
    finally:
        raw.close()
