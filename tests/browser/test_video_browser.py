"""Videos in Chromium against a real server: the tile's play badge, the poster in the lightbox before play, the
clip playing (currentTime advances) through byte ranges, and a guest's clip sent from the phone-size upload page
going live in the gallery."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .. import videofactory as vf
from .conftest import PATIENCE_MS, LiveServer, Page, api_client, start_server, stop_server
from .test_guest_browser import make_gallery


@pytest.fixture(scope="module")
def server(tmp_path_factory: Any) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("video") / "data")
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def api(server: LiveServer) -> Iterator[httpx.Client]:
    yield from api_client(server)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: Any) -> Path:
    return vf.make_clip(tmp_path_factory.mktemp("clip") / "dance.mp4", width=640, height=360, seconds=4,
                        audio=True)


def test_lightbox_shows_the_poster_then_plays(server: LiveServer, api: httpx.Client, page: Page, clip: Path) -> None:
    gallery = make_gallery(api, [("dance.mp4", clip.read_bytes())])
    page.goto(gallery["share_url"])
    page.wait_for_selector("#grid .tile")
    badge = page.locator("#grid .tile .play-badge")
    assert badge.is_visible() and badge.inner_text().strip() == "\u25b6 0:04"
    page.screenshot("video-tile")

    page.locator("#grid .tile .tile-link").first.click()
    page.locator("#lightbox").wait_for(state="visible")
    video = page.locator("#lb-video")
    video.wait_for(state="visible")
    assert page.locator("#lb-img").is_hidden()
    poster = video.get_attribute("poster")
    assert poster.endswith("/view") and video.get_attribute("src").endswith("/play")
    # Before play: paused at 0 with the poster, which the browser has loaded as an image.
    assert page.evaluate("() => { const v = document.getElementById('lb-video'); "
                         "return v.paused && v.currentTime === 0; }")
    page.wait_for_function("url => new Promise(done => { const i = new Image(); "
                           "i.onload = () => done(i.naturalWidth > 0); i.onerror = () => done(false); i.src = url; })",
                           arg=poster, timeout=PATIENCE_MS)
    page.screenshot("video-poster")
    page.evaluate("() => { const v = document.getElementById('lb-video'); v.muted = true; return v.play(); }")
    page.wait_for_function("() => document.getElementById('lb-video').currentTime > 0.5", timeout=PATIENCE_MS)
    assert page.evaluate("() => document.getElementById('lb-video').error") is None
    page.screenshot("video-playing")
    page.keyboard.press("Escape")
    page.locator("#lightbox").wait_for(state="hidden")
    # The dialog hides at once on Escape, but its "close" event (whose handler stops the clip) is a task queued
    # after that: wait for the handler, then check that the clip is stopped and let go of.
    page.wait_for_function("() => { const v = document.getElementById('lb-video'); "
                           "return v.paused && !v.hasAttribute('src') && v.hidden; }", timeout=PATIENCE_MS)


def test_a_guest_sends_a_clip_from_the_phone(server: LiveServer, api: httpx.Client, phone: Page,
                                            clip: Path) -> None:
    gallery = make_gallery(api, [], allow_guest_uploads=True)
    phone.goto(gallery["share_url"] + "/upload")
    phone.fill("input[name=guest_name]", "Cousin Kim")
    phone.set_input_files("#file-input", [str(clip)])
    phone.wait_for_function("() => document.querySelectorAll('#files .file.is-done').length === 1",
                            timeout=PATIENCE_MS)
    phone.screenshot("video-guest-upload")
    phone.click("#view-gallery a")
    phone.wait_for_selector("#grid .tile .play-badge")
    assert phone.locator("#grid .tile").count() == 1
    assert phone.locator("#grid .tile .play-badge").inner_text().strip() == "\u25b6 0:04"
