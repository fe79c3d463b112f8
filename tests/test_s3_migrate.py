"""``picpeak-lite storage migrate`` against a real S3-compatible server process: a local library into a
bucket, interrupted and resumed, every original verified, the setting switched, then served from there; and
back to local. The command refuses while a server answers on the configured address."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from picpeak_lite.config import load_settings
from picpeak_lite.ops import bootstrap
from picpeak_lite.ops.check import check_data_dir
from picpeak_lite.ops.migrate import migrate
from picpeak_lite.services import Services
from picpeak_lite.store.db import Database
from picpeak_lite.store.storage import original_name
from picpeak_lite.web.app import create_app

from .conftest import AuthActions
from .factories import published, run_pool_until_idle
from .harness import cli, write_config
from .s3server import MotoServer
from .test_s3 import jpeg, photo_rows
from .test_upload import admin_upload

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
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
                                                                moto: MotoServer) -> None:
    gallery = await published(admin, name="Moving")
    sent = [(f"{i}.jpg", jpeg(20 + i)) for i in range(3)]
    assert (await admin_upload(admin, gallery["id"], sent)).status_code == 202
    await run_pool_until_idle(services)
    rows = await photo_rows(services)
    bucket = moto.new_bucket()
    data_dir = services.settings.data_path
    config = write_config(tmp_path / "picpeak.toml", data_dir=str(data_dir), port=0,
                          **{k: v for k, v in moto.settings_for(bucket).items() if k != "storage"})
    local = load_settings(config, environ={})
    assert local.storage == "local"

    with pytest.raises(Interrupted):
        migrate(local, "s3", config, interrupt_after(4))
    assert load_settings(config, environ={}).storage == "local", "switched only when everything is there"
    assert len(moto.keys(bucket)) == 4  # 3 originals + 6 derivatives in all: interrupted on the way
    summary = migrate(local, "s3", config)
    assert (summary.objects, summary.kept, summary.copied, summary.problems) == (9, 4, 5, 0)
    assert summary.switched == str(config)

    on_s3 = load_settings(config, environ={})
    assert on_s3.storage == "s3"
    for row, (_, data) in zip(rows, sent, strict=True):
        assert moto.client().get_object(Bucket=bucket, Key=original_name(row["storage_key"]))["Body"].read() == data
    report = check_data_dir(on_s3, grace=0)
    assert report.problems == 0 and report.originals_checked == 3, report.summary()

    # Served from the bucket: the local files can go.
    shutil.rmtree(data_dir / "originals")
    shutil.rmtree(data_dir / "derived")
    svc = Services(settings=on_s3, db=Database(on_s3.database_path))
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


def test_migrate_command_refuses_while_the_server_answers(tmp_path: Path, moto: MotoServer) -> None:
    settings_dir = tmp_path / "data"
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        config = write_config(tmp_path / "picpeak.toml", data_dir=str(settings_dir), port=port,
                              **{k: v for k, v in moto.settings_for(moto.new_bucket()).items() if k != "storage"})
        bootstrap.prepare(load_settings(config, environ={}))
        result = cli("storage", "migrate", "--to", "s3", "--config", str(config))
    assert result.returncode == 2, result.stderr
    assert "the server is answering at 127.0.0.1:" in result.stderr and "Traceback" not in result.stderr
    assert "storage" not in config.read_text().split("s3_")[0]


def test_migrate_command_end_to_end(tmp_path: Path, moto: MotoServer) -> None:
    """The command as an operator runs it (an empty library: the copying is the test above): the warning, a
    summary, the setting switched, and a second run told there is nothing to do."""
    bucket = moto.new_bucket()
    config = write_config(tmp_path / "picpeak.toml", data_dir=str(tmp_path / "data"), port=0,
                          **{k: v for k, v in moto.settings_for(bucket).items() if k != "storage"})
    bootstrap.prepare(load_settings(config, environ={}))
    result = cli("storage", "migrate", "--to", "s3", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert "Stop the server" in result.stderr and "Migrated 0 objects" in result.stdout
    assert 'storage = "s3"' in config.read_text()
    again = cli("storage", "migrate", "--to", "s3", "--config", str(config))
    assert again.returncode == 2 and "already 's3'" in again.stderr
