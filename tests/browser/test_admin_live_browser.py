"""The admin gallery grid follows hide and show made elsewhere (another tab, the API) without a reload."""

from __future__ import annotations

import time
from typing import Any

import httpx

from .. import imagefactory
from .conftest import PATIENCE_MS, PATIENCE_S, LiveServer, Page, admin_login


def test_live_grid_shows_hide_and_show_of_a_complete_photo(server: LiveServer, api: httpx.Client,
                                                           page: Page) -> None:
    gallery = api.post("/api/admin/galleries", json={"name": "Live"}).json()
    photo = imagefactory.save(imagefactory.photo(600, 400, seed=7), "jpeg")
    upload = api.post(f"/api/admin/galleries/{gallery['id']}/upload", files=[("photos", ("a.jpg", photo))]).json()
    deadline = time.monotonic() + PATIENCE_S  # a hung-test stop, not a speed bound
    while not api.get(f"/api/admin/uploads/{upload['upload_id']}").json()["done"]:
        assert time.monotonic() < deadline, "the photo was not processed in time"
        time.sleep(0.2)
    [photo_id] = upload["photo_ids"]

    admin_login(page, server)
    frames: list[Any] = []  # what the page's live connection received
    page.on("websocket", lambda socket: socket.on("framereceived", lambda frame: frames.append(frame)))
    page.goto(f"{server.url}/admin/galleries/{gallery['id']}")
    tile = f'#grid li[data-id="{photo_id}"]'
    page.wait_for_selector(f'{tile}[data-status="complete"]:not(.is-hidden)')
    deadline = time.monotonic() + PATIENCE_S
    while not frames:  # the live connection is open: its snapshot arrived (a fixed wait would be a speed bound)
        assert time.monotonic() < deadline, "the live connection did not open"
        page.wait_for_timeout(50)

    bulk = f"/api/admin/galleries/{gallery['id']}/photos/bulk"
    assert api.post(bulk, json={"action": "hide", "ids": [photo_id]}).json()["changed"] == 1
    page.wait_for_selector(f"{tile}.is-hidden", timeout=PATIENCE_MS)
    assert page.locator(f"{tile} .meta .badge", has_text="Hidden").count() == 1
    assert api.post(bulk, json={"action": "show", "ids": [photo_id]}).json()["changed"] == 1
    page.wait_for_selector(f"{tile}:not(.is-hidden)", timeout=PATIENCE_MS)
    assert page.locator(f"{tile} .meta .badge", has_text="Hidden").count() == 0
    assert page.locator(f"{tile} img.thumb").count() == 1


def test_photo_counts_follow_the_live_feed(server: LiveServer, api: httpx.Client, page: Page) -> None:
    """Issue 12, point 8: "Photos: 0 ready" becomes "2 ready" without a reload, as the grid does."""
    gallery = api.post("/api/admin/galleries", json={"name": "Counts"}).json()
    admin_login(page, server)
    frames: list[Any] = []
    page.on("websocket", lambda socket: socket.on("framereceived", lambda frame: frames.append(frame)))
    page.goto(f"{server.url}/admin/galleries/{gallery['id']}")
    assert page.text_content("#gallery-counts") == "0 ready"
    deadline = time.monotonic() + PATIENCE_S
    while not frames:
        assert time.monotonic() < deadline, "the live connection did not open"
        page.wait_for_timeout(50)

    files = [("photos", (f"p{i}.jpg", imagefactory.save(imagefactory.photo(500, 400, seed=i), "jpeg")))
             for i in range(2)]
    bad = ("photos", ("bad.png", imagefactory.save(imagefactory.photo(300, 200, seed=9), "png")[:200]))
    api.post(f"/api/admin/galleries/{gallery['id']}/upload", files=[*files, bad])
    page.wait_for_function("() => document.getElementById('gallery-counts').textContent.startsWith('2 ready')",
                           timeout=PATIENCE_MS)
    page.wait_for_function("() => !document.getElementById('gallery-counts').textContent.includes('waiting')",
                           timeout=PATIENCE_MS)
    page.screenshot("counts")
