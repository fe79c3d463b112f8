"""A guest gallery served from a bucket with ``s3_presigned_redirects = true``, in Chromium: every image and the
clip's ``/play`` answer 302 to a signed URL on the bucket's origin, which the page's CSP must allow (img-src,
media-src). Before it did, the gallery was blank and the video failed with MediaError 4."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .. import videofactory as vf
from ..s3server import MotoServer, S3Server
from .conftest import PATIENCE_MS, LiveServer, Page, api_client, start_server, stop_server
from .test_guest_browser import make_gallery, photo_bytes


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with MotoServer() as server:  # a private bucket: a URL without its signature is refused
        yield server


@pytest.fixture(scope="module")
def server(tmp_path_factory: Any, s3: S3Server) -> Iterator[LiveServer]:
    settings = s3.settings_for(s3.new_bucket(), s3_presigned_redirects=True)
    env = {f"PICPEAK_{key.upper()}": str(value).lower() if isinstance(value, bool) else str(value)
           for key, value in settings.items()}
    live = start_server(tmp_path_factory.mktemp("s3") / "data", env=env)
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def api(server: LiveServer) -> Iterator[httpx.Client]:
    yield from api_client(server)


def test_presigned_gallery_shows_its_images_and_plays_its_clip(server: LiveServer, api: httpx.Client,
                                                               page: Page, s3: S3Server, tmp_path: Path) -> None:
    clip = vf.make_clip(tmp_path / "dance.mp4", width=320, height=180, seconds=2, audio=False)
    gallery = make_gallery(api, [("IMG_1.jpg", photo_bytes(1)), ("IMG_2.jpg", photo_bytes(2)),
                                 ("dance.mp4", clip.read_bytes())])
    redirects: list[str] = []
    page.on("response", lambda r: r.status == 302 and r.headers.get("location", "").startswith(s3.url)
            and redirects.append(r.url))
    page.goto(gallery["share_url"])
    page.wait_for_selector("#grid .tile img")
    images = page.locator("#grid .tile img")
    assert images.count() == 3  # two photos and the clip's poster
    page.wait_for_function("() => [...document.querySelectorAll('#grid .tile img')].every("
                           "i => i.complete && i.naturalWidth > 0)", timeout=PATIENCE_MS)
    assert len(redirects) >= 3, redirects  # each image came from the bucket, through a redirect
    page.screenshot("s3-presigned-grid")

    page.locator('#grid a.tile-link:not([data-play=""])').click()
    video = page.locator("#lb-video")
    video.wait_for(state="visible")
    page.evaluate("() => { const v = document.getElementById('lb-video'); v.muted = true; return v.play(); }")
    page.wait_for_function("() => document.getElementById('lb-video').readyState >= 1", timeout=PATIENCE_MS)
    assert page.evaluate("() => document.getElementById('lb-video').error") is None
    assert any(url.endswith("/play") for url in redirects), redirects
    page.screenshot("s3-presigned-video")
