"""Issue 35, the photographer's pages (points 4-10), in Chromium against a real server, at 1440 x 900 and
390 x 844 where layout is involved. Screenshots go to test-artifacts/ as ``<test name>-<label>.png``.

Every screen state the uploader goes through is recorded by a MutationObserver in the page, so no check depends
on catching a particular moment. Waits are hang guards (PATIENCE_MS), never speed bounds.
"""

from __future__ import annotations

import http.server
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .. import imagefactory
from .conftest import (
    ARTIFACTS,
    PATIENCE_MS,
    LiveServer,
    Page,
    admin_login,
    api_client,
    page_at,
    start_server,
    stop_server,
    wait_processed,
)

PARALLEL = 3  # static/admin-upload.js: requests in flight at once, so files really being sent at once

# After each batch of DOM changes: how many rows say "Sending", what the bar and its label say.
RECORDER = """() => {
  window.__samples = [];
  const take = () => {
    const rows = [...document.querySelectorAll('#upload-list .up-item')];
    const count = (states) => rows.filter((r) => states.includes(r.dataset.state)).length;
    // A "Queued" label off the window's width or cut inside its box (at whatever size the page is).
    const cut = (e) => { const b = e.getBoundingClientRect();
      return b.left < 0 || b.right > window.innerWidth || e.scrollWidth > e.clientWidth; };
    window.__samples.push({
      rows: rows.length,
      sendingLabels: rows.filter((r) => r.querySelector('.up-state').textContent.startsWith('Sending')).length,
      sendingRows: count(['sending']),
      queuedLabels: rows.filter((r) => r.querySelector('.up-state').textContent.startsWith('Queued')).length,
      queuedCut: rows.filter((r) => r.querySelector('.up-state').textContent.startsWith('Queued')
                                    && cut(r.querySelector('.up-state'))).length,
      processed: count(['complete', 'failed', 'duplicate', 'lost']),
      refused: count(['refused']),
      value: document.getElementById('up-progress').value,
    });
  };
  new MutationObserver(take).observe(document.getElementById('upload'),
                                     {subtree: true, childList: true, characterData: true, attributes: true});
}"""


def small_photos(folder: Path, count: int, *, prefix: str = "IMG_") -> list[Path]:
    """Small, distinct JPEGs (no two are duplicates), quick to send and to process."""
    paths = []
    for i in range(count):
        path = folder / f"{prefix}{i + 1:04d}.jpg"
        imagefactory.save(imagefactory.photo(320, 240, seed=i + 1), "jpeg", path)
        paths.append(path)
    return paths


def not_a_photo(folder: Path, name: str) -> Path:
    path = folder / name
    path.write_text("these are my notes, not a photo\n" * 20)
    return path


def open_gallery(page: Page, server: LiveServer, api: httpx.Client, name: str) -> dict[str, Any]:
    gallery = api.post("/api/admin/galleries", json={"name": name}).json()
    admin_login(page, server)
    page.goto(f"{server.url}/admin/galleries/{gallery['id']}")
    return gallery


def wait_settled(page: Page) -> None:
    """Every row has reached an end state (nothing queued, sending or processing)."""
    page.wait_for_function(
        "() => { const rows = [...document.querySelectorAll('#upload-list .up-item')];"
        " return rows.length && rows.every((r) => ['complete', 'failed', 'duplicate', 'refused', 'unsent', 'lost']"
        ".includes(r.dataset.state)); }", timeout=PATIENCE_MS)


VIEWPORTS = pytest.mark.parametrize("viewport", [(1440, 900), (390, 844)], ids=["desktop", "phone"])

BOX = """(e) => { const r = e.getBoundingClientRect();
  return {text: e.textContent.trim().slice(0, 60), left: r.left, right: r.right, width: r.width,
          scrollWidth: e.scrollWidth, clientWidth: e.clientWidth}; }"""


def assert_in_width(page: Page, selector: str, width: int, *, whole_text: bool = True) -> None:
    """The first element that matches is on screen across (inside 0..width) and, where whole_text, its text is
    not cut (nothing scrolls or ellipsises inside it)."""
    box = page.locator(selector).first.evaluate(BOX)
    assert box["width"] > 0 and box["left"] >= 0 and box["right"] <= width, (selector, box)
    if whole_text:
        assert box["scrollWidth"] <= box["clientWidth"], (selector, box)


# --- point 4 -------------------------------------------------------------------------------------------------

@VIEWPORTS
def test_queued_files_say_queued_and_refused_files_are_not_processed_photos(
        server: LiveServer, api: httpx.Client, browser: Any, request: Any, tmp_path: Path,
        viewport: tuple[int, int]) -> None:
    with page_at(browser, request, viewport) as page:
        queued_and_refused(page, server, api, tmp_path, viewport[0])


def queued_and_refused(page: Page, server: LiveServer, api: httpx.Client, tmp_path: Path, width: int) -> None:
    open_gallery(page, server, api, "Queue")
    page.evaluate(RECORDER)
    files = [*small_photos(tmp_path, 30), not_a_photo(tmp_path, "notes.jpg")]
    page.set_input_files("#file-input", [str(p) for p in files])
    page.wait_for_function("() => document.querySelector('#upload-list .up-item .up-state').textContent"
                           ".startsWith('Sending')", timeout=PATIENCE_MS)
    page.screenshot("sending")
    wait_settled(page)
    page.screenshot("settled")

    samples = [s for s in page.evaluate("window.__samples") if s["rows"]]
    # Only the files whose bytes are going up say "Sending": at most one per request in flight.
    assert max(s["sendingRows"] for s in samples) <= PARALLEL, max(s["sendingRows"] for s in samples)
    assert max(s["sendingLabels"] for s in samples) <= PARALLEL
    # The rest of the 31 said "Queued" while they waited.
    assert max(s["queuedLabels"] for s in samples) >= len(files) - PARALLEL
    # ... each of them whole and inside the window's width, every time the list changed (a phone too).
    assert max(s["queuedCut"] for s in samples) == 0, max(s["queuedCut"] for s in samples)
    # The bar counts processed photos over photos: the refused file is neither.
    for s in samples:
        photos = s["rows"] - s["refused"]
        assert abs(s["value"] - (s["processed"] / photos if photos else 0)) < 1e-9, s
    assert page.inner_text("#up-photos") == "30 of 30 photos"
    assert page.inner_text("#up-percent") == "100 %"
    assert page.inner_text("#up-refused") == "1"
    assert page.inner_text("#up-failed") == "0"
    if width <= 390:
        # On a phone the refused row's status, the summary line and the bar's label are whole and on screen.
        for selector in (".up-item[data-state=refused] .up-state", "#upload-summary p", "#up-bar-label"):
            assert_in_width(page, selector, width)
        assert page.locator(".up-item[data-state=refused] .up-state").is_visible()


# --- point 7 -------------------------------------------------------------------------------------------------

def inside_list(page: Page, name: str) -> bool:
    """Whether the row of this file is within the list's visible box (the list scrolls inside itself)."""
    return bool(page.evaluate(
        """(name) => { const list = document.getElementById('upload-list').getBoundingClientRect();
        const row = [...document.querySelectorAll('#upload-list .up-item')]
          .find((r) => r.querySelector('.up-name').textContent === name).getBoundingClientRect();
        return row.top >= list.top - 1 && row.bottom <= list.bottom + 1; }""", name))


def in_window(page: Page, name: str) -> bool:
    return bool(page.evaluate(
        """(name) => { const row = [...document.querySelectorAll('#upload-list .up-item')]
          .find((r) => r.querySelector('.up-name').textContent === name).getBoundingClientRect();
        return row.top >= 0 && row.bottom <= window.innerHeight; }""", name))


@pytest.mark.parametrize("viewport", [(1440, 900), (390, 844)], ids=["desktop", "phone"])
def test_failed_and_refused_uploads_stay_in_view(server: LiveServer, api: httpx.Client, browser: Any, request: Any,
                                                  tmp_path: Path, viewport: tuple[int, int]) -> None:
    with page_at(browser, request, viewport) as page:
        open_gallery(page, server, api, "Problems")
        photos = small_photos(tmp_path, 24)
        cut = tmp_path / "cut_off.jpg"
        cut.write_bytes(photos[0].read_bytes()[:3000])  # accepted (a valid header), then fails in processing
        page.set_input_files("#file-input", [str(p) for p in [*photos, cut, not_a_photo(tmp_path, "notes.jpg")]])
        wait_settled(page)
        # The two problems are the list's first rows, in sight without scrolling the list.
        names = page.locator("#upload-list .up-item .up-name").all_inner_texts()
        assert set(names[:2]) == {"cut_off.jpg", "notes.jpg"}, names[:4]
        assert inside_list(page, "notes.jpg") and inside_list(page, "cut_off.jpg")
        assert page.inner_text("#up-problems-link") == "2 files need attention"
        page.screenshot("settled")

        # Scrolled away (the list to its end, the page to its foot): the summary's link brings them back.
        page.evaluate("() => { const l = document.getElementById('upload-list'); l.scrollTop = l.scrollHeight;"
                      " window.scrollTo(0, document.body.scrollHeight); }")
        assert not inside_list(page, "notes.jpg")
        page.evaluate("() => document.getElementById('upload').scrollIntoView()")
        page.click("#up-problems-link")
        page.wait_for_function("() => document.getElementById('upload-list').scrollTop === 0")
        assert inside_list(page, "notes.jpg") and in_window(page, "notes.jpg") and in_window(page, "cut_off.jpg")
        page.screenshot("after-link")


# --- point 5 -------------------------------------------------------------------------------------------------

def shot_at(number: int) -> bytes:
    """IMG_00NN, taken at 14:NN on the day: capture order is name order."""
    exif = imagefactory.make_exif(date_original=f"2024:06:14 14:{number:02d}:00")
    return imagefactory.save(imagefactory.photo(320, 240, seed=number), "jpeg", exif=exif)


@VIEWPORTS
def test_admin_grid_is_in_capture_order_and_the_cover_is_the_guests(server: LiveServer, api: httpx.Client,
                                                                     browser: Any, request: Any, tmp_path: Path,
                                                                     viewport: tuple[int, int]) -> None:
    with page_at(browser, request, viewport) as page:
        capture_order_and_cover(page, server, api, tmp_path, viewport[0])


def capture_order_and_cover(page: Page, server: LiveServer, api: httpx.Client, tmp_path: Path, width: int) -> None:
    gallery = api.post("/api/admin/galleries", json={"name": "Order"}).json()
    gid = gallery["id"]
    # Two batches as two parallel uploads leave them: the later shots arrive first.
    for numbers in ((21, 22, 23), (1, 2, 3)):
        files = [("photos", (f"IMG_{n:04d}.jpg", shot_at(n), "image/jpeg")) for n in numbers]
        answer = api.post(f"/api/admin/galleries/{gid}/upload", files=files)
        assert answer.status_code == 202, answer.text
        wait_processed(api, answer.json()["upload_id"])
    assert api.post(f"/api/admin/galleries/{gid}/publish").status_code == 200

    admin_login(page, server)
    page.goto(f"{server.url}/admin/galleries/{gid}")
    names = page.locator("#grid li .name").all_inner_texts()
    assert names == [f"IMG_{n:04d}.jpg" for n in (1, 2, 3, 21, 22, 23)], names
    if width <= 390:
        # On a phone the grid's first tiles (the first row) are on screen across, their names whole.
        for n in (1, 2):
            assert_in_width(page, f"#grid li:nth-child({n})", width)
            assert_in_width(page, f"#grid li:nth-child({n}) .name", width)
    # The thumbnails load lazily: bring the grid into view and let them arrive, so the screenshot shows them.
    page.locator("#grid").scroll_into_view_if_needed()
    page.wait_for_function("() => [...document.querySelectorAll('#grid img.thumb')]"
                           ".every((i) => i.complete && i.naturalWidth > 0)", timeout=PATIENCE_MS)
    page.screenshot("grid")

    # One cover everywhere: the dashboard's card shows the guest page's hero photo.
    page.goto(f"{server.url}/admin/")
    card = page.locator(".cover-thumb").first.get_attribute("src") or ""
    if width <= 390:
        assert_in_width(page, ".cover-thumb", width, whole_text=False)
    page.screenshot("dashboard")
    page.goto(f"{server.url}/g/{gallery['slug']}")
    hero = page.locator("img.hero-img").get_attribute("src") or ""
    if width <= 390:
        assert_in_width(page, "img.hero-img", width, whole_text=False)
    card_id, hero_id = re.search(r"/photos/(\d+)/", card), re.search(r"/photos/(\d+)/", hero)
    assert card_id and hero_id, (card, hero)
    assert card_id.group(1) == hero_id.group(1), (card, hero)
    first = api.get(f"/api/admin/galleries/{gid}/photos").json()["photos"][0]
    assert first["filename"] == "IMG_0001.jpg" and str(first["id"]) == hero_id.group(1)
    page.screenshot("hero")

    # Live: tiles that arrive while the page is open go in by name, whichever file was sent first.
    live = api.post("/api/admin/galleries", json={"name": "Live order"}).json()
    page.goto(f"{server.url}/admin/galleries/{live['id']}")
    paths = []
    for n in (21, 22, 1, 2):
        path = tmp_path / f"IMG_{n:04d}.jpg"
        path.write_bytes(shot_at(n))
        paths.append(str(path))
    page.set_input_files("#file-input", paths)
    page.wait_for_function("() => document.querySelectorAll('#grid li[data-status=complete]').length === 4",
                           timeout=PATIENCE_MS)
    names = page.locator("#grid li .name").all_inner_texts()
    assert names == [f"IMG_{n:04d}.jpg" for n in (1, 2, 21, 22)], names


# --- point 6 -------------------------------------------------------------------------------------------------

MB = 1024 * 1024


@pytest.fixture
def chunked(tmp_path: Path) -> Iterator[LiveServer]:
    """A server that takes tus uploads in 1 MB pieces, so that a 3 MB file is three PATCHes."""
    live = start_server(tmp_path / "chunked", env={"PICPEAK_UPLOAD_CHUNK_MB": "1"})
    yield live
    stop_server(live)


@VIEWPORTS
def test_an_unfinished_upload_is_named_after_a_reload(chunked: LiveServer, browser: Any, request: Any,
                                                       tmp_path: Path, viewport: tuple[int, int]) -> None:
    with page_at(browser, request, viewport) as page:
        unfinished_after_reload(page, chunked, tmp_path, viewport[0])


def unfinished_after_reload(page: Page, chunked: LiveServer, tmp_path: Path, width: int) -> None:
    clients = api_client(chunked)
    api = next(clients)
    path = tmp_path / "DSC_0042.jpg"
    photo = imagefactory.save(imagefactory.photo(1200, 900, seed=42), "jpeg")
    path.write_bytes(photo + bytes(3 * MB - len(photo)))  # a real JPEG padded to three 1 MB pieces

    # The second piece is held: the upload is a third done when the photographer reloads the page.
    held: list[Any] = []

    def hold(route: Any) -> None:
        if route.request.method == "PATCH" and route.request.headers.get("upload-offset") == str(MB):
            held.append(route)
            return
        route.continue_()

    page.on("dialog", lambda dialog: dialog.accept())
    open_gallery(page, chunked, api, "Reload")
    page.route("**/tus/*", hold)
    page.set_input_files("#file-input", [str(path)])
    for _ in range(PATIENCE_MS // 100):
        if held:
            break
        page.wait_for_timeout(100)
    assert held, "the page never sent the second piece"
    held[0].abort()
    page.reload()
    page.unroute("**/tus/*")
    # The one request this test cut is logged by Chromium as failed; nothing else may be.
    assert sum("ERR_FAILED" in e for e in page.console_errors) <= 1, page.console_errors
    page.console_errors[:] = [e for e in page.console_errors if "ERR_FAILED" not in e]

    note = page.locator("#up-unfinished")
    note.wait_for(state="visible", timeout=PATIENCE_MS)
    assert note.inner_text().startswith("1 unfinished upload: choose the file again to resume.")
    assert "DSC_0042.jpg (33 % sent)" in note.inner_text()
    if width <= 390:
        # On a phone the note is on screen across and its text wraps inside it (nothing cut off).
        assert_in_width(page, "#up-unfinished", width)
        assert note.is_visible()
    page.screenshot("note")

    # Choosing it again resumes it (from the second piece), and the note goes.
    patches: list[str] = []
    page.on("request", lambda r: r.method == "PATCH" and patches.append(r.headers.get("upload-offset", "")))
    page.set_input_files("#file-input", [str(path)])
    note.wait_for(state="hidden", timeout=PATIENCE_MS)
    page.wait_for_selector(".up-item[data-state=complete]", timeout=PATIENCE_MS)
    assert patches[0] == str(MB), patches
    page.reload()
    page.wait_for_timeout(1000)  # the page asked the server about what it remembers (nothing now)
    assert note.is_hidden()
    next(clients, None)


# --- point 8 -------------------------------------------------------------------------------------------------

def test_the_photographers_preview_is_no_view_and_the_chart_has_a_scale(server: LiveServer, api: httpx.Client,
                                                                        browser: Any, request: Any) -> None:
    gallery = api.post("/api/admin/galleries", json={"name": "Visits"}).json()
    gid, slug = gallery["id"], gallery["slug"]
    answer = api.post(f"/api/admin/galleries/{gid}/upload",
                      files=[("photos", ("IMG_0001.jpg", shot_at(1), "image/jpeg"))])
    wait_processed(api, answer.json()["upload_id"])
    photo_id = answer.json()["photo_ids"][0]

    # The photographer opens the draft's preview, publishes, and opens the guest page: none of it is a view.
    with page_at(browser, request, (1440, 900)) as page:
        admin_login(page, server)
        page.goto(f"{server.url}/g/{slug}")
        assert api.post(f"/api/admin/galleries/{gid}/publish").status_code == 200
        page.goto(f"{server.url}/g/{slug}")
        page.goto(f"{server.url}/admin/")
        assert page.inner_text(f'[data-activity-for="{gid}"]') == "No visits yet."

        # Guests: 40 views and one download today. The download's bar is short but visible, and the chart
        # says what its height means (0 and the peak, 40).
        with httpx.Client(base_url=server.url, timeout=60) as guest:
            for _ in range(40):
                assert guest.get(f"/g/{slug}").status_code == 200
            assert guest.get(f"/g/{slug}/photos/{photo_id}/download").status_code == 200
        for viewport in ((1440, 900), (390, 844)):
            page.set_viewport_size({"width": viewport[0], "height": viewport[1]})
            page.goto(f"{server.url}/admin/")
            card = page.locator(f'[data-activity-for="{gid}"]')
            assert card.locator(".activity-views").inner_text() == "40 views"
            assert card.locator(".axis-max").text_content() == "40"
            assert card.locator(".axis-zero").text_content() == "0"
            bars = card.locator("rect").evaluate_all(
                "(rects) => rects.map((r) => [r.getAttribute('class'), r.getBoundingClientRect().height,"
                " r.querySelector('title').textContent])")
            shown = [(kind, height) for kind, height, title in bars if not title.split(": ")[1].startswith("0 ")]
            assert ("bar-downloads", 3.0) in [(k, round(h, 1)) for k, h in shown], shown
            assert all(height >= 3 for _, height in shown), shown
            assert max(height for _, height in shown) >= 40, shown
            card.screenshot(path=str(ARTIFACTS / f"activity-chart-{viewport[0]}.png"))
            page.screenshot(f"dashboard-{viewport[0]}")


# --- point 9 -------------------------------------------------------------------------------------------------

class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hooked(tmp_path: Path) -> Iterator[tuple[LiveServer, str]]:
    """A server that may post to 127.0.0.1, and a receiver there with a long path."""
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    live = start_server(tmp_path / "hooked", env={"PICPEAK_WEBHOOK_ALLOW_PRIVATE": "true"})
    yield live, f"http://127.0.0.1:{receiver.server_address[1]}/hooks/picpeak/anna-and-ben-wedding-receiver"
    stop_server(live)
    receiver.shutdown()
    receiver.server_close()


OUTSIDE = """(selector) => [...document.querySelectorAll(selector)].filter((e) => {
  const r = e.getBoundingClientRect();
  return r.width > 0 && (r.left < -0.5 || r.right > window.innerWidth + 0.5);
}).map((e) => e.textContent.trim().slice(0, 40))"""


def test_settings_webhooks_and_the_menu_fit_a_phone(hooked: tuple[LiveServer, str], phone: Page) -> None:
    server, receiver = hooked
    page = phone
    admin_login(page, server)
    page.goto(server.url + "/admin/settings/")
    page.fill("#webhook-form input[name=url]", receiver)
    page.click("#webhook-form button[type=submit]")
    page.wait_for_selector("#endpoints")
    page.click("button.send-test")
    for _ in range(PATIENCE_MS // 250):
        page.goto(server.url + "/admin/settings/#deliveries")
        if page.locator("tr.delivery-delivered").count():
            break
        page.wait_for_timeout(250)
    assert page.locator("tr.delivery-delivered").count() == 1

    # Every item of the owner's menu, Password included, is on screen (on at most two lines: an owner's menu has
    # the accounts, the audit trail and the second factor too).
    items = page.locator(".topbar nav > a, .topbar nav button")
    assert items.all_inner_texts() == ["Galleries", "New gallery", "Settings", "Accounts", "Audit trail", "Password",
                                       "Second factor", "Log out"]
    assert page.evaluate(OUTSIDE, ".topbar nav > a, .topbar nav button") == []
    tops = items.evaluate_all("(es) => new Set(es.map((e) => Math.round(e.getBoundingClientRect().top))).size")
    assert tops <= 2
    # The webhook tables: no cell and no button off the screen, and the URL wraps at the screen's width
    # (at most two lines of 390 px, where a 3-character column needed dozens).
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert page.evaluate(OUTSIDE, "#endpoints td, #endpoints button, #delivery-log td") == []
    for cell in ("#endpoints td.url", "#delivery-log td.url"):
        box = page.locator(cell).first.bounding_box()
        assert box is not None and box["width"] >= 300, (cell, box)
        lines = page.locator(cell).first.evaluate(
            "(e) => Math.round(e.getBoundingClientRect().height / parseFloat(getComputedStyle(e).lineHeight))")
        assert lines <= 3, (cell, lines)
    for button in ("Send test", "Pause", "Remove"):
        assert page.locator("#endpoints button", has_text=button).is_visible()
    page.screenshot("settings")
    page.locator(".topbar").screenshot(path=str(ARTIFACTS / "phone-menu.png"))
    page.locator("#webhooks").screenshot(path=str(ARTIFACTS / "phone-webhooks.png"))
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(server.url + "/admin/settings/#webhooks")
    assert page.evaluate(OUTSIDE, "#endpoints td, #endpoints button, #delivery-log td") == []
    page.screenshot("settings-desktop")


# --- point 10 ------------------------------------------------------------------------------------------------

ROWS = """(selector) => [...document.querySelectorAll(selector)].map((e) => {
  const r = e.getBoundingClientRect(), tile = e.closest('li').getBoundingClientRect();
  return {text: e.textContent.trim(), top: Math.round(r.top), left: r.left - tile.left, right: tile.right - r.right};
})"""


@pytest.mark.parametrize("viewport", [(1440, 900), (390, 844)], ids=["desktop", "phone"])
def test_delete_label_and_review_buttons_sit_right(server: LiveServer, api: httpx.Client, browser: Any,
                                                   request: Any, tmp_path: Path, viewport: tuple[int, int]) -> None:
    created = api.post("/api/admin/galleries", json={"name": "Anna & Ben", "allow_guest_uploads": True,
                                                     "guest_photos_need_approval": True}).json()
    gallery = api.post(f"/api/admin/galleries/{created['id']}/publish").json()
    with page_at(browser, request, (390, 844)) as guest:
        path = tmp_path / "cake.jpg"
        path.write_bytes(shot_at(9))
        guest.goto(gallery["share_url"] + "/upload")
        guest.fill("input[name=guest_name]", "Aunt Sue")
        guest.set_input_files("#file-input", [str(path)])
        guest.wait_for_selector('#files .file[data-state="complete"]', timeout=PATIENCE_MS)

    width = viewport[0]
    with page_at(browser, request, viewport) as page:
        admin_login(page, server)
        page.goto(f"{server.url}/admin/galleries/{gallery['id']}")
        page.locator("#review-list li.review-item img.thumb").wait_for(timeout=PATIENCE_MS)
        # The review tile's three buttons on one row, none touching the tile's edge.
        buttons = page.evaluate(ROWS, "#review-list .review-actions button")
        assert [b["text"] for b in buttons] == ["Approve", "Hide", "Delete"]
        assert len({b["top"] for b in buttons}) == 1, buttons
        assert all(b["left"] >= 4 and b["right"] >= 4 for b in buttons), buttons
        # Each button's label fits inside it.
        assert page.evaluate("() => [...document.querySelectorAll('#review-list .review-actions button')]"
                             ".every((b) => b.scrollWidth <= b.clientWidth)")
        page.locator("#review").screenshot(path=str(ARTIFACTS / f"review-tile-{width}.png"))
        # "Type Anna & Ben to confirm" is one line above its box.
        label = page.locator("section.danger label span")
        lines = label.evaluate("(e) => Math.round(e.getBoundingClientRect().height"
                               " / parseFloat(getComputedStyle(e).lineHeight))")
        assert label.inner_text() == "Type Anna & Ben to confirm" and lines == 1, lines
        page.locator("section.danger").screenshot(path=str(ARTIFACTS / f"delete-gallery-{width}.png"))
