"""The admin uploader shows what is really happening (issue 12 points 7, 9, 10), at 1440 x 900:

* choosing files brings the progress into view; the bar counts processed photos, not bytes sent; every row
  says its photo's own state, in step with the summary; "Retry failed" and "Clear finished" show only when
  there is something to retry or clear;
* a file the server refuses (in the 202's ``errors``, or a 4xx for the whole request) says "Refused: <reason>"
  and has no Retry button;
* the grid's Retry sends exactly one request (not the script's and the form's both) and the tile says so;
  without script the same button posts the form and the photo is retried all the same.

Every screen state the page goes through is recorded by a MutationObserver in the page, and the invariants are
checked on each one, so the test does not depend on catching a particular moment.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from .. import imagefactory
from .conftest import ARTIFACTS, LiveServer, Page, admin_login, failed_count, new_page

TIMEOUT_MS = 120_000

# Records, after each batch of DOM changes, what the summary says next to what the rows say.
RECORDER = """() => {
  window.__samples = [];
  const text = (id) => document.getElementById(id).textContent;
  const take = () => {
    const rows = [...document.querySelectorAll('#upload-list .up-item')];
    const count = (states) => rows.filter((r) => states.includes(r.dataset.state)).length;
    window.__samples.push({
      rows: rows.length, total: Number(text('up-total')), done: Number(text('up-done')),
      failed: Number(text('up-failed')), processing: Number(text('up-processing')),
      value: document.getElementById('up-progress').value,
      rowsInFlight: count(['queued', 'waiting', 'sending']),
      rowsProcessing: count(['pending', 'processing']),
      rowsFinished: count(['complete', 'failed', 'duplicate', 'refused', 'unsent', 'lost']),
      rowsProcessed: count(['complete', 'failed', 'duplicate', 'lost']),
      rowsRefused: count(['refused']),
      rowsRetry: rows.filter((r) => r.querySelector('button.retry-one')).length,
      rowsClearable: count(['complete', 'duplicate']),
      retryHidden: !document.getElementById('retry-all').checkVisibility(),
      clearHidden: !document.getElementById('clear-finished').checkVisibility(),
      processingLabels: rows.filter((r) => ['pending', 'processing'].includes(r.dataset.state))
        .map((r) => r.querySelector('.up-state').textContent),
    });
  };
  new MutationObserver(take).observe(document.getElementById('upload'),
                                     {subtree: true, childList: true, characterData: true, attributes: true});
}"""


@pytest.fixture
def desktop(browser: Any, request: Any) -> Iterator[Page]:
    yield from new_page(browser, request, viewport={"width": 1440, "height": 900})


def large_photos(folder: Path, count: int) -> list[Path]:
    """Photos big enough that processing visibly lags sending: one image, one changed pixel per copy (so no
    two files are duplicates of each other). Just under twice the view's 1500 px floor, so that libjpeg
    cannot hand over a 1/2-scale view and each photo is decoded whole and shrunk (at 3000 px the view came
    straight from the decoder and the last photo's processing could end between two samples)."""
    base = imagefactory.photo(2990, 1994, seed=42, noise=0.2)
    paths = []
    for i in range(count):
        image = base.copy()
        image.putpixel((i, 0), (i * 7 % 256, 0, 255))
        path = folder / f"DSC_{i:04d}.jpg"
        imagefactory.save(image, "jpeg", path, quality=85)
        paths.append(path)
    return paths


def wait_failed_count(server: LiveServer, photo_id: int, n: int) -> None:
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while failed_count(server, photo_id) < n:
        assert time.monotonic() < deadline, "the retried photo was not processed again"
        time.sleep(0.05)


def check_invariants(samples: list[dict[str, Any]]) -> None:
    for s in samples:
        assert s["total"] == s["rows"], s
        # The bar: processed photos over all photos, a refused file being no photo (never bytes sent).
        photos = s["rows"] - s["rowsRefused"]
        assert abs(s["value"] - (s["rowsProcessed"] / photos if photos else 0)) < 1e-9, s
        if s["rowsProcessing"] or s["rowsInFlight"]:
            assert s["value"] < 1, s
        # The rows and the summary tell the same story.
        assert s["processing"] == s["rowsProcessing"], s
        assert all(not label.startswith(("Queued", "Sending")) for label in s["processingLabels"]), s
        # The buttons show only when there is something for them to do.
        assert s["retryHidden"] == (s["rowsRetry"] == 0), s
        assert s["clearHidden"] == (s["rowsClearable"] == 0), s


def test_bulk_upload_progress_tracks_processing_and_refusals(server: LiveServer, api: httpx.Client,
                                                               desktop: Page, tmp_path: Path) -> None:
    page = desktop
    gallery = api.post("/api/admin/galleries", json={"name": "Progress"}).json()
    folder = tmp_path / "shoot"
    folder.mkdir()
    good = large_photos(folder, 12)
    truncated = folder / "cut_off.jpg"
    truncated.write_bytes(good[0].read_bytes()[:3000])  # accepted (a valid header), then fails in processing
    fake = folder / "notes.jpg"
    fake.write_text("these are my notes, not a photo\n" * 20)  # refused at upload: not an image
    alone = folder / "readme.jpg"
    alone.write_text("also not a photo\n" * 20)  # a request of only this file is refused as a whole (415)

    admin_login(page, server)
    page.goto(f"{server.url}/admin/galleries/{gallery['id']}")
    assert page.locator("#upload-summary").is_hidden()
    page.evaluate(RECORDER)

    page.set_input_files("#file-input", [str(p) for p in [*good, truncated, fake]])
    # The progress comes into view (at 1440 x 900 it starts at the fold): the summary and the first rows.
    page.wait_for_function("() => { const r = document.getElementById('upload-summary').getBoundingClientRect();"
                           " const row = document.querySelector('#upload-list .up-item').getBoundingClientRect();"
                           " return r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight"
                           " && row.bottom <= window.innerHeight; }")
    # Mid-processing: everything sent, photos still being processed, and the bar says so.
    page.wait_for_function("() => Number(document.getElementById('up-processing').textContent) > 0",
                           timeout=TIMEOUT_MS)
    ARTIFACTS.mkdir(exist_ok=True)
    page.page.screenshot(path=str(ARTIFACTS / "admin-upload-processing.png"))
    page.wait_for_function(
        "() => document.getElementById('up-done').textContent === '12'"
        " && document.getElementById('up-failed').textContent === '1'"
        " && document.getElementById('up-refused').textContent === '1'"
        " && document.getElementById('up-processing').textContent === '0'", timeout=TIMEOUT_MS)

    # Point 9, inside a 202: the refused file says why, and offers no Retry.
    refused = page.locator(".up-item", has_text="notes.jpg")
    assert refused.get_attribute("data-state") == "refused"
    assert re.match(r"Refused: \S", refused.locator(".up-state").inner_text())
    assert refused.locator("button").count() == 0
    # A photo that failed in processing keeps its reason and can be retried; so "Retry failed" shows.
    failed = page.locator(".up-item", has_text="cut_off.jpg")
    assert failed.locator(".up-state").inner_text() == "Failed"
    assert "truncated" in failed.locator(".up-error").inner_text().lower()
    assert failed.locator("button.retry-one").count() == 1
    assert page.locator("#retry-all").is_visible() and page.locator("#clear-finished").is_visible()
    assert page.locator(".up-item[data-state=complete] .up-state", has_text="Ready").count() == 12

    # Point 9, a whole request refused (415): "Refused: <reason>", no Retry.
    page.set_input_files("#file-input", [str(alone)])
    page.wait_for_selector(".up-item[data-state=refused]:has-text('readme.jpg')", timeout=TIMEOUT_MS)
    whole = page.locator(".up-item", has_text="readme.jpg")
    assert re.match(r"Refused: \S", whole.locator(".up-state").inner_text())
    assert whole.locator("button").count() == 0
    assert page.inner_text("#up-failed") == "1" and page.inner_text("#up-refused") == "2"

    # "Clear finished" removes the ready rows and then hides itself; "Retry failed" stays for the one retryable.
    page.click("#clear-finished")
    page.wait_for_function("() => !document.getElementById('clear-finished').checkVisibility()")
    assert page.locator(".up-item").count() == 3
    assert page.locator("#retry-all").is_visible()

    samples = page.evaluate("window.__samples")
    check_invariants([s for s in samples if s["rows"]])
    # The moment the issue was about: all bytes sent, photos still processing, the bar short of 100 %.
    assert any(s["rowsInFlight"] == 0 and s["rowsProcessing"] > 0 and s["value"] < 1 for s in samples)
    assert samples[-1]["value"] == 1

    with Image.open(ARTIFACTS / "admin-upload-processing.png") as shot:
        assert shot.size == (1440, 900)


def test_grid_retry_sends_one_request_and_shows_the_attempt(server: LiveServer, api: httpx.Client,
                                                            desktop: Page, browser: Any, request: Any) -> None:
    page = desktop
    gallery = api.post("/api/admin/galleries", json={"name": "Retry"}).json()
    retries: list[tuple[str, str]] = []
    page.on("request", lambda r: "/retry" in r.url and retries.append((r.method, r.url)))
    admin_login(page, server)
    url = f"{server.url}/admin/galleries/{gallery['id']}"
    page.goto(url)
    page.wait_for_timeout(500)  # the live connection is open

    # The failed tile is drawn by the live feed (the photographer is on the page when the photo fails).
    data = imagefactory.save(imagefactory.photo(800, 600, seed=3), "jpeg")[:3000]
    upload = api.post(f"/api/admin/galleries/{gallery['id']}/upload",
                      files=[("photos", ("broken.jpg", data, "image/jpeg"))]).json()
    [photo_id] = upload["photo_ids"]
    tile = page.locator(f'#grid li[data-id="{photo_id}"]')
    page.wait_for_selector(f'#grid li[data-id="{photo_id}"][data-status="failed"] button.retry', timeout=TIMEOUT_MS)

    for attempt in (1, 2):
        tile.locator("button.retry").click()
        wait_failed_count(server, photo_id, attempt + 1)
        word = "retry" if attempt == 1 else "retries"
        tile.locator(".retry-note", has_text=f"Failed again after {attempt} {word}").wait_for(timeout=TIMEOUT_MS)
        assert tile.get_attribute("data-status") == "failed"
        assert tile.locator("button.retry").is_enabled()
        page.wait_for_timeout(500)  # a second request, if one were sent, would have been seen by now
        assert retries == [("POST", f"{server.url}/api/admin/photos/{photo_id}/retry")] * attempt
        assert page.url == url  # no form post, no navigation

    # Without script the same button posts the form, and the photo is retried all the same.
    plain_pages = new_page(browser, request, viewport={"width": 1440, "height": 900}, java_script_enabled=False)
    plain = next(plain_pages)
    try:
        admin_login(plain, server)
        plain.goto(url)
        with plain.expect_request(lambda r: r.url.endswith(f"/admin/photos/{photo_id}/retry")) as posted:
            plain.locator(f'#grid li[data-id="{photo_id}"] button.retry').click()
        assert posted.value.method == "POST"
        plain.wait_for_url(re.compile(rf".*/admin/galleries/{gallery['id']}#photos$"))
        wait_failed_count(server, photo_id, 4)
    finally:
        next(plain_pages, None)
