"""Byte ranges on a video's ``/play``, with the same expectations whether the clip is a local file
(``web/files.py`` ``send_media``) or an object in a bucket, on moto or s3rver (``send_stored``, streamed).

Browsers ask for one range (``bytes=0-``, then seeks); download managers resume with an open or suffix range.
Several ranges are answered with the whole clip (200), as RFC 9110 allows, both locally and from a bucket;
every 200 and 206 says ``Accept-Ranges: bytes`` so a client knows it may ask for ranges."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from picpeak_lite.config import Settings
from picpeak_lite.services import Services

from . import videofactory as vf
from .conftest import AuthActions, make_settings
from .s3server import SERVERS, S3Server
from .test_upload import start_guest_session
from .test_video_serving import gallery_with_video

pytestmark = pytest.mark.system  # real S3 server processes


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("clip") / "dance.mp4"
    return vf.make_clip(path, width=320, height=240, seconds=2, audio=True, crf=20).read_bytes()


@pytest.fixture(scope="module", params=["local", *sorted(SERVERS)])
def where(request: pytest.FixtureRequest) -> Iterator[S3Server | None]:
    if request.param == "local":
        yield None
        return
    with SERVERS[request.param]() as server:
        yield server


@pytest.fixture
def settings(tmp_path: Path, where: S3Server | None) -> Settings:
    if where is None:
        return make_settings(tmp_path)
    return make_settings(tmp_path, **where.settings_for(where.new_bucket()))


async def test_play_ranges_are_answered_the_same_locally_and_from_a_bucket(
        admin: AuthActions, guest: Any, services: Services, clip: bytes) -> None:
    gallery, photo_id = await gallery_with_video(admin, services, clip)
    await start_guest_session(services, guest)
    url = f"/g/{gallery['slug']}/photos/{photo_id}/play"
    size = len(clip)

    async def get(range_header: str | None = None, **headers: str) -> tuple[int, Any, bytes]:
        if range_header is not None:
            headers["Range"] = range_header
        response = await guest.get(url, headers=headers)
        return response.status_code, response.headers, await response.get_data()

    status, headers, body = await get()
    assert (status, body) == (200, clip) and headers["Accept-Ranges"] == "bytes"
    for asked, first, last in [("bytes=0-", 0, size - 1), ("bytes=0-0", 0, 0), ("bytes=10-19", 10, 19),
                               (f"bytes={size - 1}-", size - 1, size - 1), ("bytes=-100", size - 100, size - 1),
                               ("bytes=-1", size - 1, size - 1), (f"bytes=-{size + 50}", 0, size - 1),
                               (f"bytes={size - 10}-{size + 99}", size - 10, size - 1)]:
        status, headers, body = await get(asked)
        assert status == 206, (asked, status, body[:200])
        assert headers["Content-Range"] == f"bytes {first}-{last}/{size}", asked
        assert headers["Accept-Ranges"] == "bytes" and body == clip[first:last + 1], asked
    # Several ranges: the whole clip, 200, as locally.
    status, headers, body = await get("bytes=0-9, 20-29")
    assert (status, body) == (200, clip) and headers["Accept-Ranges"] == "bytes"
    status, headers, _ = await get(f"bytes={size + 5}-{size + 10}")
    assert status == 416 and headers["Content-Range"] == f"bytes */{size}"
    etag = (await get())[1]["ETag"]
    status, _, body = await get("bytes=0-9", **{"If-Range": etag})
    assert (status, body) == (206, clip[:10])
    status, headers, body = await get("bytes=0-9", **{"If-Range": '"another-version"'})
    assert (status, body) == (200, clip) and headers["Accept-Ranges"] == "bytes"
    status, _, body = await get(**{"If-None-Match": etag})
    assert (status, body) == (304, b"")
