"""The photographer's side in a real browser against a real server: bulk upload with live counters, retry,
delete seen from the guest page, a webhook delivered to a receiver on 127.0.0.1, the watermark on the view
image, and the QR code's modules. Screenshots of each main page go to test-artifacts/."""

from __future__ import annotations

import http.server
import io
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from PIL import Image, ImageChops, ImageStat

from picpeak_lite.web import qr

from .. import imagefactory
from .conftest import (
    PATIENCE_MS,
    PATIENCE_S,
    LiveServer,
    Page,
    admin_login,
    failed_count,
    new_page,
    start_server,
    stop_server,
)

GALLERY_PASSWORD = "table-7"
DONE_TIMEOUT_MS = PATIENCE_MS


class Receiver(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        Receiver.received.append({"event": self.headers.get("X-PicPeak-Event"), "body": json.loads(body)})
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    Receiver.received = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = start_server(tmp_path / "data", env={"PICPEAK_WEBHOOK_ALLOW_PRIVATE": "true"})
    yield live
    stop_server(live)


@pytest.fixture
def photos(tmp_path: Path) -> tuple[list[Path], list[Path]]:
    folder = tmp_path / "wedding"
    folder.mkdir()
    good = []
    for i in range(30):
        path = folder / f"IMG_{i:04d}.jpg"
        imagefactory.save(imagefactory.photo(800, 600, seed=i, noise=0.2), "jpeg", path, quality=80)
        good.append(path)
    broken = []
    for i in range(2):
        path = folder / f"broken_{i}.jpg"
        path.write_bytes(good[i].read_bytes()[:3000 + i])  # a valid header, then cut off
        broken.append(path)
    return good, broken


def counter(page: Page, name: str) -> int:
    return int(page.inner_text(f"#up-{name}"))


def wait_counters(page: Page, done: int, failed: int) -> None:
    page.wait_for_function(
        "([d, f]) => document.getElementById('up-done').textContent === String(d)"
        " && document.getElementById('up-failed').textContent === String(f)"
        " && document.getElementById('up-processing').textContent === '0'",
        arg=[done, failed], timeout=DONE_TIMEOUT_MS,
    )


def image_of(page: Page, url: str) -> Image.Image:
    response = page.request.get(url)
    assert response.status == 200, (url, response.status)
    return Image.open(io.BytesIO(response.body())).convert("L")


def mean_difference(a: Image.Image, b: Image.Image, box: tuple[int, int, int, int]) -> float:
    return ImageStat.Stat(ImageChops.difference(a.crop(box), b.crop(box))).mean[0]


def create_gallery(page: Page, server: LiveServer, name: str, *, password: str = "", guest_uploads: bool = False,
                   watermark: bool = False) -> int:
    page.goto(server.url + "/admin/galleries/new")
    page.fill("input[name=name]", name)
    if password:
        page.fill("input[name=password]", password)
    page.set_checked("input[name=allow_guest_uploads]", guest_uploads)
    page.set_checked("input[name=watermark]", watermark)
    page.click("button:has-text('Create gallery')")
    page.wait_for_url(re.compile(r".*/admin/galleries/\d+$"))
    return int(page.url.rsplit("/", 1)[1])


def test_photographer_workflow(server: LiveServer, page: Page, browser: Any, request: Any, receiver: str,
                               photos: tuple[list[Path], list[Path]]) -> None:
    good, broken = photos
    page.on("dialog", lambda dialog: dialog.accept())
    admin_login(page, server)

    # A webhook to a receiver on 127.0.0.1: the secret is shown once.
    page.goto(server.url + "/admin/settings/")
    page.fill("#webhook-form input[name=url]", receiver)
    page.click("#webhook-form button[type=submit]")
    assert re.fullmatch(r"[0-9a-f]{48}", page.input_value("#secret-value"))

    # A gallery with a password and guest uploads, published, with its QR codes.
    gallery_id = create_gallery(page, server, "Anna & Ben", password=GALLERY_PASSWORD, guest_uploads=True)
    page.click("button:has-text('Publish')")
    share = page.input_value("#share-link")
    assert page.input_value("#upload-link") == share + "/upload"
    png = page.request.get(f"{server.url}/admin/galleries/{gallery_id}/qr/gallery.png?scale=6").body()
    image = Image.open(io.BytesIO(png)).convert("L")
    modules = image.width // 6 - 2 * qr.BORDER
    seen = [[image.getpixel(((qr.BORDER + x) * 6 + 3, (qr.BORDER + y) * 6 + 3)) < 128 for x in range(modules)]
            for y in range(modules)]
    assert seen == qr.matrix(share)

    # 30 photos and 2 broken files through the bulk uploader: the counters reach 30 done and 2 failed.
    page.set_input_files("#file-input", [str(p) for p in good + broken])
    wait_counters(page, 30, 2)
    assert counter(page, "total") == 32 and counter(page, "sent") == 32
    failed_rows = page.locator(".up-item.up-failed")
    assert failed_rows.count() == 2
    reason = failed_rows.first.locator(".up-error").inner_text()
    assert "truncated" in reason.lower()
    page.screenshot("upload-done")

    # Retry one failed photo: it is processed again and fails again with the same reason.
    name = failed_rows.first.locator(".up-name").inner_text()
    # A truncated file fails again within milliseconds, so the row's brief 'waiting' state may never be
    # painted: watch the retry request itself, then the counters settle on the same reason.
    with page.expect_response(lambda r: r.url.endswith("/retry") and r.request.method == "POST") as retried:
        failed_rows.first.locator("button.retry-one").click()
    assert retried.value.status == 200
    photo_id = int(retried.value.url.rsplit("/", 2)[1])
    deadline = time.monotonic() + PATIENCE_S  # a hung-test stop, not a speed bound
    while failed_count(server, photo_id) < 2:  # the server processed it again and it failed again
        assert time.monotonic() < deadline, "the retried photo was not processed again"
        time.sleep(0.05)
    row = page.locator(".up-item", has_text=name)
    wait_counters(page, 30, 2)
    assert row.locator(".up-error").inner_text() == reason

    # The grid after a reload: 30 real thumbnails and 2 failed cards, nothing broken.
    page.reload()
    assert page.locator("#grid img.thumb").count() == 30
    assert page.locator("#grid .ph-failed").count() == 2
    page.wait_for_function("() => [...document.querySelectorAll('#grid img.thumb')]"
                           ".every(i => i.complete && i.naturalWidth > 0)", timeout=PATIENCE_MS)
    page.screenshot("gallery")

    # The guest sees the photo; the admin deletes it; the guest no longer sees it.
    first_id = page.locator("#grid li.tile-complete").first.get_attribute("data-id")
    guest_pages = new_page(browser, request, viewport={"width": 1280, "height": 900})
    guest = next(guest_pages)
    try:
        guest.goto(share)
        guest.fill("input[name=password]", GALLERY_PASSWORD)
        guest.click("button[type=submit]")
        guest.wait_for_selector(f"li.tile[data-id='{first_id}']")
        page.check(f"#grid li[data-id='{first_id}'] input[name=ids]")
        page.click("button[name=action][value=delete]")
        page.wait_for_load_state()
        page.wait_for_selector(f"#grid li[data-id='{first_id}']", state="detached")
        assert page.locator("#grid img.thumb").count() == 29
        guest.reload()
        guest.wait_for_selector("li.tile[data-id]")
        assert guest.locator(f"li.tile[data-id='{first_id}']").count() == 0
        assert guest.locator("li.tile[data-id]").count() == 29
    finally:
        next(guest_pages, None)

    # The delivery log shows deliveries to the receiver, and a test delivery goes out on request.
    page.goto(server.url + "/admin/settings/")
    page.click("button.send-test")
    deadline = time.monotonic() + PATIENCE_S  # a hung-test stop, not a speed bound
    while time.monotonic() < deadline:
        log = page.locator("#delivery-log")
        if log.count() and "webhook.test" in log.inner_text() and \
                page.locator("tr.delivery-delivered", has_text="webhook.test").count():
            break
        page.wait_for_timeout(250)
        page.reload()
    assert page.locator("tr.delivery-delivered", has_text="webhook.test").count() == 1
    assert page.locator("tr.delivery-delivered", has_text="photo.uploaded").count() >= 1
    assert page.locator("tr.delivery-delivered .status-code", has_text="200").count() >= 2
    events = {r["event"] for r in Receiver.received}
    assert {"webhook.test", "photo.uploaded", "photo.deleted"} <= events
    page.screenshot("settings")

    # A watermark: saved on the settings page, seen on the view image of a watermarked gallery.
    page.fill("input[name=watermark_text]", "PROOF")
    page.select_option("select[name=watermark_position]", "top-left")
    page.fill("input[name=watermark_opacity]", "1")
    page.fill("input[name=watermark_size]", "0.5")
    page.click("#watermark-form button[type=submit]")
    page.wait_for_url(re.compile(r".*saved=watermark.*"))
    marked_id = create_gallery(page, server, "Marked", watermark=True)
    page.set_input_files("#file-input", [str(good[5])])
    wait_counters(page, 1, 0)
    page.reload()
    marked_photo = page.locator("#grid li.tile-complete").first.get_attribute("data-id")
    page.goto(f"{server.url}/admin/galleries/{gallery_id}")
    plain_photo = page.locator("#grid li.tile-complete", has_text="IMG_0005.jpg").get_attribute("data-id")
    plain = image_of(page, f"{server.url}/api/admin/photos/{plain_photo}/view")
    marked = image_of(page, f"{server.url}/api/admin/photos/{marked_photo}/view")
    assert plain.size == marked.size == (800, 600)
    assert mean_difference(plain, marked, (20, 20, 400, 120)) > 10  # the mark, top left
    assert mean_difference(plain, marked, (420, 400, 800, 600)) < 3  # nothing elsewhere

    # Screenshots of the remaining main pages.
    page.goto(server.url + "/admin/")
    assert page.locator(f".gallery-card[data-gallery-id='{gallery_id}'] .count-complete").inner_text() == "29"
    assert page.locator(f".gallery-card[data-gallery-id='{gallery_id}'] .count-failed").inner_text() == "2"
    page.screenshot("dashboard")
    page.goto(f"{server.url}/admin/galleries/{gallery_id}/qr")
    page.screenshot("qr-sheet")
    page.goto(f"{server.url}/admin/galleries/{marked_id}")
    assert page.locator("#grid img.thumb").count() == 1
