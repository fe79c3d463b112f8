"""Layout at phone and desktop sizes (issue 12, points 14 and 18): nothing wider than the screen, the admin menu on
one line, the share links readable whole, and the guest grid in justified rows that keep each photo's shape and do
not move while the images load."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import LiveServer, Page, admin_login, api_client, start_server, stop_server
from .test_guest_browser import make_gallery, photo_bytes

# Landscape, portrait, square, a panorama, 4:3: the shapes of a real wedding's photos.
SIZES = [(900, 600), (400, 600), (500, 500), (900, 300), (450, 600), (900, 600), (640, 480), (400, 600),
         (600, 400), (300, 600), (800, 600), (600, 800)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: Any) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("layout") / "data")
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def api(server: LiveServer) -> Iterator[httpx.Client]:
    yield from api_client(server)


@pytest.fixture(scope="module")
def gallery(api: httpx.Client) -> dict[str, Any]:
    photos = [(f"IMG_{i}.jpg", photo_bytes(i, size)) for i, size in enumerate(SIZES)]
    return make_gallery(api, photos, allow_guest_uploads=True)


def page_width(page: Page) -> int:
    return page.evaluate("document.documentElement.scrollWidth")


def test_admin_gallery_page_fits_a_phone(server: LiveServer, gallery: dict[str, Any], phone: Page) -> None:
    admin_login(phone, server)
    phone.goto(f"{server.url}/admin/galleries/{gallery['id']}")
    assert page_width(phone) <= 390
    tops = phone.eval_on_selector_all(".topbar nav > a:visible, .topbar nav button",
                                      "items => items.map(e => Math.round(e.getBoundingClientRect().top))")
    # An owner's eight items take two lines at 390 px (never more), each whole and on screen.
    assert len(tops) >= 4 and len(set(tops)) <= 2, f"the menu takes more than two lines: {tops}"
    for box in ("#share-link", "#upload-link"):
        # The whole address is on screen: the box is as tall as its text and inside the card.
        fits = phone.eval_on_selector(box, "e => e.scrollHeight <= e.clientHeight + 1 && "
                                           "e.getBoundingClientRect().right <= window.innerWidth")
        assert fits, f"{box} cuts its link"
    assert phone.input_value("#share-link").startswith(server.url)
    phone.screenshot("admin-gallery-phone")
    for path in ("/admin/", "/admin/settings/", "/admin/galleries/new"):
        phone.goto(server.url + path)
        assert page_width(phone) <= 390, path


GRID_GEOMETRY = """() => [...document.querySelectorAll('#grid .tile')].map(t => {
  const r = t.getBoundingClientRect(), a = t.querySelector('.tile-link');
  return {left: r.left, right: r.right, top: Math.round(r.top), width: r.width, height: r.height,
          ratio: Number(a.dataset.width) / Number(a.dataset.height)};
})"""


@pytest.mark.parametrize("size", [(390, 844), (1440, 900)], ids=["phone", "desktop"])
def test_guest_grid_is_justified_rows_at_the_photos_own_ratios(server: LiveServer, gallery: dict[str, Any],
                                                               browser: Any, request: Any,
                                                               size: tuple[int, int]) -> None:
    from .conftest import new_page

    pages = new_page(browser, request, viewport={"width": size[0], "height": size[1]})
    page = next(pages)
    # Images held back: the layout before any image arrives must be the layout after. Every photo image is
    # held (grid and view: the srcset lets the browser pick either), so none can arrive before the first look.
    held: list[Any] = []

    def hold(route: Any) -> None:
        held.append(route)

    page.route("**/photos/**", hold)
    page.goto(f"{server.url}/g/{gallery['slug']}", wait_until="domcontentloaded")
    assert page.evaluate("[...document.querySelectorAll('#grid img')].filter(i => i.naturalWidth).length") == 0
    before = page.evaluate(GRID_GEOMETRY)
    page.unroute("**/photos/**")
    page.reload()
    page.wait_for_function("() => [...document.querySelectorAll('#grid img')].every(i => i.complete && i.naturalWidth)")
    after = page.evaluate(GRID_GEOMETRY)
    assert [(round(b["width"]), round(b["height"])) for b in before] == \
        [(round(a["width"]), round(a["height"])) for a in after], "tiles moved while loading"
    assert page_width(page) <= size[0]
    rows: dict[int, list[dict[str, Any]]] = {}
    for tile in after:
        rows.setdefault(tile["top"], []).append(tile)
        # The photo's own shape (within the 1/20 rounding of its ratio class), never a square crop.
        assert abs(tile["width"] / tile["height"] - tile["ratio"]) / tile["ratio"] < 0.04, tile
    full = list(rows.values())[:-1]  # the last row may end short
    assert full, "all photos on one row: the test says nothing"
    right_edge = max(t["right"] for row in full for t in row)
    for row in full:
        assert abs(row[-1]["right"] - right_edge) < 2, "a row is not filled edge to edge"
        assert max(t["height"] for t in row) - min(t["height"] for t in row) < 2, "a row has uneven heights"
    page.screenshot(f"justified-{request.node.callspec.id}")
    next(pages, None)
