"""Playing and delivering videos: HTTP Range on the play route (206, Content-Range, If-Range, 416; byte-exact for
arbitrary ranges), the guest's access rules, the page's badge and player data, zips and downloads of originals,
favourites, delete, backup check."""

from __future__ import annotations

import html
import io
import random
import zipfile
from pathlib import Path
from typing import Any

import pytest

from picpeak_lite.pipeline.video_previews import PreviewLane
from picpeak_lite.services import Services
from picpeak_lite.web import playback

from . import videofactory as vf
from .conftest import AuthActions
from .factories import published, run_pool_until_idle
from .test_upload import admin_upload, rows, start_guest_session


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("clip") / "dance.mp4"
    return vf.make_clip(path, width=320, height=240, seconds=2, audio=True, crf=20).read_bytes()


async def gallery_with_video(admin: AuthActions, services: Services, clip: bytes, **fields: Any
                             ) -> tuple[dict[str, Any], int]:
    gallery = await published(admin, name="Dance", **fields)
    response = await admin_upload(admin, gallery["id"], [("dance.mp4", clip)])
    assert response.status_code == 202, await response.get_json()
    await run_pool_until_idle(services)
    [row] = await rows(services, "SELECT id, status, error FROM photos")
    assert row["status"] == "complete", row["error"]
    return gallery, row["id"]


async def test_ranges_are_byte_exact(admin: AuthActions, guest: Any, services: Services, clip: bytes) -> None:
    gallery, photo_id = await gallery_with_video(admin, services, clip)
    await start_guest_session(services, guest)
    url = f"/g/{gallery['slug']}/photos/{photo_id}/play"
    whole = await guest.get(url)
    assert whole.status_code == 200 and whole.content_type == "video/mp4"
    assert whole.headers["Accept-Ranges"] == "bytes" and await whole.get_data() == clip
    assert "attachment" not in whole.headers.get("Content-Disposition", "")  # plays in the page
    size = len(clip)
    picks = random.Random(13)
    ranges = [(0, 0), (0, 1023), (size - 1, size - 1), (size // 2, size - 1)]
    ranges += sorted((a, min(size - 1, a + picks.randrange(1, 70000))) for a in
                     (picks.randrange(size) for _ in range(12)))
    for first, last in ranges:
        part = await guest.get(url, headers={"Range": f"bytes={first}-{last}"})
        assert part.status_code == 206, (first, last)
        assert part.headers["Content-Range"] == f"bytes {first}-{last}/{size}"
        assert await part.get_data() == clip[first : last + 1]
    suffix = await guest.get(url, headers={"Range": "bytes=-500"})
    assert suffix.status_code == 206 and await suffix.get_data() == clip[-500:]
    open_end = await guest.get(url, headers={"Range": f"bytes={size - 10}-"})
    assert await open_end.get_data() == clip[-10:]
    past = await guest.get(url, headers={"Range": f"bytes={size + 5}-{size + 10}"})
    assert past.status_code == 416
    etag = whole.headers["ETag"]
    same = await guest.get(url, headers={"Range": "bytes=0-9", "If-Range": etag})
    assert same.status_code == 206 and await same.get_data() == clip[:10]
    changed = await guest.get(url, headers={"Range": "bytes=0-9", "If-Range": '"another-version"'})
    assert changed.status_code == 200 and await changed.get_data() == clip  # not the range of a changed file
    admin_side = await admin.client.get(f"/api/admin/photos/{photo_id}/play", headers={"Range": "bytes=5-9"})
    assert admin_side.status_code == 206 and await admin_side.get_data() == clip[5:10]


async def test_playing_follows_the_guest_rules(admin: AuthActions, guest: Any, client: Any, services: Services,
                                               clip: bytes) -> None:
    gallery, photo_id = await gallery_with_video(admin, services, clip, password="letmein")
    url = f"/g/{gallery['slug']}/photos/{photo_id}/play"
    assert (await guest.get(url)).status_code == 401  # no password entered
    assert (await client.get(url)).status_code == 200  # the admin's session previews it (issue 12, point 11)
    await services.db.write(lambda conn: conn.execute("UPDATE photos SET hidden = 1"))
    await start_guest_session(services, guest)
    other = f"/g/{gallery['slug']}-nope/photos/{photo_id}/play"
    assert (await guest.get(other)).status_code == 404


async def test_the_page_shows_a_badge_and_the_player_data(admin: AuthActions, guest: Any, services: Services,
                                                          clip: bytes) -> None:
    gallery, photo_id = await gallery_with_video(admin, services, clip)
    await start_guest_session(services, guest)
    page = await (await guest.get(f"/g/{gallery['slug']}")).get_data(as_text=True)
    assert f'data-play="/g/{gallery["slug"]}/photos/{photo_id}/play"' in page
    assert "&#9654; 0:02</span>" in page and 'id="lb-video"' in page
    listing = await (await guest.get(f"/api/g/{gallery['slug']}/photos")).get_json()
    [item] = listing["photos"]
    assert (item["duration"], item["play_note"]) == ("0:02", "")
    # as an HEVC clip waits for its copy (an H.264 one plays its original meanwhile)
    await services.db.write(lambda conn: conn.execute(
        "UPDATE photos SET preview_status = 'pending', video_codec = 'hevc'"))
    listing = await (await guest.get(f"/api/g/{gallery['slug']}/photos")).get_json()
    assert (listing["photos"][0]["play_url"], listing["photos"][0]["play_note"]) == (None, playback.NO_PREVIEW)
    waiting = await guest.get(f"/g/{gallery['slug']}/photos/{photo_id}/play")
    assert waiting.status_code == 409 and playback.NO_PREVIEW in html.unescape(await waiting.get_data(as_text=True))


async def test_downloads_and_zips_carry_the_original(admin: AuthActions, guest: Any, services: Services,
                                                     clip: bytes) -> None:
    gallery, photo_id = await gallery_with_video(admin, services, clip, allow_downloads=True, watermark=True)
    await start_guest_session(services, guest)
    one = await guest.get(f"/g/{gallery['slug']}/photos/{photo_id}/download")
    assert one.status_code == 200 and await one.get_data() == clip
    assert one.content_type == "video/mp4" and 'filename="dance.mp4"' in one.headers["Content-Disposition"]
    archive = await guest.get(f"/g/{gallery['slug']}/download")
    assert archive.status_code == 200
    with zipfile.ZipFile(io.BytesIO(await archive.get_data())) as z:
        assert z.namelist() == ["dance.mp4"] and z.read("dance.mp4") == clip


async def test_favourite_delete_and_check(admin: AuthActions, guest: Any, services: Services, clip: bytes,
                                          tmp_path: Path) -> None:
    from picpeak_lite.ops import check

    gallery, photo_id = await gallery_with_video(admin, services, clip)
    csrf = await start_guest_session(services, guest)
    fav = await guest.put(f"/api/g/{gallery['slug']}/favourites/{photo_id}", headers={"X-CSRF-Token": csrf})
    assert fav.status_code == 200
    key = (await rows(services, "SELECT storage_key FROM photos"))[0]["storage_key"]
    services.storage.preview_path(key).write_bytes(b"preview")  # a playable copy goes with its video
    report = check.check_data_dir(services.settings, grace=0)  # sha256 of the original, derivatives, orphans
    assert (report.photos, report.originals_checked, report.problems) == (1, 1, 0)
    gone = await admin.client.delete(f"/api/admin/photos/{photo_id}", headers=admin.headers())
    assert gone.status_code == 204
    assert not services.storage.original_path(key).exists() and not services.storage.preview_path(key).exists()


async def test_with_downloads_off_a_guest_plays_the_made_copy_never_the_original(
        admin: AuthActions, guest: Any, services: Services, clip: bytes) -> None:
    """/download answers 403 in such a gallery, so /play may not hand out the same bytes: the preview lane makes
    a copy of every video there (H.264 here too), /play answers 409 with a sentence until it exists and then
    sends it."""
    gallery, photo_id = await gallery_with_video(admin, services, clip, allow_downloads=False)
    await start_guest_session(services, guest)
    play = f"/g/{gallery['slug']}/photos/{photo_id}/play"
    assert (await guest.get(f"/g/{gallery['slug']}/photos/{photo_id}/download")).status_code == 403
    waiting = await guest.get(play)
    body = await waiting.get_data()
    assert waiting.status_code == 409 and clip not in body
    assert playback.PREPARING in html.unescape(body.decode())
    listing = await (await guest.get(f"/api/g/{gallery['slug']}/photos")).get_json()
    assert (listing["photos"][0]["play_url"], listing["photos"][0]["play_note"]) == (None, playback.PREPARING)
    assert await PreviewLane(services).make_one() is True
    copy = services.storage.preview_path(services_key := (await rows(
        services, "SELECT storage_key FROM photos"))[0]["storage_key"]).read_bytes()
    assert services_key and copy != clip
    played = await guest.get(play)
    assert played.status_code == 200 and played.content_type == "video/mp4"
    assert await played.get_data() == copy
    part = await guest.get(play, headers={"Range": "bytes=0-99"})
    assert part.status_code == 206 and await part.get_data() == copy[:100]


async def test_turning_downloads_off_makes_copies_and_on_again_plays_the_original(
        admin: AuthActions, guest: Any, services: Services, clip: bytes) -> None:
    gallery, photo_id = await gallery_with_video(admin, services, clip, allow_downloads=True)
    await start_guest_session(services, guest)
    play = f"/g/{gallery['slug']}/photos/{photo_id}/play"
    assert await (await guest.get(play)).get_data() == clip
    path = f"/api/admin/galleries/{gallery['id']}"
    off = await admin.client.patch(path, json={"allow_downloads": False}, headers=admin.headers())
    assert off.status_code == 200, await off.get_json()
    [row] = await rows(services, "SELECT preview_status FROM photos")
    assert row["preview_status"] == "pending"
    refused = await guest.get(play)
    assert refused.status_code == 409 and clip not in await refused.get_data()
    on = await admin.client.patch(path, json={"allow_downloads": True}, headers=admin.headers())
    assert on.status_code == 200
    assert await (await guest.get(play)).get_data() == clip  # its own file again, copy or not
