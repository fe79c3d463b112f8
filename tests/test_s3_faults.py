"""S3 storage faults against a real server process that the test stops and starts again.

The bucket unreachable: an upload answers 503 with Retry-After and records nothing (no row, no upload group,
no temp file); a worker hands its photo back without spending an attempt and backs off; once the server is
back, both work. Wrong credentials: one sentence at start, not a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from picpeak_lite.config import Settings
from picpeak_lite.errors import ConfigError, StorageUnavailable
from picpeak_lite.pipeline.worker import WorkerPool
from picpeak_lite.services import Services
from picpeak_lite.store.s3 import S3Storage
from picpeak_lite.store.storage import original_name

from .conftest import AuthActions, make_settings
from .factories import run_pool_until_idle
from .harness import cli, figures, query, write_config
from .harness import temp_files as temp_paths
from .s3server import MotoServer
from .test_s3 import jpeg, photo_rows
from .test_streaming_intake import HANG_GUARD, _open_upload, _wait
from .test_upload import _serve, admin_upload, multipart, read_response

pytestmark = pytest.mark.system


@pytest.fixture
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:  # its own: these tests stop it
        yield server


@pytest.fixture
def bucket(moto: MotoServer) -> str:
    return moto.new_bucket()


@pytest.fixture
def settings(tmp_path: Path, moto: MotoServer, bucket: str) -> Settings:
    return make_settings(tmp_path, **moto.settings_for(bucket))


async def count(services: Services, table: str) -> int:
    rows = await services.db.read(lambda c: c.execute(f"SELECT count(*) AS n FROM {table}").fetchall())
    return int(rows[0]["n"])


def temp_files(settings: Settings) -> list[Path]:
    tmp = settings.data_path / "tmp"
    return sorted(tmp.iterdir()) if tmp.exists() else []


async def test_bucket_down_upload_is_503_with_retry_after_and_nothing_half_recorded(
        admin: AuthActions, services: Services, settings: Settings, moto: MotoServer, bucket: str) -> None:
    gallery = await admin.create_gallery()
    assert (await admin_upload(admin, gallery["id"], [("before.jpg", jpeg(1))])).status_code == 202
    photos, uploads = await count(services, "photos"), await count(services, "uploads")

    moto.stop()
    response = await admin_upload(admin, gallery["id"], [("x.jpg", jpeg(2)), ("y.jpg", jpeg(3))])
    assert response.status_code == 503, await response.get_data(as_text=True)
    assert int(response.headers["Retry-After"]) > 0
    assert "try again" in (await response.get_json())["error"]
    assert (await count(services, "photos"), await count(services, "uploads")) == (photos, uploads)
    assert temp_files(settings) == []

    moto.start()  # moto starts empty: the bucket is made again, as an operator would restore it
    again = await admin_upload(admin, gallery["id"], [("x.jpg", jpeg(2))])
    assert again.status_code == 202, await again.get_data(as_text=True)
    [row] = [r for r in await photo_rows(services) if r["display_name"] == "x.jpg"]
    assert original_name(row["storage_key"]) in moto.keys(bucket)


async def test_frozen_bucket_upload_is_503_with_retry_after_then_works_when_it_thaws(
        admin: AuthActions, services: Services, settings: Settings, moto: MotoServer, bucket: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A bucket that accepts connections and never answers (its process stopped) held uploads for as long as it
    was frozen (60 s per attempt); with s3_timeout_seconds (the default 5 s here: a shorter one could time out
    a merely slow moto on a loaded machine) the upload is answered 503 with Retry-After, and nothing is kept."""
    gallery = await admin.create_gallery()
    photos, uploads = await count(services, "photos"), await count(services, "uploads")
    moto.freeze()
    try:
        began = trio.current_time()
        with trio.fail_after(HANG_GUARD):  # a hang guard, not a bound on speed
            response = await admin_upload(admin, gallery["id"], [("x.jpg", jpeg(2))])
        waited = trio.current_time() - began
    finally:
        moto.thaw()
    figures(capsys, f"s3 frozen bucket: upload answered {response.status_code} after {waited:.1f} s "
                    f"(s3_timeout_seconds={settings.s3_timeout_seconds:g})")
    assert response.status_code == 503, await response.get_data(as_text=True)
    assert int(response.headers["Retry-After"]) > 0
    assert (await count(services, "photos"), await count(services, "uploads")) == (photos, uploads)
    assert temp_files(settings) == []
    again = await admin_upload(admin, gallery["id"], [("x.jpg", jpeg(2))])
    assert again.status_code == 202, await again.get_data(as_text=True)
    [row] = [r for r in await photo_rows(services) if r["display_name"] == "x.jpg"]
    assert original_name(row["storage_key"]) in moto.keys(bucket)


async def test_worker_backs_off_without_spending_attempts_then_processes(
        admin: AuthActions, services: Services, moto: MotoServer, bucket: str) -> None:
    gallery = await admin.create_gallery()
    data = jpeg(4)
    assert (await admin_upload(admin, gallery["id"], [("w.jpg", data)])).status_code == 202
    [row] = await photo_rows(services)

    moto.stop()
    pool = WorkerPool(services, count=1)
    for _ in range(services.settings.max_attempts + 1):  # more tries than attempts: none may count
        with pytest.raises(StorageUnavailable):
            await pool.process_one()
    [after] = await photo_rows(services)
    assert (after["status"], after["attempts"], after["error"]) == ("pending", 0, None)

    moto.start()
    moto.client().put_object(Bucket=bucket, Key=original_name(row["storage_key"]), Body=data)  # restored
    await run_pool_until_idle(services)
    [done] = await photo_rows(services)
    assert done["status"] == "complete"


def test_wrong_credentials_missing_bucket_or_no_server_are_one_sentence(tmp_path: Path, moto: MotoServer,
                                                                        bucket: str) -> None:
    with MotoServer(check_credentials=True) as strict, pytest.raises(
            ConfigError, match=r"refused the credentials .* AWS_ACCESS_KEY_ID"):
        S3Storage.from_settings(make_settings(tmp_path, **strict.settings_for(bucket))).check_access()
    settings = make_settings(tmp_path, **moto.settings_for("no-such-bucket"))
    with pytest.raises(ConfigError, match="does not exist"):
        S3Storage.from_settings(settings).check_access()
    moto.stop()
    with pytest.raises(ConfigError, match="cannot reach"):
        S3Storage.from_settings(make_settings(tmp_path, **moto.settings_for(bucket))).check_access()


def test_serve_with_refused_credentials_exits_with_a_sentence(tmp_path: Path) -> None:
    with MotoServer(check_credentials=True) as strict:
        config = write_config(tmp_path / "picpeak.toml", data_dir=str(tmp_path / "data"), port=0,
                              **strict.settings_for("photos"))
        result = cli("serve", "--config", str(config), env={"PICPEAK_ADMIN_PASSWORD": "correct horse battery"})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "refused the credentials" in result.stderr and "Traceback" not in result.stderr


async def test_bucket_stops_mid_request_real_server(tmp_path: Path, moto: MotoServer, bucket: str) -> None:
    """The real server over a raw socket: the first file of a request is in the bucket with its provisional
    row, then the bucket goes away before the second arrives. The request answers 503 + Retry-After and keeps
    nothing: the first file's row is taken back too (its object, which could not be deleted with the bucket
    down, is an orphan for the reconciler). With the bucket back, the same request is accepted."""
    settings = make_settings(tmp_path, shutdown_grace_seconds=1, processing_enabled=False,
                             **moto.settings_for(bucket))
    data = settings.data_path
    async with trio.open_nursery() as nursery:
        running, token = await _serve(settings, nursery)
        body, _ = multipart([("a.jpg", jpeg(1)), ("b.jpg", jpeg(2))])
        cut = body.index(b'filename="b.jpg"')
        stream = await _open_upload(running.url, token, body)
        await stream.send_all(body[:cut])
        await _wait(lambda: len(query(data, "SELECT id FROM photos")) == 1)
        assert [k for k in moto.keys(bucket) if k.startswith("originals/")]
        moto.stop()
        await stream.send_all(body[cut:])
        with trio.fail_after(HANG_GUARD):
            head, answer = await read_response(stream)
        await stream.aclose()
        assert head.startswith(b"HTTP/1.1 503"), head + answer
        assert re.search(rb"(?i)\r\nretry-after: *\d+", head)
        assert query(data, "SELECT id FROM photos") == [] and query(data, "SELECT id FROM uploads") == []
        assert temp_paths(data) == []

        moto.start()
        stream = await _open_upload(running.url, token, body)
        await stream.send_all(body)
        with trio.fail_after(HANG_GUARD):
            head, answer = await read_response(stream)
        await stream.aclose()
        assert head.startswith(b"HTTP/1.1 202"), head + answer
        assert len(query(data, "SELECT id FROM photos")) == 2
        running.stop()
