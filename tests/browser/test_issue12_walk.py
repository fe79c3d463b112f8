"""Issue 12, walked in one go: the photographer's and the guest's day at 1440 x 900 and 390 x 844, checking each
of the 21 points that a browser can see, with a screenshot per step in test-artifacts/ (``walk-NN-...``).

Points a browser cannot see are checked elsewhere and only named here: 2, 3 (tests/test_cli.py,
tests/test_server.py: the port in use, --version, config messages) and 6 (tests/test_deploy.py). Point 1's
installed wheel is tests/test_wheel.py; here the pages of the running server render. The deeper checks of each
point live in the modules named in its step (this walk is the user's path through all of them at once).
"""

from __future__ import annotations

import io
import re
import time
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from .. import imagefactory
from .conftest import PATIENCE_MS, PATIENCE_S, LiveServer, Page, admin_login, new_page, wait_processed
from .test_a11y_browser import AXE_OPTIONS
from .test_notice_browser import CONTRAST_JS


def shot(page: Page, number: int, label: str) -> None:
    page.screenshot(f"{number:02d}-{label}")


def no_axe_violations(page: Page) -> list[str]:
    from axe_playwright_python.sync_playwright import Axe

    return [v["id"] for v in Axe().run(page.page, options=AXE_OPTIONS).response["violations"]]


def test_issue12_walk(server: LiveServer, api: httpx.Client, browser: Any, request: Any, tmp_path: Path) -> None:
    request.node.name = "walk"  # screenshots: test-artifacts/walk-NN-label.png
    pages = new_page(browser, request, viewport={"width": 1440, "height": 900})
    page = next(pages)

    # 1. Every page renders, /healthz is 200, and 5. the favicon is there (no console error: conftest checks).
    assert page.request.get(server.url + "/healthz").status == 200
    assert page.request.get(server.url + "/favicon.ico").status == 200
    page.goto(server.url + "/admin/login")
    assert page.locator("input[name=password]").count() == 1
    shot(page, 1, "login")
    # 4. One log line per request, with method, path, status, bytes and time.
    page.request.get(server.url + "/no/such/page?token=secret")
    deadline = time.monotonic() + PATIENCE_S
    while not any('"GET /no/such/page' in line and " 404 " in line for line in server.output):
        assert time.monotonic() < deadline, "no request log line for the 404"
        time.sleep(0.1)
    line = next(x for x in server.output if '"GET /no/such/page' in x)
    assert "secret" not in line and re.search(r" 404 \d+ \d+ms", line), line

    # 7, 8, 9. Bulk upload: the progress comes into view, counts follow processing, a refused file says why.
    admin_login(page, server)
    gallery = api.post("/api/admin/galleries", json={
        "name": "Anna & Ben", "password": "table seven", "allow_guest_uploads": True, "allow_downloads": True,
    }).json()
    folder = tmp_path / "shoot"
    folder.mkdir()
    sizes = [(900, 600), (400, 600), (600, 600), (900, 300), (450, 600), (640, 480)]
    files = []
    for i, size in enumerate(sizes):
        path = folder / f"IMG_{i}.jpg"
        path.write_bytes(imagefactory.save(imagefactory.photo(*size, seed=i), "jpeg"))
        files.append(path)
    cut = folder / "cut_off.jpg"
    cut.write_bytes(files[0].read_bytes()[:3000])  # accepted, then fails in processing (for point 10)
    fake = folder / "notes.jpg"
    fake.write_text("not a photo\n" * 40)
    page.goto(f"{server.url}/admin/galleries/{gallery['id']}")
    assert page.text_content("#gallery-counts") == "0 ready"
    page.set_input_files("#file-input", [str(p) for p in [*files, cut, fake]])
    page.wait_for_function("() => { const r = document.getElementById('upload-summary').getBoundingClientRect();"
                           " return r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight; }")
    page.wait_for_function("() => document.getElementById('up-done').textContent === '6'", timeout=PATIENCE_MS)
    refused = page.locator("#upload-list .up-item", has_text="notes.jpg")
    # Sent as its own tus upload, the text file is refused when its bytes arrive, maybe after the others.
    refused.locator(".up-state", has_text="Refused").wait_for(timeout=PATIENCE_MS)
    assert re.match(r"Refused: \S", refused.locator(".up-state").inner_text())
    assert refused.locator("button.retry-one").count() == 0
    page.wait_for_function("() => document.getElementById('gallery-counts').textContent.startsWith('6 ready')",
                           timeout=PATIENCE_MS)
    shot(page, 7, "bulk-upload")

    # 10. The grid's Retry sends one request and the tile counts the attempt.
    retries: list[str] = []
    page.on("request", lambda r: "/retry" in r.url and retries.append(r.url))
    page.reload()
    failed_tile = page.locator('#grid li[data-status="failed"]').first
    failed_tile.locator("button.retry").click()
    failed_tile.locator(".retry-note", has_text="Failed again after 1 retry").wait_for(timeout=PATIENCE_MS)
    assert len(retries) == 1, retries
    shot(page, 10, "grid-retry")

    # 12. A webhook to a private address is refused with a sentence; 13. the watermark sentence is right.
    page.goto(server.url + "/admin/settings/")
    assert "Applies to photos processed from now on" not in page.content()
    page.fill("#webhook-form input[name=url]", "http://127.0.0.1:9/hook")
    page.click("#webhook-form button[type=submit]")
    assert page.locator("#webhooks .error, #webhooks .field-error").first.inner_text().strip()
    assert page.locator("#webhooks td.url", has_text="127.0.0.1:9").count() == 0
    shot(page, 12, "webhook-refused")
    # 17 (setup). The photographer's contact, for the expired page.
    page.fill("input[name=contact_name]", "Ana Studio")
    page.fill("input[name=contact_email]", "ana@example.com")
    page.click("#contact button[type=submit]")
    page.wait_for_url(re.compile(r".*saved=contact.*"))

    # 11. "Open" on a password gallery: the photographer sees it as a guest would, without the password.
    published = api.post(f"/api/admin/galleries/{gallery['id']}/publish").json()
    slug = published["slug"]
    page.goto(f"{server.url}/g/{slug}")
    assert page.locator(".preview-note").is_visible() and page.locator("input[name=password]").count() == 0
    assert page.locator("#grid .tile").count() == 6
    shot(page, 11, "admin-preview")
    next(pages, None)

    # 14. On a phone: the share links whole, the menu on at most two lines (an owner's eight items), no sideways
    # scroll.
    for phone in new_page(browser, request, viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True):
        admin_login(phone, server)
        phone.goto(f"{server.url}/admin/galleries/{gallery['id']}")
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
        tops = phone.eval_on_selector_all(
            ".topbar nav > a:visible, .topbar nav button",
            "items => new Set(items.map(e => Math.round(e.getBoundingClientRect().top))).size")
        assert tops <= 2
        assert phone.eval_on_selector("#share-link", "e => e.scrollHeight <= e.clientHeight + 1")
        shot(phone, 14, "admin-phone")

    # 15. The guest-upload QR code leads through the password to the upload page.
    for guest in new_page(browser, request, viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True):
        guest.goto(f"{server.url}/g/{slug}/upload")
        # 17. The lock page: an SVG, no emoji that could be an empty box.
        assert guest.locator(".gate-lock svg").count() == 1
        assert not re.search(r"[\U0001F300-\U0001FAFF\u231B]", guest.content())
        shot(guest, 17, "lock-page")
        guest.fill("input[name=password]", "table seven")
        guest.click("button[type=submit]")
        guest.wait_for_url(re.compile(rf".*/g/{slug}/upload$"))
        shot(guest, 15, "upload-after-password")

        # 18. Justified rows at the photos' own ratios; 21. a skip link and no axe violations.
        guest.goto(f"{server.url}/g/{slug}")
        tiles = guest.eval_on_selector_all("#grid .tile", """ts => ts.map(t => {
            const r = t.getBoundingClientRect(), a = t.querySelector('.tile-link');
            return [r.width / r.height, a.dataset.width / a.dataset.height]; })""")
        assert all(abs(shown - own) / own < 0.04 for shown, own in tiles), tiles
        assert guest.evaluate("document.documentElement.scrollWidth") <= 390
        assert guest.locator("a.skip-link[href='#main']").count() == 1
        assert no_axe_violations(guest) == []
        shot(guest, 18, "justified-phone")

        # 19. "Download all" says its count and size before it starts; a web size next to the original.
        announced = guest.text_content("#download-all-size") or ""
        assert re.match(r"6 photos: [\d.]+[ \xa0](kB|MB) \(web size about [\d.]+[ \xa0](kB|MB)\)", announced), announced
        guest.locator("#grid .tile-link").first.click()
        web = guest.locator("#lightbox .lb-download-web")
        assert web.is_visible() and "size=web" in (web.get_attribute("href") or "")
        with guest.expect_download() as download:
            web.click()
        with Image.open(io.BytesIO(Path(download.value.path()).read_bytes())) as copy:
            assert copy.format == "JPEG"
        shot(guest, 19, "lightbox-downloads")
        guest.keyboard.press("Escape")

        # 16. The live "new photos" notice's Show button is readable.
        late = api.post(f"/api/admin/galleries/{gallery['id']}/upload", files=[
            ("photos", ("late.jpg", imagefactory.save(imagefactory.photo(600, 400, seed=99), "jpeg")))]).json()
        wait_processed(api, late["upload_id"])
        button = guest.wait_for_selector("#new-photos:not([hidden]) .button", timeout=PATIENCE_MS)
        assert button.evaluate(CONTRAST_JS)["text"] >= 4.5
        shot(guest, 16, "new-photos-notice")
        # 20. "Upload time" is newest first: the photo just added is the first tile.
        guest.goto(f"{server.url}/g/{slug}?sort=uploaded")
        assert guest.locator("#grid .tile").first.get_attribute("data-id") == str(late["photo_ids"][0])
        shot(guest, 20, "upload-time-sort")

    # 17. The expired page: the contact, "expired" once in the text, no emoji.
    from picpeak_lite.store import db

    conn = db.connect(server.data_dir / "picpeak.sqlite3")
    try:
        with db.transaction(conn):
            conn.execute("UPDATE galleries SET expires_at = 1000 WHERE id = ?", (gallery["id"],))
    finally:
        conn.close()
    for desk in new_page(browser, request, viewport={"width": 1440, "height": 900}):
        desk.goto(f"{server.url}/g/{slug}")
        main_text = desk.inner_text("main")
        assert main_text.lower().count("expired") == 1, main_text
        assert "Ana Studio" in main_text and desk.locator("a[href='mailto:ana@example.com']").count() == 1
        assert desk.locator(".gate-lock svg").count() == 1
        assert no_axe_violations(desk) == []
        shot(desk, 17, "expired-page")
