"""Archive and restore with ``storage = "s3"`` against real S3-compatible server processes (tests/s3server.py):
the archive is one object in the bucket (a multipart upload when it is big: ``S3Storage.put_file``), read back
and checked before any loose object goes; restore puts every original back byte for byte and the workers remake
the images."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from picpeak_lite.pipeline.archive import Archiver
from picpeak_lite.services import Services
from picpeak_lite.store.storage import original_name

from .conftest import AuthActions, make_settings
from .factories import photo_jpeg, published, run_pool_until_idle
from .harness import figures
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
