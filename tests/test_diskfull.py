"""Disk-full suite: the real server with its data directory on a 16 MB tmpfs, uploaded to until it is full.

Needs root (``mount -t tmpfs``); skipped with a message otherwise. What must hold: the client gets 507 with a
message that says the disk is full; no partial file stays in ``tmp/``; every acknowledged photo has its row
and its original, and no row lacks its original; once photos are deleted (``DELETE /api/admin/photos/<id>``)
uploads are accepted again by the same process; the admin dashboard shows the low-disk warning.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from .harness import (
    ADMIN_PASSWORD,
    ServerProcess,
    base_jpeg,
    create_token,
    figures,
    file_sha256,
    multipart,
    query,
    sha256,
    temp_files,
    tmpfs,
    unique_jpeg,
    write_config,
)

# A system suite (a real server process on a small tmpfs):
# left out by -m "not system", run by plain pytest and CI.
pytestmark = pytest.mark.system

DISK_MB = 16
FILES_PER_REQUEST = 2
BIG_REQUEST_MB = 24  # more than loopback's socket buffers take in


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", DISK_MB, why="the disk-full suite") as mount:
        yield mount


def rows_without_original(data_dir: Path) -> list[int]:
    return [r["id"] for r in query(data_dir, "SELECT id, storage_key FROM photos")
            if not (data_dir / "originals" / r["storage_key"][:2] / r["storage_key"]).exists()]


async def wait_for_empty_tmp(data_dir: Path) -> list[Path]:
    """Workers write thumbnails through tmp/ as well: give the one in progress a moment to finish."""
    with trio.move_on_after(60):
        while temp_files(data_dir):
            await trio.sleep(0.05)
    return temp_files(data_dir)


async def test_disk_full_gives_507_leaves_nothing_half_written_and_recovers(small_disk: Path, tmp_path: Path,
                                                                           capsys: Any) -> None:
    data_dir = small_disk / "data"
    config = write_config(tmp_path / "picpeak.toml", workers=1, shutdown_grace_seconds=2, log_level="warning")
    token = create_token(data_dir, config)
    server = ServerProcess(data_dir, config)
    url = await trio.to_thread.run_sync(server.start)
    base = base_jpeg(1200, 900)  # ~0.5 MB
    acked: dict[int, str] = {}
    full: httpx.Response | None = None
    requests = 0
    try:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"},
                                     timeout=60) as http:
            gallery = (await http.post("/api/admin/galleries", json={"name": "Full"})).json()
            upload_url = f"/api/admin/galleries/{gallery['id']}/upload"
            for attempt in range(4 * DISK_MB):
                files = [(f"f{attempt}-{i}.jpg", unique_jpeg(base, f"{attempt}-{i}"))
                         for i in range(FILES_PER_REQUEST)]
                sent = {name: sha256(data) for name, data in files}
                body, headers = multipart(files)
                response = await http.post(upload_url, content=body, headers=headers)
                requests += 1
                if response.status_code == 507:
                    full = response
                    break
                assert response.status_code == 202, response.text
                for photo in response.json()["photos"]:
                    acked[photo["id"]] = sent[photo["filename"]]
            assert full is not None, f"the disk never filled after {requests} requests"
            message = full.json().get("error", full.text)
            # A client that reads the answer only once it has sent everything (httpx, like most) gets it even
            # when far more is left to send than socket buffers hold: the server drops the rest, then answers.
            body, headers = multipart([("big.jpg", unique_jpeg(base, "big") + bytes(BIG_REQUEST_MB << 20))])
            with trio.fail_after(120):  # a hung-test stop only
                big = await http.post(upload_url, content=body, headers=headers)
            leftovers = await wait_for_empty_tmp(data_dir)
            missing_after_full = rows_without_original(data_dir)

            # The dashboard (an admin session, as a browser) warns about the disk.
            async with httpx.AsyncClient(base_url=url, timeout=120) as browser:
                login = await browser.post("/admin/login", data={"username": "admin", "password": ADMIN_PASSWORD})
                assert login.status_code == 302, login.text
                dashboard = (await browser.get("/admin/")).text
            low_disk_shown = 'id="low-disk"' in dashboard

            # Free space by deleting photos, then upload again: the same process accepts it.
            # Three quarters: when processing lagged behind the uploads, the photos left still need their
            # thumbnails, and half was seen to leave too little room for them above the reserve.
            freed = sorted(acked)[: max(4, len(acked) * 3 // 4)]
            for photo_id in freed:
                deleted = await http.delete(f"/api/admin/photos/{photo_id}")
                assert deleted.status_code == 204, (deleted.text, server.log_tail())
                del acked[photo_id]
            again_data = unique_jpeg(base, "after")
            body, headers = multipart([("after.jpg", again_data)])
            again = await http.post(upload_url, content=body, headers=headers)
            assert again.status_code == 202, again.text
            acked[again.json()["photos"][0]["id"]] = sha256(again_data)
            # Photos whose thumbnails did not fit were handed back, not failed: they are made now.
            with trio.move_on_after(300):
                while query(data_dir, "SELECT count(*) AS n FROM photos WHERE status IN ('pending', 'processing')"
                            )[0]["n"]:
                    await trio.sleep(0.2)
        assert await trio.to_thread.run_sync(server.stop) == 0, server.log_tail()
    finally:
        server.kill()

    rows = {r["id"]: r for r in query(data_dir, "SELECT id, storage_key, sha256, status, error FROM photos")}
    lost = [pid for pid, sha in acked.items() if pid not in rows or file_sha256(
        data_dir / "originals" / rows[pid]["storage_key"][:2] / rows[pid]["storage_key"]) != sha]
    failed_processing = [r for r in rows.values() if r["status"] == "failed"]
    unfinished = [r for r in rows.values() if r["status"] in ("pending", "processing")]
    figures(capsys, f"diskfull: disk_mb={DISK_MB} requests={requests} "
                    f"acked_before_full={len(acked) + len(freed) - 1} "
                    f"status_when_full={full.status_code} tmp_leftovers={len(leftovers)} "
                    f"big_request_status={big.status_code} "
                    f"rows_without_file={len(missing_after_full) + len(rows_without_original(data_dir))} "
                    f"lost={len(lost)} freed={len(freed)} upload_after_free={again.status_code} "
                    f"server_starts={server.starts} low_disk_warning={low_disk_shown} "
                    f"failed_processing={len(failed_processing)} unfinished={len(unfinished)}")
    assert full.status_code == 507 and "disk is full" in message, message
    assert big.status_code == 507, big.text
    assert big.headers.get("connection") != "close"  # the rest was read: the connection stays usable
    assert leftovers == [], leftovers
    assert missing_after_full == [] and rows_without_original(data_dir) == []
    assert lost == []
    assert low_disk_shown, "the dashboard shows no low-disk warning"
    assert failed_processing == [] and unfinished == [], (failed_processing, unfinished, server.log_tail())
    assert not server.tracebacks(), "\n".join(server.tracebacks())
