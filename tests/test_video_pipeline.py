"""Videos through the real app: the schema's new columns, upload (admin and guest) with the header's refusals,
the worker's poster and facts, the status JSON and webhooks with media_type and duration, the importer."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from picpeak_lite.media import video
from picpeak_lite.ops import bootstrap, importer
from picpeak_lite.pipeline import video_jobs
from picpeak_lite.services import Services
from picpeak_lite.store import db, schema

from . import videofactory as vf
from .conftest import AuthActions, make_settings
from .factories import gallery_row, jpeg, published, run_pool_until_idle
from .test_upload import admin_upload, multipart, rows, start_guest_session

GUEST_VIDEO_SECONDS = 3


@pytest.fixture
def settings(tmp_path: Path) -> Any:
    return make_settings(tmp_path, guest_max_file_mb=1, guest_max_video_mb=2,
                         guest_max_video_seconds=GUEST_VIDEO_SECONDS)


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    d = tmp_path_factory.mktemp("clips")
    rotated = vf.make_clip(d / "portrait.mp4", width=320, height=240, rotation=-90, audio=True, tags={
        "com.apple.quicktime.creationdate": "2026-06-01T20:15:00+0200", "com.apple.quicktime.make": "Apple",
        "com.apple.quicktime.location.ISO6709": "+48.8577+002.2950/"})
    made = {
        "portrait.mp4": rotated.read_bytes(),
        "clip.webm": vf.make_clip(d / "clip.webm", codec="libvpx-vp9", width=256, height=144, seconds=1).read_bytes(),
        "long.mp4": vf.make_clip(d / "long.mp4", width=64, height=48, fps=5, seconds=GUEST_VIDEO_SECONDS + 2
                                 ).read_bytes(),
        "two.mp4": vf.make_clip(d / "two.mp4", frames=2).read_bytes(),
        "audio.mp4": vf.make_audio_only(d / "audio.mp4").read_bytes(),
        "cut.mp4": vf.truncated(rotated, d / "cut.mp4").read_bytes(),
        "text.mp4": b"not a video at all\n" * 40,
    }
    if vf.has_encoder("libx265"):
        made["hevc.mov"] = vf.make_clip(d / "hevc.mov", codec="libx265", width=320, height=192, seconds=1
                                        ).read_bytes()
    return made


@pytest.mark.sqlite
def test_the_migration_widens_format_and_adds_the_video_columns(tmp_path: Path) -> None:
    conn = db.connect(tmp_path / "x.sqlite3")
    schema.migrate(conn, target=len(schema.MIGRATIONS) - 1)
    early = db.connect(tmp_path / "x.sqlite3")  # opened before the step: must see the new constraint too
    early.execute("SELECT count(*) FROM photos").fetchall()
    schema.migrate(conn)
    assert conn.execute("PRAGMA integrity_check").fetchall() == [{"integrity_check": "ok"}]
    columns = {r["name"] for r in conn.execute("PRAGMA table_info(photos)").fetchall()}
    assert {"media_type", "duration", "fps", "video_codec", "audio_codec", "preview_status"} <= columns
    gallery_row(early, "G")
    early.execute("INSERT INTO uploads (id, gallery_id, uploaded_by, created_at) VALUES (?, 1, 'admin', 0)",
                  ("u" * 32,))
    insert = ("INSERT INTO photos (gallery_id, upload_id, storage_key, sha256, display_name, size, format, "
              "uploaded_by, created_at) VALUES (1, '" + "u" * 32 + "', ?, ?, 'n', 1, ?, 'admin', 0)")
    early.execute(insert, ("k1", "a" * 64, "mp4"))
    with pytest.raises(Exception, match="CHECK constraint failed"):
        early.execute(insert, ("k2", "b" * 64, "avi"))


async def test_admin_video_is_probed_and_gets_a_poster(admin: AuthActions, services: Services,
                                                     clips: dict[str, bytes]) -> None:
    gallery = await admin.create_gallery()
    response = await admin_upload(admin, gallery["id"], [("IMG_0001.MOV", clips["portrait.mp4"]),
                                                         ("clip.webm", clips["clip.webm"])])
    answer = await response.get_json()
    assert response.status_code == 202, answer
    [row] = await rows(services, "SELECT * FROM photos WHERE display_name = 'IMG_0001.MOV'")
    assert (row["media_type"], row["format"], row["width"], row["height"]) == ("video", "mp4", 240, 320)
    assert row["preview_status"] is None  # H.264 plays in browsers as it is
    await run_pool_until_idle(services)
    [row] = await rows(services, "SELECT * FROM photos WHERE display_name = 'IMG_0001.MOV'")
    assert row["status"] == "complete", row["error"]
    assert (row["width"], row["height"], row["video_codec"], row["audio_codec"]) == (240, 320, "h264", "aac")
    assert row["duration"] == pytest.approx(2.0, abs=0.1) and row["fps"] == pytest.approx(30)
    assert (row["taken_at"], row["camera_make"], row["has_gps"]) == ("2026-06-01T20:15:00", "Apple", 1)
    grid = await admin.client.get(f"/api/admin/photos/{row['id']}/grid")
    assert grid.status_code == 200 and grid.content_type == "image/jpeg"
    image = Image.open(io.BytesIO(await grid.get_data()))
    assert image.height > image.width  # the portrait clip's poster is portrait
    assert not image.getexif()
    status = await (await admin.client.get(f"/api/admin/uploads/{answer['upload_id']}")).get_json()
    kinds = {p["filename"]: (p["media_type"], round(p["duration"] or 0)) for p in status["photos"]}
    assert kinds == {"IMG_0001.MOV": ("video", 2), "clip.webm": ("video", 1)}
    # The gallery's photo list says the same as the status route (it said "photo", None for every video).
    listed = await (await admin.client.get(f"/api/admin/galleries/{gallery['id']}/photos")).get_json()
    assert {p["filename"]: (p["media_type"], round(p["duration"] or 0)) for p in listed["photos"]} == kinds


def test_webhook_body_names_media_type_and_duration() -> None:
    from picpeak_lite.pipeline.transitions import photo_event_data

    row = {"id": 1, "gallery_id": 2, "upload_id": "u", "display_name": "a.mp4", "status": "complete", "error": None,
           "width": 240, "height": 320, "uploaded_by": "guest", "media_type": "video", "duration": 2.0}
    data = photo_event_data(row)
    assert (data["media_type"], data["duration"]) == ("video", 2.0)


@pytest.mark.parametrize(("name", "status", "reason"), [
    ("audio.mp4", 415, video.NO_VIDEO),
    ("cut.mp4", 400, video.CORRUPT),
    ("text.mp4", 415, "Not a supported image (JPEG, PNG, WebP or HEIC)"),
])
async def test_bad_videos_are_refused_at_upload_with_a_sentence(admin: AuthActions, services: Services,
                                                                clips: dict[str, bytes], name: str, status: int,
                                                                reason: str) -> None:
    gallery = await admin.create_gallery()
    response = await admin_upload(admin, gallery["id"], [(name, clips[name])])
    assert response.status_code == status
    assert (await response.get_json())["errors"] == [{"filename": name, "error": reason}]
    assert await rows(services, "SELECT id FROM photos") == []


async def test_a_two_frame_clip_is_a_video_too(admin: AuthActions, services: Services,
                                               clips: dict[str, bytes]) -> None:
    gallery = await admin.create_gallery()
    assert (await admin_upload(admin, gallery["id"], [("two.mp4", clips["two.mp4"])])).status_code == 202
    await run_pool_until_idle(services)
    [row] = await rows(services, "SELECT status, error, media_type, duration FROM photos")
    assert (row["status"], row["media_type"]) == ("complete", "video"), row["error"]
    assert row["duration"] < 0.2


async def test_hevc_waits_for_a_playable_preview(admin: AuthActions, services: Services,
                                                 clips: dict[str, bytes]) -> None:
    if "hevc.mov" not in clips:
        pytest.skip("this PyAV build has no HEVC encoder")
    gallery = await admin.create_gallery()
    assert (await admin_upload(admin, gallery["id"], [("hevc.mov", clips["hevc.mov"])])).status_code == 202
    [row] = await rows(services, "SELECT format, video_codec, preview_status FROM photos")
    assert (row["format"], row["video_codec"], row["preview_status"]) == ("mov", "hevc", "pending")


async def test_guest_limits_for_videos(admin: AuthActions, guest: Any, services: Services,
                                       clips: dict[str, bytes]) -> None:
    gallery = await published(admin, name="Party", allow_guest_uploads=True)
    csrf = await start_guest_session(services, guest)
    url = f"/api/g/{gallery['slug']}/upload"

    async def send(files: list[tuple[str, bytes]]) -> Any:
        body, headers = multipart(files)
        return await guest.post(url, data=body, headers={**headers, "X-CSRF-Token": csrf})

    too_long = await send([("long.mp4", clips["long.mp4"])])
    assert too_long.status_code == 413
    assert (await too_long.get_json())["errors"] == [{"filename": "long.mp4", "error": (
        f"The video is 5 s long; guests may upload videos of at most {GUEST_VIDEO_SECONDS} s.")}]
    # a video may be larger than a guest's photo limit (1 MB here), up to the video limit (2 MB)
    padded = clips["portrait.mp4"] + bytes(1024 * 1024)  # trailing bytes after the boxes: still a valid MP4
    ok = await send([("big.mp4", padded)])
    assert ok.status_code == 202, await ok.get_json()
    big_photo = await send([("big.jpg", jpeg() + bytes(1024 * 1024 + 10))])
    assert (await big_photo.get_json())["errors"] == [
        {"filename": "big.jpg", "error": "The file is larger than the limit of 1 MB."}]
    huge = await send([("huge.mp4", clips["portrait.mp4"] + bytes(3 * 1024 * 1024))])
    assert huge.status_code == 413
    await run_pool_until_idle(services)
    [row] = await rows(services, "SELECT status, uploaded_by, media_type FROM photos")
    assert dict(row) == {"status": "complete", "uploaded_by": "guest", "media_type": "video"}
    page = await guest.get(f"/g/{gallery['slug']}")
    assert page.status_code == 200


def test_the_importer_takes_videos(tmp_path: Path, clips: dict[str, bytes]) -> None:
    settings = make_settings(tmp_path / "imp")
    bootstrap.prepare(settings)
    conn = db.connect(settings.database)
    with db.transaction(conn):
        gallery_row(conn, "Wedding", slug="wedding", share_token="share1", draft=True)
    folder = tmp_path / "card"
    folder.mkdir()
    (folder / "MVI_0001.MP4").write_bytes(clips["portrait.mp4"])
    (folder / "notes.mp4").write_bytes(clips["text.mp4"])
    summary = importer.run_import(settings, folder, "wedding")
    assert summary.added == 1 and [p.name for p, _ in summary.errors] == ["notes.mp4"]
    found = conn.execute("SELECT display_name, media_type, format FROM photos").fetchall()
    conn.close()
    assert found == [{"display_name": "MVI_0001.MP4", "media_type": "video", "format": "mp4"}]


def test_child_answers_are_checked(tmp_path: Path) -> None:
    """A child that prints something else is a crash with a sentence, not a traceback in the worker."""
    assert video_jobs.CRASHED.format(how="no answer").startswith("The video could not be read")
