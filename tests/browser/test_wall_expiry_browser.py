"""Issue 35 #18 in a real browser: a wall that is running when its gallery expires ends up on the gallery's own
expired page (with its sentence), not on "Reconnecting…" over the last photos, nor on "wall link not valid"; and
the 404 page offers a way on."""

from __future__ import annotations

from pathlib import Path

import httpx

from picpeak_lite.store import db

from .. import imagefactory
from .conftest import PATIENCE_MS, LiveServer, Page, admin_login
from .test_event_browser import wait_shown, wall_link
from .test_guest_browser import make_gallery


def test_a_running_wall_shows_the_expired_page_when_its_gallery_expires(server: LiveServer, api: httpx.Client,
                                                                        page: Page, phone: Page) -> None:
    gallery = make_gallery(api, [("one.jpg", imagefactory.save(imagefactory.photo(900, 600, seed=3), "jpeg"))])
    page.goto(wall_link(api, gallery))
    wait_shown(page, 1)
    # The gallery's last day passes while the wall runs (set as the clock would: the API refuses a past date).
    conn = db.connect(Path(server.data_dir) / "picpeak.sqlite3")
    try:
        with db.transaction(conn):
            conn.execute("UPDATE galleries SET expires_at = 1000 WHERE id = ?", (gallery["id"],))
    finally:
        conn.close()
    # The feed is closed at its next access check (seconds); the wall then loads its address again.
    page.wait_for_selector("h1:has-text('This gallery has expired')", timeout=PATIENCE_MS)
    assert page.locator("#wall").count() == 0  # the slideshow is gone, not left running under a sentence
    assert "not valid" not in page.content()
    page.screenshot("wall-expired")
    phone.goto(gallery["share_url"] + "x/photos")
    assert "check that the link is complete" in phone.content()
    phone.screenshot("404-guest")


def test_the_admins_404_page_leads_back_to_the_galleries(server: LiveServer, page: Page) -> None:
    admin_login(page, server)
    page.goto(server.url + "/admin/galleries/424242")
    page.click("#way-on")
    page.wait_for_url(server.url + "/admin/")
    page.goto(server.url + "/admin/galleries/424242")
    page.screenshot("404-admin")
