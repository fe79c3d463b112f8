"""Issue 35 #18: an error page is never a dead end, and an expired gallery's wall says that it expired.

The 404 page offers the photographer the way back to the galleries (or the login), and a guest the page of ours
they came from with what to check; a guest is never shown an admin link. A wall link of an expired gallery is
answered with the gallery page's own expired page and sentence, not "this wall link is not valid"."""

from __future__ import annotations

import re
from typing import Any

from picpeak_lite.domain import wall
from picpeak_lite.domain.access import GalleryExpired
from picpeak_lite.services import Services

from .conftest import AuthActions
from .factories import EXPIRED_AT, published


def way_on(html: str) -> tuple[str, str] | None:
    found = re.search(r'<a class="button" href="([^"]*)" id="way-on">([^<]*)</a>', html)
    return (found.group(1), found.group(2)) if found else None


async def test_the_404_page_has_a_way_on_for_the_admin_and_for_a_guest(admin: AuthActions, app: Any) -> None:
    gallery = await published(admin, name="Picnic")
    page = await admin.client.get("/admin/galleries/99999")
    assert page.status_code == 404
    assert way_on(await page.get_data(as_text=True)) == ("/admin/", "Back to your galleries")
    # The admin who follows a guest link that is wrong is sent home as well.
    wrong_guest_link = await admin.client.get("/g/no-such-gallery-abcdefgh")
    assert way_on(await wrong_guest_link.get_data(as_text=True)) == ("/admin/", "Back to your galleries")

    stranger = app.test_client()
    admin_address = await stranger.get("/admin/no-such-page")
    assert admin_address.status_code == 404
    assert way_on(await admin_address.get_data(as_text=True)) == ("/admin/login", "Log in as the photographer")

    guest = app.test_client()
    typo = await guest.get("/g/" + gallery["slug"][:-1])
    html = await typo.get_data(as_text=True)
    assert typo.status_code == 404
    assert "check that the link is complete" in html
    assert way_on(html) is None and "/admin" not in html  # nowhere of ours to go back to, and no admin link
    # From one of our pages (a photo's stale link on the gallery page): back to that page.
    stale = await guest.get(f"/g/{gallery['slug']}/photos/99999/view.jpg",
                            headers={"Referer": f"http://localhost/g/{gallery['slug']}?sort=new"})
    assert stale.status_code == 404
    assert way_on(await stale.get_data(as_text=True)) == (f"/g/{gallery['slug']}?sort=new",
                                                           "Back to the previous page")
    # Another site's page, or an address that would leave the site, is not offered.
    for referer in ("https://elsewhere.example/g/x", "http://localhost//elsewhere.example/x"):
        elsewhere = await guest.get("/g/nope-abcdefgh", headers={"Referer": referer})
        assert way_on(await elsewhere.get_data(as_text=True)) is None, referer


async def test_an_expired_gallerys_wall_says_it_expired_as_the_gallery_page_does(
        admin: AuthActions, services: Services, app: Any) -> None:
    gallery = await published(admin, name="Summer ball")
    slug, gid = gallery["slug"], gallery["id"]
    made = await admin.client.post(f"/admin/galleries/{gid}/wall-link", form={"csrf_token": admin.csrf})
    assert made.status_code == 302
    key = re.search(r'/wall\?key=([A-Za-z0-9_-]+)" id="wall-link"',
                    await (await admin.client.get(f"/admin/galleries/{gid}")).get_data(as_text=True))
    assert key
    await services.db.write(lambda conn: conn.execute("UPDATE galleries SET expires_at = ? WHERE id = ?",
                                                      (EXPIRED_AT, gid)))
    hall = app.test_client()
    gallery_page = await hall.get(f"/g/{slug}")
    wall_page = await hall.get(f"/g/{slug}/wall", query_string={"key": key.group(1)})
    assert (wall_page.status_code, gallery_page.status_code) == (410, 410)
    html = await wall_page.get_data(as_text=True)
    assert "This gallery has expired" in html and wall.BAD_LINK not in html and "not valid" not in html
    # The list the running wall reloads when its feed is closed answers with the same sentence.
    listing = await hall.get(f"/api/g/{slug}/wall/photos", query_string={"key": key.group(1)},
                             headers={"Accept": "application/json"})
    assert listing.status_code == 410
    assert (await listing.get_json())["error"] == GalleryExpired.MESSAGE
