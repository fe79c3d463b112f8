"""A complete tus upload is a photo, or a refusal the client can see (issue 28).

Once every byte is durable, making the photo is the server's job. Each test here makes the last step fail for
real, exactly after the last byte: the bucket is stopped (moto's own process), the disk is full (a tmpfs out of
inodes: the kernel's own ENOSPC), or the server is killed with -9 while the photo is being stored. In each a
standard tus client (tuspy, with retries) sends the file, and reports success only once the photo exists; HEAD
never answers the full offset while the photo does not exist (423 with Retry-After instead); and the photo
exists after the fault is mended, made by the server itself (the finisher) or by the client's next request.

The bounded tries and the readable final failure are checked on trio's autojump clock against a bucket that
never answers (a closed port).
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
import trio
from tusclient import client as tus_client

from picpeak_lite.pipeline import resumable
from picpeak_lite.pipeline.janitor import Janitor
from picpeak_lite.services import Services
from picpeak_lite.store.db import Database
from picpeak_lite.web.app import create_app

from .conftest import make_settings
from .factories import photo_jpeg
from .harness import ServerProcess, figures, query, sha256, tmpfs, write_config
from .s3server import MotoServer, free_port
from .served import prepare

pytestmark = pytest.mark.system

TUS = {"Tus-Resumable": "1.0.0"}
LAST = 200_000  # the bytes of the last PATCH


def jpeg_file(tmp_path: Path, seed: int) -> tuple[Path, bytes]:
    data = photo_jpeg(seed, size=(1200, 900), quality=95) + bytes(1_500_000)
    path = tmp_path / f"photo{seed}.jpg"
    path.write_bytes(data)
    return path, data


def uploader(endpoint: str, path: Path, headers: dict[str, str], *, resume: str | None = None,
             retries: int = 0) -> Any:
    """tuspy's own uploader (sync: call it in a thread); with ``resume`` it asks HEAD where the upload is."""
    return tus_client.TusClient(endpoint, headers=headers).uploader(
        str(path), chunk_size=1_000_000, metadata={"filename": path.name}, url=resume, retries=retries,
        retry_delay=0.5)


def tuspy(endpoint: str, path: Path, headers: dict[str, str], *, resume: str | None = None,
          stop_at: int | None = None, retries: int = 0) -> tuple[str, dict[str, str]]:
    """An upload with tuspy: its URL and the last answer's headers. Returning is the client's "success";
    any exception its failure."""
    up = uploader(endpoint, path, headers, resume=resume, retries=retries)
    up.upload(stop_at=stop_at)
    return up.url, up.request.response_headers if up.request else {}


def tus_row(data_dir: Path) -> dict[str, Any]:
    [row] = query(data_dir, "SELECT * FROM tus_uploads")
    return row


async def start_server(tmp_path: Path, settings: dict[str, Any]) -> tuple[ServerProcess, str, dict[str, str]]:
    """A real server process on ``tmp_path/data`` with these settings: the process, its URL, the admin's
    headers (an API token)."""
    config = write_config(tmp_path / "picpeak.toml", log_level="warning", **settings)
    token = prepare(make_settings(tmp_path, **settings))
    proc = ServerProcess(tmp_path / "data", config)
    url = await trio.to_thread.run_sync(proc.start)
    return proc, url, {"Authorization": f"Bearer {token}"}


async def last_step_fails(tmp_path: Path, capsys: Any, name: str, settings: dict[str, Any],
                          brk: Callable[[], Awaitable[None]], mend: Callable[[], Awaitable[None]]) -> None:
    """The file is sent up to its last PATCH; ``brk`` breaks the last step; tuspy's last PATCH fails, and a
    resume while the fault lasts does not report success; ``mend``; a retrying tuspy reports success with
    the photo, which exists."""
    data_dir = tmp_path / "data"
    proc, url, headers = await start_server(tmp_path, settings)
    path, data = jpeg_file(tmp_path, 31)
    endpoint = url + "/api/admin/galleries/1/tus"
    try:
        location, _ = await trio.to_thread.run_sync(lambda: tuspy(endpoint, path, headers, stop_at=len(data) - LAST))
        # A second tuspy client that retries (300 times, 0.5 s apart) has resumed the upload too (its HEAD said
        # where it is) and will send its end once the fault is there.
        retrying = await trio.to_thread.run_sync(lambda: uploader(endpoint, path, headers, resume=location,
                                                                  retries=300))
        await brk()
        # The last PATCH: every byte arrives and is durable, the photo cannot be made. Not a success.
        with pytest.raises(Exception) as last_patch:  # tuspy's own failure, whatever its kind
            await trio.to_thread.run_sync(lambda: tuspy(endpoint, path, headers, resume=location))
        row = tus_row(data_dir)
        assert row["upload_offset"] == row["upload_length"] == len(data) and row["state"] == "receiving"
        # The client (or the page after a reload) resumes while the fault lasts: it must not report success
        # while no photo exists, as it would if HEAD answered the full offset.
        try:
            await trio.to_thread.run_sync(lambda: tuspy(endpoint, path, headers, resume=location))
            resumed = "success"
        except Exception as error:
            resumed = type(error).__name__
        photos = query(data_dir, "SELECT count(*) AS n FROM photos")[0]["n"]
        assert resumed != "success" or photos == 1, "tuspy reported success and no photo exists"
        assert photos == 0
        async with httpx.AsyncClient(headers=headers, timeout=120) as http:
            head = await http.head(location, headers=TUS)
            # HEAD does not say "done" (the full offset): 423, when to ask again, and why.
            assert head.status_code == 423 and "upload-offset" not in head.headers, head.headers
            assert int(head.headers["retry-after"]) >= 1 and unquote(head.headers["picpeak-error"])
            failed_tries = tus_row(data_dir)["finish_attempts"]
            assert failed_tries >= 1
            # The retrying client sends its end now (409: the upload is further on; then HEAD: 423, retried)
            # and is still at it when the fault is mended: it reports success once the photo exists, made by the
            # server itself or on the client's next request.
            outcome: dict[str, Any] = {}

            async def client() -> None:
                try:
                    await trio.to_thread.run_sync(retrying.upload)
                    outcome["answer"] = retrying.request.response_headers if retrying.request else {}
                except Exception as error:
                    outcome["error"] = error

            began = time.monotonic()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client)
                await mend()
            recovered_s = time.monotonic() - began
            assert "error" not in outcome, repr(outcome.get("error"))
            head = await http.head(location, headers=TUS)
            assert head.status_code == 200 and head.headers["upload-offset"] == str(len(data))
            photo_id = int(head.headers["picpeak-photo-id"])
            assert outcome["answer"].get("picpeak-photo-id") == str(photo_id)
        rows = query(data_dir, "SELECT id, sha256 FROM photos")
        assert rows == [{"id": photo_id, "sha256": sha256(data)}]
        assert tus_row(data_dir)["state"] == "done"
        assert not (data_dir / "tmp" / "tus" / location.rsplit("/", 1)[1]).exists()
        assert not proc.tracebacks(), "\n".join(proc.tracebacks())
        figures(capsys, f"{name}: size={len(data)} last_patch={type(last_patch.value).__name__} "
                        f"resume_while_broken={resumed} head_while_broken=423 failed_tries={failed_tries} "
                        f"retrying_client_success_after_mend_s={recovered_s:.1f} photos={len(rows)}")
    finally:
        proc.kill()


async def test_bucket_down_at_the_last_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with MotoServer() as moto:
        bucket = moto.new_bucket()

        async def stop() -> None:
            await trio.to_thread.run_sync(moto.stop)

        async def start() -> None:
            await trio.to_thread.run_sync(moto.start)

        # The bytes on the local disk (tus_bytes "auto" would put them in the bucket on PostgreSQL, and moto
        # starts again empty): the bucket fails only the photo's own store. With the bytes in the bucket, a bucket
        # down fails the PATCH itself (tests/test_tus_bucket.py).
        await last_step_fails(tmp_path, capsys, "tus_finish_bucket_down",
                              moto.settings_for(bucket, tus_bytes="local"), stop, start)


async def test_disk_full_at_the_last_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The data directory on a tmpfs with few inodes. The last chunk appends to the upload's file (no new
    # inode); storing the photo needs one (its link or copy, its folder): filled up just before, a real ENOSPC.
    with tmpfs(tmp_path / "data", 64, inodes=4000, why="the full-disk finishing test") as mount:
        filler = mount / "filler"

        async def fill() -> None:
            def run() -> None:
                filler.mkdir()
                for i in range(10_000):
                    try:
                        (filler / str(i)).touch()
                    except OSError:
                        return
                raise AssertionError("the tmpfs never ran out of inodes")
            await trio.to_thread.run_sync(run)

        async def free() -> None:
            await trio.to_thread.run_sync(shutil.rmtree, filler)

        await last_step_fails(tmp_path, capsys, "tus_finish_disk_full", {}, fill, free)


async def test_kill_9_between_the_last_byte_and_the_photo(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The bucket is paused (SIGSTOP) so that the server is storing the photo when it is killed: every byte of
    the upload is durable and its photo does not exist. After the restart a tuspy client that resumes the upload
    reports success with the photo, which exists."""
    with MotoServer() as moto:
        bucket = moto.new_bucket()
        # The bytes on the local disk, so that every byte is durable while the paused bucket holds the photo's
        # store (with tus_bytes "auto" on PostgreSQL the paused bucket would hold the last PATCH's piece instead).
        settings = moto.settings_for(bucket, tus_bytes="local")
        data_dir = tmp_path / "data"
        proc, url, headers = await start_server(tmp_path, settings)
        path, data = jpeg_file(tmp_path, 32)
        try:
            location, _ = await trio.to_thread.run_sync(lambda: tuspy(
                url + "/api/admin/galleries/1/tus", path, headers, stop_at=len(data) - LAST))
            assert moto.proc is not None
            moto.proc.send_signal(signal.SIGSTOP)
            outcome: dict[str, Any] = {}

            def last_patch() -> None:
                try:
                    outcome["answer"] = tuspy(url + "/api/admin/galleries/1/tus", path, headers, resume=location)
                except Exception as error:
                    outcome["error"] = error

            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, last_patch)
                with trio.fail_after(120):  # a hung-test stop only
                    while tus_row(data_dir)["upload_offset"] < len(data):
                        await trio.sleep(0.05)
                await trio.sleep(0.5)  # the server is in the bucket's upload now (it never answers)
                assert query(data_dir, "SELECT count(*) AS n FROM photos")[0]["n"] == 0
                proc.kill()
                moto.proc.send_signal(signal.SIGCONT)
            # Killed mid-answer, the client did not report success.
            assert "error" in outcome and "answer" not in outcome
            row = tus_row(data_dir)
            assert row["upload_offset"] == len(data) and row["state"] == "receiving" and row["photo_id"] is None
            url = await trio.to_thread.run_sync(proc.start)
            location = url + location[location.index("/api/"):]
            # tuspy resumes (its first HEAD is not retried: a 423 while the photo is being made is its failure,
            # and it is started again, as its user would); whenever it reports success the photo exists.
            attempts = 0
            with trio.fail_after(300):  # a hung-test stop only
                while True:
                    attempts += 1
                    try:
                        _, last = await trio.to_thread.run_sync(lambda: tuspy(
                            url + "/api/admin/galleries/1/tus", path, headers, resume=location, retries=300))
                        break
                    except Exception:
                        await trio.sleep(0.5)
                    assert query(data_dir, "SELECT count(*) AS n FROM photos")[0]["n"] in (0, 1)
            assert query(data_dir, "SELECT count(*) AS n FROM photos")[0]["n"] == 1
            async with httpx.AsyncClient(headers=headers, timeout=120) as http:
                head = await http.head(location, headers=TUS)
            assert head.status_code == 200 and head.headers["upload-offset"] == str(len(data))
            photo_id = int(head.headers["picpeak-photo-id"])
            assert last.get("picpeak-photo-id", str(photo_id)) == str(photo_id)
            rows = query(data_dir, "SELECT id, sha256 FROM photos")
            assert rows == [{"id": photo_id, "sha256": sha256(data)}]
            figures(capsys, f"tus_finish_kill9: size={len(data)} offset_at_kill={row['upload_offset']} "
                            f"photos_at_kill=0 client_after_kill={type(outcome['error']).__name__} "
                            f"client_runs_after_restart={attempts} photos_after_restart={len(rows)}")
        finally:
            proc.kill()
            if moto.proc is not None:
                moto.proc.send_signal(signal.SIGCONT)


async def test_tries_are_bounded_and_the_last_failure_is_told(tmp_path: Path, autojump_clock: Any) -> None:
    """A bucket that never answers (nothing listens on its port): the first try answers 503 with Retry-After;
    HEAD says 423 meanwhile; the finisher tries again when due, ``tus_finish_attempts`` times in all, then the
    upload is refused with a sentence (410 to HEAD and PATCH) and its bytes go."""
    moto = MotoServer()  # never started: its port is closed
    moto.port = free_port()
    # The bytes on the local disk (with them in the bucket, "auto" on PostgreSQL, the PATCH itself fails).
    settings = make_settings(tmp_path, tus_finish_attempts=3, **moto.settings_for("never", tus_bytes="local"))
    token = prepare(settings)
    base = time.time()
    svc = Services(settings=settings, db=Database(settings.database), monotonic=trio.current_time,
                   clock=lambda: base + trio.current_time())
    try:
        http = create_app(svc).test_client()
        auth = {"Authorization": f"Bearer {token}", **TUS}
        data = photo_jpeg(33)
        created = await http.post("/api/admin/galleries/1/tus", headers={**auth, "Upload-Length": str(len(data))})
        location = created.headers["Location"]
        answer = await http.patch(location, data=data, headers={
            **auth, "Content-Type": "application/offset+octet-stream", "Upload-Offset": "0"})
        assert answer.status_code == 503 and int(answer.headers["Retry-After"]) == 5
        assert "could not store it yet" in (await answer.get_json())["error"]
        head = await http.head(location, headers=auth)
        assert head.status_code == 423 and "Upload-Offset" not in head.headers
        # A client that PATCHes again at once (tus clients retry within seconds) is told to come back when the
        # try is due, and spends none: the tries are meant to span hours, not a client's retry loop.
        again = await http.patch(location, data=b"", headers={
            **auth, "Content-Type": "application/offset+octet-stream", "Upload-Offset": str(len(data))})
        assert again.status_code == 503 and int(again.headers["Retry-After"]) >= 1
        assert query(settings.data_path, "SELECT finish_attempts FROM tus_uploads")[0]["finish_attempts"] == 1
        finisher = resumable.Finisher(svc)
        assert await finisher.finish_due() == 0  # not due yet: nothing tried
        # The server is down for an hour: its group's lease runs out, yet the janitor does not abandon a group
        # whose file's photo is still to be made.
        await trio.sleep(3600)
        await Janitor(svc).renew_and_abandon_uploads()
        assert query(settings.data_path, "SELECT count(*) AS n FROM uploads")[0]["n"] == 1
        assert await finisher.finish_due() == 0  # the second try, failed: due 10 s later
        row = query(settings.data_path, "SELECT finish_attempts, finish_after FROM tus_uploads")[0]
        assert row["finish_attempts"] == 2 and row["finish_after"] - svc.clock() == pytest.approx(10, abs=1)
        await trio.sleep(10)
        assert await finisher.finish_due() == 1  # the third and last: refused, with why
        for ask in (http.head(location, headers=auth), http.patch(location, data=b"", headers={
                **auth, "Content-Type": "application/offset+octet-stream", "Upload-Offset": str(len(data))})):
            told = await ask
            assert told.status_code == 410
            sentence = unquote(told.headers["Picpeak-Error"]) if "Picpeak-Error" in told.headers else (
                await told.get_json())["error"]
            assert sentence.startswith("The server could not store this file after 3 tries"), sentence
        assert not resumable.partial_path(svc.storage, location.rsplit("/", 1)[1]).exists()
        assert query(settings.data_path, "SELECT count(*) AS n FROM photos")[0]["n"] == 0
        assert query(settings.data_path, "SELECT count(*) AS n FROM uploads")[0]["n"] == 0  # no photo: gone
    finally:
        svc.db.close()


async def test_a_client_gone_after_its_last_byte_still_gets_its_photo(tmp_path: Path) -> None:
    """The request that brought the last byte ends before it makes the photo (its client went, or a newer
    request took over): the bytes are durable, so the finisher is rung and makes the photo; no HEAD, no
    restart needed."""
    settings = make_settings(tmp_path)
    token = prepare(settings)
    svc = Services(settings=settings, db=Database(settings.database))
    try:
        http = create_app(svc).test_client()
        auth = {"Authorization": f"Bearer {token}", **TUS}
        data = photo_jpeg(34)
        created = await http.post("/api/admin/galleries/1/tus", headers={**auth, "Upload-Length": str(len(data))})
        tus_id = created.headers["Location"].rsplit("/", 1)[1]
        row = query(settings.data_path, "SELECT * FROM tus_uploads WHERE id = ?", tus_id)[0]

        async def body() -> Any:
            yield data

        wake = svc.finisher_bell.listen()
        # What the PATCH does up to its last durable byte, and no further (resumable.complete never asked).
        assert await resumable.write_chunk(svc, row, 0, body(), content_length=len(data), checksum=None) == len(data)
        assert wake.is_set()  # the finisher is woken: the photo is its to make now
        assert await resumable.Finisher(svc).finish_due() == 1
        assert query(settings.data_path, "SELECT photo_id FROM tus_uploads")[0]["photo_id"]
        photo = query(settings.data_path, "SELECT sha256, status FROM photos")
        assert [p["sha256"] for p in photo] == [sha256(data)] and photo[0]["status"] == "pending"
    finally:
        svc.db.close()
