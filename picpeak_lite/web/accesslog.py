"""The request log: one line per HTTP request or WebSocket, written when it ends, as reverse proxies and
application servers do::

    127.0.0.1 "GET /g/anna-ben-k7x2m9qp?sort=* HTTP/1.1" 200 8123 12ms
    127.0.0.1 "POST /api/admin/galleries/3/upload HTTP/1.1" 202 412 1532ms in=52431200
    127.0.0.1 "WS /ws/admin/galleries/3" 101 2210 65432ms
    127.0.0.1 "GET /g/anna-ben-k7x2m9qp/download HTTP/1.1" 200 1048576 950ms incomplete

Fields: the client (behind a trusted proxy, the address from ``X-Forwarded-For``, by the same rule as the
throttling), the request line, the status, the bytes sent (the response body, or a WebSocket's messages), the
time until the last byte, the bytes received when there were any (uploads), and ``incomplete`` when the client
went away before the response ended. A client that went away before any answer (an upload cut by a reload or
by going offline, a health check whose caller gave up) is status 499, "client closed request", as nginx writes
it: nothing failed on our side, so it is not a 500. Query strings keep their keys but never their values, which
can be share tokens, passwords typed into a GET form or upload ids. Paths are percent-quoted, so nothing a
client sends can forge a log line. 5xx answers are logged at WARNING, everything else at INFO.

It is an ASGI wrapper around the app (not hypercorn's access log and not ``after_request``) because only there
are the real byte counts of streamed bodies and the whole life of a WebSocket visible.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import parse_qsl, quote

from picpeak_lite.web.views.common import real_client, trusted_set

log = logging.getLogger("picpeak_lite.access")

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that went away before the answer

ASGIApp = Any  # (scope, receive, send) -> Awaitable[None]; kept loose so any ASGI callable fits

# Characters left unquoted in logged paths: RFC 3986 pchar, no spaces, quotes or control characters.
_PATH_SAFE = "/-_.~!$&'()*+,;=:@%"


class AccessLog:
    """Wraps an ASGI app and logs each ``http`` and ``websocket`` scope once it ends; other scopes pass."""

    def __init__(self, app: ASGIApp, trusted_proxies: str) -> None:
        self.app = app
        self.trusted = trusted_set(trusted_proxies)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        record = _Record(scope)

        async def counting_receive() -> dict[str, Any]:
            message = await receive()
            record.received(message)
            return message

        async def counting_send(message: dict[str, Any]) -> None:
            record.sent(message)
            await send(message)

        try:
            await self.app(scope, counting_receive, counting_send)
        finally:
            record.log(self.trusted)


class _Record:
    def __init__(self, scope: dict[str, Any]) -> None:
        self.scope = scope
        self.started = time.monotonic()
        self.websocket = scope["type"] == "websocket"
        self.status: int | None = None
        self.bytes_out = 0
        self.bytes_in = 0
        self.finished = False
        self.client_gone = False  # the server was told the client disconnected

    def received(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.request":
            self.bytes_in += len(message.get("body", b""))
        elif kind == "websocket.receive":
            self.bytes_in += len(message.get("bytes") or b"") + len((message.get("text") or "").encode())
        elif kind == "http.disconnect":
            self.client_gone = True
        elif kind == "websocket.disconnect":
            self.client_gone = True
            self.finished = True

    def sent(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind in ("http.response.start", "websocket.http.response.start"):
            self.status = message["status"]
        elif kind in ("http.response.body", "websocket.http.response.body"):
            self.bytes_out += len(message.get("body", b""))
            if not message.get("more_body", False):
                self.finished = True
        elif kind == "websocket.accept":
            self.status = 101
        elif kind == "websocket.send":
            self.bytes_out += len(message.get("bytes") or b"") + len((message.get("text") or "").encode())
        elif kind == "websocket.close":
            # Closed before the handshake was accepted: the client was refused (hypercorn answers 403).
            self.status = self.status or 403
            self.finished = True

    def log(self, trusted: frozenset[str]) -> None:
        scope = self.scope
        peer = (scope.get("client") or ("-", 0))[0]
        forwarded = ",".join(value.decode("latin-1") for name, value in scope.get("headers", ())
                             if name.lower() == b"x-forwarded-for")
        client = real_client(peer, forwarded, trusted)
        target = quote(scope.get("path", ""), safe=_PATH_SAFE)
        query = scope.get("query_string", b"")
        if query:
            keys = [quote(key, safe="") for key, _ in parse_qsl(query.decode("latin-1"), keep_blank_values=True)]
            target += "?" + "&".join(f"{key}=*" for key in keys) if keys else "?*"
        if self.websocket:
            line = f"WS {target}"
        else:
            line = f"{scope.get('method', '-')} {target} HTTP/{scope.get('http_version', '1.1')}"
        # No answer began: the client left first (499), or the app failed (500).
        status = self.status or (CLIENT_CLOSED_REQUEST if self.client_gone else 500)
        ms = (time.monotonic() - self.started) * 1000
        text = f'{client} "{line}" {status} {self.bytes_out} {ms:.0f}ms'
        if self.bytes_in:
            text += f" in={self.bytes_in}"
        if not self.finished:
            text += " incomplete"
        log.log(logging.WARNING if status >= 500 else logging.INFO, "%s", text)
