"""``picpeak-lite serve --processes N`` (picpeak_lite/supervisor.py): N serving processes on one port, as one
service. Real processes: the supervisor, its serving children, their image children."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from .harness import ServerProcess, base_jpeg, cli, create_token, multipart, query, unique_jpeg, write_config

pytestmark = pytest.mark.system

BATCHES = 6
FILES_PER_BATCH = 4


def serving_children(supervisor: int) -> list[int]:
    """The supervisor's direct children (its serving processes), by their parent pid."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == supervisor and fields[0] != "Z":
                found.append(int(stat.parent.name))
    return sorted(found)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


async def upload(http: httpx.AsyncClient, gallery_id: int, base: bytes, tag: str) -> list[int]:
    files = [(f"{tag}-{i}.jpg", unique_jpeg(base, f"{tag}-{i}")) for i in range(FILES_PER_BATCH)]
    body, headers = multipart(files)
    response = await http.post(f"/api/admin/galleries/{gallery_id}/upload", content=body, headers=headers)
    assert response.status_code == 202, response.text
    return [photo["id"] for photo in response.json()["photos"]]


async def until(condition: Any) -> None:
    with trio.fail_after(300):  # a hung-test stop only
        while not await trio.to_thread.run_sync(condition):
            await trio.sleep(0.1)


async def test_two_serving_processes_share_the_port_and_the_work_and_outlive_a_killed_one(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    config = write_config(tmp_path / "picpeak.toml", lease_seconds=5, workers=1)
    server = ServerProcess(data_dir, config, args=("--processes", "2"))
    url = await trio.to_thread.run_sync(server.start)
    try:
        first = serving_children(server.pid)
        assert len(first) == 2, server.log_tail()
        token = await trio.to_thread.run_sync(create_token, data_dir, config)
        base = base_jpeg(640, 480)
        # A new connection per request: the kernel hands each to whichever process accepts first.
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120,
                                     limits=httpx.Limits(max_keepalive_connections=0)) as http:
            gallery = (await http.post("/api/admin/galleries", json={"name": "Two processes"})).json()
            acked: list[int] = []
            async with trio.open_nursery() as nursery:
                async def one(tag: str) -> None:
                    acked.extend(await upload(http, gallery["id"], base, tag))

                for index in range(BATCHES):
                    nursery.start_soon(one, f"b{index}")
            assert len(acked) == BATCHES * FILES_PER_BATCH

            def all_complete() -> bool:
                rows = query(data_dir, "SELECT status FROM photos")
                return len(rows) == len(acked) and all(r["status"] == "complete" for r in rows)

            await until(all_complete)
            # One of them watches the hot folders, holding the lease; kill -9 it: the supervisor starts another
            # process, and the lease goes to a live process once it runs out (lease_seconds = 5).
            holder = query(data_dir, "SELECT holder FROM leases WHERE name = 'hot_folders'")[0]["holder"]
            victim = int(holder.split("/")[1])
            assert victim in first
            os.kill(victim, signal.SIGKILL)

            def replaced() -> bool:
                now = serving_children(server.pid)
                return len(now) == 2 and victim not in now and all(alive(pid) for pid in now)

            await until(replaced)

            def lease_moved() -> bool:
                rows = query(data_dir, "SELECT holder FROM leases WHERE name = 'hot_folders'")
                return bool(rows) and int(rows[0]["holder"].split("/")[1]) in serving_children(server.pid)

            await until(lease_moved)
            # The service went on answering and processing throughout.
            more = await upload(http, gallery["id"], base, "after")
            await until(lambda: all(r["status"] == "complete" for r in query(
                data_dir, "SELECT status FROM photos WHERE id IN (" + ",".join(map(str, more)) + ")")))
            listing = await http.get(f"/api/admin/galleries/{gallery['id']}/photos")
            assert listing.status_code == 200
        log = server.log_tail(400)
        assert "ended with status -9; starting it again" in log, log
        children = serving_children(server.pid)
        assert await trio.to_thread.run_sync(server.stop) == 0  # SIGTERM: every child drains, then it exits
        assert not any(alive(pid) for pid in children)
        assert "Stopped." in "".join(server.output)
    finally:
        if server.proc is not None:
            for pid in serving_children(server.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            server.kill()


def test_a_bad_processes_setting_is_one_line(tmp_path: Path) -> None:
    result = cli("serve", "--port", "0", "--data-dir", str(tmp_path / "data"), "--processes", "0")
    assert result.returncode != 0
    assert "processes" in result.stderr and "must be from 1 to 64" in result.stderr
    assert "Traceback" not in result.stderr
