"""The database server drops our connections (a restart, a failover, a cut network): the requests meanwhile are
told 503 with Retry-After, and the server goes on by itself once the database answers again (issue 31: "restart
PostgreSQL under load ... every host reconnects by itself"). On the real PostgreSQL server of the test run: its
backends are terminated (what a restart does to a client) and connections to the database refused for a while."""

from __future__ import annotations

from typing import Any

import pytest

from picpeak_lite.services import Services

from . import pgserver
from .conftest import AuthActions

pytestmark = pytest.mark.postgresql


def _database_name(services: Services) -> str:
    return services.settings.database_url.rsplit("/", 1)[1]


def _terminate_backends(name: str) -> None:
    pgserver.server().admin_sql(
        f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' AND pid <> pg_backend_pid()")


async def test_connections_dropped_while_idle_are_opened_again_without_a_failed_request(
        admin: AuthActions, services: Services, caplog: Any) -> None:
    assert (await admin.client.get("/api/admin/galleries", headers=admin.headers())).status_code == 200
    _terminate_backends(_database_name(services))
    # Every connection of the pool was dropped while idle: each is found broken at its BEGIN and opened again.
    for _ in range(8):  # more requests than connections, reads and writes
        response = await admin.client.get("/api/admin/galleries", headers=admin.headers())
        assert response.status_code == 200, await response.get_data(as_text=True)
    created = await admin.client.post("/api/admin/galleries", json={"name": "After the restart"},
                                      headers=admin.headers())
    assert created.status_code == 201
    assert "a dropped connection was opened again" in caplog.text


async def test_while_the_database_refuses_requests_are_told_503_with_retry_after(
        admin: AuthActions, services: Services) -> None:
    name = _database_name(services)
    pg = pgserver.server()
    pg.admin_sql(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
    try:
        _terminate_backends(name)
        response = await admin.client.get("/api/admin/galleries", headers=admin.headers())
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "5"
        body = await response.get_json()
        assert body["error"].startswith("The database is not answering just now; nothing was saved.")
        assert "127.0.0.1" not in body["error"] and "postgres" not in body["error"]  # the detail is for the log
        page = await admin.client.get("/admin/", headers={"Accept": "text/html"})
        assert page.status_code == 503
    finally:
        pg.admin_sql(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
    response = await admin.client.get("/api/admin/galleries", headers=admin.headers())
    assert response.status_code == 200, await response.get_data(as_text=True)
