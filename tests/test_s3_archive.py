"""Archive and restore with ``storage = "s3"`` against real S3-compatible server processes (tests/s3server.py):
the archive is one object in the bucket (a multipart upload when it is big: ``S3Storage.put_file``), read back
and checked before any loose object goes; restore puts every original back byte for byte and the workers remake
the images."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from picpeak_lite.config import load_settings
from picpeak_lite.ops import bootstrap
from picpeak_lite.ops.migrate import migrate
from picpeak_lite.pipeline import archive
from picpeak_lite.pipeline.archive import Archiver
from picpeak_lite.services import Services
from picpeak_lite.store.db import Database
from picpeak_lite.store.queries import archive as archive_q
from picpeak_lite.store.storage import original_name

from .conftest import AuthActions, make_settings
from .factories import create_gallery, photo_jpeg, published, run_pool_until_idle, stage_photo
from .harness import figures, write_config
from .s3server import S3Server
from .test_s3 import bucket, object_bytes, photo_rows, s3  # noqa: F401 -- the fixtures
from .test_upload import admin_upload

pytestmark = pytest.mark.system  # a real server process per module


@pytest.fixture
def settings(tmp_path: Path, s3: S3Server, bucket: str) -> Any:  # noqa: F811
    return make_settings(tmp_path, **s3.settings_for(bucket, s3_prefix="lib/"))


async def test_round_trip_in_the_bucket(admin: AuthActions, guest: Any, services: Services, s3: S3Server,  # noqa: F811
                                        bucket: str, capsys: Any) -> None:  # noqa: F811
    g = await published(admin, name="Bucket wedding")
    sent = [(f"p{i}.jpg", photo_jpeg(seed=70 + i)) for i in range(3)]
    assert (await admin_upload(admin, g["id"], sent)).status_code == 202
    await run_pool_until_idle(services)
    rows = await photo_rows(services)
    before = {r["id"]: hashlib.sha256(object_bytes(s3, bucket, "lib/" + original_name(r["storage_key"]))).hexdigest()
              for r in rows}
    assert before == {r["id"]: r["sha256"] for r in rows}
    objects_before = s3.keys(bucket, "lib/")
    assert len(objects_before) == 3 * len(rows)

    asked = await admin.client.post(f"/api/admin/galleries/{g['id']}/archive", headers=admin.headers())
    assert asked.status_code == 202
    [done] = await Archiver(services).pass_once()
    assert done.state == "archived" and done.error is None
    assert s3.keys(bucket, "lib/") == [f"lib/archives/gallery-{g['id']}.tar"]
    size = len(object_bytes(s3, bucket, f"lib/archives/gallery-{g['id']}.tar"))
    assert done.bytes_after == size and done.freed is not None and done.freed > 0
    figures(capsys, f"archive s3 ({s3.name}): {len(rows)} photos, {done.bytes_before} bytes before, "
                    f"{done.bytes_after} after, {done.freed} freed")
    assert (await guest.get(f"/g/{g['slug']}")).status_code == 410

    restore = await admin.client.post(f"/api/admin/galleries/{g['id']}/restore", headers=admin.headers())
    assert restore.status_code == 202
    [done] = await Archiver(services).pass_once()
    assert done.state == "active"
    after = {r["id"]: hashlib.sha256(object_bytes(s3, bucket, "lib/" + original_name(r["storage_key"]))).hexdigest()
             for r in await photo_rows(services)}
    assert after == before
    await run_pool_until_idle(services)
    assert {r["status"] for r in await photo_rows(services)} == {"complete"}
    assert sorted(s3.keys(bucket, "lib/")) == sorted(objects_before)
    assert (await guest.get(f"/g/{g['slug']}")).status_code == 200


async def test_storage_migrate_carries_the_archive_into_the_bucket(tmp_path: Path, s3: S3Server) -> None:  # noqa: F811
    """A gallery archived on local storage, the library moved into a bucket, the gallery restored from there."""
    bucket_name = s3.new_bucket()
    data_dir = tmp_path / "local"
    config = write_config(tmp_path / "picpeak.toml", data_dir=str(data_dir), port=0,
                          **{k: v for k, v in s3.settings_for(bucket_name).items() if k != "storage"})
    local = load_settings(config, environ={})
    bootstrap.prepare(local)
    svc = Services(settings=local, db=Database(local.database_path))
    try:
        gallery_id = await svc.db.write(create_gallery)
        for seed in (1, 2):
            photo_id, _ = stage_photo(svc, gallery_id, photo_jpeg(seed=seed))
            await svc.db.write(lambda c, i=photo_id: c.execute(  # type: ignore[misc]
                "UPDATE photos SET status = 'complete', completed_at = 1 WHERE id = ?", (i,)))
        rows = await svc.db.read(archive_q.photos_of, gallery_id)
        await svc.db.write(archive.request_archive, gallery_id)
        [done] = await Archiver(svc).pass_once()
        assert done.state == "archived"
    finally:
        svc.db.close()

    summary = migrate(local, "s3", config)
    assert summary.problems == 0 and summary.copied == 1, summary
    assert s3.keys(bucket_name) == [f"archives/gallery-{gallery_id}.tar"]
    on_s3 = load_settings(config, environ={})
    svc = Services(settings=on_s3, db=Database(on_s3.database_path))
    try:
        await svc.db.write(archive.request_restore, gallery_id)
        [done] = await Archiver(svc).pass_once()
        assert done.state == "active"
    finally:
        svc.db.close()
    for row in rows:
        data = object_bytes(s3, bucket_name, original_name(row["storage_key"]))
        assert hashlib.sha256(data).hexdigest() == row["sha256"]
