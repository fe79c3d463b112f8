"""``picpeak-lite storage migrate`` against a real S3-compatible server process: a local library into a
bucket, interrupted and resumed, every original verified, the setting switched, then served from there; and
back to local. The command refuses while a server answers on the configured address."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from picpeak_lite.config import load_settings
from picpeak_lite.errors import CommandFailed
from picpeak_lite.ops import bootstrap
from picpeak_lite.ops.check import check_data_dir
from picpeak_lite.ops.migrate import migrate
from picpeak_lite.services import Services
from picpeak_lite.store.db import Database
from picpeak_lite.store.storage import original_name
from picpeak_lite.web.app import create_app

from .conftest import AuthActions
from .factories import create_gallery, published, run_pool_until_idle, stage_photo
from .harness import cli, write_config
from .s3server import SERVERS, S3Server
from .test_s3 import jpeg, photo_rows
from .test_upload import admin_upload

pytestmark = pytest.mark.system


@pytest.fixture(scope="module", params=sorted(SERVERS))
def s3(request: pytest.FixtureRequest) -> Iterator[S3Server]:
    """Each test against both S3 implementations (tests/s3server.py says how they differ)."""
    with SERVERS[request.param]() as server:
        yield server


class Interrupted(Exception):
    pass


def interrupt_after(n: int) -> Any:
    def progress(done: int, total: int, name: str) -> None:
        if done > n:
            raise Interrupted(name)
    return progress


async def test_migrate_to_s3_resumes_verifies_switches_and_back(admin: AuthActions, guest: Any,
                                                                services: Services, tmp_path: Path,
                                                                s3: S3Server) -> None:
    gallery = await published(admin, name="Moving")
    sent = [(f"{i}.jpg", jpeg(20 + i)) for i in range(3)]
    assert (await admin_upload(admin, gallery["id"], sent)).status_code == 202
    await run_pool_until_idle(services)
    rows = await photo_rows(services)
    bucket = s3.new_bucket()
    data_dir = services.settings.data_path
    config = write_config(tmp_path / "picpeak.toml", data_dir=str(data_dir), port=0,
                          **{k: v for k, v in s3.settings_for(bucket).items() if k != "storage"})
    local = load_settings(config, environ={})
    assert local.storage == "local"

    with pytest.raises(Interrupted):
        migrate(local, "s3", config, interrupt_after(4))
    assert load_settings(config, environ={}).storage == "local", "switched only when everything is there"
    assert len(s3.keys(bucket)) == 4  # 3 originals + 6 derivatives in all: interrupted on the way
    summary = migrate(local, "s3", config)
    assert (summary.objects, summary.kept, summary.copied, summary.problems) == (9, 4, 5, 0)
    assert summary.switched == str(config)

    on_s3 = load_settings(config, environ={})
    assert on_s3.storage == "s3"
    for row, (_, data) in zip(rows, sent, strict=True):
        assert s3.client().get_object(Bucket=bucket, Key=original_name(row["storage_key"]))["Body"].read() == data
    report = check_data_dir(on_s3, grace=0)
    assert report.problems == 0 and report.originals_checked == 3, report.summary()

    # Served from the bucket: the local files can go.
    shutil.rmtree(data_dir / "originals")
    shutil.rmtree(data_dir / "derived")
    svc = Services(settings=on_s3, db=Database(on_s3.database))
    try:
        app = create_app(svc)
        image = await app.test_client().get(f"/g/{gallery['slug']}/photos/{rows[0]['id']}/download")
        assert image.status_code == 200 and await image.get_data() == sent[0][1]
    finally:
        svc.db.close()

    back = migrate(on_s3, "local", config)
    assert (back.copied, back.problems) == (9, 0)
    assert load_settings(config, environ={}).storage == "local"
    assert all((data_dir / original_name(r["storage_key"])).read_bytes() == d
               for r, (_, d) in zip(rows, sent, strict=True))
    assert check_data_dir(load_settings(config, environ={}), grace=0).problems == 0


def test_migrate_command_refuses_while_the_server_answers(tmp_path: Path, s3: S3Server) -> None:
    settings_dir = tmp_path / "data"
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        config = write_config(tmp_path / "picpeak.toml", data_dir=str(settings_dir), port=port,
                              **{k: v for k, v in s3.settings_for(s3.new_bucket()).items() if k != "storage"})
        bootstrap.prepare(load_settings(config, environ={}))
        result = cli("storage", "migrate", "--to", "s3", "--config", str(config))
    assert result.returncode == 2, result.stderr
    assert "the server is answering at 127.0.0.1:" in result.stderr and "Traceback" not in result.stderr
    assert "storage" not in config.read_text().split("s3_")[0]


def test_migrate_command_end_to_end(tmp_path: Path, s3: S3Server) -> None:
    """The command as an operator runs it (an empty library: the copying is the test above): the warning, a
    summary, the setting switched, and a second run told there is nothing to do."""
    bucket = s3.new_bucket()
    config = write_config(tmp_path / "picpeak.toml", data_dir=str(tmp_path / "data"), port=0,
                          **{k: v for k, v in s3.settings_for(bucket).items() if k != "storage"})
    bootstrap.prepare(load_settings(config, environ={}))
    result = cli("storage", "migrate", "--to", "s3", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert "Stop the server" in result.stderr and "Migrated 0 objects" in result.stdout
    assert 'storage = "s3"' in config.read_text()
    again = cli("storage", "migrate", "--to", "s3", "--config", str(config))
    assert again.returncode == 2 and "already 's3'" in again.stderr


async def test_migrate_command_copies_an_original_over_the_multipart_threshold(admin: AuthActions,
                                                                              services: Services, tmp_path: Path,
                                                                              s3: S3Server) -> None:
    """A 17 MB original goes up as a multipart upload; s3rver answers it with the whole object's MD5 as ETag,
    where moto answers md5-of-md5s-N. Both are stored as sent, so both are copied (this ended in a traceback)."""
    gallery = await published(admin, name="Large")
    big = jpeg(40) + os.urandom(17 * 1024 * 1024)  # a JPEG with trailing bytes: still the photo, now 17 MB
    response = await admin_upload(admin, gallery["id"], [("big.jpg", big)])
    assert response.status_code == 202, await response.get_data(as_text=True)
    [row] = await photo_rows(services)
    bucket = s3.new_bucket()
    config = write_config(tmp_path / "picpeak.toml", data_dir=str(services.settings.data_path), port=0,
                          **{k: v for k, v in s3.settings_for(bucket).items() if k != "storage"})
    result = cli("storage", "migrate", "--to", "s3", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and 'storage = "s3"' in config.read_text()
    key = original_name(row["storage_key"])
    assert s3.client().get_object(Bucket=bucket, Key=key)["Body"].read() == big


async def test_migrate_stops_with_one_sentence_when_an_object_cannot_be_copied(services: Services,
                                                                               tmp_path: Path, s3: S3Server
                                                                               ) -> None:
    """An original that cannot be read (here a directory where its file was, the moment it is copied) stops the
    run with one sentence naming it, the setting unchanged; once it is put right, the same command goes on."""
    data_dir = services.settings.data_path
    config = write_config(tmp_path / "picpeak.toml", data_dir=str(data_dir), port=0,
                          **{k: v for k, v in s3.settings_for(s3.new_bucket()).items() if k != "storage"})
    local = load_settings(config, environ={})
    data = jpeg(41)
    stage_photo(services, await services.db.write(create_gallery), data)
    [row] = await photo_rows(services)
    key = row["storage_key"]
    path = data_dir / original_name(key)

    def replace_with_a_directory(done: int, total: int, name: str) -> None:
        if name == original_name(key) and path.is_file():
            path.unlink()
            path.mkdir()

    with pytest.raises(CommandFailed, match=r"could not copy originals/.* \(Is a directory\); the storage setting "
                                            r"was not changed: run the command again"):
        migrate(local, "s3", config, replace_with_a_directory)
    assert load_settings(config, environ={}).storage == "local"
    path.rmdir()
    path.write_bytes(data)
    summary = migrate(local, "s3", config)
    assert (summary.copied, summary.problems) == (1, 0) and load_settings(config, environ={}).storage == "s3"
