"""Accessibility (issue 12, point 21): a skip link to <main> on every page, and axe-core's WCAG 2.0-2.2 A and AA
rules with no violation on the main pages, at desktop (1440 x 900) and phone (390 x 844) sizes, light and dark.
axe-core comes packaged for Playwright by ``axe-playwright-python`` (the test extra)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .. import imagefactory
from .conftest import (
    LiveServer,
    Page,
    admin_login,
    api_client,
    new_page,
    start_server,
    stop_server,
    wait_processed,
)

AXE_OPTIONS = {
    "runOnly": {"type": "tag", "values": ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa"]},
    "resultTypes": ["violations"],
}
SIZES = {"desktop": (1440, 900), "phone": (390, 844)}


@pytest.fixture(scope="module")
def server(tmp_path_factory: Any) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("a11y") / "data")
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def world(server: LiveServer) -> dict[str, str]:
    """The addresses of the pages checked: an open gallery with photos and guest uploads, a password gallery
    and an expired one."""
    from picpeak_lite.store import db

    for api in api_client(server):
        return _build(server, api, db)
    raise AssertionError("no API client")


def _build(server: LiveServer, api: httpx.Client, db: Any) -> dict[str, str]:
    def gallery(**fields: Any) -> dict[str, Any]:
        made = api.post("/api/admin/galleries", json=fields).json()
        return {**made, **api.post(f"/api/admin/galleries/{made['id']}/publish").json()}

    open_gallery = gallery(name="Anna & Ben", allow_guest_uploads=True, allow_downloads=True)
    files = [("photos", (f"p{i}.jpg", imagefactory.save(imagefactory.photo(600, 400 + 100 * i, seed=i), "jpeg")))
             for i in range(3)]
    upload = api.post(f"/api/admin/galleries/{open_gallery['id']}/upload", files=files).json()
    wait_processed(api, upload["upload_id"])
    locked = gallery(name="Locked", password="a long password")
    old = gallery(name="Old")
    conn = db.connect(server.data_dir / "picpeak.sqlite3")
    try:
        with db.transaction(conn):
            conn.execute("UPDATE galleries SET expires_at = 1000 WHERE id = ?", (old["id"],))
    finally:
        conn.close()
    return {
        "login": "/admin/login", "dashboard": "/admin/", "admin gallery": f"/admin/galleries/{open_gallery['id']}",
        "settings": "/admin/settings/", "guest gallery": f"/g/{open_gallery['slug']}",
        "guest upload": f"/g/{open_gallery['slug']}/upload", "password": f"/g/{locked['slug']}",
        "expired": f"/g/{old['slug']}",
    }


FIRST_FOCUSABLE = """() => {
  const e = document.querySelector('a[href], button, input:not([type=hidden]), select, textarea, [tabindex]');
  return [e.className, e.getAttribute('href')];
}"""
ADMIN_PAGES = ("dashboard", "admin gallery", "settings")


def check_page(page: Page, name: str) -> list[str]:
    from axe_playwright_python.sync_playwright import Axe

    problems = []
    # The skip link: the first focusable element (pages with an autofocused field start there instead), shown
    # when focused, leading to <main>.
    first = page.evaluate(FIRST_FOCUSABLE)
    page.focus("a.skip-link")
    shown = page.evaluate("() => document.activeElement.getBoundingClientRect().top >= 0")
    page.keyboard.press("Enter")
    if first != ["skip-link", "#main"] or not shown or page.locator("main#main").count() != 1 \
            or not page.url.endswith("#main"):
        problems.append(f"{name}: the first focusable element is {first} (shown: {shown}), not a skip link to <main>")
    results = Axe().run(page.page, options=AXE_OPTIONS)
    for violation in results.response["violations"]:
        targets = [node["target"] for node in violation["nodes"]][:3]
        problems.append(f"{name}: {violation['id']} ({violation['impact']}) at {targets}: {violation['help']}")
    return problems


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("size", list(SIZES), ids=list(SIZES))
def test_main_pages_have_a_skip_link_and_no_axe_violations(server: LiveServer, world: dict[str, str],
                                                           browser: Any, request: Any, size: str,
                                                           scheme: str) -> None:
    width, height = SIZES[size]
    problems: list[str] = []
    for who in ("guest", "admin"):
        pages = new_page(browser, request, viewport={"width": width, "height": height}, color_scheme=scheme)
        page = next(pages)
        if who == "admin":
            page.goto(server.url + world["login"])
            problems += check_page(page, "login")
            page.screenshot(f"{size}-{scheme}-login")
            admin_login(page, server)
        names = ADMIN_PAGES if who == "admin" else ("guest gallery", "guest upload", "password", "expired")
        for name in names:
            page.goto(server.url + world[name])
            problems += check_page(page, name)
            page.screenshot(f"{size}-{scheme}-{name.replace(' ', '-')}")
        next(pages, None)
    assert problems == [], "\n".join(problems)
