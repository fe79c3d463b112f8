"""The guest side in a real browser against a real server: password, grid, lightbox, downloads, favourites,
the guest upload page with live progress, and the phone layout. Screenshots go to test-artifacts/."""

from __future__ import annotations

import io
import re
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .. import imagefactory
from .conftest import PATIENCE_MS, LiveServer, Page, api_client, start_server, stop_server, wait_processed


@pytest.fixture(scope="module")
def server(tmp_path_factory: Any) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("guest") / "data")
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def api(server: LiveServer) -> Iterator[httpx.Client]:
    yield from api_client(server)


def photo_bytes(seed: int, size: tuple[int, int] = (900, 600)) -> bytes:
    return imagefactory.save(imagefactory.photo(*size, seed=seed), "jpeg")


def make_gallery(api: httpx.Client, photos: list[tuple[str, bytes]], **fields: Any) -> dict[str, Any]:
    """A published gallery whose photos are all processed (uploaded through the admin API, then waited for)."""
    created = api.post("/api/admin/galleries", json={"name": "Anna & Ben", **fields})
    assert created.status_code == 201, created.text
    gallery = created.json()
    if photos:
        upload = api.post(f"/api/admin/galleries/{gallery['id']}/upload",
                          files=[("photos", (name, data, "image/jpeg")) for name, data in photos])
        assert upload.status_code == 202, upload.text
        wait_processed(api, upload.json()["upload_id"])
    published = api.post(f"/api/admin/galleries/{gallery['id']}/publish")
    assert published.status_code == 200, published.text
    return published.json()


def saved(download: Any) -> bytes:
    return Path(download.path()).read_bytes()


def test_password_gallery_lightbox_and_downloads(server: LiveServer, api: httpx.Client, page: Page) -> None:
    photos = [(f"IMG_{i}.jpg", photo_bytes(i)) for i in range(3)]
    gallery = make_gallery(api, photos, password="letmein", welcome_message="Thank you for celebrating with us!")
    page.goto(gallery["share_url"])
    assert page.title().startswith("Protected gallery")
    page.fill("input[name=password]", "wrong password")
    page.click("button[type=submit]")
    assert "not right" in page.locator("[role=alert]").inner_text()
    page.screenshot("password-wrong")
    page.fill("input[name=password]", "letmein")
    page.click("button[type=submit]")
    page.wait_for_selector("#grid .tile")
    tiles = page.locator("#grid .tile")
    assert tiles.count() == 3
    page.wait_for_function("() => [...document.querySelectorAll('#grid img')].every(i => i.complete && i.naturalWidth)")
    # Desktop at DPR 1 picks the grid image for tiles (Chromium may reuse the cover's view image, already in its
    # memory cache, for the first tile: that costs no bytes).
    sources = page.eval_on_selector_all("#grid img", "els => els.map(e => e.currentSrc)")
    assert all("/grid" in src for src in sources[1:])
    page.screenshot("gallery")

    tiles.nth(0).locator(".tile-link").click()
    box = page.locator("#lightbox")
    box.wait_for(state="visible")
    first_src = page.locator("#lb-img").get_attribute("src")
    assert first_src.endswith("/view")
    page.keyboard.press("ArrowRight")
    page.wait_for_function("src => document.getElementById('lb-img').getAttribute('src') !== src", arg=first_src)
    second_id = tiles.nth(1).get_attribute("data-id")
    assert f"/photos/{second_id}/view" in page.locator("#lb-img").get_attribute("src")
    page.wait_for_function("() => document.getElementById('lb-img').complete")
    page.screenshot("lightbox")

    with page.expect_download() as one:
        page.click("#lightbox .lb-download:not(.lb-download-web)")
    name_to_bytes = dict(photos)
    assert saved(one.value) == name_to_bytes[one.value.suggested_filename]
    page.keyboard.press("Escape")
    box.wait_for(state="hidden")

    with page.expect_download() as everything:
        page.click("#download-all")
    assert everything.value.suggested_filename == "Anna & Ben.zip"
    archive = zipfile.ZipFile(io.BytesIO(saved(everything.value)))
    assert sorted(archive.namelist()) == sorted(name_to_bytes)
    assert all(archive.read(name) == data for name, data in photos)


def test_guest_page_follows_the_gallery_live_by_its_slug(server: LiveServer, api: httpx.Client,
                                                         page: Page) -> None:
    """The page's script opens ``/ws/g/<slug>`` (the guest's own capability) and shows what arrives."""
    gallery = make_gallery(api, [("first.jpg", photo_bytes(40))], password="letmein")
    page.goto(gallery["share_url"])
    page.fill("input[name=password]", "letmein")
    with page.expect_websocket() as opened:
        page.click("button[type=submit]")
    socket = opened.value
    socket.wait_for_event("framereceived")  # the snapshot: the feed is live before anything changes
    page.wait_for_selector("#grid .tile")
    first_id = page.locator("#grid .tile").nth(0).get_attribute("data-id")
    upload = api.post(f"/api/admin/galleries/{gallery['id']}/upload",
                      files=[("photos", ("second.jpg", photo_bytes(41), "image/jpeg"))])
    assert upload.status_code == 202, upload.text
    page.wait_for_selector("#new-photos:not([hidden])", timeout=30000)
    assert page.locator("#new-photos .notice-text").inner_text() == "1 new photo"
    assert api.delete(f"/api/admin/photos/{first_id}").status_code == 204
    page.wait_for_selector(f'#grid .tile[data-id="{first_id}"]', state="detached", timeout=30000)
    assert socket.url.endswith(f"/ws/g/{gallery['slug']}"), socket.url


def test_guest_upload_page_shows_progress_thumbnails_and_errors(server: LiveServer, api: httpx.Client,
                                                                page: Page, tmp_path: Path) -> None:
    gallery = make_gallery(api, [], allow_guest_uploads=True)
    files = []
    for i in range(3):
        path = tmp_path / f"guest_{i}.jpg"
        path.write_bytes(photo_bytes(100 + i, (1200, 800)))
        files.append(str(path))
    notes = tmp_path / "notes.txt"
    notes.write_text("not a photo")
    files.append(str(notes))

    page.goto(gallery["share_url"] + "/upload")
    page.fill("input[name=guest_name]", "Cousin Kim")
    page.set_input_files("#file-input", files)
    rows = page.locator("#files .file")
    assert rows.count() == 4
    page.wait_for_function(
        "() => document.querySelectorAll('#files .file.is-done .file-thumb img').length === 3"
        " && document.querySelectorAll('#files .file.is-error').length === 1", timeout=PATIENCE_MS)
    page.wait_for_function("() => [...document.querySelectorAll('#files .file-thumb img')].every(i => i.complete)")
    error_row = page.locator("#files .file.is-error")
    assert error_row.locator(".file-name").inner_text() == "notes.txt"
    assert "supported" in error_row.locator(".file-status").inner_text().lower()
    # Refused by the server (a 415 for that request): said as such, and no Retry that could only fail again.
    assert error_row.locator(".file-status").inner_text().startswith("Refused: ")
    assert error_row.locator(".retry").is_hidden()
    assert page.locator("#summary").inner_text().startswith("3 of 4 done")
    page.screenshot("guest-upload")

    page.click("#view-gallery a")
    page.wait_for_selector("#grid .tile")
    assert page.locator("#grid .tile").count() == 3


def test_guest_upload_page_stops_following_a_gallery_that_went_away(server: LiveServer, api: httpx.Client,
                                                                    page: Page, tmp_path: Path) -> None:
    """The status endpoint answers 404 (gallery unpublished, session gone): the page says so and stops asking."""
    gallery = make_gallery(api, [], allow_guest_uploads=True)
    path = tmp_path / "late.jpg"
    path.write_bytes(photo_bytes(300, (600, 400)))
    asked: list[float] = []

    def gone(route: Any) -> None:
        asked.append(time.monotonic())
        route.fulfill(status=404, content_type="application/json",
                      body='{"error": "There is no upload with this id."}')

    page.add_init_script("delete window.WebSocket")  # live.js then follows the upload by polling the endpoint
    page.route(re.compile(r".*/api/g/[^/]+/uploads/[0-9a-f]{32}$"), gone)
    page.goto(gallery["share_url"] + "/upload")
    page.set_input_files("#file-input", [str(path)])
    page.wait_for_selector("#upload-stopped", timeout=PATIENCE_MS)
    assert "There is no upload with this id." in page.inner_text("#upload-stopped")
    row = page.locator("#files .file")
    assert "is-error" in row.get_attribute("class")
    assert "progress can no longer be shown" in row.locator(".file-status").inner_text()
    seen = len(asked)
    page.wait_for_timeout(4000)  # the old page asked again every 1.5 s, forever
    assert len(asked) == seen


def test_guest_upload_page_waits_out_a_429_by_itself(server: LiveServer, api: httpx.Client, page: Page,
                                                     tmp_path: Path) -> None:
    gallery = make_gallery(api, [], allow_guest_uploads=True)
    path = tmp_path / "patient.jpg"
    path.write_bytes(photo_bytes(301, (600, 400)))
    answered: list[int] = []

    def slow_down_once(route: Any) -> None:
        if answered:
            answered.append(0)
            route.continue_()
            return
        answered.append(429)
        route.fulfill(status=429, headers={"Retry-After": "2", "Connection": "close"},
                      content_type="application/json", body='{"error": "Slow down."}')

    # The page sends with tus: the 429 answers the creation of the file's upload (POST .../tus).
    page.route(re.compile(r".*/api/g/[^/]+/tus$"), slow_down_once)
    page.goto(gallery["share_url"] + "/upload")
    page.set_input_files("#file-input", [str(path)])
    page.wait_for_function("() => /slow down/i.test(document.querySelector('#files .file-status').textContent)")
    page.wait_for_selector("#files .file.is-done .file-thumb img", timeout=PATIENCE_MS)
    assert answered == [429, 0]


def test_phone_favourites_and_favourites_zip(server: LiveServer, api: httpx.Client, phone: Page) -> None:
    photos = [(f"DSC_{i}.jpg", photo_bytes(200 + i, (600, 900) if i % 2 else (900, 600))) for i in range(5)]
    gallery = make_gallery(api, photos)
    phone.goto(gallery["share_url"])
    phone.wait_for_selector("#grid .tile")
    phone.wait_for_function(
        "() => [...document.querySelectorAll('#grid img')].every(i => i.complete && i.naturalWidth)")

    # Two or three columns, no horizontal scroll, and tiles load a derivative, never the original (which one fills
    # the tile at 3x: test_guest_walk_browser.py, test_tiles_get_an_image_as_wide_as_their_device_pixels).
    lefts = phone.eval_on_selector_all("#grid .tile", "els => els.map(e => Math.round(e.getBoundingClientRect().left))")
    assert len(set(lefts)) in (2, 3)
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    shown = phone.eval_on_selector_all("#grid img", "els => els.map(e => e.currentSrc)")
    assert all(s.endswith(("/grid", "/view")) for s in shown), shown
    phone.screenshot("phone-gallery")

    tiles = phone.locator("#grid .tile")
    picked = [tiles.nth(1).get_attribute("data-id"), tiles.nth(3).get_attribute("data-id")]
    for index in (1, 3):
        tiles.nth(index).locator(".heart").click()
        phone.wait_for_function("el => el.getAttribute('aria-pressed') === 'true'",
                                arg=tiles.nth(index).locator(".heart").element_handle())
    assert phone.locator(".fav-count").first.inner_text() == "2"

    phone.click("text=My favourites")
    phone.wait_for_selector("#download-favourites")
    assert [t.get_attribute("data-id") for t in phone.locator("#grid .tile").all()] == picked
    phone.fill("#guest-name input[name=name]", "Grandma")
    phone.click("#guest-name button")
    phone.wait_for_function("() => document.querySelector('.guest-name-status').textContent === 'Saved.'")
    phone.screenshot("phone-favourites")
    with phone.expect_download() as favourites:
        phone.click("#download-favourites")
    archive = zipfile.ZipFile(io.BytesIO(saved(favourites.value)))
    by_name = dict(photos)
    assert len(archive.namelist()) == 2
    assert all(archive.read(name) == by_name[name] for name in archive.namelist())


def test_phone_guest_upload_page(server: LiveServer, api: httpx.Client, phone: Page, tmp_path: Path) -> None:
    """At 390 x 844: rows with thumbnails, a refused file said as such, nothing wider than the screen."""
    gallery = make_gallery(api, [], allow_guest_uploads=True)
    files = []
    for i in range(2):
        path = tmp_path / f"phone_{i}.jpg"
        path.write_bytes(photo_bytes(400 + i, (800, 1200) if i else (1200, 800)))
        files.append(str(path))
    fake = tmp_path / "IMG_fake.jpg"
    fake.write_text("a text file with a photo's name\n" * 10)
    files.append(str(fake))
    phone.goto(gallery["share_url"] + "/upload")
    phone.fill("input[name=guest_name]", "Aunt Jo")
    phone.set_input_files("#file-input", files)
    phone.wait_for_function(
        "() => document.querySelectorAll('#files .file.is-done .file-thumb img').length === 2"
        " && document.querySelectorAll('#files .file[data-state=refused]').length === 1", timeout=30_000)
    phone.wait_for_function("() => [...document.querySelectorAll('#files .file-thumb img')].every(i => i.complete)")
    refused = phone.locator("#files .file[data-state=refused]")
    assert refused.locator(".file-name").inner_text() == "IMG_fake.jpg"
    assert refused.locator(".file-status").inner_text().startswith("Refused: ")
    assert refused.locator(".retry").is_hidden()
    assert phone.locator("#summary").inner_text() == "2 of 3 done · 1 failed"
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    phone.screenshot("guest-upload-phone")
