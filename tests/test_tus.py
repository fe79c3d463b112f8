"""Resumable uploads (tus 1.0.0, issue 14): a real hypercorn on port 0, raw HTTP for every rule of the protocol,
and a real third-party client (tuspy) for uploads to both routes, a resume after a cut connection, and a resume
after the server was killed with -9 and restarted.

Protocol rules checked here: OPTIONS capabilities; 412 without Tus-Resumable; creation (201, Location,
Upload-Expires, Upload-Metadata) and creation-with-upload; HEAD (Upload-Offset, Upload-Length, no-store);
PATCH (204, 415 on a wrong Content-Type, 409 on an offset mismatch, 413 past Upload-Length); 404 for an unknown
upload and for someone else's; termination; checksum (sha1 and sha256, 460 and the chunk discarded, 400 for an
algorithm we do not offer); expiry (the janitor, with trio's autojump clock: idle for tus_idle_minutes or a day
after creation, 410, bytes gone, a tombstone without metadata). Reservations (issue 27): Upload-Metadata capped;
guests' unfinished announced bytes capped per client address (across sessions) and per gallery, never the admin's.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import re
import time
from collections.abc import AsyncIterator
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
import trio
from tusclient import client as tus_client

from picpeak_lite.pipeline import resumable
from picpeak_lite.pipeline.intake import WRITE_BATCH
from picpeak_lite.pipeline.janitor import Janitor
from picpeak_lite.services import Services
from picpeak_lite.store.db import Database
from picpeak_lite.web.app import create_app

from .conftest import make_settings
from .factories import photo_jpeg, run_pool_until_idle
from .harness import ServerProcess, figures, query, write_config
from .served import CSRF_META, Served, prepare, serve
from .videofactory import make_clip

TUS = {"Tus-Resumable": "1.0.0"}
OCTETS = {**TUS, "Content-Type": "application/offset+octet-stream"}
GUEST_FILE_MB = 2
MB = 1024 * 1024


def meta(**values: str) -> str:
    return ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" for k, v in values.items())


def big_jpeg(seed: int, extra: int = 0) -> bytes:
    """A real JPEG of some hundreds of KB (several chunks), optionally padded after its end (still a JPEG).
    Not the same bytes on each call (the factory adds noise): call it once per file."""
    return photo_jpeg(seed, size=(1200, 900), quality=95) + bytes(extra)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(tmp_path, guest_max_file_mb=GUEST_FILE_MB, guest_max_files=3) as running:
        yield running


async def create(http: httpx.AsyncClient, url: str, length: int, **metadata: str) -> str:
    answer = await http.post(url, headers={**TUS, "Upload-Length": str(length),
                                           "Upload-Metadata": meta(**metadata)})
    assert answer.status_code == 201, answer.text
    return answer.headers["location"]


async def patch(http: httpx.AsyncClient, location: str, offset: int, data: bytes, **headers: str) -> httpx.Response:
    return await http.patch(location, content=data, headers={**OCTETS, "Upload-Offset": str(offset), **headers})


def sql(svc: Services, statement: str, *args: Any) -> list[dict[str, Any]]:
    return query(svc.settings.data_path, statement, *args)


def partial_file(svc: Services, location: str) -> Path:
    return resumable.partial_path(svc.storage, location.rsplit("/", 1)[1])


# --- capabilities and the protocol header ---------------------------------------------------------------------

async def test_options_tells_the_capabilities_without_a_login(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url, timeout=120) as http:
        # A guest's largest file is a video (guest_max_video_mb); a photo is held to its own limit once its first
        # bytes show it is one (test_a_guest_video_over_the_photo_limit_...).
        for url, max_size in ((served.admin_tus, 2048 * 1024 * 1024), (served.guest_tus, 500 * 1024 * 1024)):
            answer = await http.options(url)
            assert answer.status_code == 204
            assert answer.headers["tus-resumable"] == "1.0.0"
            assert answer.headers["tus-version"] == "1.0.0"
            assert set(answer.headers["tus-extension"].split(",")) == {
                "creation", "creation-with-upload", "termination", "expiration", "checksum"}
            assert answer.headers["tus-max-size"] == str(max_size)
            assert answer.headers["tus-checksum-algorithm"] == "sha1,sha256"


async def test_requests_without_tus_resumable_are_412_with_the_version(served: Served) -> None:
    async with served.admin() as http:
        answer = await http.post(served.admin_tus, headers={"Upload-Length": "10"})
        assert answer.status_code == 412
        assert answer.headers["tus-version"] == "1.0.0" and answer.headers["tus-resumable"] == "1.0.0"
        location = await create(http, served.admin_tus, 10)
        assert (await http.head(location)).status_code == 412
        answer = await http.patch(location, content=b"x", headers={"Content-Type": "application/offset+octet-stream",
                                                                   "Upload-Offset": "0"})
        assert answer.status_code == 412


async def test_x_http_method_override_is_honoured_and_405s_say_tus(served: Served) -> None:
    """Issue 28: the tus spec says a server MUST take X-HTTP-Method-Override as the method (clients behind
    proxies that block PATCH send POST with it), and every answer carries Tus-Resumable, a 405 included."""
    data = big_jpeg(15)
    async with served.admin() as http:
        location = await create(http, served.admin_tus, len(data), filename="override.jpg")
        half = len(data) // 2
        first = await http.post(location, content=data[:half], headers={
            **OCTETS, "Upload-Offset": "0", "X-HTTP-Method-Override": "PATCH"})
        assert first.status_code == 204 and first.headers["upload-offset"] == str(half)
        head = await http.post(location, headers={**TUS, "X-HTTP-Method-Override": "HEAD"})
        assert head.status_code == 200 and head.headers["upload-offset"] == str(half)
        last = await http.post(location, content=data[half:], headers={
            **OCTETS, "Upload-Offset": str(half), "X-HTTP-Method-Override": "patch"})
        assert last.status_code == 204 and last.headers["picpeak-photo-id"]
        other = await create(http, served.admin_tus, 100)
        gone = await http.post(other, headers={**TUS, "X-HTTP-Method-Override": "DELETE"})
        assert gone.status_code == 204 and (await http.head(other, headers=TUS)).status_code == 404
        # Methods a tus URL does not take: 405 with Allow, Tus-Resumable and a sentence.
        for method, url, allow in (("POST", location, "HEAD, PATCH, DELETE"), ("GET", location, "HEAD, PATCH, DELETE"),
                                   ("PUT", served.admin_tus, "OPTIONS, POST"),
                                   ("DELETE", served.admin_tus, "OPTIONS, POST")):
            refused = await http.request(method, url, headers=TUS)
            assert refused.status_code == 405, (method, url, refused.status_code)
            assert refused.headers["tus-resumable"] == "1.0.0" and refused.headers["allow"] == allow
            assert "This tus URL takes" in refused.json()["error"]
        options = await http.options(location)
        assert options.status_code == 204 and options.headers["tus-version"] == "1.0.0"
    # A guest's override is a state change like a PATCH: it needs the CSRF token.
    async with served.guest() as (guest, _csrf):
        mine = await create(guest, served.guest_tus, 100)
        no_token = await guest.post(mine, content=b"x", headers={
            **OCTETS, "Upload-Offset": "0", "X-HTTP-Method-Override": "PATCH", "X-CSRF-Token": ""})
        assert no_token.status_code == 403
        taken = await guest.post(mine, content=b"x" * 10, headers={
            **OCTETS, "Upload-Offset": "0", "X-HTTP-Method-Override": "PATCH"})
        assert taken.status_code == 204 and taken.headers["upload-offset"] == "10"


# --- creation -------------------------------------------------------------------------------------------------

async def test_creation_answers_201_with_location_expiry_and_head_tells_the_state(served: Served) -> None:
    async with served.admin() as http:
        answer = await http.post(served.admin_tus, headers={
            **TUS, "Upload-Length": "1234", "Upload-Metadata": meta(filename="a.jpg", filetype="image/jpeg")})
        assert answer.status_code == 201
        location = answer.headers["location"]
        assert re.fullmatch(r"/api/admin/galleries/1/tus/[0-9a-f]{32}", location)
        expires = answer.headers["upload-expires"]
        assert expires.endswith(" GMT")
        head = await http.head(location, headers=TUS)
        assert head.status_code == 200
        assert head.headers["upload-offset"] == "0" and head.headers["upload-length"] == "1234"
        assert head.headers["cache-control"] == "no-store"
        assert head.headers["upload-metadata"] == meta(filename="a.jpg", filetype="image/jpeg")
        assert head.headers["upload-expires"] == expires
        assert partial_file(served.services, location).exists()


@pytest.mark.parametrize(("headers", "status", "words"), [
    ({}, 400, "Upload-Length header is missing"),
    ({"Upload-Length": "-5"}, 400, "non-negative integer"),
    ({"Upload-Length": "0"}, 400, "empty"),
    ({"Upload-Defer-Length": "1"}, 400, "not supported"),
    # Not advertised (issue 28): refused at creation, not left to fail after every part was sent.
    ({"Upload-Length": "10", "Upload-Concat": "partial"}, 400, "Upload-Concat (tus concatenation) is not supported"),
    ({"Upload-Concat": "final;/api/admin/galleries/1/tus/a /api/admin/galleries/1/tus/b"}, 400, "Upload-Concat"),
    ({"Upload-Length": str(3000 * 1024 * 1024)}, 413, "larger than the limit"),
    ({"Upload-Length": "10", "Upload-Metadata": "filename not-base64!"}, 400, "not valid base64"),
    ({"Upload-Length": "10", "Upload-Metadata": "a b c"}, 400, "pairs"),
    ({"Upload-Length": "10", "Upload-Metadata": meta(upload_group="no spaces please")}, 400, "upload_group"),
])
async def test_creation_refusals(served: Served, headers: dict[str, str], status: int, words: str) -> None:
    async with served.admin() as http:
        answer = await http.post(served.admin_tus, headers={**TUS, **headers})
        assert answer.status_code == status
        assert words in answer.json()["error"] and answer.headers["tus-resumable"] == "1.0.0"
    assert sql(served.services, "SELECT count(*) AS n FROM tus_uploads")[0]["n"] == 0


async def test_creation_for_a_missing_gallery_is_404(served: Served) -> None:
    async with served.admin() as http:
        answer = await http.post("/api/admin/galleries/77/tus", headers={**TUS, "Upload-Length": "10"})
        assert answer.status_code == 404


# --- core: HEAD and PATCH ---------------------------------------------------------------------------------------

async def test_chunks_then_the_photo(served: Served) -> None:
    data = big_jpeg(1)
    async with served.admin() as http:
        location = await create(http, served.admin_tus, len(data), filename="wedding.jpg", filetype="image/jpeg")
        cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
        for start, end in itertools.pairwise(cut):
            answer = await patch(http, location, start, data[start:end])
            assert answer.status_code == 204, answer.text
            assert answer.headers["upload-offset"] == str(end)
            assert answer.headers["tus-resumable"] == "1.0.0"
            if end < len(data):
                assert "picpeak-photo-id" not in answer.headers and "upload-expires" in answer.headers
                assert (await http.head(location, headers=TUS)).headers["upload-offset"] == str(end)
        photo_id = int(answer.headers["picpeak-photo-id"])
        upload_id = answer.headers["picpeak-upload-id"]
        assert answer.headers["picpeak-duplicate"] == "false"
        # A HEAD afterwards tells the same: a client that lost that answer can still learn its photo.
        head = await http.head(location, headers=TUS)
        assert head.headers["upload-offset"] == str(len(data))
        assert head.headers["picpeak-photo-id"] == str(photo_id) and head.headers["picpeak-upload-id"] == upload_id
        # The last PATCH sent again (its answer lost): the same answer, nothing twice.
        again = await patch(http, location, len(data), b"")
        assert again.status_code == 204 and again.headers["picpeak-photo-id"] == str(photo_id)
        await run_pool_until_idle(served.services)
        status = (await http.get(f"/api/admin/uploads/{upload_id}")).json()
        assert status["photos"][0]["id"] == photo_id and status["photos"][0]["status"] == "complete"
    row = sql(served.services, "SELECT * FROM photos WHERE id = ?", photo_id)[0]
    assert row["display_name"] == "wedding.jpg" and row["sha256"] == hashlib.sha256(data).hexdigest()
    assert served.services.storage.original_path(row["storage_key"]).read_bytes() == data
    assert not partial_file(served.services, location).exists()
    assert sql(served.services, "SELECT completed_at FROM uploads WHERE id = ?", upload_id)[0]["completed_at"]


async def test_patch_rules(served: Served) -> None:
    data = big_jpeg(2)
    async with served.admin() as http:
        location = await create(http, served.admin_tus, len(data))
        wrong_type = await http.patch(location, content=data[:10], headers={
            **TUS, "Content-Type": "application/octet-stream", "Upload-Offset": "0"})
        assert wrong_type.status_code == 415
        no_offset = await http.patch(location, content=data[:10], headers=OCTETS)
        assert no_offset.status_code == 400
        assert (await patch(http, location, 0, data[:1000])).status_code == 204
        mismatch = await patch(http, location, 500, data[500:2000])
        assert mismatch.status_code == 409 and mismatch.headers["upload-offset"] == "1000"
        past = await patch(http, location, 1000, data[1000:] + b"more than announced")
        assert past.status_code == 413
        assert (await http.head(location, headers=TUS)).headers["upload-offset"] == "1000"
        assert partial_file(served.services, location).stat().st_size == 1000
        unknown = location[:-32] + "0" * 32
        assert (await http.head(unknown, headers=TUS)).status_code == 404
        assert (await patch(http, unknown, 0, b"x")).status_code == 404
        assert (await http.head(location[:-32] + "not-an-id", headers=TUS)).status_code == 404
        # The same upload under another gallery's URL is unknown there.
        assert (await http.head(location.replace("/galleries/1/", "/galleries/2/"), headers=TUS)).status_code == 404


async def test_creation_with_upload(served: Served) -> None:
    data = big_jpeg(3)
    async with served.admin() as http:
        answer = await http.post(served.admin_tus, content=data[:5000], headers={
            **OCTETS, "Upload-Length": str(len(data)), "Upload-Metadata": meta(filename="c.jpg")})
        assert answer.status_code == 201 and answer.headers["upload-offset"] == "5000"
        other = big_jpeg(4)
        whole = await http.post(served.admin_tus, content=other, headers={
            **OCTETS, "Upload-Length": str(len(other)), "Upload-Metadata": meta(filename="d.jpg")})
        assert whole.status_code == 201 and whole.headers["picpeak-photo-id"]
        rest = await patch(http, answer.headers["location"], 5000, data[5000:])
        assert rest.status_code == 204 and rest.headers["picpeak-photo-id"]


# --- checksum ---------------------------------------------------------------------------------------------------

async def test_checksums(served: Served) -> None:
    data = big_jpeg(5)
    half = len(data) // 2

    def digest(name: str, chunk: bytes) -> str:
        return f"{name} {base64.b64encode(hashlib.new(name, chunk).digest()).decode()}"

    async with served.admin() as http:
        location = await create(http, served.admin_tus, len(data))
        good = await patch(http, location, 0, data[:half], **{"Upload-Checksum": digest("sha1", data[:half])})
        assert good.status_code == 204 and good.headers["upload-offset"] == str(half)
        bad = await patch(http, location, half, data[half:], **{"Upload-Checksum": digest("sha256", b"other")})
        assert bad.status_code == 460
        assert (await http.head(location, headers=TUS)).headers["upload-offset"] == str(half)
        assert partial_file(served.services, location).stat().st_size == half  # the chunk was discarded
        md5 = await patch(http, location, half, data[half:], **{"Upload-Checksum": "md5 AAAA"})
        assert md5.status_code == 400
        done = await patch(http, location, half, data[half:], **{"Upload-Checksum": digest("sha256", data[half:])})
        assert done.status_code == 204 and done.headers["picpeak-photo-id"]


# --- termination --------------------------------------------------------------------------------------------------

async def test_termination(served: Served) -> None:
    async with served.admin() as http:
        location = await create(http, served.admin_tus, 5000)
        assert (await patch(http, location, 0, b"\xff" * 100)).status_code == 204
        answer = await http.delete(location, headers=TUS)
        assert answer.status_code == 204 and answer.headers["tus-resumable"] == "1.0.0"
        assert (await http.head(location, headers=TUS)).status_code == 404
        assert (await patch(http, location, 100, b"x")).status_code == 404
    assert not partial_file(served.services, location).exists()
    # The group it had opened had no photo: it is gone too.
    assert sql(served.services, "SELECT count(*) AS n FROM uploads")[0]["n"] == 0


# --- the intake: the same checks as multipart ----------------------------------------------------------------------

async def test_duplicates_refusals_and_groups(served: Served) -> None:
    first, second = big_jpeg(6), big_jpeg(7)
    async with served.admin() as http:
        # One batch: the two files join one group, which completes only once both have arrived.
        a = await create(http, served.admin_tus, len(first), filename="a.jpg", upload_group="batch-1")
        b = await create(http, served.admin_tus, len(second), filename="b.jpg", upload_group="batch-1")
        done_a = await patch(http, a, 0, first)
        upload_id = done_a.headers["picpeak-upload-id"]
        await run_pool_until_idle(served.services)
        [group] = sql(served.services, "SELECT completed_at FROM uploads WHERE id = ?", upload_id)
        assert group["completed_at"] is None
        done_b = await patch(http, b, 0, second)
        assert done_b.headers["picpeak-upload-id"] == upload_id
        await run_pool_until_idle(served.services)
        status = (await http.get(f"/api/admin/uploads/{upload_id}")).json()
        assert sorted(p["filename"] for p in status["photos"]) == ["a.jpg", "b.jpg"]
        assert sql(served.services, "SELECT completed_at FROM uploads WHERE id = ?", upload_id)[0]["completed_at"]
        # The same bytes again: a duplicate, with the existing photo's id, and no new group to follow.
        c = await create(http, served.admin_tus, len(first), filename="again.jpg")
        dup = await patch(http, c, 0, first)
        assert dup.status_code == 204 and dup.headers["picpeak-duplicate"] == "true"
        assert dup.headers["picpeak-photo-id"] == done_a.headers["picpeak-photo-id"]
        assert "picpeak-upload-id" not in dup.headers
        # Not an image: the last PATCH is refused as multipart would refuse the file, and the upload ends; HEAD
        # afterwards tells the same refusal (its sentence in Picpeak-Error: a HEAD answer has no body), never
        # an offset a client would take for success.
        junk = b"this is not a photo at all" * 100
        d = await create(http, served.admin_tus, len(junk), filename="notes.txt")
        refused = await patch(http, d, 0, junk)
        assert refused.status_code in (400, 415) and refused.json()["error"]
        head = await http.head(d, headers=TUS)
        assert head.status_code == refused.status_code and "upload-offset" not in head.headers
        assert unquote(head.headers["picpeak-error"]) == refused.json()["error"]
    assert sql(served.services, "SELECT count(*) AS n FROM photos")[0]["n"] == 2
    assert sql(served.services, "SELECT count(*) AS n FROM uploads")[0]["n"] == 1
    assert list((served.services.storage.tmp_dir / resumable.TUS_DIR).iterdir()) == []


async def test_gallery_cap_is_checked_at_creation(served: Served) -> None:
    await served.services.db.write(lambda conn: conn.execute("UPDATE galleries SET photo_cap = 1"))
    async with served.admin() as http:
        data = big_jpeg(8)
        location = await create(http, served.admin_tus, len(data))
        assert (await patch(http, location, 0, data)).status_code == 204
        full = await http.post(served.admin_tus, headers={**TUS, "Upload-Length": "100"})
        assert full.status_code == 409 and "full" in full.json()["error"]


# --- guests: their own uploads only, and their limits ----------------------------------------------------------------

async def test_guests_reach_only_their_own_uploads(served: Served) -> None:
    data = big_jpeg(9)
    async with served.guest() as (mine, _), served.guest() as (other, _), served.admin() as admin:
        location = await create(mine, served.guest_tus, len(data), filename="guest.jpg", guest_name="Ana")
        assert re.fullmatch(r"/api/g/g/tus/[0-9a-f]{32}", location)
        assert (await patch(mine, location, 0, data[:1000])).status_code == 204
        # Another guest session, and the admin under the guest URL or the admin URL: the upload does not exist.
        assert (await other.head(location, headers=TUS)).status_code == 404
        assert (await patch(other, location, 1000, data[1000:])).status_code == 404
        assert (await other.delete(location, headers=TUS)).status_code == 404
        admin_url = location.replace("/api/g/g/tus/", "/api/admin/galleries/1/tus/")
        assert (await admin.head(admin_url, headers=TUS)).status_code == 404
        # Without the CSRF token a guest's own PATCH is refused; without a session, everything.
        no_csrf = await mine.patch(location, content=data[1000:], headers={
            **OCTETS, "Upload-Offset": "1000", "X-CSRF-Token": ""})
        assert no_csrf.status_code == 403
        async with httpx.AsyncClient(base_url=served.url, timeout=120) as nobody:
            assert (await nobody.head(location, headers=TUS)).status_code == 403
            assert (await nobody.post(served.guest_tus, headers={**TUS, "Upload-Length": "10"})).status_code == 403
        done = await patch(mine, location, 1000, data[1000:])
        assert done.status_code == 204
        upload_id = done.headers["picpeak-upload-id"]
        assert (await mine.get(f"/api/g/g/uploads/{upload_id}")).status_code == 200
    row = sql(served.services, "SELECT * FROM photos")[0]
    assert row["uploaded_by"] == "guest" and row["guest_name"] == "Ana"


async def test_guest_limits(served: Served) -> None:
    async with served.guest() as (guest, _):
        # Past the larger (video) limit; a photo past its own is refused at its header (test_a_guest_video_...).
        too_big = await guest.post(served.guest_tus, headers={**TUS, "Upload-Length": str(500 * MB + 1)})
        assert too_big.status_code == 413 and "limit of 500 MB" in too_big.json()["error"]
        for _ in range(3):
            await create(guest, served.guest_tus, 100)
        over = await guest.post(served.guest_tus, headers={**TUS, "Upload-Length": "100"})
        assert over.status_code == 409 and "unfinished uploads" in over.json()["error"]
        await served.services.db.write(lambda conn: conn.execute("UPDATE galleries SET allow_guest_uploads = 0"))
        closed = await guest.post(served.guest_tus, headers={**TUS, "Upload-Length": "100"})
        assert closed.status_code == 403 and "does not accept photos" in closed.json()["error"]


async def test_upload_metadata_is_capped(served: Served) -> None:
    async with served.admin() as http:
        huge = await http.post(served.admin_tus, headers={**TUS, "Upload-Length": "100",
                                                          "Upload-Metadata": meta(filename="a" * 5000)})
        assert huge.status_code == 400 and "at most 4 KB" in huge.json()["error"]
        await create(http, served.admin_tus, 100, filename="a" * 2000)
    assert sql(served.services, "SELECT count(*) AS n FROM tus_uploads")[0]["n"] == 1


@contextlib.asynccontextmanager
async def guest_at(served: Served, address: str) -> AsyncIterator[httpx.AsyncClient]:
    """A new guest session whose connections come from ``address`` (127.0.0.x: still this machine)."""
    transport = httpx.AsyncHTTPTransport(local_address=address)
    async with httpx.AsyncClient(base_url=served.url, timeout=120, transport=transport) as http:
        page = await http.get(f"/g/{served.slug}/upload")
        assert page.status_code == 200
        csrf = CSRF_META.search(page.text)
        assert csrf is not None
        http.headers["X-CSRF-Token"] = csrf.group(1)
        yield http


async def test_guest_reservations_are_capped_per_client_and_per_gallery(tmp_path: Path) -> None:
    """Guests' unfinished uploads are capped by the bytes they announced: per client address across sessions,
    and per gallery; 429 with a sentence past a cap; the admin is not held by them; ended uploads free it."""
    mb = 2**20
    async with serve(tmp_path, guest_max_file_mb=GUEST_FILE_MB, guest_max_files=3, tus_unfinished_mb_per_client=5,
                     tus_unfinished_mb_per_gallery=7) as served:
        async with guest_at(served, "127.0.0.1") as one, guest_at(served, "127.0.0.1") as two:
            first = await create(one, served.guest_tus, 2 * mb)
            await create(one, served.guest_tus, 2 * mb)
            # Another session at the same address shares the address's cap (5 MB): 4 + 2 is too much ...
            over = await two.post(served.guest_tus, headers={**TUS, "Upload-Length": str(2 * mb)})
            assert over.status_code == 429 and "from your network" in over.json()["error"]
            assert int(over.headers["retry-after"]) > 0
            # ... but 1 MB fits.
            await create(two, served.guest_tus, 1 * mb)
            async with guest_at(served, "127.0.0.2") as other:
                # Another address has its own share, within the gallery's 7 MB: 5 + 2 fits, 5 + 2 + 1 does not.
                await create(other, served.guest_tus, 2 * mb)
                full = await other.post(served.guest_tus, headers={**TUS, "Upload-Length": str(1 * mb)})
                assert full.status_code == 429 and "this gallery" in full.json()["error"]
                # The admin's uploads are the admin's: guests' reservations do not hold them.
                async with served.admin() as admin:
                    await create(admin, served.admin_tus, 100 * mb)
                # An upload that ends (here: cancelled) frees its share at once.
                assert (await one.delete(first, headers=TUS)).status_code == 204
                await create(other, served.guest_tus, 1 * mb)
        rows = sql(served.services, "SELECT client_ip, sum(upload_length) AS n FROM tus_uploads "
                                    "WHERE uploaded_by = 'guest' GROUP BY client_ip ORDER BY client_ip")
        assert [(r["client_ip"], r["n"]) for r in rows] == [("127.0.0.1", 3 * mb), ("127.0.0.2", 3 * mb)]


# --- a third-party client -------------------------------------------------------------------------------------------

def tuspy_upload(url: str, path: Path, headers: dict[str, str], *, chunk: int, metadata: dict[str, str],
                 resume: str | None = None, stop_at: int | None = None,
                 retries: int = 0) -> tuple[str, dict[str, str]]:
    """tuspy's own uploader (sync, in a thread): returns the upload URL and the last answer's headers."""
    uploader = tus_client.TusClient(url, headers=headers).uploader(
        str(path), chunk_size=chunk, metadata=metadata, url=resume, retries=retries, retry_delay=1)
    uploader.upload(stop_at=stop_at)
    return uploader.url, uploader.request.response_headers if uploader.request else {}


async def test_tuspy_uploads_to_both_routes(served: Served, tmp_path: Path) -> None:
    admin_file, guest_file = tmp_path / "admin.jpg", tmp_path / "guest.jpg"
    admin_file.write_bytes(big_jpeg(10))
    guest_file.write_bytes(big_jpeg(11))
    url, headers = await trio.to_thread.run_sync(lambda: tuspy_upload(
        served.url + served.admin_tus, admin_file, {"Authorization": f"Bearer {served.token}"}, chunk=100_000,
        metadata={"filename": "admin.jpg", "filetype": "image/jpeg"}))
    assert headers["picpeak-photo-id"]
    async with served.guest() as (guest, csrf):
        cookie = "; ".join(f"{name}={value}" for name, value in guest.cookies.items())
        url, headers = await trio.to_thread.run_sync(lambda: tuspy_upload(
            served.url + served.guest_tus, guest_file, {"Cookie": cookie, "X-CSRF-Token": csrf}, chunk=64_000,
            metadata={"filename": "guest.jpg"}))
    assert headers["picpeak-photo-id"] and "/api/g/g/tus/" in url
    rows = sql(served.services, "SELECT display_name, sha256, uploaded_by FROM photos ORDER BY id")
    assert [(r["display_name"], r["uploaded_by"]) for r in rows] == [("admin.jpg", "admin"), ("guest.jpg", "guest")]
    assert rows[1]["sha256"] == hashlib.sha256(guest_file.read_bytes()).hexdigest()


async def test_a_connection_cut_mid_chunk_keeps_what_arrived_and_tuspy_resumes(served: Served, tmp_path: Path) -> None:
    data = big_jpeg(12, extra=WRITE_BATCH + 600_000)
    path = tmp_path / "cut.jpg"
    path.write_bytes(data)
    async with served.admin() as http:
        location = await create(http, served.admin_tus, len(data), filename="cut.jpg")
    host, port = served.url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    sent = WRITE_BATCH + 400_000  # one write batch is on disk, the rest still in memory when the connection goes
    await stream.send_all(
        f"PATCH {location} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {served.token}\r\nTus-Resumable: 1.0.0\r\n"
        f"Content-Type: application/offset+octet-stream\r\nUpload-Offset: 0\r\nContent-Length: {len(data)}\r\n\r\n"
        .encode() + data[:sent])
    with trio.fail_after(60):  # a hung-test stop only
        while partial_file(served.services, location).stat().st_size == 0:
            await trio.sleep(0.02)
    await stream.aclose()
    async with served.admin() as http:
        with trio.fail_after(60):
            while (offset := int((await http.head(location, headers=TUS)).headers["upload-offset"])) == 0:
                await trio.sleep(0.02)
    # What arrived was kept (including what was still waiting in memory), fsynced and recorded on the way out.
    assert WRITE_BATCH < offset <= sent
    assert partial_file(served.services, location).read_bytes() == data[:offset]
    _url, headers = await trio.to_thread.run_sync(lambda: tuspy_upload(
        served.url + served.admin_tus, path, {"Authorization": f"Bearer {served.token}"}, chunk=256_000,
        metadata={"filename": "cut.jpg"}, resume=served.url + location))
    row = sql(served.services, "SELECT * FROM photos WHERE id = ?", int(headers["picpeak-photo-id"]))[0]
    assert row["sha256"] == hashlib.sha256(data).hexdigest()


async def test_a_guest_video_over_the_photo_limit_goes_up_and_a_photo_over_it_is_refused_at_its_header(
        served: Served, tmp_path: Path) -> None:
    """Issue 28: the create accepts up to the video limit; once the first bytes arrive, a photo is held to the
    photo limit, refused with the multipart sentence, as multipart refuses it."""
    clip = make_clip(tmp_path / "party.mp4", width=640, height=480, seconds=0.5, crf=0, camera=True)
    assert clip.stat().st_size > GUEST_FILE_MB * MB
    async with served.guest() as (guest, csrf):
        cookie = "; ".join(f"{name}={value}" for name, value in guest.cookies.items())
        _url, headers = await trio.to_thread.run_sync(lambda: tuspy_upload(
            served.url + served.guest_tus, clip, {"Cookie": cookie, "X-CSRF-Token": csrf}, chunk=1_000_000,
            metadata={"filename": "party.mp4"}))
        [row] = sql(served.services, "SELECT media_type, size FROM photos WHERE id = ?",
                    int(headers["picpeak-photo-id"]))
        assert row == {"media_type": "video", "size": clip.stat().st_size}
        # A photo announced over the photo limit: created (it might be a video), refused at its first chunk.
        big = big_jpeg(14, extra=GUEST_FILE_MB * MB)
        location = await create(guest, served.guest_tus, len(big), filename="huge.jpg")
        refused = await patch(guest, location, 0, big[:64 * 1024])
        sentence = f"The file is larger than the limit of {GUEST_FILE_MB} MB."
        assert refused.status_code == 413 and refused.json()["error"] == sentence
        head = await guest.head(location, headers=TUS)
        assert head.status_code == 413 and unquote(head.headers["picpeak-error"]) == sentence
        assert not partial_file(served.services, location).exists()
        # Multipart says the same of the same file.
        multipart = await guest.post("/api/g/g/upload", files={"photos": ("huge.jpg", big, "image/jpeg")})
        assert multipart.status_code == 413 and multipart.json()["errors"][0]["error"] == sentence


# --- kill -9 --------------------------------------------------------------------------------------------------------

@pytest.mark.system
async def test_kill_9_mid_chunk_then_resume_from_the_durable_offset(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    data_dir = tmp_path / "data"
    config = write_config(tmp_path / "picpeak.toml")
    settings = make_settings(tmp_path)
    token = prepare(settings)
    data = big_jpeg(13, extra=3_000_000)
    path = tmp_path / "big.jpg"
    path.write_bytes(data)
    proc = ServerProcess(data_dir, config)
    url = await trio.to_thread.run_sync(proc.start)
    try:
        headers = {"Authorization": f"Bearer {token}"}
        first = 1_000_000
        # tuspy sends the first megabyte, answered (durable) ...
        location, _ = await trio.to_thread.run_sync(lambda: tuspy_upload(
            url + "/api/admin/galleries/1/tus", path, headers, chunk=first, metadata={"filename": "big.jpg"},
            stop_at=first))
        # ... then a chunk that is half sent when the server is killed.
        host, port = url.removeprefix("http://").rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(
            f"PATCH {location.removeprefix(url)} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            f"Tus-Resumable: 1.0.0\r\nContent-Type: application/offset+octet-stream\r\nUpload-Offset: {first}\r\n"
            f"Content-Length: {len(data) - first}\r\n\r\n".encode() + data[first:first + 1_500_000])
        partial = data_dir / "tmp" / "tus" / location.rsplit("/", 1)[1]
        with trio.fail_after(60):  # a hung-test stop only
            while partial.stat().st_size <= first:
                await trio.sleep(0.02)
        proc.kill()
        await stream.aclose()
        url = await trio.to_thread.run_sync(proc.start)
        location = url + location[location.index("/api/"):]
        async with httpx.AsyncClient(headers=headers, timeout=120) as http:
            head = await http.head(location, headers=TUS)
        offset = int(head.headers["upload-offset"])
        on_disk = partial.read_bytes()
        # What HEAD reports is on disk, byte for byte: never more than what was made durable.
        assert len(on_disk) >= offset and on_disk[:offset] == data[:offset]
        assert offset >= first
        # The killed process's writer lease on the upload is still live for up to resumable.WRITER_LEASE_SECONDS,
        # but its holder was a process on this machine that no longer runs (runtime/lease.holder_is_gone): the
        # new server takes it over at once. (Had the holder been on another host, the PATCH would be answered 423
        # with Retry-After until the lease ran out; the client retries, as tus clients do.)
        resumed = time.monotonic()
        _, last = await trio.to_thread.run_sync(lambda: tuspy_upload(
            url + "/api/admin/galleries/1/tus", path, headers, chunk=1_000_000, metadata={"filename": "big.jpg"},
            resume=location, retries=2 * int(resumable.WRITER_LEASE_SECONDS)))
        resumed_s = time.monotonic() - resumed
        photo_id = int(last["picpeak-photo-id"])
        rows = query(data_dir, "SELECT id, sha256 FROM photos")
        assert rows == [{"id": photo_id, "sha256": hashlib.sha256(data).hexdigest()}]
        figures(capsys, f"tus_kill9: size={len(data)} durable_before_kill={first} head_after_restart={offset} "
                        f"on_disk_after_restart={len(on_disk)} photos={len(rows)} "
                        f"resume_after_restart_s={resumed_s:.1f}")
    finally:
        proc.kill()


# --- expiry, on trio's autojump clock -------------------------------------------------------------------------------

async def test_unfinished_uploads_expire_when_idle_and_the_janitor_removes_their_bytes(
        tmp_path: Path, autojump_clock: Any) -> None:
    settings = make_settings(tmp_path, lease_seconds=3600, tus_expiry_hours=24, tus_idle_minutes=15)
    token = prepare(settings)
    base = time.time()
    svc = Services(settings=settings, db=Database(settings.database), monotonic=trio.current_time,
                   clock=lambda: base + trio.current_time())
    try:
        app = create_app(svc)
        http = app.test_client()
        auth = {"Authorization": f"Bearer {token}"}

        async def start(name: str, group: str) -> str:
            answer = await http.post("/api/admin/galleries/1/tus", headers={
                **auth, **TUS, "Upload-Length": "5000", "Upload-Metadata": meta(filename=name, upload_group=group)})
            assert answer.status_code == 201
            # A new upload holds its reservation for the idle period, not a day.
            assert parsedate_to_datetime(answer.headers["Upload-Expires"]).timestamp() <= svc.clock() + 15 * 60
            return answer.headers["Location"]

        def stored(location: str) -> dict[str, Any]:
            return sql(svc, "SELECT * FROM tus_uploads WHERE id = ?", location.rsplit("/", 1)[1])[0]

        created = svc.clock()
        idle, busy = await start("idle.jpg", "b"), await start("busy.jpg", "b")
        for location in (idle, busy):
            answer = await http.patch(location, data=b"\xff" * 1000, headers={**auth, **OCTETS, "Upload-Offset": "0"})
            assert answer.status_code == 204
        # The janitor's passes run at the moments the test picks: run as a task beside requests, the autojump
        # clock would also jump while a request waits for a thread (trio counts that task as blocked).
        janitor = Janitor(svc)
        await trio.sleep(10 * 60)
        await janitor.reconcile()
        # The busy one sends a chunk: its expiry slides 15 minutes on from now (and the answer says so).
        answer = await http.patch(busy, data=b"\xff" * 1000, headers={**auth, **OCTETS, "Upload-Offset": "1000"})
        assert answer.status_code == 204
        expires = parsedate_to_datetime(answer.headers["Upload-Expires"]).timestamp()
        assert svc.clock() + 14 * 60 <= expires <= svc.clock() + 15 * 60
        assert abs(stored(busy)["expires_at"] - expires) < 1
        # An empty PATCH is no progress: it moves nothing.
        answer = await http.patch(busy, data=b"", headers={**auth, **OCTETS, "Upload-Offset": "2000"})
        assert answer.status_code == 204 and abs(stored(busy)["expires_at"] - expires) < 1
        await trio.sleep(10 * 60)
        # Idle for 20 minutes, before the janitor's pass: already 410, and its reservation no longer counts.
        assert (await http.head(idle, headers={**auth, **TUS})).status_code == 410
        assert resumable.partial_path(svc.storage, idle.rsplit("/", 1)[1]).exists()
        assert sql(svc, "SELECT count(*) AS n FROM tus_uploads WHERE expires_at >= ?", svc.clock())[0]["n"] == 1
        await janitor.reconcile()
        assert (await http.head(idle, headers={**auth, **TUS})).status_code == 410
        assert (await http.patch(idle, data=b"x", headers={**auth, **OCTETS, "Upload-Offset": "1000"})
                ).status_code == 410
        assert not resumable.partial_path(svc.storage, idle.rsplit("/", 1)[1]).exists()
        tombstone = stored(idle)
        assert tombstone["state"] == "expired" and tombstone["metadata"] == ""  # a tombstone keeps no metadata
        assert (await http.head(busy, headers={**auth, **TUS})).status_code == 200
        assert sql(svc, "SELECT count(*) AS n FROM uploads")[0]["n"] == 1
        # A trickle (one byte every 14 minutes) keeps the busy one alive, but never past a day from its creation.
        offset = 2000
        while svc.clock() < created + 24 * 3600:
            answer = await http.patch(busy, data=b"\xff", headers={**auth, **OCTETS, "Upload-Offset": str(offset)})
            if answer.status_code == 410:
                break
            assert answer.status_code == 204
            offset += 1
            assert stored(busy)["expires_at"] <= created + 24 * 3600
            await trio.sleep(14 * 60)
        assert (await http.head(busy, headers={**auth, **TUS})).status_code == 410
        # The group waited for its busy file; now that it expired too, the group (no photo) goes.
        await janitor.reconcile()
        assert sql(svc, "SELECT count(*) AS n FROM uploads")[0]["n"] == 0
        assert list((svc.storage.tmp_dir / resumable.TUS_DIR).iterdir()) == []
        # Tombstones are forgotten after another period: unknown (404) from then on.
        await trio.sleep(25 * 3600)
        await janitor.reconcile()
        assert (await http.head(idle, headers={**auth, **TUS})).status_code == 404
        assert sql(svc, "SELECT count(*) AS n FROM tus_uploads")[0]["n"] == 0
    finally:
        svc.db.close()
