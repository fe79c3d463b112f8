"""tus uploads whose pieces live in the bucket (``tus_bytes``: bucket, ``pipeline/tuspieces.py``; issue 31): a
real server (in the test's trio run, or processes of their own) and a real S3 server process (moto, s3rver).

On one server: PATCHes of uneven sizes (one larger than a piece) become a photo with the file's sha256, no byte on
the local disk, the pieces gone afterwards; a PATCH cut off mid-body keeps what arrived and the client resumes
from HEAD's offset; a wrong Upload-Checksum stores nothing and leaves the offset; the bucket stopped during a
PATCH is 503 with Retry-After, the offset unchanged, and the upload completes once it answers again; terminate
and expiry remove the pieces (and a piece left by an upload that ended is swept). On two server processes that
share one PostgreSQL database and one bucket and nothing else (each its own data directory): PATCHes alternate
between them, and a kill -9 of the one that took the last-but-one PATCH loses nothing: the other finishes.
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from picpeak_lite.config import load_settings
from picpeak_lite.errors import ConfigError
from picpeak_lite.pipeline import resumable, tuspieces
from picpeak_lite.services import Services
from picpeak_lite.store.db import Database

from . import pgserver
from .conftest import make_settings
from .harness import ServerProcess, figures, query, write_config
from .s3server import SERVERS, MotoServer, S3Server
from .served import prepare, serve
from .test_tus import MB, TUS, big_jpeg, create, patch, tuspy_upload
from .videofactory import make_clip

pytestmark = pytest.mark.system

PIECE = tuspieces.PIECE_BYTES


@pytest.fixture(scope="module", params=sorted(SERVERS))
def s3(request: pytest.FixtureRequest) -> Iterator[S3Server]:
    with SERVERS[request.param]() as server:
        yield server


@pytest.fixture
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:  # its own: a test freezes it
        yield server


def bucket_settings(server: S3Server, bucket: str, **extra: Any) -> dict[str, Any]:
    return server.settings_for(bucket, tus_bytes="bucket", **extra)


def pieces(server: S3Server, bucket: str, location: str | None = None) -> list[str]:
    return server.keys(bucket, "tus/" + (location.rsplit("/", 1)[1] + "/" if location else ""))


def local_tus_files(svc: Services) -> list[Path]:
    folder = svc.storage.tmp_dir / resumable.TUS_DIR
    return sorted(folder.iterdir()) if folder.exists() else []


def photo_sha(svc: Services, photo_id: int) -> str:
    return str(query(svc.settings.data_path, "SELECT sha256 FROM photos WHERE id = ?", photo_id)[0]["sha256"])


async def head_offset(http: httpx.AsyncClient, location: str) -> int:
    answer = await http.head(location, headers=TUS)
    assert answer.status_code == 200, answer.status_code
    return int(answer.headers["upload-offset"])


def test_the_setting() -> None:
    """auto: the bucket where several hosts may share the service (S3 and PostgreSQL), else the local disk;
    bucket without S3 is refused at start in one sentence."""
    s3 = {"storage": "s3", "s3_bucket": "b"}
    pg = {"database_url": "postgresql://u@h/d"}
    assert not load_settings(environ={}, overrides={}).tus_in_bucket
    assert not load_settings(environ={}, overrides=s3).tus_in_bucket
    assert not load_settings(environ={}, overrides=pg).tus_in_bucket
    assert load_settings(environ={}, overrides={**s3, **pg}).tus_in_bucket
    assert not load_settings(environ={}, overrides={**s3, **pg, "tus_bytes": "local"}).tus_in_bucket
    assert load_settings(environ={}, overrides={**s3, "tus_bytes": "bucket"}).tus_in_bucket
    with pytest.raises(ConfigError, match=r"^setting 'tus_bytes' may be \"bucket\" only with storage = \"s3\""):
        load_settings(environ={}, overrides={"tus_bytes": "bucket"})
    with pytest.raises(ConfigError, match="tus_bytes"):
        load_settings(environ={}, overrides={"tus_bytes": "elsewhere"})


async def test_patches_of_uneven_sizes_become_the_photo_and_the_pieces_go(tmp_path: Path, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    data = big_jpeg(80, extra=PIECE + 5_000_000)  # about 14 MB
    sizes = [100_000, 3_000_000, PIECE + 1_000_000]  # the third is larger than a piece: two pieces
    async with serve(tmp_path, **bucket_settings(s3, bucket)) as served, served.admin() as http:
        location = await create(http, served.admin_tus, len(data), filename="big.jpg")
        offset = 0
        for size in sizes:
            if size > PIECE:
                # A body without Content-Length that runs past Upload-Length keeps nothing, though a whole piece
                # of it was stored before it did: that piece lies past the offset (and is replaced below).
                async def too_long(rest: bytes) -> AsyncIterator[bytes]:
                    for at in range(0, len(rest), MB):
                        yield rest[at:at + MB]

                refused = await http.patch(location, content=too_long(data[offset:] + b"x"), headers={
                    **TUS, "Content-Type": "application/offset+octet-stream", "Upload-Offset": str(offset)})
                assert refused.status_code == 413 and await head_offset(http, location) == offset
            answer = await patch(http, location, offset, data[offset:offset + size])
            assert answer.status_code == 204, answer.text
            offset += size
            assert int(answer.headers["upload-offset"]) == offset == await head_offset(http, location)
        names = pieces(s3, bucket, location)
        starts = [int(name.rsplit("/", 1)[1].split("-")[0]) for name in names]
        assert starts == [0, 100_000, 3_100_000, 3_100_000 + PIECE], names
        assert local_tus_files(served.services) == []  # not a byte of it on this host's disk
        last = await patch(http, location, offset, data[offset:])
        assert last.status_code == 204, last.text
        photo_id = int(last.headers["picpeak-photo-id"])
        assert photo_sha(served.services, photo_id) == hashlib.sha256(data).hexdigest()
        assert pieces(s3, bucket) == []
        head = await http.head(location, headers=TUS)
        assert head.status_code == 200 and int(head.headers["picpeak-photo-id"]) == photo_id


async def test_a_patch_cut_off_mid_body_keeps_what_arrived_and_the_client_resumes(tmp_path: Path,
                                                                                 s3: S3Server) -> None:
    bucket = s3.new_bucket()
    data = big_jpeg(81, extra=PIECE + 1_500_000)
    path = tmp_path / "cut.jpg"
    path.write_bytes(data)
    async with serve(tmp_path, **bucket_settings(s3, bucket)) as served:
        async with served.admin() as http:
            location = await create(http, served.admin_tus, len(data), filename="cut.jpg")
        host, port = served.url.removeprefix("http://").rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        sent = PIECE + 700_000  # a whole piece, stored while the body arrives; the rest of it mid-piece
        await stream.send_all(
            f"PATCH {location} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {served.token}\r\nTus-Resumable: 1.0.0"
            f"\r\nContent-Type: application/offset+octet-stream\r\nUpload-Offset: 0\r\nContent-Length: {len(data)}"
            "\r\n\r\n".encode() + data[:sent])
        with trio.fail_after(60):  # a hung-test stop only
            while not pieces(s3, bucket, location):
                await trio.sleep(0.05)
        await stream.aclose()
        async with served.admin() as http:
            with trio.fail_after(60):
                while (offset := await head_offset(http, location)) <= PIECE:
                    await trio.sleep(0.02)
        # What arrived after the first piece was stored as a piece of its own and recorded on the way out.
        assert PIECE < offset <= sent
        assert len(pieces(s3, bucket, location)) == 2
        _url, headers = await trio.to_thread.run_sync(lambda: tuspy_upload(
            served.url + served.admin_tus, path, {"Authorization": f"Bearer {served.token}"}, chunk=600_000,
            metadata={"filename": "cut.jpg"}, resume=served.url + location))
        assert photo_sha(served.services, int(headers["picpeak-photo-id"])) == hashlib.sha256(data).hexdigest()
        assert pieces(s3, bucket) == []


async def test_a_wrong_checksum_stores_nothing_and_leaves_the_offset(tmp_path: Path) -> None:
    with MotoServer() as moto:
        bucket = moto.new_bucket()
        data = big_jpeg(82)
        async with serve(tmp_path, **bucket_settings(moto, bucket)) as served, served.admin() as http:
            location = await create(http, served.admin_tus, len(data))
            half = len(data) // 2
            assert (await patch(http, location, 0, data[:half])).status_code == 204
            wrong = "sha1 " + base64.b64encode(hashlib.sha1(b"other").digest()).decode()
            refused = await patch(http, location, half, data[half:], **{"Upload-Checksum": wrong})
            assert refused.status_code == 460, refused.text
            assert await head_offset(http, location) == half
            assert len(pieces(moto, bucket, location)) == 1  # the refused body never reached the bucket
            right = "sha256 " + base64.b64encode(hashlib.sha256(data[half:]).digest()).decode()
            done = await patch(http, location, half, data[half:], **{"Upload-Checksum": right})
            assert done.status_code == 204, done.text
            assert photo_sha(served.services, int(done.headers["picpeak-photo-id"])) == hashlib.sha256(
                data).hexdigest()
            assert pieces(moto, bucket) == []


async def test_the_bucket_stopped_during_a_patch_is_503_and_the_upload_completes_after(
        tmp_path: Path, moto: MotoServer, capsys: pytest.CaptureFixture[str]) -> None:
    bucket = moto.new_bucket()
    data = big_jpeg(83)
    third = len(data) // 3
    async with serve(tmp_path, **bucket_settings(moto, bucket, s3_timeout_seconds=2)) as served, \
            served.admin() as http:
        location = await create(http, served.admin_tus, len(data))
        assert (await patch(http, location, 0, data[:third])).status_code == 204

        async def body() -> AsyncIterator[bytes]:
            yield data[third:2 * third]
            moto.freeze()  # the bucket stops while the body arrives (its process stopped: nothing answers)
            yield data[2 * third:]

        try:
            began = time.monotonic()
            refused = await http.patch(location, content=body(), headers={
                **TUS, "Content-Type": "application/offset+octet-stream", "Upload-Offset": str(third)})
            waited = time.monotonic() - began
        finally:
            moto.thaw()
        assert refused.status_code == 503, refused.text
        assert int(refused.headers["retry-after"]) >= 1
        assert await head_offset(http, location) == third
        again = await patch(http, location, third, data[third:])
        assert again.status_code == 204, again.text
        assert photo_sha(served.services, int(again.headers["picpeak-photo-id"])) == hashlib.sha256(data).hexdigest()
        assert pieces(moto, bucket) == []
        figures(capsys, f"tus_bucket_stopped: patch_answered=503 after_s={waited:.1f} offset_kept={third} "
                        "completed_after=1")


async def test_terminate_and_expiry_remove_the_pieces(tmp_path: Path) -> None:
    with MotoServer() as moto:
        bucket = moto.new_bucket()
        async with serve(tmp_path, **bucket_settings(moto, bucket)) as served, served.admin() as http:
            svc = served.services
            ended = await create(http, served.admin_tus, 500_000)
            idle = await create(http, served.admin_tus, 500_000)
            for location in (ended, idle):
                assert (await patch(http, location, 0, b"\xff\xd8" + bytes(99_998))).status_code == 204
                assert (await patch(http, location, 100_000, bytes(100_000))).status_code == 204
                assert len(pieces(moto, bucket, location)) == 2
            assert (await http.delete(ended, headers=TUS)).status_code == 204
            assert pieces(moto, bucket, ended) == []
            assert len(pieces(moto, bucket, idle)) == 2
            # A piece left by an upload that ended (its removal met the bucket down) is an orphan.
            orphan = tuspieces.piece_name("0" * 32, 0, 5)
            moto.client().put_object(Bucket=bucket, Key=orphan, Body=b"12345")
            later = Services(settings=svc.settings, db=Database(svc.settings.database),
                             clock=lambda: time.time() + 2 * 24 * 3600)
            try:
                assert await resumable.expire(later) == 1
            finally:
                later.db.close()
            assert pieces(moto, bucket) == []
            assert (await http.head(idle, headers=TUS)).status_code == 410


async def test_the_first_bytes_tell_a_video_from_a_photo_over_the_photo_limit(tmp_path: Path) -> None:
    """The header check reads the first bytes back from the bucket: a guest's video over the photo limit goes
    up; a photo over it is refused at its first PATCH (413), and its pieces go."""
    clip = make_clip(tmp_path / "party.mp4", width=640, height=480, seconds=0.5, crf=0, camera=True)
    assert clip.stat().st_size > MB
    with MotoServer() as moto:
        bucket = moto.new_bucket()
        async with serve(tmp_path, **bucket_settings(moto, bucket, guest_max_file_mb=1)) as served, \
                served.guest() as (guest, csrf):
            cookie = "; ".join(f"{name}={value}" for name, value in guest.cookies.items())
            _url, headers = await trio.to_thread.run_sync(lambda: tuspy_upload(
                served.url + served.guest_tus, clip, {"Cookie": cookie, "X-CSRF-Token": csrf}, chunk=400_000,
                metadata={"filename": "party.mp4"}))
            [row] = query(served.services.settings.data_path, "SELECT media_type, sha256 FROM photos WHERE id = ?",
                          int(headers["picpeak-photo-id"]))
            assert row == {"media_type": "video", "sha256": hashlib.sha256(clip.read_bytes()).hexdigest()}
            big = big_jpeg(84, extra=MB)
            location = await create(guest, served.guest_tus, len(big), filename="huge.jpg")
            refused = await patch(guest, location, 0, big[:64 * 1024])
            assert refused.status_code == 413
            assert refused.json()["error"] == "The file is larger than the limit of 1 MB."
            assert pieces(moto, bucket) == []


# --- two hosts: one PostgreSQL database, one bucket, nothing else shared -----------------------------------------

@pytest.mark.postgresql
async def test_two_hosts_take_alternate_patches_and_a_kill_9_loses_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with MotoServer() as moto:
        bucket = moto.new_bucket()
        first = make_settings(tmp_path / "a", **moto.settings_for(bucket))  # tus_bytes: auto
        assert first.database_url and first.tus_in_bucket
        token = prepare(first)
        hosts = []
        for name in ("a", "b"):
            values = {"data_dir": str(tmp_path / name / "data"), "database_url": first.database_url,
                      "log_level": "warning", **moto.settings_for(bucket)}
            (tmp_path / name).mkdir(exist_ok=True)
            config = write_config(tmp_path / name / "picpeak.toml", **values)
            hosts.append(ServerProcess(tmp_path / name / "data", config, database_url=first.database_url))
        urls = [await trio.to_thread.run_sync(host.start) for host in hosts]
        auth = {"Authorization": f"Bearer {token}"}
        files = [big_jpeg(90 + i, extra=300_000) for i in range(2)]
        patch_hosts: set[int] = set()
        try:
            async with httpx.AsyncClient(headers=auth, timeout=120) as http:
                made = []
                for number, data in enumerate(files):
                    alive = [0, 1]
                    location = await create(http, urls[0] + "/api/admin/galleries/1/tus", len(data))
                    location = urls[0] + location if location.startswith("/") else location
                    path = location.removeprefix(urls[0])
                    step = len(data) // 5 + 1
                    cuts = list(range(0, len(data), step))
                    answer = None
                    for i, offset in enumerate(cuts):
                        host = alive[i % len(alive)]
                        answer = await patch(http, urls[host] + path, offset, data[offset:offset + step])
                        assert answer.status_code == 204, answer.text
                        patch_hosts.add(host)
                        if number == 1 and i == len(cuts) - 2:
                            # kill -9 of the host that took the last-but-one PATCH: the other takes the last.
                            hosts[host].kill()
                            alive.remove(host)
                    assert answer is not None
                    photo_id = int(answer.headers["picpeak-photo-id"])
                    made.append(photo_id)
            rows = query(tmp_path / "a" / "data", "SELECT id, sha256 FROM photos ORDER BY id")
            assert rows == [{"id": made[i], "sha256": hashlib.sha256(files[i]).hexdigest()} for i in range(2)]
            assert pieces(moto, bucket) == []
            for name in ("a", "b"):  # neither host kept a byte of an upload on its disk
                folder = tmp_path / name / "data" / "tmp" / "tus"
                assert not folder.exists() or not any(folder.iterdir())
            for host in hosts:
                if host.proc is not None:
                    assert not host.tracebacks(), "\n".join(host.tracebacks())
            figures(capsys, f"tus_bucket_two_hosts: uploads={len(files)} photos={len(rows)} "
                            f"pieces_left={len(pieces(moto, bucket))} patch_hosts={len(patch_hosts)}")
        finally:
            for host in hosts:
                host.kill()
    assert pgserver.engine == "postgresql"
