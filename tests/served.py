"""A real server in the test's own trio run: ``server.run`` on port 0, with an admin, an API token and one
gallery that takes guest uploads, for tests that need real HTTP (raw sockets, tus clients) but not a process
of its own (those use ``harness.ServerProcess``)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio

from picpeak_lite import server
from picpeak_lite.ops import bootstrap
from picpeak_lite.services import Services
from picpeak_lite.store import db

from .conftest import ADMIN_PASSWORD, make_settings
from .factories import gallery_row

CSRF_META = re.compile(r'<meta name="csrf-token" content="([^"]+)"')


@dataclass
class Served:
    """A real server (``server.run`` on port 0), and what a test needs to reach it."""

    url: str
    token: str
    services: Services
    slug: str = "g"
    gallery_id: int = 1

    def admin(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=120)

    @contextlib.asynccontextmanager
    async def guest(self) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
        """A browser's guest session: its cookie, and the CSRF token its upload page carries."""
        async with httpx.AsyncClient(base_url=self.url, timeout=120) as http:
            page = await http.get(f"/g/{self.slug}/upload")
            assert page.status_code == 200
            csrf = CSRF_META.search(page.text).group(1)  # type: ignore[union-attr]
            http.headers["X-CSRF-Token"] = csrf
            yield http, csrf

    @property
    def admin_tus(self) -> str:
        return f"/api/admin/galleries/{self.gallery_id}/tus"

    @property
    def guest_tus(self) -> str:
        return f"/api/g/{self.slug}/tus"


def prepare(settings: Any) -> str:
    bootstrap.prepare(settings)
    bootstrap.ensure_admin(settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
    conn = db.connect(settings.database)
    with db.transaction(conn):
        token = bootstrap.create_api_token(conn, "test", time.time())
        gallery_id = gallery_row(conn, "G", slug="g", share_token="share")
        conn.execute("UPDATE galleries SET allow_guest_uploads = 1 WHERE id = ?", (gallery_id,))
    conn.close()
    return token


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, **overrides: Any) -> AsyncIterator[Served]:
    """Run the server on settings made by ``make_settings`` with ``overrides``, stopped on the way out."""
    settings = make_settings(tmp_path, shutdown_grace_seconds=1, **overrides)
    token = prepare(settings)
    async with trio.open_nursery() as nursery:
        running = await nursery.start(server.run, settings)
        yield Served(running.url, token, running.services)
        running.stop()
