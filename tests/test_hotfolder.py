"""Hot folders (ops/hotfolder.py): files written into a watched folder become photos, each exactly once, never
half written, through the same intake and workers as an upload.

Real files written by real threads (a camera's FTP transfer is another process writing), real inotify (and the
polling fallback), the real worker pool and change feed. No wall-clock bound is asserted: the closed-to-complete
times are printed as a figures line.
"""

from __future__ import annotations

import hashlib
import math
import os
import statistics
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from picpeak_lite.events.feed import ChangeFeed
from picpeak_lite.media.wholefile import looks_whole
from picpeak_lite.ops import bootstrap
from picpeak_lite.ops.hotfolder import HotFolder, HotFolders
from picpeak_lite.pipeline.worker import WorkerPool
from picpeak_lite.services import Services
from picpeak_lite.store import db
from picpeak_lite.web.app import create_app

from . import imagefactory
from .conftest import ADMIN_PASSWORD, AuthActions, own_services, sql
from .factories import create_gallery, jpeg, png, webp

HANG_GUARD = 600  # only against a hang; nothing here is timed by assertion


@pytest.fixture(scope="module")
def camera_jpeg() -> bytes:
    """One 24 MP camera-like JPEG (6000x4000), made once: each file below is a variant of it."""
    return imagefactory.save(imagefactory.photo(6000, 4000, seed=7), "jpeg", quality=90)


def variant(data: bytes, n: int) -> bytes:
    """The same picture with a comment segment after SOI: other bytes (another sha256), still a whole JPEG."""
    body = f"frame {n}".encode()
    return data[:2] + b"\xff\xfe" + (len(body) + 2).to_bytes(2, "big") + body + data[2:]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Services]:
    with own_services(tmp_path, workers=1, hot_folder_settle_seconds=0.5) as services:
        yield services


def gallery(svc: Services) -> int:
    conn = db.connect(svc.settings.database_path)
    try:
        with db.transaction(conn):
            return create_gallery(conn, "Live")
    finally:
        conn.close()


@pytest.fixture
async def running(svc: Services) -> AsyncIterator[Services]:
    """The worker pool and the change feed of a server."""
    async with trio.open_nursery() as nursery:
        await nursery.start(WorkerPool(svc, count=1, poll_seconds=0.2).run)
        await nursery.start(ChangeFeed(svc, svc.broker, poll_seconds=0.02).run)
        yield svc
        nursery.cancel_scope.cancel()


def watcher(svc: Services, gallery_id: int, folder: Path, *, polling: bool | None = None) -> HotFolder:
    return HotFolder(db=svc.db, storage=svc.storage, settings=svc.settings, gallery_id=gallery_id, folder=folder,
                     clock=svc.clock, on_commit=svc.workers_bell.ring, polling=polling)


def photos(svc: Services, gallery_id: int) -> list[dict[str, Any]]:
    return sql(svc, "SELECT id, sha256, status, display_name, completed_at FROM photos WHERE gallery_id = ? "
                    "ORDER BY id", gallery_id)


async def wait_complete(svc: Services, gallery_id: int, count: int) -> list[dict[str, Any]]:
    with trio.fail_after(HANG_GUARD):
        while True:
            rows = photos(svc, gallery_id)
            if len(rows) >= count and all(r["status"] in ("complete", "failed") for r in rows):
                return rows
            await trio.sleep(0.05)


def write_slowly(path: Path, data: bytes, pieces: int, pause: float, closed: dict[str, float]) -> None:
    """An FTP-like sender: the file grows piece by piece with pauses longer than the quiet period."""
    step = -(-len(data) // pieces)
    with open(path, "wb") as f:
        for start in range(0, len(data), step):
            f.write(data[start:start + step])
            f.flush()
            time.sleep(pause)
    closed[path.name] = time.time()


# --- whether a file has reached its end ---

@pytest.mark.parametrize("data", [jpeg(), png(), webp()], ids=["jpeg", "png", "webp"])
def test_a_file_looks_whole_only_at_its_end(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "f"
    for cut in (len(data) // 4, len(data) // 2, len(data) - 3):
        path.write_bytes(data[:cut])
        assert not looks_whole(path), cut
    path.write_bytes(data)
    assert looks_whole(path)


def test_an_iso_media_file_looks_whole_when_its_boxes_add_up(tmp_path: Path) -> None:
    heif = imagefactory.save(imagefactory.photo(64, 48), "heif")
    path = tmp_path / "f.heic"
    path.write_bytes(heif[: len(heif) - 10])
    assert not looks_whole(path)
    path.write_bytes(heif)
    assert looks_whole(path)


def test_senders_temporary_names_are_never_taken(tmp_path: Path) -> None:
    from picpeak_lite.ops.importer import wanted

    for name in ("IMG_1.JPG.part", "IMG_1.jpg.filepart", ".IMG_1.jpg.x7Gq", ".in.IMG_1.jpg.", "a/.hidden/b.jpg",
                 "MISC/x.jpg", "IMG_1.tmp"):
        assert not wanted(tmp_path, tmp_path / name), name
    for name in ("IMG_1.JPG", "DCIM/100CANON/IMG_2.jpg", "x.heic"):
        assert wanted(tmp_path, tmp_path / name), name


# --- at camera pace, then a restart ---

async def test_camera_pace_each_file_one_photo_and_a_restart_takes_nothing_again(
        running: Services, tmp_path: Path, camera_jpeg: bytes) -> None:
    svc = running
    gallery_id = gallery(svc)
    folder = tmp_path / "card"
    (folder / "DCIM" / "100CANON").mkdir(parents=True)
    files = {f"DCIM/100CANON/IMG_{n:04d}.JPG": variant(camera_jpeg, n) for n in range(5)}
    closed: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        hot = watcher(svc, gallery_id, folder)
        await nursery.start(hot.run)
        for rel, data in files.items():  # one 24 MP file every 2 s, each written in 1 MiB pieces and closed
            path = folder / rel
            await trio.to_thread.run_sync(write_slowly, path, data, 12, 0.0, closed)
            closed[rel] = closed.pop(path.name)
            await trio.sleep(2)
        rows = await wait_complete(svc, gallery_id, len(files))
        nursery.cancel_scope.cancel()
    assert sorted(r["sha256"] for r in rows) == sorted(sha(d) for d in files.values())  # none half, none twice
    assert all(r["status"] == "complete" for r in rows)
    by_name = {r["display_name"]: r for r in rows}
    lags = sorted((by_name[Path(rel).name]["completed_at"] - closed[rel]) * 1000 for rel in files)
    p95 = lags[math.ceil(0.95 * len(lags)) - 1]  # nearest rank
    half = sum(1 for r in rows if r["sha256"] not in {sha(d) for d in files.values()})
    print(f"\nhotfolder: files={len(files)} photos={len(rows)} half={half} dup={hot.counts.duplicates} "
          f"closed_to_wall_ms p50={statistics.median(lags):.0f} p95={p95:.0f} (24 MP, one per 2 s, "
          f"settle {svc.settings.hot_folder_settle_seconds:g} s, 1 worker)")
    assert hot.counts.files == len(files) and hot.counts.photos == len(files)

    # A restart: the files are known by path, size and time, and none is read again.
    again = watcher(svc, gallery_id, folder)
    async with trio.open_nursery() as nursery:
        await nursery.start(again.run)
        await trio.sleep(1)  # a few quiet periods: nothing is waiting to be taken
        assert not again._seen
        nursery.cancel_scope.cancel()
    assert again.counts.files == 0
    # Even without that memory (a lost table), the intake finds the same bytes: duplicates, no new photo.
    sql(svc, "DELETE FROM hot_folder_files")
    forgetful = watcher(svc, gallery_id, folder)
    async with trio.open_nursery() as nursery:
        await nursery.start(forgetful.run)
        with trio.fail_after(HANG_GUARD):
            while forgetful.counts.files < len(files):
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    assert forgetful.counts.duplicates == len(files) and forgetful.counts.photos == 0
    assert len(photos(svc, gallery_id)) == len(files)


# --- a slow sender ---

@pytest.mark.parametrize("polling", [None, True], ids=["events", "polling"])
async def test_a_slow_sender_is_taken_once_whole_never_half(running: Services, tmp_path: Path,
                                                            polling: bool | None) -> None:
    """Ten pieces with a pause of 1 s after each (10 s in all), twice the quiet period: by quiet alone the file
    would be taken half at the first pause; it ends only with its last piece."""
    svc = running
    gallery_id = gallery(svc)
    folder = tmp_path / "ftp"
    folder.mkdir()
    data = imagefactory.save(imagefactory.photo(1200, 800, seed=3), "jpeg")
    closed: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        hot = watcher(svc, gallery_id, folder, polling=polling)
        await nursery.start(hot.run)
        await trio.to_thread.run_sync(write_slowly, folder / "IMG_0001.JPG", data, 10, 1.0, closed)
        rows = await wait_complete(svc, gallery_id, 1)
        await trio.sleep(1.5)  # any second take would come within a few quiet periods
        nursery.cancel_scope.cancel()
    rows = photos(svc, gallery_id)
    assert [r["sha256"] for r in rows] == [sha(data)]
    assert rows[0]["status"] == "complete"
    assert hot.counts.files == 1 and hot.counts.errors == 0
    assert hot.counts.polling is bool(polling)


async def test_a_sender_that_renames_when_done_is_taken_after_the_rename(running: Services,
                                                                         tmp_path: Path) -> None:
    svc = running
    gallery_id = gallery(svc)
    folder = tmp_path / "ftp"
    folder.mkdir()
    data = jpeg(seed=5)
    async with trio.open_nursery() as nursery:
        hot = watcher(svc, gallery_id, folder)
        await nursery.start(hot.run)
        # Half of it under the temporary name, quiet for longer than the quiet period: never looked at.
        part = folder / "IMG_0002.JPG.part"
        part.write_bytes(data[: len(data) // 2])
        await trio.sleep(1.5)
        assert photos(svc, gallery_id) == [] and not hot._seen
        part.write_bytes(data)
        os.rename(part, folder / "IMG_0002.JPG")
        rows = await wait_complete(svc, gallery_id, 1)
        nursery.cancel_scope.cancel()
    assert [r["sha256"] for r in rows] == [sha(data)]


async def test_files_in_a_new_subfolder_are_taken_though_they_came_before_its_watch(running: Services,
                                                                                     tmp_path: Path) -> None:
    """A card's new folder (DCIM/101CANON) with a file written into it at once: inotify watches a new folder
    only once it has seen it made, so the file may come first. The new folder is walked when it is reported."""
    svc = running
    gallery_id = gallery(svc)
    folder = tmp_path / "card"
    folder.mkdir()
    files = {f"DCIM/{100 + n}CANON/IMG_{n:04d}.JPG": jpeg(seed=30 + n) for n in range(1, 6)}
    async with trio.open_nursery() as nursery:
        hot = watcher(svc, gallery_id, folder)
        await nursery.start(hot.run)
        for rel, data in files.items():
            (folder / rel).parent.mkdir(parents=True)
            (folder / rel).write_bytes(data)
        rows = await wait_complete(svc, gallery_id, len(files))
        nursery.cancel_scope.cancel()
    assert sorted(r["sha256"] for r in rows) == sorted(sha(d) for d in files.values())


# --- a gallery's own hot folder, watched by the server ---

async def test_a_gallerys_hot_folder_is_set_inside_the_root_only_and_watched_by_the_server(
        tmp_path: Path) -> None:
    root = tmp_path / "hot"
    (root / "party").mkdir(parents=True)
    with own_services(tmp_path, hot_folder_root=str(root), hot_folder_settle_seconds=0.2) as svc:
        bootstrap.ensure_admin(svc.settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
        admin = AuthActions(create_app(svc).test_client())
        await admin.login()
        for outside in ("/etc", "../../etc", "party/../.."):
            refused = await admin.client.post("/api/admin/galleries", json={"name": "G", "hot_folder": outside},
                                              headers=admin.headers())
            assert refused.status_code == 400, outside
            assert "inside" in (await refused.get_json())["fields"]["hot_folder"]
        gallery_id = (await admin.create_gallery(hot_folder="party"))["id"]
        assert sql(svc, "SELECT hot_folder FROM galleries WHERE id = ?", gallery_id)[0]["hot_folder"] == str(
            root.resolve() / "party")

        # The server's task watches it, and takes what is written into it (and into its subfolders).
        data = jpeg(seed=9)
        async with trio.open_nursery() as nursery:
            await nursery.start(WorkerPool(svc, count=1, poll_seconds=0.2).run)
            folders = HotFolders(svc, poll_seconds=0.1)
            await nursery.start(folders.run)
            assert gallery_id in folders.running
            await trio.sleep(1)  # its watcher is started by then: the subfolder below is new to it
            (root / "party" / "cam").mkdir()
            (root / "party" / "cam" / "IMG_1.JPG").write_bytes(data)
            rows = await wait_complete(svc, gallery_id, 1)
            # Cleared on the form: the watcher stops.
            cleared = await admin.client.patch(f"/api/admin/galleries/{gallery_id}", json={"hot_folder": ""},
                                               headers=admin.headers())
            assert cleared.status_code == 200
            with trio.fail_after(HANG_GUARD):
                while gallery_id in folders.running:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        assert [r["sha256"] for r in rows] == [sha(data)]


async def test_without_a_root_the_form_refuses_a_hot_folder(admin: AuthActions) -> None:
    response = await admin.client.post("/api/admin/galleries", json={"name": "G", "hot_folder": "/tmp/x"},
                                       headers=admin.headers())
    assert response.status_code == 400
    assert "hot_folder_root" in (await response.get_json())["fields"]["hot_folder"]


def test_watch_is_a_command(tmp_path: Path) -> None:
    from .test_cli import run_cli

    assert "--in-place" in run_cli("watch", "--help").stdout
    missing = run_cli("watch", str(tmp_path), "--gallery", "nope", "--data-dir", str(tmp_path / "data"))
    assert missing.returncode != 0 and "no gallery with the slug 'nope'" in missing.stderr, missing


# --- originals referenced in place ---

def folder_state(folder: Path) -> dict[str, tuple[int, int, str]]:
    return {p.relative_to(folder).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns, sha(p.read_bytes()))
            for p in sorted(folder.rglob("*")) if p.is_file()}


async def test_in_place_the_original_is_the_folders_file_which_is_never_changed(running: Services,
                                                                               tmp_path: Path) -> None:
    from picpeak_lite.ops.check import check_data_dir
    from picpeak_lite.store.storage import original_name

    svc = running
    gallery_id = gallery(svc)
    folder = tmp_path / "nas"
    (folder / "day1").mkdir(parents=True)
    kept, going, refused = jpeg(seed=11), jpeg(seed=12), b"not a photo"
    (folder / "day1" / "IMG_1.JPG").write_bytes(kept)
    (folder / "day1" / "IMG_2.JPG").write_bytes(going)
    (folder / "day1" / "IMG_3.JPG").write_bytes(refused)
    state = folder_state(folder)
    async with trio.open_nursery() as nursery:
        hot = watcher(svc, gallery_id, folder)
        hot.in_place = True
        await nursery.start(hot.run)
        rows = await wait_complete(svc, gallery_id, 2)
        with trio.fail_after(HANG_GUARD):
            while hot.counts.files < 3:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert sorted(r["sha256"] for r in rows) == sorted([sha(kept), sha(going)])
    assert hot.counts.errors == 1  # the file that is no photo: refused, and left where it is
    assert folder_state(folder) == state  # nothing written, renamed or removed
    keys = {r["display_name"]: sql(svc, "SELECT storage_key FROM photos WHERE id = ?", r["id"])[0]["storage_key"]
            for r in rows}
    storage = svc.storage
    assert storage.referenced_source(keys["IMG_1.JPG"]) == (folder / "day1" / "IMG_1.JPG").resolve()
    assert storage.sha256_of(original_name(keys["IMG_1.JPG"])) == sha(kept)  # read through the storage layer

    # A file that leaves the folder: check names it with its path.
    (folder / "day1" / "IMG_2.JPG").unlink()
    report = check_data_dir(svc.settings)
    by_id = {r["display_name"]: r["id"] for r in rows}
    assert report.vanished == [(by_id["IMG_2.JPG"], (folder / "day1" / "IMG_2.JPG").resolve())]
    assert "vanished_in_place=1" in report.summary()

    # Deleting the photo removes the link, never the file.
    storage.remove_photo_files(keys["IMG_1.JPG"])
    assert (folder / "day1" / "IMG_1.JPG").read_bytes() == kept


async def test_in_place_needs_local_storage(svc: Services, tmp_path: Path) -> None:
    from picpeak_lite.errors import ConfigError

    class Bucket:
        kind = "s3"

    hot = watcher(svc, gallery(svc), tmp_path)
    hot.in_place, hot.storage = True, Bucket()  # type: ignore[assignment]
    with pytest.raises(ConfigError, match="only with local storage"):
        await hot.run()
