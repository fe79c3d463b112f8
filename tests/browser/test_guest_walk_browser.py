"""Issue 35, the guest's pages (points 12-16), each seen in Chromium at 1440 x 900 and on a 390 x 844 phone, with
screenshots in test-artifacts/ (``guest35-...``).

The server runs with a text watermark in the bottom-right corner (the default position), so that the galleries
made with ``watermark: True`` show what a photographer's watermarked gallery shows.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image, ImageChops

from picpeak_lite.media import images

from .. import imagefactory
from .conftest import ARTIFACTS, LiveServer, Page, new_page, start_server, stop_server, wait_processed

WATERMARK_ENV = {"PICPEAK_WATERMARK_TEXT": "PROOF COPY", "PICPEAK_WATERMARK_OPACITY": "1",
                 "PICPEAK_WATERMARK_SIZE": "0.4", "PICPEAK_WATERMARK_POSITION": "bottom-right"}
DESK = {"viewport": {"width": 1440, "height": 900}}
PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 3, "is_mobile": True, "has_touch": True}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = start_server(tmp_path / "data", env=WATERMARK_ENV)
    yield live
    stop_server(live)


def shot(page: Page, label: str, *, full: bool = False) -> None:
    """What the guest sees on the screen (``full``: the whole page)."""
    if full:
        page.screenshot(label)
    else:
        ARTIFACTS.mkdir(exist_ok=True)
        page.page.screenshot(path=str(ARTIFACTS / f"{page.name}-{label}.png"))


def open_page(browser: Any, request: Any, name: str, **args: Any) -> tuple[Page, Iterator[Page]]:
    pages = new_page(browser, request, **args)
    page = next(pages)
    page.name = f"guest35-{name}"
    return page, pages


def close(pages: Iterator[Page]) -> None:
    next(pages, None)  # runs new_page's end: the context closes and the console is checked for errors


def gallery_with(api: httpx.Client, name: str, files: list[tuple[str, bytes]], **fields: Any) -> dict[str, Any]:
    """A published gallery holding ``files``, every photo processed."""
    gallery = api.post("/api/admin/galleries", json={"name": name, **fields}).json()
    upload = api.post(f"/api/admin/galleries/{gallery['id']}/upload",
                      files=[("photos", (n, data)) for n, data in files]).json()
    wait_processed(api, upload["upload_id"])
    return {**gallery, **api.post(f"/api/admin/galleries/{gallery['id']}/publish").json()}


def fetched(page: Page, url: str) -> Image.Image:
    response = page.request.get(url)
    assert response.status == 200, (url, response.status)
    return Image.open(io.BytesIO(response.body())).convert("L")


def changed_share(a: Image.Image, b: Image.Image, box: tuple[float, float, float, float]) -> float:
    """The share of pixels in ``box`` (given as shares of the width and height) that differ by more than 40 grey
    levels: a watermark's letters, not JPEG noise."""
    w, h = a.size
    crop = (round(box[0] * w), round(box[1] * h), round(box[2] * w), round(box[3] * h))
    hist = ImageChops.difference(a.crop(crop), b.crop(crop)).histogram()
    return sum(hist[41:]) / max(1, sum(hist))


# ---- 14. Every size a guest sees carries the watermark ---------------------------------------------------------------

SIZES_14 = [(1800, 1200), (1200, 1800), (1600, 1600), (2000, 1000), (1500, 1000), (1000, 1400), (1700, 1100),
            (1300, 1300)]


def test_every_tile_and_the_cover_of_a_watermarked_gallery_show_the_watermark(server: LiveServer, api: httpx.Client,
                                                                 browser: Any, request: Any) -> None:
    sources = {size: imagefactory.save(imagefactory.photo(*size, seed=i), "jpeg") for i, size in enumerate(SIZES_14)}
    gallery = gallery_with(api, "Marked", [(f"IMG_{i:04d}.jpg", data) for i, data in enumerate(sources.values())],
                           watermark=True)
    # What the server makes without a watermark, made here by the same code: the reference for each size.
    plain = {size: images.render(data, images.RenderSpec()) for size, data in sources.items()}
    for name, args in (("desk", DESK), ("phone", PHONE)):
        page, pages = open_page(browser, request, f"14-watermark-{name}", **args)
        page.goto(f"{server.url}/g/{gallery['slug']}")
        page.evaluate("window.scrollTo(0, document.body.scrollHeight)")  # every lazy tile loads
        page.wait_for_function("""() => [...document.querySelectorAll('#grid .tile img')]
                                  .every(i => i.complete && i.naturalWidth > 0)""")
        tiles = page.eval_on_selector_all("#grid .tile", """ts => ts.map(t => {
            const a = t.querySelector('.tile-link'), i = t.querySelector('img');
            const abs = u => new URL(u, location.href).href;
            return {w: +a.dataset.width, h: +a.dataset.height, shown: i.currentSrc, grid: abs(i.getAttribute("src")),
                    view: abs(a.dataset.view)}; })""")
        assert len(tiles) == len(SIZES_14)
        for index, tile in enumerate(tiles):
            reference = plain[(tile["w"], tile["h"])]
            for url in {tile["shown"], tile["grid"], tile["view"]}:
                served = fetched(page, url)
                made = reference.grid_jpeg if served.width <= 400 and served.height <= 400 else reference.view_jpeg
                unmarked = Image.open(io.BytesIO(made)).convert("L")
                assert served.size == unmarked.size, (url, served.size, unmarked.size)
                # The mark sits in the bottom-right corner (40 % of the width); the opposite corner is untouched.
                corner = changed_share(served, unmarked, (0.5, 0.5, 1, 1))
                assert corner > 0.01, f"tile {index + 1} ({url}) has no watermark: {corner:.2%} changed"
                assert changed_share(served, unmarked, (0, 0, 0.5, 0.5)) < 0.001, url
        page.evaluate("window.scrollTo(0, 0)")
        assert_cover_shows_its_mark(page, plain)
        shot(page, "grid", full=True)
        close(pages)


def assert_cover_shows_its_mark(page: Page, plain: dict[tuple[int, int], images.Rendered]) -> None:
    """The hero crops its cover (object-fit: cover): the watermark's corner must stay in the frame."""
    hero = page.eval_on_selector(".hero-img", """i => { const r = i.getBoundingClientRect();
        const [px, py] = getComputedStyle(i).objectPosition.split(' ').map(v => parseFloat(v) / 100);
        return {x: r.left, y: r.top, w: r.width, h: r.height, px, py, src: i.currentSrc}; }""")
    served = fetched(page, hero["src"])
    unmarked = next(u for u in (Image.open(io.BytesIO(r.view_jpeg)).convert("L") for r in plain.values())
                    if u.size == served.size and changed_share(served, u, (0, 0, 0.5, 0.5)) < 0.001)
    changed = ImageChops.difference(served, unmarked).point(lambda v: 255 if v > 40 else 0).getbbox()
    assert changed, "the cover has no watermark"
    scale = max(hero["w"] / served.width, hero["h"] / served.height)
    left = hero["x"] + (hero["w"] - served.width * scale) * hero["px"]
    top = hero["y"] + (hero["h"] - served.height * scale) * hero["py"]
    mark = [left + changed[0] * scale, top + changed[1] * scale, left + changed[2] * scale, top + changed[3] * scale]
    assert mark[0] >= hero["x"] - 1 and mark[2] <= hero["x"] + hero["w"] + 1, (mark, hero)
    assert mark[1] >= hero["y"] - 1 and mark[3] <= hero["y"] + hero["h"] + 1, (mark, hero)


# ---- 12. A refused heart says why where the guest is looking ---------------------------------------------------------

IN_VIEW_JS = """e => { const r = e.getBoundingClientRect(), x = r.left + r.width / 2, y = r.top + r.height / 2;
    const top = document.elementFromPoint(x, y);
    return {top: r.top, bottom: r.bottom, left: r.left, right: r.right, shown: !!top && e.contains(top),
            width: innerWidth, height: innerHeight}; }"""


def assert_in_view(box: dict[str, Any]) -> None:
    assert box["shown"], box  # nothing covers it
    assert box["top"] >= 0 and box["bottom"] <= box["height"], box
    assert box["left"] >= 0 and box["right"] <= box["width"], box


def press(page: Page, target: Any) -> None:
    """A finger's tap on a touch screen, a mouse click (after the hover that shows a tile's heart) elsewhere."""
    target.scroll_into_view_if_needed()
    if page.evaluate("matchMedia('(hover: hover)').matches"):
        target.hover()
        target.click()
    else:
        target.tap()


def test_the_eleventh_heart_says_the_limit_on_screen(server: LiveServer, api: httpx.Client, browser: Any,
                                                     request: Any) -> None:
    files = [(f"DSC_{i:04d}.jpg", imagefactory.save(imagefactory.photo(900, 600 + 20 * i, seed=i), "jpeg"))
             for i in range(13)]
    gallery = gallery_with(api, "Limited", files, favourite_limit=10)
    for name, args in (("phone", PHONE), ("desk", DESK)):
        page, pages = open_page(browser, request, f"12-limit-{name}", **args)
        page.goto(f"{server.url}/g/{gallery['slug']}")
        hearts = page.locator("#grid .tile .heart")
        for index in range(11):
            press(page, hearts.nth(index))
            if index < 10:
                page.wait_for_selector(f"#grid .tile:nth-child({index + 1}).is-favourite")
        said = page.wait_for_selector("#favourite-error:not([hidden])")
        assert "up to 10 favourites" in said.inner_text()
        assert page.locator("#grid .tile.is-favourite").count() == 10
        assert_in_view(said.evaluate(IN_VIEW_JS))
        shot(page, "grid")
        # In the lightbox, the same: its heart on a photo not chosen is refused on screen, over the photo.
        page.locator("#grid .tile .tile-link").nth(11).click()
        page.wait_for_selector("#lightbox[open]")
        page.evaluate("document.getElementById('favourite-error').hidden = true")
        page.click("#lightbox .lb-fav")
        said = page.wait_for_selector("#favourite-error:not([hidden])")
        assert_in_view(said.evaluate(IN_VIEW_JS))
        shot(page, "lightbox")
        page.keyboard.press("Escape")
        # A heart taken back is never refused: the message goes.
        press(page, hearts.nth(0))
        page.wait_for_selector("#grid .tile:nth-child(1):not(.is-favourite)")
        assert page.locator("#favourite-error").is_hidden()
        close(pages)


# ---- 13. A tile gets an image as sharp as the screen can show --------------------------------------------------------

def test_tiles_get_an_image_as_wide_as_their_device_pixels(server: LiveServer, api: httpx.Client, browser: Any,
                                                            request: Any) -> None:
    sizes = [(2400, 1600), (1600, 2400), (2000, 2000), (2400, 1350), (1800, 2400), (2400, 1800)]
    files = [(f"IMG_{i:04d}.jpg", imagefactory.save(imagefactory.photo(*size, seed=40 + i, noise=0.1), "jpeg"))
             for i, size in enumerate(sizes)]
    gallery = gallery_with(api, "Sharp", files)
    for name, args, ratio in (("phone", PHONE, 3), ("desk", DESK, 1)):
        page, pages = open_page(browser, request, f"13-sharp-{name}", **args)
        page.goto(f"{server.url}/g/{gallery['slug']}")
        page.evaluate("window.scrollTo(0, document.body.scrollHeight)")  # every lazy tile loads
        page.wait_for_function("""() => [...document.querySelectorAll('#grid .tile img')]
                                  .every(i => i.complete && i.naturalWidth > 0)""")
        # naturalWidth of a srcset image is in CSS pixels: the file's own width comes from a plain Image of it.
        tiles = page.eval_on_selector_all("#grid .tile img", """imgs => Promise.all(imgs.map(i => {
            const file = new Image();
            file.src = i.currentSrc;
            return file.decode().then(() => ({tile: i.getBoundingClientRect().width, natural: file.naturalWidth,
                src: i.currentSrc, bytes: (performance.getEntriesByName(i.currentSrc)[0] || {}).encodedBodySize || 0}));
            }))""")
        assert len(tiles) == len(sizes)
        for tile in tiles:
            wanted = min(tile["tile"] * ratio, 1600)  # nothing wider than the view image exists
            assert tile["natural"] >= wanted * 0.98, (name, tile)
        print(f"\n{name}: tiles {[round(t['tile'] * ratio) for t in tiles]} device px, images "
              f"{[t['natural'] for t in tiles]} px, {sum(t['bytes'] for t in tiles) / 1024:.0f} KB in all")
        shot(page, "grid", full=True)
        close(pages)


# ---- 15. A phone: nothing at the screen's edge, nothing covered, nothing cut -----------------------------------------

TEXT_BOX_JS = """e => { const r = document.createRange(); r.selectNodeContents(e); const b = r.getBoundingClientRect();
    return {left: b.left, right: b.right, width: innerWidth}; }"""
LINES_JS = """e => { const r = document.createRange(); r.selectNodeContents(e);
    return new Set([...r.getClientRects()].map(x => Math.round(x.top))).size; }"""


def test_the_phone_layout_keeps_off_the_edges_and_shows_everything(server: LiveServer, api: httpx.Client,
                                                                   browser: Any, request: Any,
                                                                   tmp_path: Path) -> None:
    from .. import videofactory
    from .test_event_browser import guest_upload

    exif = imagefactory.make_exif(make="Canon", model="Canon EOS R5", date_original="2024:06:14 18:30:05",
                                  fnumber=(18, 10), exposure=(1, 200), iso=400, focal=(35, 1))
    files = [(f"IMG_{i:04d}.jpg", imagefactory.save(imagefactory.photo(1200, 800, seed=60 + i), "jpeg", exif=exif))
             for i in range(3)]
    clip = videofactory.make_clip(tmp_path / "dance.mp4", width=360, height=640, seconds=4)
    files.append(("dance.mp4", clip.read_bytes()))
    gallery = gallery_with(api, "Phone", files, favourite_limit=5, allow_guest_uploads=True,
                           guest_photos_need_approval=True, allow_downloads=True)
    page, pages = open_page(browser, request, "15-phone", **PHONE)
    upload = tmp_path / "cake.jpg"
    upload.write_bytes(imagefactory.save(imagefactory.photo(800, 600, seed=69), "jpeg"))
    guest_upload(page, gallery, str(upload), "Aunt Sue")
    page.goto(gallery["share_url"])
    page.wait_for_selector("#own-waiting img")
    # The favourites' count and the waiting photos' sentences keep 8 px off both edges.
    for selector in ("#favourite-limit", "#own-waiting-title", "#own-waiting p", "#download-all-size"):
        text = page.eval_on_selector(selector, TEXT_BOX_JS)
        assert text["left"] >= 8 and text["right"] <= text["width"] - 8, (selector, text)
    # The video tile's badge and heart do not meet.
    video = page.locator("#grid .tile", has=page.locator(".play-badge:visible"))
    badge, heart = video.locator(".play-badge").bounding_box(), video.locator(".heart").bounding_box()
    assert badge and heart
    apart = (badge["x"] + badge["width"] <= heart["x"] or heart["x"] + heart["width"] <= badge["x"]
             or badge["y"] + badge["height"] <= heart["y"] or heart["y"] + heart["height"] <= badge["y"])
    assert apart, (badge, heart)
    shot(page, "gallery", full=True)
    # The lightbox: the date and the camera whole, each button on one line, a hint that swiping turns the page.
    page.locator("#grid .tile-link[data-camera*='Canon']").first.click()
    page.wait_for_selector("#lightbox[open]")
    for selector in (".lb-date", ".lb-camera"):
        cut = page.eval_on_selector(f"#lightbox {selector}", "e => [e.scrollWidth, e.clientWidth, e.textContent]")
        assert cut[2] and cut[0] <= cut[1], (selector, cut)
    assert "14 June 2024" in page.inner_text("#lightbox .lb-date")
    for button in page.locator("#lightbox .lb-actions .button:visible").all():
        assert button.evaluate(LINES_JS) == 1, button.inner_text()
        box = button.bounding_box()
        assert box and box["x"] >= 8 and box["x"] + box["width"] <= 390 - 8, box
    assert page.locator("#lightbox .lb-hint").is_visible()
    shot(page, "lightbox")
    page.evaluate("""() => { const box = document.getElementById('lightbox');  // a swipe to the left
        const at = x => new Touch({identifier: 1, target: box, clientX: x, clientY: 400});
        box.dispatchEvent(new TouchEvent('touchstart', {touches: [at(300)], bubbles: true}));
        box.dispatchEvent(new TouchEvent('touchend', {changedTouches: [at(100)], bubbles: true})); }""")
    assert page.locator("#lightbox .lb-hint").is_hidden()  # swiped once: the hint has done its job
    close(pages)
    # A mouse has the previous and next buttons: no swipe hint there.
    desk, pages = open_page(browser, request, "15-desk", **DESK)
    desk.goto(gallery["share_url"])
    desk.locator("#grid .tile-link").first.click()
    desk.wait_for_selector("#lightbox[open]")
    assert desk.locator("#lightbox .lb-hint").is_hidden()
    cut = desk.eval_on_selector("#lightbox .lb-camera", "e => [e.scrollWidth, e.clientWidth]")
    assert cut[0] <= cut[1], cut
    shot(desk, "lightbox")
    close(pages)


# ---- 16. The wall's QR code leaves the watermark in sight ------------------------------------------------------------

def test_the_walls_qr_code_does_not_cover_the_watermark(server: LiveServer, api: httpx.Client, browser: Any,
                                                        request: Any) -> None:
    from .test_event_browser import wait_shown, wall_link

    data = imagefactory.save(imagefactory.photo(2400, 1600, seed=80), "jpeg")
    gallery = gallery_with(api, "Wall", [("IMG_0080.jpg", data)], watermark=True, allow_guest_uploads=True)
    gallery["share_url"] = f"{server.url}/g/{gallery['slug']}"
    link = wall_link(api, gallery)
    unmarked = Image.open(io.BytesIO(images.render(data, images.RenderSpec()).view_jpeg)).convert("L")
    for name, args in (("desk", DESK), ("phone", PHONE)):
        page, pages = open_page(browser, request, f"16-wall-{name}", **args)
        page.goto(link)
        wait_shown(page, 1)
        shown = page.wait_for_selector(".wall-layer.is-shown img")
        page.wait_for_function("() => { const i = document.querySelector('.wall-layer.is-shown img');"
                               " return i && i.complete && i.naturalWidth > 0 && "
                               "getComputedStyle(i.parentNode).opacity === '1'; }")
        served = fetched(page, shown.evaluate("i => i.currentSrc"))
        # Where the mark is: the pixels that differ from an unwatermarked render, mapped onto the screen.
        changed = ImageChops.difference(served, unmarked).point(lambda v: 255 if v > 40 else 0).getbbox()
        assert changed and changed[0] > served.width / 2 and changed[1] > served.height / 2, changed  # bottom right
        img = shown.bounding_box()
        assert img
        scale = img["width"] / served.width
        mark = (img["x"] + changed[0] * scale, img["y"] + changed[1] * scale,
                img["x"] + changed[2] * scale, img["y"] + changed[3] * scale)
        qr = page.locator(".wall-qr").bounding_box()
        assert qr
        overlap = not (qr["x"] + qr["width"] <= mark[0] or mark[2] <= qr["x"]
                       or qr["y"] + qr["height"] <= mark[1] or mark[3] <= qr["y"])
        assert not overlap, (name, qr, mark)
        shot(page, "photo")
        close(pages)
