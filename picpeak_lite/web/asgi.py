"""Request bodies that cannot eat the server's memory.

quart-trio reads the socket as fast as the client sends and appends everything to the request body's buffer,
whether or not the app is keeping up: 200 guests uploading 3 MB each made the server hold most of 600 MB, and
the copying showed as event-loop lag. Two rules replace that:

* **Bodies not streamed by our own code** (forms, JSON) are limited by ``MAX_CONTENT_LENGTH`` (a sane 16 MiB),
  whether read whole or parsed chunk by chunk, so a guest endpoint cannot be made to take in gigabytes. The
  limit is applied only once the app reads: refusing earlier (as Quart does from ``Content-Length``) would
  throw away the first bytes of an upload that is about to lift the limit.
* **Everything else is read with backpressure**: the connection stops reading the socket while more than
  ``STREAM_BUFFER_BYTES`` wait in the buffer, until the app either iterates the body (uploads, which call
  :meth:`BoundedBody.stream` to replace Quart's total limit by their own byte counting) or asks for it whole.
  So a request waiting on its checks holds 64 KiB, not its whole body, and a fast sender is slowed to the
  speed of the disk.
"""

from __future__ import annotations

from typing import Any

import trio
from quart_trio.asgi import TrioASGIHTTPConnection
from quart_trio.wrappers.request import TrioBody, TrioRequest
from werkzeug.exceptions import RequestEntityTooLarge

# What waits for the app per connection. With 200 guests uploading at once, 64 KiB (instead of 256) took the
# load suite's peak from about 340 to 260 MB at the same upload times: the app keeps up, the buffer only waits.
STREAM_BUFFER_BYTES = 64 * 1024


class BoundedBody(TrioBody):
    def __init__(self, expected_content_length: int | None, max_content_length: int | None) -> None:
        # No refusal yet: until the app says how it reads the body, Quart's limit would only drop the data.
        super().__init__(expected_content_length, None)
        self._expected = expected_content_length or 0
        self._whole_limit = max_content_length
        self._received = 0
        self.wanted_whole = False
        self._room = trio.Event()

    def stream(self) -> None:
        """The caller reads this body chunk by chunk and enforces its own limits: no whole-body limit."""
        self._whole_limit = None

    def append(self, data: bytes) -> None:
        self._received += len(data)
        super().append(data)
        if self.wanted_whole and self._over_limit():
            self._refuse()

    def __await__(self) -> Any:
        # Read whole (JSON, small forms): stop holding the socket back; MAX_CONTENT_LENGTH bounds it instead.
        self.wanted_whole = True
        self._room.set()
        if self._over_limit() or (self._whole_limit is not None and self._expected > self._whole_limit):
            self._refuse()
        return super().__await__()

    async def __anext__(self) -> bytes:
        if self._over_limit():
            raise RequestEntityTooLarge()
        data = await super().__anext__()
        self._room.set()
        self._room = trio.Event()
        return data

    def _over_limit(self) -> bool:
        return self._whole_limit is not None and self._received > self._whole_limit

    def _refuse(self) -> None:
        self._must_raise = RequestEntityTooLarge()
        self._data.clear()
        self.set_complete()

    async def wait_for_room(self) -> None:
        """Block the socket reader while enough is waiting for the app (unless it wants the body whole)."""
        while not self.wanted_whole and len(self._data) >= STREAM_BUFFER_BYTES:
            await self._room.wait()


class BoundedRequest(TrioRequest):
    body_class = BoundedBody


class BackpressureHTTPConnection(TrioASGIHTTPConnection):
    async def handle_messages(self, nursery: trio.Nursery, request: Any, receive: Any) -> None:  # type: ignore[override]
        body = request.body
        while True:
            await body.wait_for_room()
            message = await receive()
            if message["type"] == "http.request":
                body.append(message.get("body", b""))
                if not message.get("more_body", False):
                    body.set_complete()
            elif message["type"] == "http.disconnect":
                break
        nursery.cancel_scope.cancel()
