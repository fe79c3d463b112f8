"""Request bodies that cannot eat the server's memory.

quart-trio reads the socket as fast as the client sends and appends everything to the request body's buffer,
whether or not the app is keeping up: 200 guests uploading 3 MB each made the server hold most of 600 MB, and
the copying showed as event-loop lag. Three rules replace that:

* **Bodies not streamed by our own code** (forms, JSON) are limited by ``MAX_CONTENT_LENGTH`` (a sane 16 MiB),
  whether read whole or parsed chunk by chunk, so a guest endpoint cannot be made to take in gigabytes. The
  limit is applied only once the app reads: refusing earlier (as Quart does from ``Content-Length``) would
  throw away the first bytes of an upload that is about to lift the limit.
* **Everything else is read with backpressure**: the connection stops reading the socket while more than
  ``STREAM_BUFFER_BYTES`` wait in the buffer, until the app either iterates the body (uploads, which call
  :meth:`BoundedBody.stream` to replace Quart's total limit by their own byte counting) or asks for it whole.
  So a request waiting on its checks holds a chunk or two (64 KiB, or one socket read when that is larger),
  not its whole body, and a fast sender is slowed to the speed of the disk.
* **Once the app sends the end of its answer, the rest of the body is read and dropped**
  (:meth:`BackpressureHTTPConnection.handle_request`). An answer given before the body was read (a 404 gallery,
  a bad token, the database down) would otherwise never reach the client: the reader waited for room the app
  would never make, hypercorn's queue to the app filled, and sending the answer's end waited behind that queue
  (hypercorn tells the app of the closed stream through it), so the client, still writing its body, was held
  until its own timeout (a 3 MB upload with PostgreSQL stopped: no answer at all instead of a 503). Not earlier
  than the answer's end: from then on hypercorn closes the connection (its request did not end), so little
  more is read; marked as the app made its answer, a busy server read megabytes it would throw away.

How much one socket read takes follows how many bodies arrive at once (:class:`ReadSize`). Every chunk costs
the same Python on its way (hypercorn, h11, the body, the multipart decoder, the write batch), so the chunk
size sets what receiving costs: 24 MP photos (9 MB) cost the server 41-52 ms of CPU each (median 46) in 64 KiB
reads and 31-41 ms (median 37) in 256 KiB reads, interleaved; 1 MiB was worse, 55 ms: each buffer had a
mapping of its own (runtime/memory.py).
But each body in flight holds up to three chunks (the reader's, hypercorn's queue, this body), and 200 guests
uploading 3 MB each took the server from 230 to 341 MB in 256 KiB reads. So a few bodies at once (a
photographer's upload, a few guests) are read in large chunks, and many in small ones.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import trio
from hypercorn.trio import tcp_server as hypercorn_tcp
from quart_trio.asgi import TrioASGIHTTPConnection
from quart_trio.wrappers.request import TrioBody, TrioRequest
from werkzeug.exceptions import RequestEntityTooLarge

from picpeak_lite.errors import RequestTimeout
from picpeak_lite.i18n import _
from picpeak_lite.perrun import PerRun

# What waits for the app per connection. With 200 guests uploading at once, 64 KiB (instead of 256) took the
# load suite's peak from about 340 to 260 MB at the same upload times: the app keeps up, the buffer only waits.
STREAM_BUFFER_BYTES = 64 * 1024
LARGE_READ_BYTES = 256 * 1024
SMALL_READ_BYTES = 64 * 1024  # hypercorn's own
LARGE_READS_UP_TO = 8  # bodies arriving at once: 8 x 3 chunks of 256 KiB is 6 MiB


class ReadSize:
    """Counts the request bodies being received and sets hypercorn's read size to match.

    hypercorn has no setting for it, only the module constant ``MAX_RECV`` that its reader looks up on every
    read (tests/test_asgi.py checks that it still does). A body that starts when the count passes the limit
    makes every read that starts after it small; a read already waiting keeps the size it was called with,
    so each connection holds at most one large chunk more than the bound."""

    def __init__(self) -> None:
        self.receiving = 0

    def started(self) -> None:
        self.receiving += 1
        self._apply()

    def ended(self) -> None:
        self.receiving -= 1
        self._apply()

    def _apply(self) -> None:
        large = self.receiving <= LARGE_READS_UP_TO
        hypercorn_tcp.MAX_RECV = LARGE_READ_BYTES if large else SMALL_READ_BYTES


READ_SIZE = PerRun("picpeak_read_size", ReadSize)


class BoundedBody(TrioBody):
    """Quart's body, with the limits above, keeping the chunks as they came: Quart copies each into one buffer
    and out again, two copies of every byte of every upload; here a chunk is handed on as it is (and joined
    only when more than one waits)."""

    def __init__(self, expected_content_length: int | None, max_content_length: int | None) -> None:
        # No refusal yet: until the app says how it reads the body, Quart's limit would only drop the data.
        super().__init__(expected_content_length, None)
        self._expected = expected_content_length or 0
        self._whole_limit = max_content_length
        self._received = 0
        self._chunks: deque[bytes] = deque()
        self.wanted_whole = False
        self._room = trio.Event()
        self._answered = False

    def stream(self) -> None:
        """The caller reads this body chunk by chunk and enforces its own limits: no whole-body limit."""
        self._whole_limit = None

    def append(self, data: bytes) -> None:
        if not data or self._must_raise is not None or self._answered:
            return
        self._received += len(data)
        self._chunks.append(data)
        self._has_data.set()
        if self.wanted_whole and self._over_limit():
            self._refuse()

    def clear(self) -> None:
        self._chunks.clear()

    def answered(self) -> None:
        """The app is sending the end of its answer: it reads no more, so what waits is dropped, the reader no
        longer waits for room, and what still arrives is dropped as it comes."""
        self._answered = True
        self._chunks.clear()
        self._room.set()

    def __await__(self) -> Any:
        # Read whole (JSON, small forms): stop holding the socket back; MAX_CONTENT_LENGTH bounds it instead.
        self.wanted_whole = True
        self._room.set()
        if self._over_limit() or (self._whole_limit is not None and self._expected > self._whole_limit):
            self._refuse()
        if self._must_raise is not None:
            raise self._must_raise
        yield from self._complete.wait().__await__()
        if self._must_raise is not None:
            raise self._must_raise
        return self._take(keep=True)

    async def __anext__(self) -> bytes:
        if self._over_limit():
            raise RequestEntityTooLarge()
        if self._must_raise is not None:
            raise self._must_raise
        if not self._complete.is_set():
            await self._has_data.wait()
            if self._must_raise is not None:
                raise self._must_raise
        if self._complete.is_set() and not self._chunks:
            raise StopAsyncIteration()
        data = self._take(keep=False)
        self._has_data.clear()
        self._room.set()
        self._room = trio.Event()
        return data

    def _take(self, *, keep: bool) -> bytes:
        """Everything waiting, as one bytes object; kept for the next whole read when ``keep``."""
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        if keep:
            self._chunks.append(data)
        return data

    def _over_limit(self) -> bool:
        return self._whole_limit is not None and self._received > self._whole_limit

    def _refuse(self) -> None:
        self._must_raise = RequestEntityTooLarge()
        self.clear()
        self.set_complete()

    @property
    def complete(self) -> bool:
        return self._complete.is_set()

    def too_slow(self) -> None:
        """End the body with a 408 for whoever reads it (see :class:`BodyRate`)."""
        self._must_raise = RequestTimeout(
            _("The upload arrived too slowly and was stopped; please try again on a better connection."))
        self.clear()
        self.set_complete()

    async def wait_for_room(self) -> None:
        """Block the socket reader while enough is waiting for the app (unless it wants the body whole)."""
        while not self._answered and not self.wanted_whole and sum(map(len, self._chunks)) >= STREAM_BUFFER_BYTES:
            await self._room.wait()


class BoundedRequest(TrioRequest):
    body_class = BoundedBody


class BodyRate:
    """The minimum rate of a request body: each ``window`` seconds of waiting for the client must bring at least
    ``window * min_bytes_per_second`` bytes (the first window starts with the request), else the body is ended.

    hypercorn's ``read_timeout`` counts only between bytes, so a client sending one byte every 50 s held its
    connection (and a file descriptor, and a request task) for ever. Only the time spent waiting for the client
    counts: while the body waits for the app (backpressure, a full backlog) the client is not to blame. At the
    default 1 KB/s over 30 s a phone on poor venue Wi-Fi (20-50 KB/s, stalls of several seconds) is far inside
    the bound; a client below it is not really sending."""

    def __init__(self, min_bytes_per_second: float, window: float) -> None:
        self.quota = min_bytes_per_second * window
        self.window = window
        self.left = window
        self.got = 0

    def deadline(self) -> float:
        """How long the next wait for the client may take (infinite with no minimum)."""
        return max(0.0, self.left) if self.quota > 0 else math.inf

    def waited(self, seconds: float, size: int) -> None:
        self.left -= seconds
        self.got += size
        if self.got >= self.quota:  # this window's share arrived: the next one starts now
            self.left, self.got = self.window, 0


class BackpressureHTTPConnection(TrioASGIHTTPConnection):
    async def handle_request(self, nursery: trio.Nursery, request: Any, send: Any) -> None:  # type: ignore[override]
        body = request.body

        async def send_answering(message: Any) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                body.answered()  # before the answer's end is sent: see the module's docstring
            await send(message)

        await super().handle_request(nursery, request, send_answering)

    async def handle_messages(self, nursery: trio.Nursery, request: Any, receive: Any) -> None:  # type: ignore[override]
        body = request.body
        read_size, arriving = READ_SIZE.get(), False
        settings = self.app.extensions["picpeak"].settings
        rate = BodyRate(settings.min_body_rate_kb * 1000, settings.body_rate_window_seconds)
        try:
            while True:  # until the client goes: a disconnect cancels the request's handler
                await body.wait_for_room()
                began = trio.current_time()
                with trio.move_on_after(math.inf if body.complete else rate.deadline()) as waiting:
                    message = await receive()
                if waiting.cancelled_caught:
                    # Too slow: the app's read of the body raises 408, its answer closes the connection
                    # (hypercorn does not reuse one whose request did not end), and the rest is not read.
                    body.too_slow()
                    continue
                if message["type"] == "http.request":
                    more = message.get("more_body", False)
                    rate.waited(trio.current_time() - began, len(message.get("body", b"")))
                    if more and not arriving:
                        arriving = True
                        read_size.started()
                    body.append(message.get("body", b""))
                    if not more:
                        body.set_complete()
                        if arriving:
                            arriving = False
                            read_size.ended()
                elif message["type"] == "http.disconnect":
                    break
        finally:
            if arriving:
                read_size.ended()
        nursery.cancel_scope.cancel()
