"""S3 storage against real S3-compatible server processes on 127.0.0.1 (moto and s3rver, tests/s3server.py).

The whole photo flow runs through the real app with ``storage = "s3"``: upload (durable in the bucket before
the 202, the row's sha256 the object's), processing (derivatives written as objects, no temp copy left),
serving (ETags, 304, Range, the same access rules; presigned redirects only after them), zips, deletes,
check and the reconciler listing the bucket, backup copying from it.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from picpeak_lite.config import Settings
from picpeak_lite.ops.backup import backup
from picpeak_lite.ops.check import check_data_dir
from picpeak_lite.pipeline.janitor import Janitor
from picpeak_lite.services import Services
from picpeak_lite.store.s3 import S3Storage
from picpeak_lite.store.storage import new_key, original_name

from . import imagefactory
from .conftest import AuthActions, make_settings
from .factories import published, run_pool_until_idle
from .s3server import SERVERS, S3Server
from .test_upload import admin_upload

pytestmark = pytest.mark.system  # a real server process per module


@pytest.fixture(scope="module", params=sorted(SERVERS))
def s3(request: pytest.FixtureRequest) -> Iterator[S3Server]:
    """Each test against both S3 implementations (tests/s3server.py says how they differ)."""
    with SERVERS[request.param]() as server:
        yield server


@pytest.fixture
def bucket(s3: S3Server) -> str:
    return s3.new_bucket()


@pytest.fixture
def settings(tmp_path: Path, s3: S3Server, bucket: str) -> Settings:
    return make_settings(tmp_path, **s3.settings_for(bucket, s3_prefix="lib/"))


def jpeg(seed: int, size: tuple[int, int] = (320, 240)) -> bytes:
    return imagefactory.save(imagefactory.photo(*size, seed=seed), "jpeg")


def object_bytes(s3: S3Server, bucket: str, key: str) -> bytes:
    data: bytes = s3.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    return data


async def photo_rows(services: Services) -> list[dict[str, Any]]:
    return await services.db.read(lambda c: c.execute("SELECT * FROM photos ORDER BY id").fetchall())


def local_files(settings: Settings) -> list[Path]:
    return sorted(p for sub in ("originals", "derived", "tmp") for p in (settings.data_path / sub).rglob("*")
                  if p.is_file())


async def test_upload_process_serve_zip_delete_in_the_bucket(admin: AuthActions, guest: Any, services: Services,
                                                            settings: Settings, s3: S3Server, bucket: str
                                                            ) -> None:
    gallery = await published(admin, name="Bucket")
    sent = [("a.jpg", jpeg(1)), ("b.jpg", jpeg(2))]
    response = await admin_upload(admin, gallery["id"], sent)
    assert response.status_code == 202, await response.get_data(as_text=True)
    rows = await photo_rows(services)
    # Durable before 202 means in the bucket: each original is there, byte-exact, its sha256 the row's.
    for row, (_, data) in zip(rows, sent, strict=True):
        stored = object_bytes(s3, bucket, "lib/" + original_name(row["storage_key"]))
        assert stored == data and hashlib.sha256(stored).hexdigest() == row["sha256"]
    assert local_files(settings) == [], "the local disk keeps only temp files, and none after the upload"

    await run_pool_until_idle(services)
    rows = await photo_rows(services)
    assert [r["status"] for r in rows] == ["complete", "complete"]
    keys = s3.keys(bucket, "lib/derived/")
    assert len(keys) == 4 and all(k.endswith((".grid.jpg", ".view.jpg")) for k in keys)
    assert local_files(settings) == [], "the worker's local copies of the originals are gone"

    # Serving: streamed from the bucket with its ETag; a revalidation is 304; a Range is 206.
    first = rows[0]
    url = f"/g/{gallery['slug']}/photos/{first['id']}/grid"
    image = await guest.get(url)
    assert image.status_code == 200
    assert await image.get_data() == object_bytes(s3, bucket, f"lib/derived/{first['storage_key'][:2]}/"
                                                                 f"{first['storage_key']}.grid.jpg")
    assert image.headers["Cache-Control"].startswith("private, max-age=")
    etag = image.headers["ETag"]
    again = await guest.get(url, headers={"If-None-Match": etag})
    assert again.status_code == 304
    download = f"/g/{gallery['slug']}/photos/{first['id']}/download"
    whole = await guest.get(download)
    assert whole.status_code == 200 and await whole.get_data() == sent[0][1]
    assert whole.headers["Content-Disposition"].startswith("attachment;")
    assert whole.headers["Content-Security-Policy"] == "default-src 'none'; sandbox"
    part = await guest.get(download, headers={"Range": "bytes=2-11"})
    assert part.status_code == 206 and await part.get_data() == sent[0][1][2:12]
    # A guest of another (unpublished) gallery gets nothing, bucket or not.
    draft = await admin.create_gallery(name="Draft")
    assert (await guest.get(f"/g/{draft['slug']}/photos/{first['id']}/grid")).status_code == 404

    archive = await guest.get(f"/g/{gallery['slug']}/download")
    assert archive.status_code == 200
    with zipfile.ZipFile(io.BytesIO(await archive.get_data())) as z:
        assert sorted(z.read(n) for n in z.namelist()) == sorted(d for _, d in sent)

    deleted = await admin.client.delete(f"/api/admin/photos/{first['id']}", headers=admin.headers())
    assert deleted.status_code in (200, 204), await deleted.get_data(as_text=True)
    assert not [k for k in s3.keys(bucket) if first["storage_key"] in k], "the photo's objects are gone"
    assert [k for k in s3.keys(bucket) if rows[1]["storage_key"] in k]


async def test_watermarked_download_is_cached_in_the_bucket(admin: AuthActions, guest: Any, services: Services,
                                                           s3: S3Server, bucket: str) -> None:
    gallery = await published(admin, name="Marked", watermark=True)
    assert (await admin_upload(admin, gallery["id"], [("m.jpg", jpeg(5))])).status_code == 202
    await run_pool_until_idle(services)
    [row] = await photo_rows(services)
    first = await guest.get(f"/g/{gallery['slug']}/photos/{row['id']}/download")
    assert first.status_code == 200
    [cached] = [k for k in s3.keys(bucket) if ".wm-" in k]
    assert object_bytes(s3, bucket, cached) == await first.get_data()
    archive = await guest.get(f"/g/{gallery['slug']}/download")
    with zipfile.ZipFile(io.BytesIO(await archive.get_data())) as z:
        assert [z.read(n) for n in z.namelist()] == [await first.get_data()]


async def test_presigned_redirect_only_after_the_access_check(tmp_path: Path, s3: S3Server, bucket: str
                                                              ) -> None:
    from .conftest import own_services

    with own_services(tmp_path, **s3.settings_for(bucket, s3_presigned_redirects=True)) as svc:
        from picpeak_lite.ops import bootstrap
        from picpeak_lite.web.app import create_app

        from .conftest import ADMIN_PASSWORD

        bootstrap.ensure_admin(svc.settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
        app = create_app(svc)
        admin = AuthActions(app.test_client())
        assert (await admin.login()).status_code == 302
        guest = app.test_client()
        gallery = await published(admin, name="Signed")
        data = jpeg(7)
        assert (await admin_upload(admin, gallery["id"], [("s.jpg", data)])).status_code == 202
        await run_pool_until_idle(svc)
        [row] = await photo_rows(svc)
        response = await guest.get(f"/g/{gallery['slug']}/photos/{row['id']}/download")
        assert response.status_code == 302
        assert response.headers["Cache-Control"] == "private, no-store"
        location = response.headers["Location"]
        assert location.startswith(s3.url) and "Signature" in location
        fetched = await trio.to_thread.run_sync(lambda: httpx.get(location, timeout=120))
        assert fetched.status_code == 200 and fetched.content == data
        assert fetched.headers["Content-Disposition"].startswith("attachment;")
        # The bucket itself is private: the same object without a signature is refused.
        bare = await trio.to_thread.run_sync(lambda: httpx.get(location.split("?", 1)[0], timeout=120))
        assert bare.status_code == 403 or not s3.private_buckets
        # No access, no URL: a gallery that is not published answers 404, never a redirect.
        draft = await admin.create_gallery(name="Draft")
        refused = await guest.get(f"/g/{draft['slug']}/photos/{row['id']}/download")
        assert refused.status_code == 404 and "Location" not in refused.headers


def test_multipart_upload_is_verified_part_by_part(tmp_path: Path, s3: S3Server, bucket: str) -> None:
    settings = make_settings(tmp_path, **s3.settings_for(bucket))
    storage = S3Storage.from_settings(settings)
    small = S3Storage(root=storage.root, bucket=bucket, prefix="", client=storage.client,
                      multipart_threshold=5 * 1024 * 1024, part_bytes=5 * 1024 * 1024)
    small.create_dirs()
    data = os.urandom(12 * 1024 * 1024 + 123)  # three parts
    temp = small.new_temp_path()
    temp.write_bytes(data)
    key = new_key()
    small.commit_original(temp, key, hashlib.sha256(data).hexdigest())
    assert not temp.exists()
    head = s3.client().head_object(Bucket=bucket, Key=original_name(key))
    assert head["ContentLength"] == len(data)
    assert small.sha256_of(original_name(key)) == hashlib.sha256(data).hexdigest()
    assert small.read_range(original_name(key), 5 * 1024 * 1024 - 2, 4) == data[5 * 1024 * 1024 - 2:][:4]
    # A temp file that is not what the intake hashed is never stored.
    temp = small.new_temp_path()
    temp.write_bytes(data)
    other = new_key()
    with pytest.raises(OSError, match="changed on disk"):
        small.commit_original(temp, other, hashlib.sha256(b"something else").hexdigest())
    assert not small.has_original(other)
    assert s3.pending_uploads(bucket) == [] or not s3.aborts_uploads


async def test_upload_over_the_multipart_threshold_is_accepted_on_both_servers(
        admin: AuthActions, services: Services, s3: S3Server, bucket: str) -> None:
    """A 17 MB photo goes up in three parts. s3rver answers the completed upload with the whole object's MD5 as
    its ETag (moto: md5-of-md5s-N); the upload was refused with a 500 there, though stored as sent."""
    gallery = await published(admin, name="Large")
    big = jpeg(50) + os.urandom(17 * 1024 * 1024)  # a JPEG with trailing bytes: still the photo, now 17 MB
    response = await admin_upload(admin, gallery["id"], [("big.jpg", big)])
    assert response.status_code == 202, await response.get_data(as_text=True)
    [row] = await photo_rows(services)
    assert object_bytes(s3, bucket, "lib/" + original_name(row["storage_key"])) == big


async def test_check_reconciler_and_backup_list_the_bucket(admin: AuthActions, services: Services,
                                                          settings: Settings, s3: S3Server, bucket: str,
                                                          tmp_path: Path) -> None:
    gallery = await published(admin, name="Checked")
    sent = [(f"{i}.jpg", jpeg(10 + i)) for i in range(3)]
    assert (await admin_upload(admin, gallery["id"], sent)).status_code == 202
    await run_pool_until_idle(services)
    rows = await photo_rows(services)
    client = s3.client()
    client.delete_object(Bucket=bucket, Key=f"lib/derived/{rows[0]['storage_key'][:2]}/"
                                            f"{rows[0]['storage_key']}.grid.jpg")  # a thumbnail lost
    orphan = new_key()
    client.put_object(Bucket=bucket, Key="lib/" + original_name(orphan), Body=b"no row")
    report = await trio.to_thread.run_sync(lambda: check_data_dir(settings, grace=60, now=_later()))
    assert report.missing_derivatives == [rows[0]["id"]]
    assert [p.name for p in report.orphans] == [orphan]
    assert report.originals_checked == 3 and report.sha_mismatch == [] and report.missing_original == []

    dest = tmp_path / "backup"
    summary = await trio.to_thread.run_sync(backup, settings, dest)
    assert summary.problems == 0 and summary.copied == 3 + 2 * 3 - 1
    for row, (_, data) in zip(rows, sent, strict=True):
        assert (dest / original_name(row["storage_key"])).read_bytes() == data

    # The reconciler lists the bucket too: the orphan goes, a row whose original vanished fails.
    client.delete_object(Bucket=bucket, Key="lib/" + original_name(rows[2]["storage_key"]))
    janitor = Janitor(services, orphan_grace=-120)
    counts = await janitor.reconcile()
    assert counts["orphans_removed"] == 1 and counts["missing_failed"] == 1
    assert not [k for k in s3.keys(bucket) if orphan in k]


def _later() -> float:
    import time

    return time.time() + 600


async def test_a_worker_cancelled_mid_photo_removes_its_local_copy(admin: AuthActions, services: Services,
                                                                   settings: Settings) -> None:
    """The worker reads the original from a temp copy of the object; cancelled while it decodes (shutdown),
    it hands the photo back and the copy is gone."""
    from picpeak_lite.pipeline.worker import WorkerPool

    gallery = await admin.create_gallery()
    assert (await admin_upload(admin, gallery["id"], [("big.jpg", jpeg(9, (4000, 3000)))])).status_code == 202
    tmp = settings.data_path / "tmp"
    seen_copy = False
    with trio.fail_after(120):  # a hung-test stop only
        async with trio.open_nursery() as nursery:
            await nursery.start(WorkerPool(services, count=1, poll_seconds=0.05).run)
            while not seen_copy:
                seen_copy = tmp.exists() and any(tmp.iterdir())
                await trio.sleep(0.002)
            nursery.cancel_scope.cancel()
    assert seen_copy and list(tmp.iterdir()) == []
    [row] = await photo_rows(services)
    assert (row["status"], row["attempts"]) == ("pending", 0)


async def test_import_folder_into_the_bucket(admin: AuthActions, services: Services, settings: Settings,
                                            s3: S3Server, bucket: str, tmp_path: Path) -> None:
    from picpeak_lite.ops import importer

    gallery = await published(admin, name="Card")
    folder = tmp_path / "card"
    folder.mkdir()
    sent = {f"{i}.jpg": jpeg(60 + i) for i in range(3)}
    for name, data in sent.items():
        (folder / name).write_bytes(data)
    summary = await trio.to_thread.run_sync(importer.run_import, settings, folder, gallery["slug"])
    assert (summary.added, summary.errors) == (3, [])
    for row in await photo_rows(services):
        assert object_bytes(s3, bucket, "lib/" + original_name(row["storage_key"])) == sent[row["display_name"]]
    assert local_files(settings) == []
