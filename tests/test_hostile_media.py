"""Hostile: tiny videos whose index claims millions of samples, sent by guests in parallel (issue 27).

Each is a real 64x64 H.264 MP4 of about 2 KB whose stsz/stts/stsc claim 10 million one-byte samples
(``videofactory.sample_table_bomb``). Before the fix every upload started its own probe child, each allowed
1 GB, and FFmpeg built a 730 MB index for each: twelve at once took several GB (the figures line of the old
code: peak_rss_mb=8547 children_peak=13). Now the children share ``media_children`` places and each bomb is
refused from its box headers with a sentence, while a good video and a good photo sent in the same run still
complete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from picpeak_lite.media import video

from . import videofactory
from .harness import ServerProcess, base_jpeg, create_token, guest_client, multipart, write_config
from .hostile import Watch

pytestmark = pytest.mark.system

GUESTS = 8  # the attack through the guest route, each a request of its own
ADMIN_BOMBS = 4  # and through the admin API, at the same time
MEDIA_CHILDREN = 2
PASSWORD = "hostile media"
ANSWER_SECONDS = 300.0  # a hang guard only: no figure is asserted against time
SETTLE_SECONDS = 300.0


def make_files(folder: Path) -> tuple[list[tuple[str, bytes]], bytes, bytes]:
    bombs = [(f"bomb-{i}.mp4", videofactory.sample_table_bomb(folder / f"bomb-{i}.mp4", variant=i).read_bytes())
             for i in range(GUESTS + ADMIN_BOMBS)]
    good_video = videofactory.make_clip(folder / "good.mp4", width=320, height=240, seconds=2.0).read_bytes()
    return bombs, good_video, base_jpeg(1200, 800)


async def test_tiny_videos_with_a_giant_index_wait_their_turn_and_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_dir = tmp_path / "data"
    config = write_config(tmp_path / "picpeak.toml", media_children=MEDIA_CHILDREN, decode_memory_mb=256,
                          log_level="warning")
    token = create_token(data_dir, config)
    bombs, good_video, good_photo = await trio.to_thread.run_sync(make_files, tmp_path)
    server = ServerProcess(data_dir, config)
    await trio.to_thread.run_sync(server.start)
    refusals: dict[str, str] = {}
    good: dict[str, Any] = {}
    try:
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {token}"},
                                     timeout=ANSWER_SECONDS) as admin:
            created = await admin.post("/api/admin/galleries", json={
                "name": "Hostile media", "password": PASSWORD, "allow_guest_uploads": True})
            assert created.status_code == 201, created.text
            gallery_id, slug = created.json()["id"], created.json()["slug"]
            assert (await admin.post(f"/api/admin/galleries/{gallery_id}/publish")).status_code == 200
            guests = [await guest_client(server.url, slug, PASSWORD, request_seconds=ANSWER_SECONDS)
                      for _ in range(GUESTS)]
            watch = Watch(server, "tiny videos with a giant index", budget_mb=256)

            def record(response: httpx.Response) -> None:
                watch.saw(response.status_code)
                for error in response.json().get("errors") or []:
                    refusals[error["filename"]] = error["error"]

            async def guest_upload(index: int) -> None:
                client, csrf = guests[index]
                body, headers = multipart([bombs[index]])
                record(await client.post(f"/api/g/{slug}/upload", content=body,
                                         headers={**headers, "X-CSRF-Token": csrf}))

            async def admin_upload(index: int) -> None:
                body, headers = multipart([bombs[GUESTS + index]])
                record(await admin.post(f"/api/admin/galleries/{gallery_id}/upload", content=body,
                                        headers=headers))

            async def good_upload() -> None:
                body, headers = multipart([("good.mp4", good_video), ("good.jpg", good_photo)])
                response = await admin.post(f"/api/admin/galleries/{gallery_id}/upload", content=body,
                                            headers=headers)
                watch.saw(response.status_code)
                assert response.status_code == 202, response.text
                good.update(response.json())

            async with watch.during():
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(good_upload)
                    for index in range(GUESTS):
                        nursery.start_soon(guest_upload, index)
                    for index in range(ADMIN_BOMBS):
                        nursery.start_soon(admin_upload, index)
                photos = await settle(admin, good["upload_id"])
            for client, _ in guests:
                await client.aclose()
        complete = [p for p in photos if p["status"] == "complete"]
        lost = len(good["photo_ids"]) - len(complete)
        watch.line(capsys, media_children=MEDIA_CHILDREN, bombs=len(bombs), refused=len(refusals),
                   good_complete=len(complete), lost=lost)
        watch.check()
        sizes = {name: len(data) for name, data in bombs}
        assert refusals == {name: video.INDEX_CLAIMS.format(count=10_000_000, size=size)
                            for name, size in sizes.items()}
        assert sorted(p["media_type"] for p in complete) == ["photo", "video"] and lost == 0, photos
        assert watch.media_children_peak <= MEDIA_CHILDREN + 1  # +1: /proc is read thread by thread, not at once
    finally:
        server.kill()


async def settle(admin: httpx.AsyncClient, upload_id: str) -> list[dict[str, Any]]:
    """The good upload's photos once every one is terminal (a hang guard, not a figure)."""
    with trio.fail_after(SETTLE_SECONDS):
        while True:
            status = (await admin.get(f"/api/admin/uploads/{upload_id}")).json()
            if status["done"]:
                return list(status["photos"])
            await trio.sleep(0.1)

