"""The real server: hypercorn on 127.0.0.1 port 0, started with nursery.start."""

from __future__ import annotations

from typing import Any

import httpx
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
