"""Uploads end to end: the real routes, a real SQLite file, real files on disk, and a real hypercorn server
for what only a socket can show (Connection: close, the next request, a client that vanishes mid-body)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from picpeak_lite import security, server
from picpeak_lite.media import images
from picpeak_lite.ops import bootstrap
from picpeak_lite.pipeline import intake
from picpeak_lite.pipeline.intake import clean_filename, clean_guest_name
from picpeak_lite.services import Services
from picpeak_lite.store import db
from picpeak_lite.store.db import Database
from picpeak_lite.store.queries import guests as guest_q
from picpeak_lite.store.storage import RESERVE_MAX_BYTES, RESERVE_SHARE, LocalStorage
from picpeak_lite.web import ratelimit
from picpeak_lite.web.app import create_app

from . import imagefactory
from .conftest import ADMIN_PASSWORD, AuthActions, make_settings
from .factories import gallery_row, jpeg, png, published, tiny_png, webp
from .harness import tmpfs

BOUNDARY = "----picpeak-test-7f3a"
GUEST_FILE_MB = 1


@pytest.fixture
def settings(tmp_path: Path) -> Any:
    # Small guest limits so that "too large" and "too many" cost a megabyte or two, not fifty.
    return make_settings(tmp_path, guest_max_file_mb=GUEST_FILE_MB, guest_max_files=4, admin_max_files=6)


def multipart(files: list[tuple[str, bytes]], fields: list[tuple[str, str]] = (), *,  # type: ignore[assignment]
              field: str = "photos", fields_last: bool = False) -> tuple[bytes, dict[str, str]]:
    """A multipart/form-data body built by hand: form fields first (as a browser sends hidden inputs)."""

    def part(headers: str, data: bytes) -> bytes:
        return f"--{BOUNDARY}\r\n{headers}\r\n\r\n".encode() + data + b"\r\n"

    field_parts = [part(f'Content-Disposition: form-data; name="{n}"', v.encode()) for n, v in fields]
    file_parts = [
        part(f'Content-Disposition: form-data; name="{field}"; filename="{name}"\r\n'
             "Content-Type: application/octet-stream", data)
        for name, data in files
    ]
    body = b"".join(file_parts + field_parts if fields_last else field_parts + file_parts)
    body += f"--{BOUNDARY}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


async def admin_upload(admin: AuthActions, gallery_id: int, files: list[tuple[str, bytes]], **kw: Any) -> Any:
    body, headers = multipart(files, **kw)
    return await admin.client.post(f"/api/admin/galleries/{gallery_id}/upload", data=body,
                                   headers={**headers, **admin.headers()})


async def start_guest_session(services: Any, client: Any) -> str:
    """A guest browser session (cookie in the test client's jar); returns its CSRF token."""
    token, csrf = security.new_token(), security.new_token()
    await services.db.write(guest_q.create_session, security.token_hash(token), csrf, time.time())
    client.set_cookie("localhost", "pp_guest", token)
    return csrf


async def rows(services: Any, sql: str, *args: Any) -> list[dict[str, Any]]:
    return await services.db.read(lambda conn: conn.execute(sql, args).fetchall())


def temp_files(settings: Any) -> list[str]:
    tmp = settings.data_path / "tmp"
    return sorted(p.name for p in tmp.iterdir()) if tmp.exists() else []


def originals(settings: Any) -> list[Path]:
    return sorted(p for p in (settings.data_path / "originals").rglob("*") if p.is_file())


async def test_several_files_are_stored_byte_exact_and_queued(admin: AuthActions, services: Any,
                                                              settings: Any) -> None:
    gallery = await admin.create_gallery()
    sent = [("IMG_0001.JPG", jpeg(1)), ("scan.png", png()), ("phone.webp", webp())]
    response = await admin_upload(admin, gallery["id"], sent)
    assert response.status_code == 202, await response.get_data(as_text=True)
    body = await response.get_json()
    assert re.fullmatch(r"[0-9a-f]{32}", body["upload_id"])
    assert body["count"] == 3 and body["errors"] == []
    assert [p["filename"] for p in body["photos"]] == ["IMG_0001.JPG", "scan.png", "phone.webp"]
    assert [p["size"] for p in body["photos"]] == [len(d) for _, d in sent]
    assert body["photo_ids"] == [p["id"] for p in body["photos"]]
    assert not any(p["duplicate"] for p in body["photos"])

    photos = await rows(services, "SELECT * FROM photos ORDER BY id")
    assert [(r["status"], r["uploaded_by"], r["guest_name"], r["upload_id"]) for r in photos] == [
        ("pending", "admin", None, body["upload_id"])] * 3
    assert [(r["format"], r["width"], r["height"]) for r in photos] == [
        ("jpeg", 64, 48), ("png", 40, 30), ("webp", 50, 50)]
    storage = LocalStorage(settings.data_path)
    for row, (name, data) in zip(photos, sent, strict=True):
        path = storage.original_path(row["storage_key"])
        assert path.read_bytes() == data, f"{name} differs on disk"
        assert name not in str(path)
    uploads = await rows(services, "SELECT * FROM uploads")
    assert [(u["id"], u["uploaded_by"], u["gallery_id"]) for u in uploads] == [
        (body["upload_id"], "admin", gallery["id"])]
    assert temp_files(settings) == []


async def test_duplicates_are_listed_not_stored_twice(admin: AuthActions, services: Any, settings: Any) -> None:
    gallery = await admin.create_gallery()
    data = jpeg(1)  # the factory's grain is random: keep one copy of the bytes
    first = await (await admin_upload(admin, gallery["id"], [("a.jpg", data), ("a-copy.jpg", data)])).get_json()
    # The same bytes twice in one request: one photo, the second listed as its duplicate.
    assert [(p["id"], p["duplicate"]) for p in first["photos"]] == [(first["photo_ids"][0], False),
                                                                    (first["photo_ids"][0], True)]
    again = await admin_upload(admin, gallery["id"], [("renamed.jpg", data)])
    assert again.status_code == 202
    body = await again.get_json()
    # Only duplicates: accepted, nothing new to follow, so no upload group and no upload_id.
    assert body["upload_id"] is None and body["count"] == 1
    assert body["photos"] == [{"id": first["photo_ids"][0], "filename": "renamed.jpg",
                               "size": len(data), "duplicate": True}]
    assert len(originals(settings)) == 1
    assert len(await rows(services, "SELECT id FROM uploads")) == 1
    # Another gallery is another gallery.
    other = await admin.create_gallery(name="Other")
    assert (await (await admin_upload(admin, other["id"], [("a.jpg", data)])).get_json())["photos"][0][
        "duplicate"] is False
    assert temp_files(settings) == []


async def test_bad_files_are_refused_one_by_one(admin: AuthActions, services: Any, settings: Any) -> None:
    gallery = await admin.create_gallery()
    sent = [("good.jpg", jpeg(3)), ("empty.jpg", b""), ("page.jpg", b"<!doctype html><html>hi</html>"),
            ("tiny.png", tiny_png()), ("noise.jpg", bytes(range(256)) * 4), ("good.png", png())]
    response = await admin_upload(admin, gallery["id"], sent)
    assert response.status_code == 202
    body = await response.get_json()
    assert [p["filename"] for p in body["photos"]] == ["good.jpg", "good.png"]
    errors = {e["filename"]: e["error"] for e in body["errors"]}
    assert list(errors) == ["empty.jpg", "page.jpg", "tiny.png", "noise.jpg"]
    assert errors["page.jpg"] == errors["noise.jpg"] == images.UNSUPPORTED
    assert "empty" in errors["empty.jpg"] and "too small (8x8)" in errors["tiny.png"]
    assert len(originals(settings)) == 2 and temp_files(settings) == []


@pytest.mark.parametrize(("sent", "status"), [
    ([("a.jpg", b"<svg xmlns='http://www.w3.org/2000/svg'/>"), ("b.gif", b"GIF89a" + bytes(40))], 415),
    ([("a.jpg", b""), ("b.png", tiny_png())], 400),
])
async def test_nothing_accepted_gets_no_upload_id(admin: AuthActions, services: Any, settings: Any,
                                                  sent: list[tuple[str, bytes]], status: int) -> None:
    gallery = await admin.create_gallery()
    response = await admin_upload(admin, gallery["id"], sent)
    assert response.status_code == status
    body = await response.get_json()
    assert "upload_id" not in body and [e["filename"] for e in body["errors"]] == [n for n, _ in sent]
    assert await rows(services, "SELECT id FROM uploads") == []
    assert originals(settings) == [] and temp_files(settings) == []


async def test_no_files_and_not_multipart(admin: AuthActions) -> None:
    gallery = await admin.create_gallery()
    url = f"/api/admin/galleries/{gallery['id']}/upload"
    assert (await admin_upload(admin, gallery["id"], [], fields=[("x", "y")])).status_code == 400
    as_json = await admin.client.post(url, json={"photos": []}, headers=admin.headers())
    assert as_json.status_code == 415
    cut_off, headers = multipart([("a.jpg", jpeg())])
    response = await admin.client.post(url, data=cut_off[:-60], headers={**headers, **admin.headers()})
    assert response.status_code == 400 and "cut off" in (await response.get_json())["error"]


async def test_too_many_files_saves_nothing(admin: AuthActions, services: Any, settings: Any) -> None:
    gallery = await admin.create_gallery()
    response = await admin_upload(admin, gallery["id"], [(f"{i}.jpg", jpeg(i)) for i in range(7)])
    assert response.status_code == 413 and response.headers["Connection"] == "close"
    assert "at most 6" in (await response.get_json())["error"]
    assert await rows(services, "SELECT id FROM photos") == []
    assert originals(settings) == [] and temp_files(settings) == []


async def test_admin_needs_csrf_header_or_token(client: Any, admin: AuthActions, services: Any) -> None:
    gallery = await admin.create_gallery()
    body, headers = multipart([("a.jpg", jpeg())], fields=[("csrf_token", admin.csrf or "")])
    url = f"/api/admin/galleries/{gallery['id']}/upload"
    assert (await client.post(url, data=body, headers=headers)).status_code == 403
    value = await services.db.write(bootstrap.create_api_token, "ci", time.time())
    with_token = await client.post(url, data=body, headers={**headers, "Authorization": f"Bearer {value}"})
    assert with_token.status_code == 202
    assert (await admin.client.post("/api/admin/galleries/999/upload", data=body,
                                    headers={**headers, **admin.headers()})).status_code == 404


async def test_photo_cap(admin: AuthActions, services: Any, settings: Any) -> None:
    gallery = await admin.create_gallery(photo_cap=2)
    response = await admin_upload(admin, gallery["id"], [(f"{i}.jpg", jpeg(i)) for i in range(3)])
    body = await response.get_json()
    assert response.status_code == 202 and body["count"] == 2
    assert body["errors"] == [{"filename": "2.jpg", "error": "The gallery is full: it holds at most 2 photos."}]
    full = await admin_upload(admin, gallery["id"], [("9.jpg", jpeg(9))])
    assert full.status_code == 409 and full.headers["Connection"] == "close"
    assert len(originals(settings)) == 2 and temp_files(settings) == []


def test_clean_filename() -> None:
    assert clean_filename("../../etc/passwd") == "passwd"
    assert clean_filename("..\\..\\windows\\system32\\cmd.exe") == "cmd.exe"
    assert clean_filename("..") == "photo" and clean_filename("") == "photo" and clean_filename("/") == "photo"
    assert clean_filename("a\x00b.jpg") == "ab.jpg"
    assert clean_filename("evil\u202egpj.exe") == "evilgpj.exe"
    assert clean_filename("\u2066x\u2069\u200e\u200f\u061c.png") == "x.png"
    assert clean_filename("line\r\nbreak\t.jpg") == "linebreak.jpg"
    assert clean_filename("...hidden.jpg") == "hidden.jpg"
    assert clean_filename("CON") == "CON"
    assert clean_filename("Cafe\u0301.jpg") == "Café.jpg"  # NFC, as macOS names arrive decomposed
    long = clean_filename("é" * 300 + ".jpeg")
    assert long.endswith(".jpeg") and len(long.encode()) <= 255 and long.startswith("é")
    assert len(clean_filename("x" * 300).encode()) == 255
    assert clean_guest_name("  Anna\u202e \n  Maria\x00 ") == "Anna Maria"
    assert clean_guest_name("z" * 150) == "z" * 100 and clean_guest_name(" \t") is None


async def test_display_name_cleaned_through_the_route(admin: AuthActions, services: Any) -> None:
    gallery = await admin.create_gallery()
    response = await admin_upload(admin, gallery["id"], [("../../etc/\u202epasswd.jpg", jpeg())])
    assert (await response.get_json())["photos"][0]["filename"] == "passwd.jpg"
    assert [r["display_name"] for r in await rows(services, "SELECT display_name FROM photos")] == ["passwd.jpg"]


async def test_guest_upload_rules(admin: AuthActions, guest: Any, services: Any, settings: Any) -> None:
    open_ = await published(admin, name="Open", allow_guest_uploads=True)
    closed = await published(admin, name="No uploads")
    draft = await admin.create_gallery(name="Draft", allow_guest_uploads=True)
    private = await published(admin, name="Private", password="letmein", allow_guest_uploads=True)
    body, headers = multipart([("a.jpg", jpeg())])
    assert (await guest.post(f"/api/g/{open_['slug']}/upload", data=body, headers=headers)).status_code == 403
    csrf = await start_guest_session(services, guest)
    with_csrf = {**headers, "X-CSRF-Token": csrf}

    async def status(slug: str, request_headers: dict[str, str] = with_csrf, data: bytes = body) -> int:
        return (await guest.post(f"/api/g/{slug}/upload", data=data, headers=request_headers)).status_code

    assert await status(open_["slug"], headers) == 403  # a session, but no token
    assert await status(open_["slug"], {**headers, "X-CSRF-Token": "wrong"}) == 403
    late, _ = multipart([("a.jpg", jpeg())], fields=[("csrf_token", csrf)], fields_last=True)
    assert await status(open_["slug"], headers, late) == 403  # the form field must come before the files
    assert await status(draft["slug"]) == 404
    assert await status(private["slug"]) == 401
    assert await status(closed["slug"]) == 403
    assert await status("no-such-gallery") == 404
    assert await rows(services, "SELECT id FROM photos") == [] and temp_files(settings) == []


async def test_guest_upload_recorded_as_guest(admin: AuthActions, guest: Any, services: Any) -> None:
    gallery = await published(admin, name="Party", allow_guest_uploads=True)
    csrf = await start_guest_session(services, guest)
    # A no-JS form: the hidden csrf_token input first, then the name, then the files.
    body, headers = multipart([("me.jpg", jpeg(5)), ("us.png", png())],
                              fields=[("csrf_token", csrf), ("guest_name", " Tante\u202e Erna\r\n")])
    response = await guest.post(f"/api/g/{gallery['slug']}/upload", data=body, headers=headers)
    assert response.status_code == 202, await response.get_data(as_text=True)
    upload_id = (await response.get_json())["upload_id"]
    photos = await rows(services, "SELECT uploaded_by, guest_name, status FROM photos")
    assert photos == [{"uploaded_by": "guest", "guest_name": "Tante Erna", "status": "pending"}] * 2
    [upload] = await rows(services, "SELECT * FROM uploads WHERE id = ?", upload_id)
    assert (upload["uploaded_by"], upload["guest_name"]) == ("guest", "Tante Erna")
    assert upload["guest_session_id"] is not None


async def test_guest_with_password_access(admin: AuthActions, guest: Any, services: Any) -> None:
    gallery = await published(admin, name="Private", password="letmein", allow_guest_uploads=True)
    page = await guest.get(f"/g/{gallery['slug']}")  # starts the guest session, shows the password form
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', await page.get_data(as_text=True)).group(1)
    await guest.post(f"/g/{gallery['slug']}/password", form={"password": "letmein", "csrf_token": csrf})
    body, headers = multipart([("a.jpg", jpeg())])
    response = await guest.post(f"/api/g/{gallery['slug']}/upload", data=body,
                                headers={**headers, "X-CSRF-Token": csrf})
    assert response.status_code == 202


async def test_guest_file_over_the_limit(admin: AuthActions, guest: Any, services: Any, settings: Any) -> None:
    gallery = await published(admin, name="Party", allow_guest_uploads=True)
    csrf = await start_guest_session(services, guest)
    big = jpeg() + bytes(GUEST_FILE_MB * 1024 * 1024)
    url = f"/api/g/{gallery['slug']}/upload"
    body, headers = multipart([("big.jpg", big)])
    alone = await guest.post(url, data=body, headers={**headers, "X-CSRF-Token": csrf})
    assert alone.status_code == 413 and alone.headers["Connection"] == "close"
    assert (await alone.get_json())["errors"] == [
        {"filename": "big.jpg", "error": f"The file is larger than the limit of {GUEST_FILE_MB} MB."}]
    body, headers = multipart([("small.jpg", jpeg()), ("big.jpg", big)])
    mixed = await guest.post(url, data=body, headers={**headers, "X-CSRF-Token": csrf})
    assert mixed.status_code == 202 and [p["filename"] for p in (await mixed.get_json())["photos"]] == ["small.jpg"]
    assert len(originals(settings)) == 1 and temp_files(settings) == []
    assert await rows(services, "SELECT count(*) AS n FROM uploads") == [{"n": 1}]


async def test_an_upload_asks_for_a_memory_trim(admin: AuthActions, services: Any) -> None:
    gallery = await admin.create_gallery()
    assert not services.trimmer.due
    response = await admin_upload(admin, gallery["id"], [("a.jpg", jpeg())])
    assert response.status_code == 202 and services.trimmer.due  # see memory.py


@contextlib.asynccontextmanager
async def admin_on(tmp_path: Path, data_dir: Path) -> AsyncIterator[tuple[AuthActions, Services]]:
    """The real app over a data directory of the test's choosing (here: on a small tmpfs), admin logged in."""
    settings = make_settings(tmp_path, data_dir=str(data_dir))
    bootstrap.prepare(settings)
    bootstrap.ensure_admin(settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
    database = Database(settings.database)
    svc = Services(settings=settings, db=database)
    try:
        admin = AuthActions(create_app(svc).test_client())
        assert (await admin.login()).status_code == 302
        yield admin, svc
    finally:
        database.close()


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


async def test_disk_full_mid_file_is_507_and_leaves_nothing(tmp_path: Path) -> None:
    """The disk fills while a file is being written: the first batches fit, a later one does not. The answer is
    507 and the partial temp file is gone. (A real 8 MB tmpfs, filled up to 3 MB above the reserve.)"""
    with tmpfs(tmp_path / "disk", 8, why="the in-process disk-full test") as disk:
        async with admin_on(tmp_path, disk / "data") as (admin, svc):
            gallery = await admin.create_gallery()
            svc.storage.create_dirs()
            stat = os.statvfs(disk)
            reserve = min(RESERVE_MAX_BYTES, int(stat.f_blocks * stat.f_frsize * RESERVE_SHARE))
            with open(disk / "filler", "wb") as filler:
                filler.write(bytes(free_bytes(disk) - reserve - (3 << 20)))
            big = jpeg() + bytes(5 << 20)  # several write batches: the first ones fit, then the disk is full
            assert intake.WRITE_BATCH * 2 < free_bytes(disk) - reserve < len(big)
            response = await admin_upload(admin, gallery["id"], [("a.jpg", big)])
            assert response.status_code == 507 and "disk is full" in (await response.get_json())["error"]
            assert temp_files(svc.settings) == [] and originals(svc.settings) == []


async def test_no_room_for_a_new_file_is_507_and_leaves_nothing(tmp_path: Path) -> None:
    """The kernel itself says ENOSPC (no inode left for the temp file, though bytes are free): 507 too."""
    with tmpfs(tmp_path / "disk", 8, inodes=64, why="the in-process disk-full test") as disk:
        async with admin_on(tmp_path, disk / "data") as (admin, svc):
            gallery = await admin.create_gallery()
            svc.storage.create_dirs()
            (disk / "fill").mkdir()
            for n in range(10_000):
                try:
                    (disk / "fill" / str(n)).touch()
                except OSError as error:
                    assert error.errno == errno.ENOSPC
                    break
            response = await admin_upload(admin, gallery["id"], [("a.jpg", jpeg())])
            assert response.status_code == 507 and "disk is full" in (await response.get_json())["error"]
            assert temp_files(svc.settings) == [] and originals(svc.settings) == []


# The real server --------------------------------------------------------------------------------------------


async def wait_for(condition: Any) -> None:
    """Poll the file system (it has no event to wait on) until ``condition()`` holds."""
    while not condition():  # nothing to wait on but the directory itself
        await trio.sleep(0.01)


async def read_response(stream: trio.SocketStream) -> tuple[bytes, bytes]:
    """One HTTP/1.1 response with a Content-Length, read off a raw connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some()
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head).group(1))
    while len(body) < length:
        body += await stream.receive_some()
    return head, body


async def _serve(settings: Any, nursery: trio.Nursery) -> tuple[Any, str]:
    bootstrap.prepare(settings)
    bootstrap.ensure_admin(settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
    conn = db.connect(settings.database)
    with db.transaction(conn):
        value = bootstrap.create_api_token(conn, "test", time.time())
        gallery_row(conn, "G", slug="g", share_token="share")
    conn.close()
    running = await nursery.start(server.run, settings)
    return running, value


async def test_real_server_413_closes_and_the_next_request_is_answered(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, admin_max_file_mb=1, admin_max_files=2, shutdown_grace_seconds=1)
    async with trio.open_nursery() as nursery:
        running, token = await _serve(settings, nursery)
        auth = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=running.url, headers=auth, timeout=120) as http:
            body, headers = multipart([("big.jpg", jpeg() + bytes(1024 * 1024))])
            too_big = await http.post("/api/admin/galleries/1/upload", content=body, headers=headers)
            assert too_big.status_code == 413 and too_big.headers["connection"] == "close"
            body, headers = multipart([(f"{i}.jpg", jpeg()) for i in range(3)])
            too_many = await http.post("/api/admin/galleries/1/upload", content=body, headers=headers)
            assert too_many.status_code == 413 and too_many.headers["connection"] == "close"
            # Checked now: once ok.jpg is queued, the workers write their own temp files there.
            assert temp_files(settings) == [] and originals(settings) == []
            body, headers = multipart([("ok.jpg", jpeg())])
            ok = await http.post("/api/admin/galleries/1/upload", content=body, headers=headers)
            assert ok.status_code == 202

        # Refused from the headers alone: the answer comes before any of the body is sent.
        host, port = running.url.removeprefix("http://").rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(
            f"POST /api/admin/galleries/1/upload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {10 ** 10}\r\n\r\n"
            .encode())
        with trio.fail_after(60):
            head, body = await read_response(stream)
        await stream.aclose()
        assert head.startswith(b"HTTP/1.1 413") and b"\r\nconnection: close" in head.lower()
        assert b"larger than the server accepts" in body
        async with httpx.AsyncClient(base_url=running.url, timeout=120) as http:
            assert (await http.get("/healthz")).status_code == 200
        running.stop()


async def test_real_server_client_gone_mid_upload_leaves_no_temp_file(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, shutdown_grace_seconds=1)
    async with trio.open_nursery() as nursery:
        running, token = await _serve(settings, nursery)
        body, _ = multipart([("a.jpg", jpeg()), ("b.jpg", jpeg(1) + bytes(3 * 1024 * 1024))])
        host, port = running.url.removeprefix("http://").rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(
            f"POST /api/admin/galleries/1/upload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {len(body)}\r\n\r\n"
            .encode() + body[: len(body) // 2])
        tmp = settings.data_path / "tmp"
        # The server is receiving: a temp file exists (or a.jpg is already stored).
        with trio.fail_after(60):
            await wait_for(lambda: bool(temp_files(settings) or originals(settings)))
        await stream.aclose()
        with trio.fail_after(60):
            await wait_for(lambda: not (temp_files(settings) or originals(settings)))
        assert list(tmp.iterdir()) == [] and originals(settings) == []
        async with httpx.AsyncClient(base_url=running.url, timeout=120) as http:
            assert (await http.get("/healthz")).status_code == 200
        running.stop()


class _Clock:
    """A monotonic clock the test moves by hand, for the app's guest upload budgets (``WebLimits``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _small_budgets(db: Any, clock: _Clock, **budgets: tuple[float, float]) -> ratelimit.GuestUploadLimits:
    """The app's guest upload budgets with some of its buckets made small: (burst, refill per second) by the
    bucket's name. The buckets are the limits object's public parts; no module constant is patched."""
    limits = ratelimit.GuestUploadLimits(db, clock)
    for name, (burst, per_second) in budgets.items():
        setattr(limits, name, ratelimit.RateLimit(name, burst, per_second, db=db, clock=clock,
                                                  message=ratelimit.UPLOAD_SLOW_DOWN))
    return limits


async def _guest_upload(guest: Any, slug: str, csrf: str, files: list[tuple[str, bytes]]) -> Any:
    body, headers = multipart(files)
    return await guest.post(f"/api/g/{slug}/upload", data=body, headers={**headers, "X-CSRF-Token": csrf})


async def test_guest_uploads_are_limited_per_session_and_per_ip(app: Any, admin: AuthActions, guest: Any,
                                                                services: Any, settings: Any) -> None:
    clock = _Clock()
    app.extensions["picpeak_limits"].guest_upload_limits = _small_budgets(services.db, clock,
                                                                          per_session=(3, 0.01),
                                                                          per_ip=(4, 0.01))
    gallery = await published(admin, name="Party", allow_guest_uploads=True)
    csrf = await start_guest_session(services, guest)
    for i in range(3):
        assert (await _guest_upload(guest, gallery["slug"], csrf, [(f"{i}.jpg", jpeg(i))])).status_code == 202
    refused = await _guest_upload(guest, gallery["slug"], csrf, [("3.jpg", jpeg(3))])
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "100" and refused.headers["Connection"] == "close"
    assert "faster than this server accepts" in (await refused.get_json())["error"]
    assert len(await rows(services, "SELECT id FROM photos")) == 3 and temp_files(settings) == []
    # Another browser on the same address has its own session budget but shares the address's: one more.
    other = app.test_client()
    other_csrf = await start_guest_session(services, other)
    assert (await _guest_upload(other, gallery["slug"], other_csrf, [("4.jpg", jpeg(4))])).status_code == 202
    assert (await _guest_upload(other, gallery["slug"], other_csrf, [("5.jpg", jpeg(5))])).status_code == 429
    # The budgets refill with time.
    clock.now += 100
    assert (await _guest_upload(guest, gallery["slug"], csrf, [("3.jpg", jpeg(3))])).status_code == 202
    # Admin uploads are not the guests' budget.
    assert (await admin_upload(admin, gallery["id"], [("6.jpg", jpeg(6))])).status_code == 202


async def test_guest_uploads_have_a_byte_budget(app: Any, admin: AuthActions, guest: Any, services: Any) -> None:
    clock = _Clock()
    app.extensions["picpeak_limits"].guest_upload_limits = _small_budgets(services.db, clock,
                                                                          bytes_per_session=(10_000, 100.0))
    gallery = await published(admin, name="Party", allow_guest_uploads=True)
    csrf = await start_guest_session(services, guest)
    big = imagefactory.save(imagefactory.photo(200, 150, seed=1), "png")  # noisy pixels: tens of KB
    assert len(big) > 20_000
    assert (await _guest_upload(guest, gallery["slug"], csrf, [("big.png", big)])).status_code == 202
    # Charged after the fact: the budget is now in debt by len(big) - 10_000 bytes, refilled at 100 a second.
    refused = await _guest_upload(guest, gallery["slug"], csrf, [("small.jpg", jpeg(2))])
    assert refused.status_code == 429
    wait = int(refused.headers["Retry-After"])
    assert wait == -(-(len(big) - 10_000 + 1) // 100)
    clock.now += wait - 1
    assert (await _guest_upload(guest, gallery["slug"], csrf, [("small.jpg", jpeg(2))])).status_code == 429
    clock.now += 1
    assert (await _guest_upload(guest, gallery["slug"], csrf, [("small.jpg", jpeg(2))])).status_code == 202
