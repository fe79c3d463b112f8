"""Fixtures: real settings in a temp dir, a real SQLite file, the real app, and an auth helper."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import apsw
import PIL
import pytest
import trio
from quart.testing.connections import WebsocketResponseError

from picpeak_lite.config import Settings, load_settings
from picpeak_lite.events.feed import ChangeFeed
from picpeak_lite.ops import bootstrap
from picpeak_lite.services import Services
from picpeak_lite.store import db
from picpeak_lite.store.db import Database
from picpeak_lite.web.app import create_app

from . import bothengines, harness, pgserver

ADMIN_PASSWORD = "correct horse battery"


def pytest_addoption(parser: Any) -> None:
    parser.addoption("--engine", choices=(*pgserver.ENGINES, "both"), default="sqlite",
                     help="The database the suite runs on: SQLite files, or a PostgreSQL server it starts "
                          "(tests/pgserver.py); both: the SQLite pass here and the PostgreSQL pass (without the "
                          "browser tests) beside it (tests/bothengines.py).")


def pytest_configure(config: Any) -> None:
    chosen = config.getoption("--engine")
    pgserver.engine = "sqlite" if chosen == "both" else chosen
    if not _is_worker(config):
        config.stash[_FIGURES_FROM] = harness.figures_size()
        if chosen == "both":
            bothengines.start(config)


def _is_worker(config: Any) -> bool:
    """A process that ``-n`` (pytest-xdist) started to run part of the tests, not the run's own."""
    return hasattr(config, "workerinput")


_FIGURES_FROM = pytest.StashKey[int]()


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    bothengines.finish(session, exitstatus)


def pytest_terminal_summary(terminalreporter: Any, config: Any) -> None:
    """With ``-n``, the figures lines the workers printed are not shown: the run's own process prints them."""
    if _is_worker(config) or not getattr(config.option, "numprocesses", None):
        return
    lines = harness.figures_since(config.stash.get(_FIGURES_FROM, 0), pgserver.engine)
    if lines:
        terminalreporter.section(f"figures lines (engine={pgserver.engine})")
        for line in lines:
            terminalreporter.write_line(line)


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Tests of one engine itself run only in that engine's pass: on PostgreSQL those marked ``sqlite`` are left
    out (they ran in the SQLite pass), and on SQLite those marked ``postgresql``."""
    other = "sqlite" if pgserver.engine == "postgresql" else "postgresql"
    left_out = [item for item in items if item.get_closest_marker(other)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker(other)]


def pytest_report_header(config: Any) -> list[str]:
    return [f"engine={pgserver.engine}; SQLite {apsw.sqlite_lib_version()}, apsw {apsw.apsw_version()}, "
            f"Pillow {PIL.__version__}"]


@pytest.fixture(autouse=True)
def _drop_test_databases() -> Iterator[None]:
    yield
    pgserver.drop_made()


def make_settings(tmp_path: Any, **overrides: Any) -> Settings:
    values = {"data_dir": str(tmp_path / "data"), "port": 0, "workers": 2}
    values.update(overrides)
    url = pgserver.database_for(values["data_dir"])
    if url is not None and "database_url" not in overrides:
        values["database_url"] = url
    return load_settings(environ={}, overrides=values)


@contextlib.contextmanager
def own_services(tmp_path: Any, **overrides: Any) -> Iterator[Services]:
    """Services over a fresh data directory with particular settings, for tests that need them."""
    settings = make_settings(tmp_path, **overrides)
    bootstrap.prepare(settings)
    svc = Services(settings=settings, db=Database(settings.database))
    try:
        yield svc
    finally:
        svc.db.close()


@pytest.fixture
def settings(tmp_path: Any) -> Settings:
    return make_settings(tmp_path)


@pytest.fixture
async def services(settings: Settings) -> AsyncIterator[Services]:
    bootstrap.prepare(settings)
    bootstrap.ensure_admin(settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
    db = Database(settings.database)
    # trio.current_time drives the throttles, so that autojump_clock tests can skip the windows.
    svc = Services(settings=settings, db=db, monotonic=trio.current_time)
    yield svc
    db.close()


@pytest.fixture
async def live(services: Services) -> AsyncIterator[Services]:
    """The change feed running for the test client's app (live pages and WebSocket feeds)."""
    async with trio.open_nursery() as nursery:
        await nursery.start(ChangeFeed(services, services.broker, poll_seconds=0.02).run)
        yield services
        nursery.cancel_scope.cancel()


@pytest.fixture
def app(services: Services) -> Any:
    return create_app(services)


@pytest.fixture
def client(app: Any) -> Any:
    return app.test_client()


@pytest.fixture
def guest(app: Any) -> Any:
    """A second browser, for the guest: its own cookie jar."""
    return app.test_client()


def sql(services: Services, statement: str, *args: Any) -> list[dict[str, Any]]:
    """Run one statement on its own connection (to set up or inspect what a test needs)."""
    conn = db.connect(services.settings.database)
    try:
        with db.transaction(conn):
            return conn.execute(statement, args).fetchall()
    finally:
        conn.close()


class HashChecks:
    """Counts the password hash checks the app really runs (our own Services method, wrapped, not mocked)."""

    def __init__(self, services: Services) -> None:
        self.count = 0
        original = services.verify_password

        async def counting(password_hash: str | None, password: str) -> bool:
            self.count += 1
            return await original(password_hash, password)

        services.verify_password = counting  # type: ignore[method-assign]


@pytest.fixture
def hash_checks(services: Services) -> HashChecks:
    return HashChecks(services)


async def websocket_status(client: Any, path: str, headers: dict[str, str] | None = None) -> int:
    """101 when the handshake is accepted and a first message arrives; the refusal's HTTP status otherwise."""
    refusal = await websocket_refusal(client, path, headers, accepted_ok=True)
    return 101 if refusal is None else refusal.status_code


async def websocket_refusal(client: Any, path: str, headers: dict[str, str] | None = None, *,
                            accepted_ok: bool = False) -> Any:
    """The response that refused the handshake (Quart's test client raises it, inside an exception group);
    None when it was accepted and a first message arrived, which fails the test unless ``accepted_ok``."""
    try:
        with trio.fail_after(60):  # a hung-test stop only
            async with client.websocket(path, headers=headers or {}) as ws:
                await ws.receive()
    except BaseExceptionGroup as group:
        refusals = [e for e in _leaves(group) if isinstance(e, WebsocketResponseError)]
        if not refusals:
            raise
        return refusals[0].response
    except WebsocketResponseError as error:
        return error.response
    assert accepted_ok, f"{path} was accepted"
    return None


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


CSRF_INPUT = re.compile(r'name="csrf_token" value="([^"]+)"')


class AuthActions:
    """Logs the admin in through the real login form and finds the CSRF token on a real page."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.csrf: str | None = None

    async def login(self, password: str = ADMIN_PASSWORD, username: str = "admin") -> Any:
        response = await self.client.post(
            "/admin/login", form={"username": username, "password": password}
        )
        if response.status_code == 302:
            page = await self.client.get("/admin/password")  # a page every role may open
            self.csrf = CSRF_INPUT.search(await page.get_data(as_text=True)).group(1)
        return response

    def headers(self) -> dict[str, str]:
        assert self.csrf, "log in first"
        return {"X-CSRF-Token": self.csrf}

    async def create_gallery(self, **fields: Any) -> dict[str, Any]:
        body = {"name": "Anna & Ben", **fields}
        response = await self.client.post("/api/admin/galleries", json=body, headers=self.headers())
        assert response.status_code == 201, await response.get_data(as_text=True)
        return await response.get_json()


async def add_account(services: Services, name: str, role: str, password: str = ADMIN_PASSWORD,
                      grants: tuple[int, ...] = ()) -> int:
    """An account made as the accounts page and the CLI make one (``domain/accounts``), with its galleries."""
    from picpeak_lite.domain import accounts

    password_hash = await services.hash_password(password)

    def add(conn: Any) -> int:
        account_id = accounts.add_account(conn, name, password_hash, role, services.clock(), accounts.CLI)
        if grants:
            accounts.set_grants(conn, account_id, list(grants), services.clock(), accounts.CLI)
        return account_id

    return await services.db.write(add)


@pytest.fixture
async def auth(client: Any) -> AuthActions:
    return AuthActions(client)


@pytest.fixture
async def admin(auth: AuthActions) -> AuthActions:
    response = await auth.login()
    assert response.status_code == 302
    return auth
