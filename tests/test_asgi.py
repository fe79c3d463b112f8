"""Bounded request bodies: the socket reader waits while the app is behind, unless the app wants it whole."""

from __future__ import annotations

import trio

from picpeak_lite.asgi import STREAM_BUFFER_BYTES, BoundedBody


async def test_reader_waits_until_the_app_takes_what_is_buffered() -> None:
    body = BoundedBody(None, 16 * 1024 * 1024)
    body.append(b"x" * STREAM_BUFFER_BYTES)
    with trio.move_on_after(0.05) as waited:
        await body.wait_for_room()
    assert waited.cancelled_caught  # full: the socket is not read
    async with trio.open_nursery() as nursery:
        nursery.start_soon(body.wait_for_room)
        await trio.sleep(0.01)
        assert len(await body.__anext__()) == STREAM_BUFFER_BYTES  # the app reads; the reader goes on


async def test_streaming_lifts_the_whole_body_limit_and_a_whole_read_lifts_the_backpressure() -> None:
    refused = BoundedBody(50 * 1024 * 1024, 16 * 1024 * 1024)  # Content-Length over the whole-body limit
    refused.stream()
    refused.append(b"y" * 10)
    refused.set_complete()
    assert await refused.__anext__() == b"y" * 10

    whole = BoundedBody(None, 16 * 1024 * 1024)
    async with trio.open_nursery() as nursery:
        async def read_whole() -> None:
            assert len(await whole) == 3 * STREAM_BUFFER_BYTES

        nursery.start_soon(read_whole)
        await trio.sleep(0.01)
        for _ in range(3):
            with trio.fail_after(1):
                await whole.wait_for_room()  # never blocks once the app wants the body whole
            whole.append(b"z" * STREAM_BUFFER_BYTES)
        whole.set_complete()
