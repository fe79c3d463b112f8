"""The event itself (issue 16) in a real browser against a real server: the live wall (a guest's photo appears on
an open wall; the wall reconnects after the server restarts), the review queue (approved in the admin's tab, it
appears in another guest's tab), the proofing export's formats and the favourites limit."""

from __future__ import annotations

import contextlib
import csv
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .. import imagefactory
from .conftest import PATIENCE_MS, LiveServer, Page, admin_login, api_client, new_page, start_server, stop_server
from .test_guest_browser import make_gallery, saved

# The shared generators as context managers: what follows their yield (closing, the console check) runs on exit.
open_page = contextlib.contextmanager(new_page)
open_api = contextlib.contextmanager(api_client)
WALL_KEY = re.compile(r'value="[^"]*/wall\?key=([A-Za-z0-9_-]+)" id="wall-link"')


@pytest.fixture(scope="module")
def server(tmp_path_factory: Any) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("event") / "data")
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def api(server: LiveServer) -> Iterator[httpx.Client]:
    yield from api_client(server)


def photo_file(tmp_path: Path, name: str, seed: int) -> str:
    path = tmp_path / name
    path.write_bytes(imagefactory.save(imagefactory.photo(1200, 800, seed=seed), "jpeg"))
    return str(path)


def wall_link(api: httpx.Client, gallery: dict[str, Any]) -> str:
    """A wall link made as the admin makes it (the gallery page's form), read back from the gallery page."""
    made = api.post(f"/admin/galleries/{gallery['id']}/wall-link", follow_redirects=False)
    assert made.status_code == 302, made.text
    key = WALL_KEY.search(api.get(f"/admin/galleries/{gallery['id']}").text)
    assert key, "the gallery page shows the wall link"
    return f"{gallery['share_url']}/wall?key={key.group(1)}"


def guest_upload(page: Page, gallery: dict[str, Any], path: str, name: str) -> None:
    page.goto(gallery["share_url"] + "/upload")
    page.fill("input[name=guest_name]", name)
    page.set_input_files("#file-input", [path])
    page.wait_for_selector('#files .file[data-state="complete"]', timeout=PATIENCE_MS)


def wait_shown(page: Page, count: int) -> list[dict[str, Any]]:
    page.wait_for_function("n => window.PicpeakWall && window.PicpeakWall.shown.length >= n", arg=count,
                           timeout=PATIENCE_MS)
    shown: list[dict[str, Any]] = page.evaluate("() => window.PicpeakWall.shown")
    return shown


def test_a_guests_photo_appears_on_an_open_wall(server: LiveServer, api: httpx.Client, page: Page, phone: Page,
                                               tmp_path: Path) -> None:
    gallery = make_gallery(api, [], allow_guest_uploads=True, wall_captions=True, password="party-pass")
    page.goto(wall_link(api, gallery))
    page.wait_for_selector("#wall-empty:not([hidden])")
    # A screen for a hall: nothing scrolls, the QR code is in its corner.
    assert page.evaluate("() => document.documentElement.scrollHeight <= innerHeight && "
                         "getComputedStyle(document.body).overflow === 'hidden'")
    assert page.locator(".wall-qr img").evaluate("img => img.complete && img.naturalWidth > 0")
    page.screenshot("wall-empty")
    phone.goto(gallery["share_url"])
    phone.fill("input[name=password]", "party-pass")
    phone.click("button[type=submit]")
    guest_upload(phone, gallery, photo_file(tmp_path, "dance.jpg", 7), "Uncle Tom")
    [first] = wait_shown(page, 1)
    layer = page.locator(".wall-layer.is-shown")
    src = layer.locator("img").get_attribute("src")
    assert re.search(rf"/g/{gallery['slug']}/wall/photos/{first['id']}\.jpg\?key=", src or ""), src
    assert layer.locator("figcaption").inner_text() == "Uncle Tom"
    page.wait_for_timeout(1500)  # the cross-fade
    page.screenshot("wall-photo")
    # Space pauses (and says so), space again goes on.
    page.keyboard.press(" ")
    assert page.evaluate("() => window.PicpeakWall.paused()") is True
    assert page.locator("#wall-state").inner_text() == "Paused"
    page.keyboard.press(" ")
    assert page.evaluate("() => window.PicpeakWall.paused()") is False


def test_the_wall_reconnects_after_the_server_restarts(browser: Any, request: Any, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    live = start_server(data_dir)
    port = live.url.rsplit(":", 1)[1]
    try:
        # One API client throughout: its token is in the data directory, and the server comes back on its port.
        with open_page(browser, request, viewport={"width": 1280, "height": 720}) as page, open_api(live) as api:
            gallery = make_gallery(api, [("before.jpg", imagefactory.save(imagefactory.photo(900, 600, seed=1),
                                                                          "jpeg"))])
            page.goto(wall_link(api, gallery))
            [before] = wait_shown(page, 1)
            stop_server(live)
            page.wait_for_selector("#wall-state:not([hidden])", timeout=PATIENCE_MS)  # "Reconnecting…"
            live = start_server(data_dir, "--port", port)
            data = imagefactory.save(imagefactory.photo(900, 600, seed=2), "jpeg")
            upload = api.post(f"/api/admin/galleries/{gallery['id']}/upload",
                              files=[("photos", ("after.jpg", data, "image/jpeg"))])
            assert upload.status_code == 202, upload.text
            after = upload.json()["photo_ids"][0]
            page.wait_for_function("id => window.PicpeakWall.shown.some(s => s.id === id)", arg=after,
                                   timeout=PATIENCE_MS)
            assert before["id"] != after
            page.wait_for_selector("#wall-state", state="hidden")
            # The refused connections while the server was away are expected; nothing else may be in the console.
            page.console_errors[:] = [e for e in page.console_errors
                                      if "WebSocket connection" not in e and "ERR_CONNECTION_REFUSED" not in e]
    finally:
        stop_server(live)


def test_approved_in_the_admins_tab_it_appears_in_a_guests_tab(server: LiveServer, api: httpx.Client, page: Page,
                                                               phone: Page, browser: Any, request: Any,
                                                               tmp_path: Path) -> None:
    gallery = make_gallery(api, [("first.jpg", imagefactory.save(imagefactory.photo(900, 600, seed=3), "jpeg"))],
                           allow_guest_uploads=True, guest_photos_need_approval=True)
    admin_login(page, server)
    page.goto(f"{server.url}/admin/galleries/{gallery['id']}")
    page.wait_for_selector("#review-empty:not([hidden])")
    with open_page(browser, request, viewport={"width": 1280, "height": 900}) as viewer:
        viewer.goto(gallery["share_url"])
        viewer.wait_for_selector("#grid .tile")
        guest_upload(phone, gallery, photo_file(tmp_path, "cake.jpg", 9), "Aunt Sue")
        assert "waiting for approval" in phone.locator("#files .file .file-status").inner_text()
        # The uploader sees its own photo; the queue shows it live.
        phone.wait_for_function("() => { const i = document.querySelector('#files .file-thumb img');"
                                " return i && i.complete && i.naturalWidth > 0; }", timeout=PATIENCE_MS)
        phone.goto(gallery["share_url"])  # the gallery page shows the uploader its waiting photo, alone
        phone.wait_for_function("() => { const i = document.querySelector('#own-waiting img');"
                                " return i && i.complete && i.naturalWidth > 0; }", timeout=PATIENCE_MS)
        item = page.locator("#review-list li.review-item").first
        item.wait_for(timeout=PATIENCE_MS)
        assert "Aunt Sue" in item.inner_text()
        item.locator("img.thumb").wait_for(timeout=PATIENCE_MS)
        page.screenshot("review-queue")
        assert viewer.locator("#new-photos").is_hidden()
        item.focus()
        page.keyboard.press("a")
        page.wait_for_selector("#review-list li.review-item", state="detached", timeout=PATIENCE_MS)
        viewer.wait_for_selector("#new-photos:not([hidden])", timeout=PATIENCE_MS)
        assert viewer.locator("#new-photos .notice-text").inner_text() == "1 new photo"
        viewer.click("#new-photos a")
        viewer.wait_for_function("() => document.querySelectorAll('#grid .tile').length === 2")


def heart(page: Page, index: int) -> None:
    page.locator("#grid .tile .heart").nth(index).click()


def test_favourites_limit_and_the_export_formats(server: LiveServer, api: httpx.Client, page: Page,
                                                 phone: Page) -> None:
    photos = [(f"DSC_{i:04d}.jpg", imagefactory.save(imagefactory.photo(900, 600, seed=20 + i), "jpeg"))
              for i in range(4)]
    gallery = make_gallery(api, photos, favourite_limit=2)
    # A guest names itself on the favourites page, then chooses: the third heart is refused with the sentence.
    phone.goto(gallery["share_url"] + "?favourites=1")
    phone.fill("#guest-name input[name=name]", "Anna")
    phone.click("#guest-name button[type=submit]")
    phone.wait_for_selector(".guest-name-status:has-text('Saved.')", timeout=PATIENCE_MS)
    phone.goto(gallery["share_url"] + "?sort=uploaded")
    assert "Choose up to 2 favourites" in phone.locator("#favourite-limit").inner_text()
    phone.wait_for_selector("#grid .tile")
    ids = phone.eval_on_selector_all("#grid .tile", "els => els.map(e => Number(e.dataset.id))")
    names = {photo_id: name for photo_id, (name, _) in zip(sorted(ids), photos, strict=True)}
    for index in (0, 1):
        heart(phone, index)
        phone.wait_for_selector(f"#grid .tile:nth-child({index + 1}).is-favourite")
    heart(phone, 2)
    phone.wait_for_selector("#favourite-error:not([hidden])", timeout=PATIENCE_MS)
    assert "You can choose up to 2 favourites" in phone.locator("#favourite-error").inner_text()
    assert phone.locator("#grid .tile.is-favourite").count() == 2
    phone.screenshot("favourite-limit")
    chosen = sorted(names[i] for i in ids[:2])

    admin_login(page, server)
    page.goto(f"{server.url}/admin/galleries/{gallery['id']}")
    row = page.locator('#proofing tr[data-guest="Anna"]')
    assert "2" in row.inner_text()
    page.screenshot("proofing")

    def download(link: Any) -> str:
        with page.expect_download() as got:
            link.click()
        return saved(got.value).decode()

    assert download(row.get_by_text("File names")) == "".join(f"{n}\n" for n in chosen)
    stems = [n.removesuffix(".jpg") for n in chosen]
    assert download(row.get_by_text("Lightroom filter")) == ", ".join(stems) + "\n"
    assert download(row.get_by_text("Capture One filter")) == " ".join(stems) + "\n"
    table = list(csv.reader(io.StringIO(download(page.locator("#proofing .proofing-everyone").get_by_text("CSV")))))
    assert table[0] == ["file name", "who", "when"]
    assert [r[:2] for r in table[1:]] == [[n, "Anna"] for n in chosen]
