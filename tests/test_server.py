"""The real server: hypercorn on 127.0.0.1 port 0, started with nursery.start."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
import trio

from picpeak_lite import server
from picpeak_lite.ops import bootstrap

from .conftest import ADMIN_PASSWORD, make_settings


async def test_real_server_serves_and_shuts_down_cleanly(tmp_path: Any) -> None:
    settings = make_settings(tmp_path, shutdown_grace_seconds=2)
    bootstrap.prepare(settings)
    bootstrap.ensure_admin(settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
    async with trio.open_nursery() as nursery:
        running = await nursery.start(server.run, settings)
        assert running.url.startswith("http://127.0.0.1:") and not running.url.endswith(":0")
        async with httpx.AsyncClient(base_url=running.url) as http:
            health = await http.get("/healthz")
            assert health.status_code == 200 and health.json() == {"status": "ok"}
            login = await http.post("/admin/login", data={"username": "admin", "password": ADMIN_PASSWORD})
            assert login.status_code == 302 and "pp_admin" in login.cookies
            page = await http.get("/admin/")
            assert page.status_code == 200 and "Galleries" in page.text
        running.stop()
    # run() returned: the database was closed cleanly, so the WAL was checkpointed and removed.
    assert not (settings.data_path / "picpeak.sqlite3-wal").exists()


async def test_the_start_says_once_how_share_links_are_made(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="picpeak_lite.server")
    for name, extra, expected in (
        ("plain", {}, "share links use the request's Host when it is one of 127.0.0.1:{port}, localhost:{port}, "
                      "[::1]:{port} ... any other Host gets {url}."),
        ("listed", {"allowed_hosts": ("photos.lan",)}, "photos.lan"),
        ("public", {"public_url": "https://photos.example.com"}, "share links use public_url "
                                                                "https://photos.example.com"),
    ):
        caplog.clear()
        settings = make_settings(tmp_path / name, shutdown_grace_seconds=1, processing_enabled=False, **extra)
        bootstrap.prepare(settings)
        async with trio.open_nursery() as nursery:
            running = await nursery.start(server.run, settings)
            running.stop()
        lines = [r.getMessage() for r in caplog.records if "share links" in r.getMessage()]
        assert len(lines) == 1, lines
        port = running.url.rsplit(":", 1)[1]
        for part in expected.format(port=port, url=running.url).split(" ... "):
            assert part in lines[0], (part, lines[0])
        assert running.services.bind_url == running.url
