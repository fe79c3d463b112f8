"""Bounded request bodies: the socket reader waits while the app is behind, unless the app wants it whole."""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
from pathlib import Path
from typing import Any

import httpx
import trio
from hypercorn.trio import tcp_server
from PIL import Image

from picpeak_lite.web import asgi
from picpeak_lite.web.asgi import STREAM_BUFFER_BYTES, BoundedBody

from .factories import jpeg
from .harness import multipart
from .served import Served, serve


async def test_reader_waits_until_the_app_takes_what_is_buffered(autojump_clock: Any) -> None:
    """(On trio's virtual clock: 'still waiting after 50 ms' and 'never blocks' do not depend on the load.)"""
    body = BoundedBody(None, 16 * 1024 * 1024)
    body.append(b"x" * STREAM_BUFFER_BYTES)
    with trio.move_on_after(0.05) as waited:
        await body.wait_for_room()
    assert waited.cancelled_caught  # full: the socket is not read
    async with trio.open_nursery() as nursery:
        nursery.start_soon(body.wait_for_room)
        await trio.sleep(0.01)
        assert len(await body.__anext__()) == STREAM_BUFFER_BYTES  # the app reads; the reader goes on


async def test_streaming_lifts_the_whole_body_limit_and_a_whole_read_lifts_the_backpressure(
        autojump_clock: Any) -> None:
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


async def test_an_upload_over_the_whole_body_limit_keeps_every_byte(client: Any, admin: Any,
                                                                     services: Any) -> None:
    """Content-Length above MAX_CONTENT_LENGTH (16 MiB): Quart would refuse at once and drop what arrived
    before the upload code lifted the limit, corrupting the multipart body."""
    gallery = await admin.create_gallery(name="Big files")
    image = io.BytesIO()
    Image.new("RGB", (64, 48), (10, 120, 200)).save(image, "JPEG")
    data = image.getvalue() + b"\0" * (17 * 1024 * 1024)  # bytes after EOI: still a JPEG, now 17 MiB
    body = (b"--b\r\nContent-Disposition: form-data; name=\"photos\"; filename=\"big.jpg\"\r\n"
            b"Content-Type: image/jpeg\r\n\r\n" + data + b"\r\n--b--\r\n")
    response = await client.post(f"/api/admin/galleries/{gallery['id']}/upload", data=body,
                                 headers={**admin.headers(), "Content-Type": "multipart/form-data; boundary=b"})
    assert response.status_code == 202, await response.get_data(as_text=True)
    photo_id = (await response.get_json())["photo_ids"][0]
    row = await services.db.read(lambda conn: conn.execute("SELECT * FROM photos WHERE id = ?",
                                                           (photo_id,)).fetchall()[0])
    stored = services.storage.original_path(row["storage_key"])
    assert stored.read_bytes() == data and row["sha256"] == hashlib.sha256(data).hexdigest()


async def test_json_and_forms_over_the_limit_are_refused(client: Any, admin: Any) -> None:
    big = b'{"name": "' + b"x" * (17 * 1024 * 1024) + b'"}'
    response = await client.post("/api/admin/galleries", data=big,
                                 headers={**admin.headers(), "Content-Type": "application/json"})
    assert response.status_code == 413
    form = await client.post("/admin/login", data=b"password=" + b"y" * (17 * 1024 * 1024),
                             headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert form.status_code == 413


def test_hypercorn_still_reads_the_constant_the_read_size_sets() -> None:
    assert "receive_some(MAX_RECV)" in inspect.getsource(tcp_server.TCPServer)


async def test_reads_are_large_for_a_few_bodies_at_once_and_small_for_many() -> None:
    """A photographer's upload is read in 256 KiB; once more than 8 bodies arrive at once, every read is 64 KiB
    (the 200-guest load suite holds the server's peak to what it was with hypercorn's own size)."""
    read_size = asgi.ReadSize()
    for _ in range(asgi.LARGE_READS_UP_TO):
        read_size.started()
        assert tcp_server.MAX_RECV == asgi.LARGE_READ_BYTES == 256 * 1024
    read_size.started()
    assert tcp_server.MAX_RECV == asgi.SMALL_READ_BYTES == 64 * 1024
    read_size.ended()
    assert tcp_server.MAX_RECV == asgi.LARGE_READ_BYTES


async def test_the_real_server_reads_small_chunks_while_many_bodies_arrive(tmp_path: Path) -> None:
    """Ten uploads that are still sending: reads are small; once only eight are left, large again; once they
    are gone, nothing is left counted."""
    async with serve(tmp_path) as served:
        await _count_read_sizes(served)


async def _count_read_sizes(served: Served) -> None:
    read_size = asgi.READ_SIZE.get()
    host, port = served.url.removeprefix("http://").split(":")
    head = (f"POST /api/admin/galleries/{served.gallery_id}/upload HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {served.token}\r\nContent-Type: multipart/form-data; boundary=b\r\n"
            f"Content-Length: 1000000\r\n\r\n").encode()
    part = b'--b\r\nContent-Disposition: form-data; name="photos"; filename="a.jpg"\r\n\r\n' + b"\xff" * 1000

    async def counted(n: int) -> None:
        with trio.fail_after(30):  # a hang guard, not a bound
            while read_size.receiving != n:
                await trio.sleep(0.01)

    streams = []
    for _ in range(10):
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(head + part)
        streams.append(stream)
    await counted(10)
    assert tcp_server.MAX_RECV == asgi.SMALL_READ_BYTES
    for stream in streams[:2]:
        await stream.aclose()
    await counted(8)
    assert tcp_server.MAX_RECV == asgi.LARGE_READ_BYTES
    for stream in streams[2:]:
        await stream.aclose()
    await counted(0)


async def test_an_upload_slower_than_the_minimum_rate_is_ended_with_408_and_leaves_nothing(tmp_path: Path) -> None:
    """A multipart upload that trickles (2 bytes/s against 1 KB/s over 2 s windows): the intake's read of the
    body raises 408, the answer closes the connection, and no photo, upload or temp file is left. (The hostile
    suite does the same to whole-body reads, the login form, at scale.)"""
    async with serve(tmp_path, body_rate_window_seconds=2) as served:
        host, port = served.url.removeprefix("http://").split(":")
        head = (f"POST /api/admin/galleries/{served.gallery_id}/upload HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer {served.token}\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                f"Content-Length: 1000000\r\n\r\n").encode()
        part = b'--b\r\nContent-Disposition: form-data; name="photos"; filename="a.jpg"\r\n\r\n\xff\xd8'
        stream = await trio.open_tcp_stream(host, int(port))
        answer, closed = b"", False
        with trio.move_on_after(60):  # a hang guard, not a bound
            await stream.send_all(head + part)
            while not closed:  # the server closes the connection after its answer
                with trio.move_on_after(0.5):
                    chunk = await stream.receive_some(4096)
                    answer += chunk
                    closed = not chunk
                    continue
                with contextlib.suppress(trio.BrokenResourceError):
                    await stream.send_all(b"\xff")
        await stream.aclose()
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b"too slowly" in answer and closed
        rows = await served.services.db.read(
            lambda conn: conn.execute("SELECT (SELECT count(*) FROM photos) AS p, (SELECT count(*) FROM uploads) AS u")
            .fetchall()[0])
        assert (rows["p"], rows["u"]) == (0, 0)
        assert [p for p in (tmp_path / "data" / "tmp").rglob("*") if p.is_file()] == []


async def test_an_answer_given_before_the_body_is_read_reaches_a_client_still_sending_it(tmp_path: Path) -> None:
    """A 16 MB upload answered before any of its body is read (no such gallery: 404; a wrong token: 401), sent by
    a client that reads the answer only once it has sent everything, as httpx does. The answer reaches it and the
    connection is closed: before, the reader waited for room the app would never make and the answer's end waited
    behind it, so the client hung until its own timeout (a 3 MB upload with PostgreSQL stopped got no 503)."""
    body, headers = multipart([("a.jpg", b"\xff" * (16 << 20))])
    async with serve(tmp_path) as served:
        answers = []
        for gallery_id, token in ((served.gallery_id + 1000, served.token), (served.gallery_id, "not-a-token")):
            async with httpx.AsyncClient(base_url=served.url, timeout=None,
                                         headers={"Authorization": f"Bearer {token}"}) as http:
                with trio.fail_after(120):  # a hang guard, not a bound
                    response = await http.post(f"/api/admin/galleries/{gallery_id}/upload", content=body,
                                               headers=headers)
            answers.append((response.status_code, response.headers.get("Connection"), "error" in response.json()))
        assert answers == [(404, "close", True), (401, "close", True)]
        # The server goes on: the next upload is taken.
        photo, photo_headers = multipart([("after.jpg", jpeg(1, (320, 240)))])
        async with served.admin() as http:
            ok = await http.post(f"/api/admin/galleries/{served.gallery_id}/upload", headers=photo_headers,
                                 content=photo)
        assert ok.status_code == 202, ok.text
