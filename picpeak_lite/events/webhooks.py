"""Signed webhook delivery from the outbox (``picpeak_lite.store.queries.webhooks``).

Events are written to the outbox in the transaction that changes a photo; :class:`WebhookSender` posts them
afterwards, at least once each, always under the same event id, so receivers can drop duplicates by id.

Receivers are URLs from the config, which makes this an SSRF surface: a webhook must not become a way to poke
at the cloud metadata service or an admin port on localhost. So every address a name resolves to must be a
public one (unless ``webhook_allow_private``), and the connection goes to that checked address, never through
a second DNS lookup that could answer differently. Redirects are not followed for the same reason.

HTTP is spoken with h11 over a trio stream: one request per connection, ``Connection: close``, and no more
than a few KB of the answer is read.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import logging
import os
import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import h11
import trio

from picpeak_lite.events import outbox
from picpeak_lite.runtime.bell import Bell
from picpeak_lite.store.queries import webhooks as queries
from picpeak_lite.targets import TargetRefused, parse_target, public_addresses, refuse_loopback_name

if TYPE_CHECKING:
    from picpeak_lite.config import Settings, WebhookEndpoint
    from picpeak_lite.store.db import Database

logger = logging.getLogger(__name__)

USER_AGENT = "picpeak-lite-webhooks/1"
# One attempt, from DNS lookup to the last byte of the answer.
ATTEMPT_TIMEOUT = 10.0
# The safety net for events queued without a wake() (another process, a wake before the commit).
POLL_SECONDS = 5.0
# Deliveries attempted at once; one slow receiver must not hold up all the others.
CONCURRENCY = 8
# A claimed delivery comes back by itself after this long if the attempt never got recorded (a crash).
CLAIM_SECONDS = 60.0
# What we read of a receiver's answer: enough for the status line, headers and an error message.
MAX_RESPONSE_HEAD = 8 * 1024
MAX_RESPONSE_BODY = 4 * 1024
ERROR_SNIPPET_CHARS = 200

@dataclasses.dataclass(frozen=True)
class Target:
    """A checked webhook URL, pinned to the addresses that were checked."""

    scheme: str
    host: str  # as written in the URL, lower case, without brackets: for Host, SNI and the certificate
    port: int
    path: str  # path and query, what goes on the request line
    addresses: tuple[str, ...]  # numeric, every one of them checked; we connect to these only

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


@dataclasses.dataclass(frozen=True)
class AttemptResult:
    """What one POST came to: a 2xx status, or a readable reason it failed (and the status, if any)."""

    status_code: int | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def sign(secret: str, delivery_id: str, timestamp: int | str, body: str) -> str:
    """HMAC-SHA256 over ``"{id}.{timestamp}.{body}"``, hex.

    The id and timestamp are signed along with the body so that a captured request cannot be replayed later
    or under another id; receivers should also reject timestamps that are far off.
    """
    message = f"{delivery_id}.{timestamp}.{body}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


async def resolve_target(url: str, allow_private: bool) -> Target:
    """Check ``url`` and resolve its host once; refuse it unless every address is public (or allowed).

    Every address, not just the first: a name that answers with one public and one private address would
    otherwise let whoever controls its DNS pick where we connect. Numeric oddities (``127.1``,
    ``2130706433``, ``0177.0.0.1``) are turned into real addresses by getaddrinfo, and the check looks at what
    it returned, never at the text of the URL.
    """
    scheme, host, port, path = parse_target(url)
    refuse_loopback_name(host, allow_private)
    try:
        infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
    except OSError as error:
        raise TargetRefused(f"could not resolve {host!r}: {error}") from None
    addresses = public_addresses(host, infos, allow_private)
    return Target(scheme=scheme, host=host, port=port, path=path, addresses=tuple(addresses))


def request_headers(
    target: Target, secret: str, delivery_id: str, event_type: str, timestamp: int, body: bytes
) -> list[tuple[str, str]]:
    signature = sign(secret, delivery_id, timestamp, body.decode())
    return [
        ("Host", target.host_header),
        ("User-Agent", USER_AGENT),
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
        ("X-PicPeak-Id", delivery_id),
        ("X-PicPeak-Event", event_type),
        ("X-PicPeak-Timestamp", str(timestamp)),
        ("X-PicPeak-Signature", f"sha256={signature}"),
    ]


async def post(target: Target, headers: list[tuple[str, str]], body: bytes) -> tuple[h11.Response, bytes]:
    """POST ``body`` to the pinned target and return the response head and up to MAX_RESPONSE_BODY bytes.

    Raises OSError, trio.BrokenResourceError or h11.ProtocolError when the exchange fails; the caller owns
    the deadline.
    """
    stream: trio.abc.Stream = await _connect(target)
    try:
        if target.scheme == "https":
            stream = trio.SSLStream(
                stream, _ssl_context(), server_hostname=target.host, https_compatible=True
            )
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_RESPONSE_HEAD)
        request = h11.Request(method="POST", target=target.path, headers=headers)
        data = conn.send(request) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
        await stream.send_all(data)
        response: h11.Response | None = None
        content = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                if response is not None and len(content) >= MAX_RESPONSE_BODY:
                    break
                conn.receive_data(bytes(await stream.receive_some(4096)))
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                content += event.data
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                break
        if response is None:
            raise h11.RemoteProtocolError("the connection closed before a response")
        return response, bytes(content[:MAX_RESPONSE_BODY])
    finally:
        await trio.aclose_forcefully(stream)


async def _connect(target: Target) -> trio.SocketStream:
    """Connect to the checked addresses in turn: a numeric host, so no second DNS lookup happens."""
    errors: list[str] = []
    for address in target.addresses:
        try:
            return await trio.open_tcp_stream(address, target.port)
        except OSError as error:
            # trio keeps the real reason ("Connection refused") in the group it raises this from.
            causes = getattr(error.__cause__, "exceptions", None) or [error]
            errors.append(f"{address}: {', '.join(_os_reason(cause) for cause in causes)}")
    raise OSError(f"could not connect to {target.host} port {target.port} ({'; '.join(errors)})")


def _os_reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.errno:
        return os.strerror(error.errno)
    return str(error)


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """Built once: loading the system CA bundle takes milliseconds."""
    return ssl.create_default_context()


async def attempt_delivery(
    url: str,
    secret: str,
    delivery_id: str,
    event_type: str,
    body: str,
    *,
    allow_private: bool,
    timestamp: int,
) -> AttemptResult:
    """One attempt with its own 10 s deadline: check the target, POST once, and judge the answer.

    Only 2xx counts; a 3xx is a failure too (following it would bypass the target check). Every expected
    failure comes back as a result with a readable reason; only bugs raise.
    """
    with trio.move_on_after(ATTEMPT_TIMEOUT):
        try:
            target = await resolve_target(url, allow_private)
        except TargetRefused as error:
            return AttemptResult(None, f"refused: {error}")
        payload = body.encode()
        headers = request_headers(target, secret, delivery_id, event_type, timestamp, payload)
        try:
            response, content = await post(target, headers, payload)
        except (OSError, trio.BrokenResourceError, h11.ProtocolError) as error:
            return AttemptResult(None, f"{type(error).__name__}: {error}")
        status = response.status_code
        if 200 <= status < 300:
            return AttemptResult(status)
        if 300 <= status < 400:
            location = dict(response.headers).get(b"location", b"").decode(errors="replace")
            return AttemptResult(status, f"HTTP {status}: redirect to {location or '?'} not followed")
        snippet = content.decode(errors="replace")[:ERROR_SNIPPET_CHARS].strip()
        reason = response.reason.decode(errors="replace")
        return AttemptResult(status, f"HTTP {status} {reason}".strip() + (f": {snippet}" if snippet else ""))
    return AttemptResult(None, f"timed out after {ATTEMPT_TIMEOUT:g} s")


class WebhookSender:
    """Posts due outbox rows and records the outcome; one per server process.

    Start it with ``await nursery.start(sender.run)``; call :meth:`wake` after committing a transaction that
    enqueued events, so they go out at once instead of at the next poll.
    """

    def __init__(
        self,
        db: Database,
        settings: Settings,
        *,
        bell: Bell | None = None,
        clock: Callable[[], float] = time.time,
        poll_seconds: float = POLL_SECONDS,
        concurrency: int = CONCURRENCY,
    ) -> None:
        self._db = db
        self._endpoints: dict[str, WebhookEndpoint] = {}
        for endpoint in settings.webhooks:
            self._endpoints.setdefault(endpoint.url, endpoint)
        self._allow_private = settings.webhook_allow_private
        # Wall-clock seconds as stored in the rows; tests pass trio.current_time with autojump_clock.
        self._clock = clock
        self._poll_seconds = poll_seconds
        self._concurrency = concurrency
        # Rung after a commit that enqueued deliveries (Services.webhooks_bell): make a pass now.
        self.bell = bell or Bell()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver forever. Nothing to recover first: rows claimed by a process that died come back by
        themselves when their claim runs out."""
        task_status.started()
        await outbox.serve(self.bell, self.deliver_due, functools.partial(self._db.read, queries.next_due_at),
                           self._clock, poll_seconds=self._poll_seconds, batch=self._concurrency)

    async def deliver_due(self) -> int:
        """One pass: claim what is due (up to ``concurrency`` rows), attempt them together, record each
        outcome. Returns how many rows were claimed."""
        rows = await self._db.write(queries.claim_due, self._clock(), self._concurrency, CLAIM_SECONDS)
        if rows:
            async with trio.open_nursery() as nursery:
                for row in rows:
                    nursery.start_soon(self._deliver_one, row)
        return len(rows)

    async def _deliver_one(self, row: dict[str, Any]) -> None:
        endpoint = self._endpoints.get(row["endpoint_url"])
        if endpoint is None:  # added on the settings page rather than in the config file
            endpoint = await self._db.read(queries.endpoint_for_url, row["endpoint_url"])
        if endpoint is None:
            # Without its endpoint there is no secret to sign with; waiting will not bring it back.
            error = "the endpoint is no longer in the configuration"
            logger.warning("webhook %s to %s given up: %s", row["event_id"], row["endpoint_url"], error)
            give_up = functools.partial(queries.record_failure, final=True)
            await self._db.write(give_up, row["id"], error, self._clock())
            return
        try:
            result = await attempt_delivery(
                endpoint.url,
                endpoint.secret,
                row["event_id"],
                row["event_type"],
                row["body"],
                allow_private=self._allow_private,
                timestamp=int(self._clock()),
            )
        except Exception as error:  # a bug of ours, not the receiver's fault: record it and carry on
            logger.exception("webhook %s to %s crashed", row["event_id"], endpoint.url)
            result = AttemptResult(None, f"internal error: {type(error).__name__}: {error}")
        now = self._clock()
        if result.ok:
            assert result.status_code is not None
            await self._db.write(queries.record_delivered, row["id"], result.status_code, now)
            return
        assert result.error is not None
        updated = await self._db.write(
            functools.partial(queries.record_failure, status_code=result.status_code),
            row["id"],
            result.error,
            now,
        )
        if updated is not None and updated["status"] == "failed":
            logger.error(
                "webhook %s to %s failed after %d attempts, giving up: %s",
                row["event_id"], endpoint.url, updated["attempts"], result.error,
            )
        else:
            logger.warning(
                "webhook %s to %s failed, will retry: %s", row["event_id"], endpoint.url, result.error
            )
