"""Guest downloads: single photos, whole-gallery and favourites zips, names, headers and the rules."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import httpx
import trio
from PIL import Image

from picpeak_lite import server
from picpeak_lite.domain import admin_settings
from picpeak_lite.ops import bootstrap
from picpeak_lite.services import Services
from picpeak_lite.store.db import Database
from picpeak_lite.web import zipstream

from . import imagefactory
from .conftest import ADMIN_PASSWORD, AuthActions, make_settings
from .factories import add_photo, gallery_row, published
from .test_guest_pages import guest_csrf


async def test_single_download_is_the_original_with_safe_headers(guest: Any, admin: AuthActions,
                                                                  services: Services) -> None:
    gallery = await published(admin, name="G")
    data = imagefactory.save(imagefactory.photo(80, 60, seed=3), "jpeg")
    photo = add_photo(services, gallery["id"], name="Brautpaar am Fluß.jpg", data=data)
    response = await guest.get(f"/g/{gallery['slug']}/photos/{photo}/download")
    assert response.status_code == 200
    assert await response.get_data() == data
    assert response.headers["Content-Type"] == "image/jpeg"
    assert response.headers["Content-Disposition"] == (
        "attachment; filename=\"Brautpaar am Flu_.jpg\"; filename*=UTF-8''Brautpaar%20am%20Flu%C3%9F.jpg")
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Content-Security-Policy"] == "default-src 'none'; sandbox"


async def test_watermarked_gallery_downloads_a_marked_copy(guest: Any, admin: AuthActions,
                                                           services: Services) -> None:
    gallery = await published(admin, name="Marked", watermark=True)
    data = imagefactory.save(imagefactory.photo(300, 200, seed=4), "png")
    photo = add_photo(services, gallery["id"], name="scan.png", data=data, fmt="png")
    response = await guest.get(f"/g/{gallery['slug']}/photos/{photo}/download")
    assert response.status_code == 200
    body = await response.get_data()
    assert body[:3] == b"\xff\xd8\xff" and body != data
    assert Image.open(io.BytesIO(body)).size == (300, 200)  # full size, not the view image
    assert "filename*=UTF-8''scan.jpg" in response.headers["Content-Disposition"]
    # The original on disk is untouched.
    key = (await services.db.read(lambda c: c.execute("SELECT storage_key FROM photos").fetchall()))[0]["storage_key"]
    assert services.storage.original_path(key).read_bytes() == data


async def test_downloads_off_is_403_everywhere(guest: Any, admin: AuthActions, services: Services) -> None:
    gallery = await published(admin, name="No downloads", allow_downloads=False)
    photo = add_photo(services, gallery["id"])
    for url in (f"/g/{gallery['slug']}/photos/{photo}/download", f"/g/{gallery['slug']}/download",
                f"/g/{gallery['slug']}/favourites/download"):
        response = await guest.get(url, headers={"Accept": "application/json"})
        assert response.status_code == 403, url
        assert "turned off downloads" in (await response.get_json())["error"]
    html = await (await guest.get(f"/g/{gallery['slug']}")).get_data(as_text=True)
    assert "Download all" not in html and "/download" not in html
    # The image routes for viewing still work.
    assert (await guest.get(f"/g/{gallery['slug']}/photos/{photo}/view")).status_code == 200


async def test_gallery_zip_has_only_visible_photos_with_safe_unique_names(guest: Any, admin: AuthActions,
                                                                         services: Services) -> None:
    gallery = await published(admin, name="Anna & Ben")
    a = imagefactory.save(imagefactory.photo(40, 30, seed=1), "jpeg")
    b = imagefactory.save(imagefactory.photo(40, 30, seed=2), "jpeg")
    c = imagefactory.save(imagefactory.photo(40, 30, seed=3), "png")
    add_photo(services, gallery["id"], name="a.jpg", data=a, taken_at="2024-06-20T10:00:00")
    add_photo(services, gallery["id"], name="A.JPG", data=b, taken_at="2024-06-20T11:00:00")
    # A control character (not NUL: PostgreSQL's text cannot hold one, and the intake strips it on both engines).
    add_photo(services, gallery["id"], name="../../etc/pass\x07wd", data=c, fmt="png",
              taken_at="2024-06-20T12:00:00")
    add_photo(services, gallery["id"], name="hidden.jpg", hidden=1)
    add_photo(services, gallery["id"], name="pending.jpg", status="pending")
    add_photo(services, gallery["id"], name="failed.jpg", status="failed")

    response = await guest.get(f"/g/{gallery['slug']}/download")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/zip"
    assert response.headers["Content-Disposition"] == (
        "attachment; filename=\"Anna _ Ben.zip\"; filename*=UTF-8''Anna%20%26%20Ben.zip")
    archive = zipfile.ZipFile(io.BytesIO(await response.get_data()))
    assert archive.testzip() is None
    assert archive.namelist() == ["a.jpg", "A (2).JPG", "pass_wd.png"]
    assert [i.compress_type for i in archive.infolist()] == [zipfile.ZIP_STORED] * 3
    assert archive.read("a.jpg") == a and archive.read("A (2).JPG") == b and archive.read("pass_wd.png") == c
    assert archive.getinfo("a.jpg").date_time == (2024, 6, 20, 10, 0, 0)


async def test_empty_gallery_zip_is_404(guest: Any, admin: AuthActions) -> None:
    gallery = await published(admin, name="Empty")
    assert (await guest.get(f"/g/{gallery['slug']}/download")).status_code == 404


async def test_favourites_zip_holds_only_this_guests_favourites(guest: Any, client: Any, admin: AuthActions,
                                                               services: Services) -> None:
    gallery = await published(admin, name="Favs")
    ids = [add_photo(services, gallery["id"], name=f"p{i}.jpg") for i in range(4)]
    csrf = await guest_csrf(guest, gallery["slug"])
    for photo_id in ids[1:3]:
        r = await guest.put(f"/api/g/{gallery['slug']}/favourites/{photo_id}", headers={"X-CSRF-Token": csrf})
        assert r.status_code == 200
    archive = zipfile.ZipFile(io.BytesIO(await (await guest.get(f"/g/{gallery['slug']}/favourites/download"))
                                         .get_data()))
    assert archive.namelist() == ["p1.jpg", "p2.jpg"]
    # Another browser (the admin's client has no guest session yet) has no favourites.
    assert (await client.get(f"/g/{gallery['slug']}/favourites/download")).status_code == 404


def test_entry_names() -> None:
    names = zipstream.entry_names([
        ("a.jpg", "jpeg"), ("a.jpg", "jpeg"), ("A.jpg", "jpeg"), ("..", "jpeg"), ("../x/..\\y.png", "png"),
        ("nul\x00\x1fname", "jpeg"), ("CON.jpg", "jpeg"), ("IMG_1.HEIC", "heif"), ("scan.png", "jpeg"),
        ("my.party", "jpeg"), ("a (2).jpg", "jpeg"), ("x" * 300 + ".jpg", "jpeg"),
    ])
    assert names[:11] == ["a.jpg", "a (2).jpg", "A (3).jpg", "photo.jpg", "y.png", "nul__name.jpg", "_CON.jpg",
                          "IMG_1.HEIC", "scan.jpg", "my.party.jpg", "a (2) (2).jpg"]
    assert len(names[11]) == zipstream.MAX_NAME_CHARS + 4
    for name in names:
        assert "/" not in name and "\\" not in name and "\x00" not in name and not name.startswith(".")


async def test_zip_streams_from_the_real_server(tmp_path: Any) -> None:
    """A zip of many chunks (the in-process test client cannot read those): complete, and in pieces."""
    settings = make_settings(tmp_path, shutdown_grace_seconds=2)
    bootstrap.prepare(settings)
    bootstrap.ensure_admin(settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
    svc = Services(settings=settings, db=Database(settings.database))
    try:
        gallery_id = await svc.db.write(lambda conn: gallery_row(conn, "Big", slug="big-zip", share_token="b" * 32))
        blobs = [imagefactory.save(imagefactory.photo(900, 700, seed=i), "jpeg", quality=98) for i in range(8)]
        for i, blob in enumerate(blobs):
            add_photo(svc, gallery_id, name=f"IMG_{i}.jpg", data=blob, taken_at=f"2024-06-20T10:0{i}:00")
    finally:
        svc.db.close()
    total = sum(map(len, blobs))
    assert total > 2 * 1024 * 1024
    async with trio.open_nursery() as nursery:
        running = await nursery.start(server.run, settings)
        async with httpx.AsyncClient(base_url=running.url, timeout=120) as http, \
                http.stream("GET", "/g/big-zip/download") as r:
            assert r.status_code == 200 and "content-length" not in r.headers
            pieces = [piece async for piece in r.aiter_raw()]
        running.stop()
    body = b"".join(pieces)
    assert len(pieces) > 10 and len(body) > total
    archive = zipfile.ZipFile(io.BytesIO(body))
    assert archive.testzip() is None
    assert [archive.read(f"IMG_{i}.jpg") for i in range(8)] == blobs


async def _storage_keys(services: Services) -> list[str]:
    rows = await services.db.read(lambda c: c.execute("SELECT storage_key FROM photos ORDER BY id").fetchall())
    return [r["storage_key"] for r in rows]


def _watermarked(services: Services, keys: list[str]) -> dict[str, tuple[Path, int]]:
    """Each key's cached watermarked copy and its inode. A copy is written to a temp file and renamed over the
    old one, so the inode changes exactly when the original was decoded and watermarked again: the tests count
    the real work by what it leaves on disk, not by patching the function that does it."""
    found = {}
    for key in keys:
        for path in services.storage.root.glob(f"derived/{key[:2]}/{key}.wm-*.jpg"):
            assert key not in found, f"two watermarked copies of {key}"
            found[key] = (path, path.stat().st_ino)
    return found


async def test_watermarked_download_is_made_once_and_cached_on_disk(guest: Any, admin: AuthActions,
                                                                    services: Services) -> None:
    gallery = await published(admin, name="Marked", watermark=True)
    photo = add_photo(services, gallery["id"], data=imagefactory.save(imagefactory.photo(300, 200), "jpeg"))
    url = f"/g/{gallery['slug']}/photos/{photo}/download"
    first = await guest.get(url)
    [key] = await _storage_keys(services)
    made = _watermarked(services, [key])
    second = await guest.get(url)
    assert first.status_code == second.status_code == 200
    assert await first.get_data() == await second.get_data()
    assert _watermarked(services, [key]) == made, "the second download decoded the original again"
    [(cached, _)] = made.values()
    assert cached.read_bytes() == await second.get_data()
    # The reconciler sees the cached copy as one of the key's files, and deleting the photo removes it.
    assert (key, cached) in [(k, p) for k, p, _ in services.storage.iter_derived()]
    services.storage.remove_photo_files(key)
    assert not cached.exists()


async def test_a_changed_watermark_makes_a_new_copy_and_drops_the_old(guest: Any, admin: AuthActions,
                                                                      services: Services) -> None:
    gallery = await published(admin, name="Marked", watermark=True)
    photo = add_photo(services, gallery["id"], data=imagefactory.save(imagefactory.photo(300, 200), "jpeg"))
    url = f"/g/{gallery['slug']}/photos/{photo}/download"
    before = await (await guest.get(url)).get_data()
    [key] = await _storage_keys(services)
    [(old, _)] = _watermarked(services, [key]).values()
    await services.db.write(admin_settings.save, {"watermark_text": "Studio Nord", "watermark_position": "center"})
    after = await (await guest.get(url)).get_data()
    [(cached, _)] = _watermarked(services, [key]).values()
    assert cached != old and not old.exists() and before != after  # made a second time, for the new watermark
    assert cached.read_bytes() == after


async def test_watermarking_runs_one_at_a_time(app: Any, guest: Any, admin: AuthActions, services: Services) -> None:
    """Watermarking takes the one token of the app's ``WebLimits.watermark_limiter``: the test holds it, and all four
    downloads are seen queued for it; released, each photo is watermarked once."""
    gallery = await published(admin, name="Marked", watermark=True)
    ids = [add_photo(services, gallery["id"], data=imagefactory.save(imagefactory.photo(200, 150, seed=i), "jpeg"))
           for i in range(4)]
    statuses = []
    limiter = app.extensions["picpeak_limits"].watermark_limiter
    assert limiter.total_tokens == 1

    async def download(photo_id: int) -> None:
        statuses.append((await guest.get(f"/g/{gallery['slug']}/photos/{photo_id}/download")).status_code)

    async with trio.open_nursery() as nursery:
        await limiter.acquire()
        for photo_id in ids:
            nursery.start_soon(download, photo_id)
        while limiter.statistics().tasks_waiting + len(statuses) < 4:  # queued, or (wrongly) done without it
            await trio.sleep(0.01)
        queued = limiter.statistics().tasks_waiting
        limiter.release()
    assert queued == 4 and statuses == [200] * 4
    assert len(_watermarked(services, await _storage_keys(services))) == 4


async def test_watermarked_zip_uses_and_fills_the_same_cache(guest: Any, admin: AuthActions,
                                                            services: Services) -> None:
    gallery = await published(admin, name="Marked", watermark=True)
    ids = [add_photo(services, gallery["id"], name=f"p{i}.png", fmt="png", taken_at=f"2024-06-20T10:0{i}:00",
                     data=imagefactory.save(imagefactory.photo(200, 150, seed=i), "png")) for i in range(3)]
    keys = await _storage_keys(services)
    single = await (await guest.get(f"/g/{gallery['slug']}/photos/{ids[0]}/download")).get_data()
    made_once = _watermarked(services, keys)
    assert list(made_once) == [keys[0]]
    first = zipfile.ZipFile(io.BytesIO(await (await guest.get(f"/g/{gallery['slug']}/download")).get_data()))
    assert first.namelist() == ["p0.jpg", "p1.jpg", "p2.jpg"]
    assert first.read("p0.jpg") == single
    made = _watermarked(services, keys)
    assert len(made) == 3 and made[keys[0]] == made_once[keys[0]], \
        "the zip decoded a photo whose watermarked copy was cached"
    second = zipfile.ZipFile(io.BytesIO(await (await guest.get(f"/g/{gallery['slug']}/download")).get_data()))
    assert _watermarked(services, keys) == made
    assert [second.read(n) for n in second.namelist()] == [first.read(n) for n in first.namelist()]
    assert Image.open(io.BytesIO(second.read("p2.jpg"))).size == (200, 150)


async def test_web_size_downloads_single_and_zipped(guest: Any, admin: AuthActions, services: Services) -> None:
    """Issue 12, point 19: ``?size=web`` gives a ~2048 px JPEG with the photographer's rights and no GPS, for
    one photo and as a zip; "Download all" says how many photos and how many bytes before it starts."""
    from .test_images import photo_with_rights

    gallery = await published(admin, name="Web", allow_downloads=True)
    data = photo_with_rights((3000, 2000))
    photo = add_photo(services, gallery["id"], name="IMG_1.jpg", data=data)
    await services.db.write(lambda c: c.execute("UPDATE photos SET width = 3000, height = 2000"))
    response = await guest.get(f"/g/{gallery['slug']}/photos/{photo}/download?size=web")
    assert response.status_code == 200
    assert "filename*=UTF-8''IMG_1%20%28web%29.jpg" in response.headers["Content-Disposition"]
    assert response.headers["Content-Security-Policy"] == "default-src 'none'; sandbox"
    web = Image.open(io.BytesIO(await response.get_data()))
    assert web.size == (2048, 1365)
    assert dict(web.getexif()) == {0x013B: "Ana Photo", 0x8298: "(c) 2026 Ana Photo"}
    assert web.getexif().get_ifd(0x8825) == {} and b"All rights reserved" in web.info["xmp"]
    original = await guest.get(f"/g/{gallery['slug']}/photos/{photo}/download?size=original")
    assert await original.get_data() == data
    bad = await guest.get(f"/g/{gallery['slug']}/photos/{photo}/download?size=huge")
    assert bad.status_code == 400 and "size must be" in await bad.get_data(as_text=True)

    zipped = await guest.get(f"/g/{gallery['slug']}/download?size=web")
    assert zipped.status_code == 200 and "Web%20%28web%20size%29.zip" in zipped.headers["Content-Disposition"]
    with zipfile.ZipFile(io.BytesIO(await zipped.get_data())) as archive:
        [name] = archive.namelist()
        assert name == "IMG_1.jpg"
        assert Image.open(io.BytesIO(archive.read(name))).size == (2048, 1365)

    page = await (await guest.get(f"/g/{gallery['slug']}")).get_data(as_text=True)
    from picpeak_lite.media import images
    from picpeak_lite.web.views.guest import size_label

    s = 2048 / 3000  # the web copy's scale; the ratio measured in media/images.py
    web_estimate = len(data) * s * s * (images.WEB_SCALED_BASE + images.WEB_SCALED_SLOPE * s)
    assert (f'id="download-all-size">1 photo: {size_label(len(data))} (web size about {size_label(web_estimate)})'
            in page)
    assert [size_label(n) for n in (800, 3.64e6, 48e6, 1.23e9)] == ["1\xa0kB", "3.6\xa0MB", "48\xa0MB", "1.2\xa0GB"]
    assert 'id="download-all-web"' in page and "size=web" in page
