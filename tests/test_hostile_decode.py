"""Hostile suite: progressive-JPEG "scan bombs" from guests against a real server (issue 27).

The issue's file: a grey SOF2 header, one DC scan, then thousands of AC scans of runs of empty blocks, a few
tens of bytes each. It passed the header check (202) and held a worker for minutes (7000x7000 with 20,000
scans: 316 s), and two in one request stopped every gallery's processing. Here three guests send several each
(the issue's kind and the costlier refinement scans, up to the guest pixel limit), while the admin uploads good
photos and one guest a bomb just under the scan limit at 49 MP, the slowest JPEG the server still accepts.

What must hold: every bomb refused at upload (4xx) with the scan sentence; the bomb under the limit ends
(complete, or failed with the deadline's sentence) within the decode deadline; the good photos complete; no
photo lost; the watch's checks. The figures line gives the longest worker hold, read from the photos'
``processing_started_at`` and ``completed_at``.

Against the code before the scan limit (checked by hand with the change stashed) the bombs were answered 202.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from picpeak_lite.media import images
from picpeak_lite.pipeline.worker import TOO_SLOW

from . import bombs
from .harness import ServerProcess, base_jpeg, create_token, guest_client, multipart, query, unique_jpeg, write_config
from .hostile import Watch

pytestmark = pytest.mark.system

GUESTS = 3
PASSWORD = "scan bombs gallery password"
DEADLINE_SECONDS = 60.0  # the default decode_deadline_seconds, written out so that the line can name it
SETTLE_SECONDS = 600.0  # a hung-test stop only


def bombs_for(guest: int) -> list[tuple[str, bytes]]:
    """Three bombs per request, each guest a different mix; every file's bytes distinct."""
    made = [
        (f"g{guest}-issue.jpg", bombs.jpeg_scans(20_000, width=7000, height=7000, variant=guest)),
        (f"g{guest}-refine.jpg", bombs.jpeg_scans(2_000, width=4000 + guest * 1000, height=4000, refine=True,
                                                  variant=guest)),
        (f"g{guest}-just-over.jpg", bombs.jpeg_scans(images.MAX_SCANS, width=3000, height=2000, variant=guest)),
    ]
    return made


async def test_scan_bombs_are_refused_at_upload_and_no_decode_outlives_its_deadline(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_dir = tmp_path / "data"
    config = write_config(tmp_path / "picpeak.toml", log_level="warning", shutdown_grace_seconds=2)
    token = create_token(data_dir, config)
    server = ServerProcess(data_dir, config)
    url = await trio.to_thread.run_sync(server.start)
    guest_files = [await trio.to_thread.run_sync(bombs_for, g) for g in range(GUESTS)]
    under = await trio.to_thread.run_sync(
        lambda: bombs.jpeg_scans(images.MAX_SCANS - 1, width=7000, height=7000, refine=True))
    base = base_jpeg(3000, 2000)
    good = [(f"good-{i}.jpg", unique_jpeg(base, str(i))) for i in range(6)]
    answers: dict[str, tuple[int, dict[str, Any]]] = {}
    watch = Watch(server, "scan bombs")
    try:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"},
                                     timeout=120) as admin:
            created = await admin.post("/api/admin/galleries", json={
                "name": "Scans", "password": PASSWORD, "allow_guest_uploads": True})
            assert created.status_code == 201, created.text
            gallery = created.json()
            assert (await admin.post(f"/api/admin/galleries/{gallery['id']}/publish")).status_code == 200
            slug = gallery["slug"]
            guests = [await guest_client(url, slug, PASSWORD) for _ in range(GUESTS)]

            async def guest_upload(where: str, client: httpx.AsyncClient, csrf: str,
                                   files: list[tuple[str, bytes]]) -> None:
                body, headers = multipart(files)
                response = await client.post(f"/api/g/{slug}/upload", content=body,
                                              headers={**headers, "X-CSRF-Token": csrf})
                watch.saw(response.status_code)
                answers[where] = (response.status_code, response.json())

            async def admin_upload() -> None:
                body, headers = multipart(good)
                response = await admin.post(f"/api/admin/galleries/{gallery['id']}/upload", content=body,
                                            headers=headers)
                watch.saw(response.status_code)
                answers["good"] = (response.status_code, response.json())

            async with watch.during():
                with trio.fail_after(SETTLE_SECONDS):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(guest_upload, "under", *guests[0], [("under-the-limit.jpg", under)])
                        nursery.start_soon(admin_upload)
                        for index, (client, csrf) in enumerate(guests):
                            nursery.start_soon(guest_upload, f"guest {index}", client, csrf, guest_files[index])
                    while query(data_dir, "SELECT count(*) AS n FROM photos WHERE status IN "
                                          "('pending', 'processing')")[0]["n"]:
                        await trio.sleep(0.2)
            for client, _ in guests:
                await client.aclose()
    finally:
        await trio.to_thread.run_sync(server.stop)

    refused = {}
    for index in range(GUESTS):
        status, body = answers[f"guest {index}"]
        assert 400 <= status < 500, (status, body)
        refused.update({e["filename"]: e["error"] for e in body.get("errors") or []})
    rows = query(data_dir, "SELECT display_name, status, error, processing_started_at AS began, completed_at "
                           "FROM photos")
    by_name = {row["display_name"]: row for row in rows}
    holds = [row["completed_at"] - row["began"] for row in rows if row["completed_at"] and row["began"]]
    sent_bombs = [name for files in guest_files for name, _ in files]
    accepted = len(good) + 1
    lost = accepted - sum(1 for row in rows if row["status"] in ("complete", "failed"))
    under_row = by_name.get("under-the-limit.jpg", {})
    watch.line(capsys, bombs_sent=len(sent_bombs), bombs_refused=sum(1 for n in sent_bombs if n in refused),
               bomb_bytes_max=max(len(d) for files in guest_files for _, d in files),
               under_limit=f"{under_row.get('status')}", deadline_s=f"{DEADLINE_SECONDS:g}",
               good_complete=sum(1 for name, _ in good if by_name.get(name, {}).get("status") == "complete"),
               longest_worker_hold_s=f"{max(holds, default=0):.1f}", lost=lost)
    watch.check()
    assert {name: refused.get(name) for name in sent_bombs} == dict.fromkeys(sent_bombs, images.TOO_MANY_SCANS)
    assert not [row for row in rows if row["display_name"] in sent_bombs]
    assert answers["under"][0] == 202 and answers["good"][0] == 202, answers
    assert under_row["status"] == "complete" or under_row["error"] == TOO_SLOW.format(seconds=DEADLINE_SECONDS)
    assert all(by_name[name]["status"] == "complete" for name, _ in good), rows
    assert lost == 0
