"""Issue 18: each file of an upload is claimable once its original is durable, while the upload group stays
exactly as correct as when the rows came at the end. The real server over a raw socket (to hold a request
half-sent), the real worker pool and janitor, real SQLite, real images."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import trio

from picpeak_lite.pipeline.intake import Intake, Limits, Uploader, receiving_uploads
from picpeak_lite.pipeline.janitor import Janitor
from picpeak_lite.services import Services
from picpeak_lite.store.queries import galleries as gallery_q

from .conftest import make_settings
from .harness import query, stored_files
from .harness import temp_files as temp_paths
from .test_upload import BOUNDARY, _serve, jpeg, multipart, originals, read_response, temp_files

HANG_GUARD = 60  # seconds: only so that a bug fails the test instead of hanging CI; never a speed bound


async def _wait(condition: Any) -> None:
    with trio.fail_after(HANG_GUARD):
        while not condition():
            await trio.sleep(0.02)


async def _open_upload(url: str, token: str, body: bytes) -> trio.SocketStream:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(
        f"POST /api/admin/galleries/1/upload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {len(body)}\r\n\r\n".encode())
    return stream


def _photos(data_dir: Path) -> list[dict[str, Any]]:
    return query(data_dir, "SELECT id, display_name, status, provisional, upload_id FROM photos ORDER BY id")


def _uploads(data_dir: Path) -> list[dict[str, Any]]:
    return query(data_dir, "SELECT id, completed_at, receiving_until FROM uploads")


async def test_first_photo_is_processed_while_its_request_still_arrives(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, shutdown_grace_seconds=1, workers=1)
    data = settings.data_path
    async with trio.open_nursery() as nursery:
        running, token = await _serve(settings, nursery)
        body, _ = multipart([("a.jpg", jpeg(1, (320, 240))), ("b.jpg", jpeg(2, (320, 240)))])
        cut = body.index(b'filename="b.jpg"')  # a.jpg and the boundary after it have arrived, b.jpg has not
        stream = await _open_upload(running.url, token, body)
        await stream.send_all(body[:cut])
        await _wait(lambda: [p["status"] for p in _photos(data)] == ["complete"])
        # Complete, but its request is still arriving: provisional, and the group neither complete nor done.
        [photo] = _photos(data)
        assert photo["provisional"] == 1
        [upload] = _uploads(data)
        assert upload["completed_at"] is None and upload["receiving_until"] is not None
        await stream.send_all(body[cut:])
        with trio.fail_after(HANG_GUARD):
            head, answer = await read_response(stream)
        await stream.aclose()
        assert head.startswith(b"HTTP/1.1 202"), head + answer
        sent = json.loads(answer)
        assert [p["filename"] for p in sent["photos"]] == ["a.jpg", "b.jpg"] and sent["upload_id"] == upload["id"]
        await _wait(lambda: _uploads(data)[0]["completed_at"] is not None)
        assert [(p["status"], p["provisional"]) for p in _photos(data)] == [("complete", 0)] * 2
        assert _uploads(data)[0]["receiving_until"] is None
        running.stop()


async def test_a_request_cut_off_after_a_processed_photo_keeps_nothing(tmp_path: Path) -> None:
    """Nothing of a request is acknowledged before its 202, so a client that goes leaves nothing, even photos
    that were already processed and shown: their rows, files and derivatives go, and so does the group."""
    settings = make_settings(tmp_path, shutdown_grace_seconds=1, workers=1)
    data = settings.data_path
    async with trio.open_nursery() as nursery:
        running, token = await _serve(settings, nursery)
        body, _ = multipart([("a.jpg", jpeg(1, (320, 240))), ("b.jpg", jpeg(2) + bytes(2 * 1024 * 1024))])
        stream = await _open_upload(running.url, token, body)
        await stream.send_all(body[: body.index(b'filename="b.jpg"') + 4096])
        await _wait(lambda: [p["status"] for p in _photos(data)] == ["complete"])
        assert stored_files(data)  # original and derivatives of a.jpg
        await stream.aclose()
        await _wait(lambda: not _photos(data) and not originals(settings) and not temp_files(settings))
        assert _uploads(data) == [] and stored_files(data) == {} and temp_paths(data) == []
        running.stop()


async def _receive(intake: Intake, name: str, data: bytes) -> Any:
    sink = intake.start_file(name)
    await sink.write(data)
    return await intake.finish_file(sink)


async def test_janitor_takes_back_a_dead_request_but_not_what_another_request_was_told(
        services: Services, settings: Any) -> None:
    gallery = await services.db.write(
        lambda conn: conn.execute("INSERT INTO galleries (slug, share_token, name, created_at, updated_at) "
                                  "VALUES ('g', 's', 'G', 0, 0) RETURNING *").fetchall()[0])
    uploader = Uploader(lambda conn: gallery_q.get(conn, gallery["id"]), "admin")
    common = {"db": services.db, "storage": services.storage, "settings": settings, "gallery": gallery,
              "limits": Limits.admin(settings), "clock": time.time, "uploader": uploader}
    shared, own = jpeg(1), jpeg(2)
    dying = Intake(**common)  # never finished and never left: its process "dies" with it
    for name, data in (("shared.jpg", shared), ("own.jpg", own)):
        await _receive(dying, name, data)
    data_dir = settings.data_path
    assert [(p["display_name"], p["provisional"]) for p in _photos(data_dir)] == [("shared.jpg", 1), ("own.jpg", 1)]
    # Another request sends the same bytes as the first file: told "already in the gallery", and answered.
    async with Intake(**common) as other:
        entry = await _receive(other, "again.jpg", shared)
        assert entry.duplicate
        await other.finish(None)
    assert other.answer()["upload_id"] is None and other.answer()["photos"][0]["duplicate"] is True
    receiving_uploads().discard(dying.upload_id)  # as in another process: nobody renews its lease now
    janitor = Janitor(services)
    assert await janitor.renew_and_abandon_uploads() == 0  # within the lease: left alone
    later = Services(settings=settings, db=services.db, clock=lambda: time.time() + settings.lease_seconds + 1)
    assert await Janitor(later).renew_and_abandon_uploads() == 1
    [kept] = _photos(data_dir)
    assert (kept["display_name"], kept["provisional"], kept["id"]) == ("shared.jpg", 0, entry.photo_id)
    assert [u["receiving_until"] for u in _uploads(data_dir)] == [None]  # no longer receiving: it can complete
    assert len(originals(settings)) == 1


async def test_a_request_that_fails_after_its_first_rows_keeps_nothing(services: Services, settings: Any) -> None:
    """413 for too many files, after the first files' rows were committed: all taken back on the way out."""
    gallery = await services.db.write(
        lambda conn: conn.execute("INSERT INTO galleries (slug, share_token, name, created_at, updated_at) "
                                  "VALUES ('g', 's', 'G', 0, 0) RETURNING *").fetchall()[0])
    uploader = Uploader(lambda conn: gallery_q.get(conn, gallery["id"]), "admin")
    intake = Intake(db=services.db, storage=services.storage, settings=settings, gallery=gallery,
                    limits=Limits(10 * 1024 * 1024, 1), clock=time.time, uploader=uploader)
    try:
        async with intake:
            await _receive(intake, "a.jpg", jpeg(1))
            assert len(_photos(settings.data_path)) == 1
            intake.start_file("b.jpg")
    except Exception as error:
        assert "Too many files" in str(error)
    else:
        raise AssertionError("the second file was not refused")
    assert _photos(settings.data_path) == [] and _uploads(settings.data_path) == []
    assert originals(settings) == [] and temp_files(settings) == []
