"""Archive and restore in a real browser: the photographer archives from the gallery page (the archiver task of
the real server does the work), sees the space freed, the guest's phone shows the archived page, and restore
brings the gallery back. Screenshots: test-artifacts/*-archive-*.png."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from picpeak_lite.store import db
from picpeak_lite.store.queries import settings as settings_q

from .. import imagefactory
from .conftest import PATIENCE_S, LiveServer, Page, admin_login
from .test_guest_browser import make_gallery


def reload_until(page: Page, selector: str) -> None:
    """The gallery page does not follow the archiver live: reload until ``selector`` shows (a hung-test stop at
    PATIENCE_S, not a speed bound)."""
    deadline = time.monotonic() + PATIENCE_S
    while page.locator(selector).count() == 0:
        assert time.monotonic() < deadline, f"{selector} did not show"
        time.sleep(0.3)
        page.reload()


def test_archive_and_restore_from_the_gallery_page(server: LiveServer, api: httpx.Client, page: Page,
                                                   phone: Page) -> None:
    photos = [(f"IMG_{i}.jpg", imagefactory.save(imagefactory.photo(900, 600, seed=i), "jpeg")) for i in range(2)]
    gallery = make_gallery(api, photos)
    conn = db.connect(Path(server.data_dir) / "picpeak.sqlite3")
    try:
        with db.transaction(conn):
            settings_q.set_many(conn, {"contact_name": '"Ana Studio"', "contact_email": '"ana@example.com"'})
    finally:
        conn.close()
    admin_login(page, server)
    page.goto(server.url + f"/admin/galleries/{gallery['id']}#archive")
    page.on("dialog", lambda dialog: dialog.accept())
    page.click("#archive button:has-text('Archive now')")
    reload_until(page, "#archive[data-archive-state='archived'] #archive-bytes")
    freed = int(page.get_attribute("[data-bytes-freed]", "data-bytes-freed") or "0")
    assert freed > 0
    assert page.locator("#photos-archived").count() == 1
    page.locator("#archive").scroll_into_view_if_needed()
    page.screenshot("archive-admin")

    phone.goto(gallery["share_url"])
    assert phone.locator("h1").inner_text() == "This gallery has been archived"
    assert phone.locator("a[href='mailto:ana@example.com']").count() == 1
    phone.screenshot("archive-guest")

    page.click("#archive button:has-text('Restore')")
    reload_until(page, "#archive[data-archive-state='active']")
    reload_until(page, "#grid .tile-complete")
    page.screenshot("archive-restored")
    assert httpx.get(gallery["share_url"]).status_code == 200
