"""The test harness's own client helpers, against a server that misbehaves on purpose."""

from __future__ import annotations

import functools

import httpx
import trio

from .harness import get_idempotent

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


async def test_a_poll_survives_a_kept_alive_connection_closed_under_it() -> None:
    """The race a loaded CI machine met while polling: the server closes a kept-alive connection just as the
    client sends its next request on it. Made certain here: each connection answers one request and closes
    when the second arrives. A plain GET fails with ReadError / RemoteProtocolError; the helper asks again on a
    new connection."""
    answered = 0

    async def one_answer_per_connection(stream: trio.SocketStream) -> None:
        nonlocal answered
        async with stream:
            await stream.receive_some(65536)
            answered += 1
            await stream.send_all(ANSWER)
            await stream.receive_some(65536)  # the reuse: closed without an answer

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(
            functools.partial(trio.serve_tcp, one_answer_per_connection, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            assert (await http.get("/status")).text == "ok"
            plain_failed = False
            try:
                await http.get("/status")
            except (httpx.ReadError, httpx.RemoteProtocolError):
                plain_failed = True
            assert (await get_idempotent(http, "/status")).text == "ok"
            assert (await get_idempotent(http, "/status")).text == "ok"
        nursery.cancel_scope.cancel()
    assert plain_failed and answered == 3  # the first connection, then one per retry
