"""The preview lane: an HEVC clip gets a playable H.264/AAC copy, made only when no photo waits; the play route
serves it; a copy that cannot be made fails with a sentence and the lightbox's note says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from picpeak_lite.media import video
from picpeak_lite.pipeline import video_jobs
from picpeak_lite.pipeline.video_previews import PreviewLane
from picpeak_lite.services import Services
from picpeak_lite.web import playback

from . import procs
from . import videofactory as vf
from .conftest import AuthActions
from .factories import jpeg, run_pool_until_idle
from .test_upload import admin_upload, rows

pytestmark = pytest.mark.skipif(not vf.has_encoder("libx265"), reason="this PyAV build has no HEVC encoder")


@pytest.fixture(scope="module")
def hevc(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("hevc") / "IMG_0042.MOV"
    return vf.make_clip(path, codec="libx265", width=480, height=272, seconds=2, audio=True, rotation=-90
                        ).read_bytes()


async def test_hevc_gets_a_playable_copy_after_the_photos(admin: AuthActions, services: Services, hevc: bytes,
                                                          tmp_path: Path) -> None:
    gallery = await admin.create_gallery()
    assert (await admin_upload(admin, gallery["id"], [("IMG_0042.MOV", hevc)])).status_code == 202
    await run_pool_until_idle(services)
    [row] = await rows(services, "SELECT id, status, error, preview_status, storage_key FROM photos")
    assert (row["status"], row["preview_status"]) == ("complete", "pending"), row["error"]
    waiting = await admin.client.get(f"/api/admin/photos/{row['id']}/play")
    assert waiting.status_code == 409
    lane = PreviewLane(services)
    # A photo waiting to be processed goes first: the lane does nothing until the workers are idle.
    assert (await admin_upload(admin, gallery["id"], [("a.jpg", jpeg())])).status_code == 202
    assert await lane.make_one() is False
    await run_pool_until_idle(services)
    assert await lane.make_one() is True
    [row] = await rows(services, f"SELECT preview_status, preview_error FROM photos WHERE id = {row['id']}")
    assert row["preview_status"] == "complete", row["preview_error"]
    [row] = await rows(services, "SELECT id, storage_key FROM photos WHERE media_type = 'video'")
    played = await admin.client.get(f"/api/admin/photos/{row['id']}/play", headers={"Range": "bytes=0-99"})
    assert played.status_code == 206 and played.content_type == "video/mp4"
    info = await video_jobs.probe(services.storage.preview_path(row["storage_key"]), deadline=120,
                                  max_pixels=video.MAX_FRAME_PIXELS)
    assert (info.video_codec, info.audio_codec, info.width, info.height) == ("h264", "aac", 272, 480)
    assert info.duration == pytest.approx(2.0, abs=0.15)
    assert await lane.make_one() is False  # nothing left


async def test_a_copy_that_cannot_be_made_says_why(admin: AuthActions, services: Services, hevc: bytes) -> None:
    gallery = await admin.create_gallery()
    assert (await admin_upload(admin, gallery["id"], [("IMG_0042.MOV", hevc)])).status_code == 202
    await run_pool_until_idle(services)
    [row] = await rows(services, "SELECT id, storage_key FROM photos")
    path = services.storage.original_path(row["storage_key"])
    path.write_bytes(path.read_bytes()[:2000])  # the disk lost its end since the poster was made
    assert await PreviewLane(services).make_one() is True
    [row] = await rows(services, "SELECT id, preview_status, preview_error FROM photos")
    assert (row["preview_status"], row["preview_error"]) == ("failed", video.CORRUPT)
    answer = await admin.client.get(f"/api/admin/photos/{row['id']}/play")
    assert answer.status_code == 409
    assert (await answer.get_json())["error"] == playback.PREVIEW_FAILED


def test_transcode_deadline_grows_with_the_clip() -> None:
    from picpeak_lite.pipeline.video_previews import transcode_deadline

    assert transcode_deadline(None, 120) == 120 and transcode_deadline(300, 120) == 6120


async def test_the_lane_runs_in_the_background(services: Services, autojump_clock: Any) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(PreviewLane(services, poll_seconds=1).run)
        await trio.sleep(5)  # idle: nothing pending, it only polls
        nursery.cancel_scope.cancel()


async def _until(check: Any) -> Any:
    """Poll a condition of another process (no event reaches us from it)."""
    with trio.fail_after(300):  # a hung-test stop only
        while not (found := check()):
            await trio.sleep(0.02)
    return found


async def test_a_transcode_is_stopped_while_photos_wait(admin: AuthActions, services: Services,
                                                       tmp_path: Path) -> None:
    clip = vf.make_clip(tmp_path / "IMG_0043.MOV", codec="libx265", width=640, height=360, seconds=4)
    gallery = await admin.create_gallery()
    assert (await admin_upload(admin, gallery["id"], [("IMG_0043.MOV", clip.read_bytes())])).status_code == 202
    await run_pool_until_idle(services)
    lane = PreviewLane(services)
    async with trio.open_nursery() as nursery:
        made = trio.Event()

        async def make() -> None:
            assert await lane.make_one() is True
            made.set()

        nursery.start_soon(make)
        [pid] = await _until(lambda: procs.children_running("self", b"transcode"))
        # A photo arrives while the copy is being made: the child stops at once and stays stopped.
        assert (await admin_upload(admin, gallery["id"], [("a.jpg", jpeg())])).status_code == 202
        await _until(lambda: procs.state(pid) == "T")
        assert not made.is_set()
        await run_pool_until_idle(services)
        # The photo is done: the child goes on and the copy is made.
        with trio.fail_after(300):  # a hung-test stop only
            await made.wait()
    [row] = await rows(services, "SELECT status, preview_status, preview_error FROM photos WHERE media_type = 'video'")
    assert (row["status"], row["preview_status"]) == ("complete", "complete"), row["preview_error"]
    [photo] = await rows(services, "SELECT status FROM photos WHERE media_type = 'photo'")
    assert photo["status"] == "complete"
