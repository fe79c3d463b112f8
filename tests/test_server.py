"""The real server: hypercorn on 127.0.0.1 port 0, started with nursery.start."""

from __future__ import annotations

import logging
import re
import shutil
import socket
from typing import Any

import httpx
import pytest
import trio

from picpeak_lite import server
from picpeak_lite.errors import ConfigError
from picpeak_lite.ops import bootstrap
from picpeak_lite.resources import TEMPLATES_DIR
from picpeak_lite.web.app import create_app

from . import pgserver, served
from .conftest import ADMIN_PASSWORD, make_settings


async def test_real_server_serves_and_shuts_down_cleanly(tmp_path: Any) -> None:
    settings = make_settings(tmp_path, shutdown_grace_seconds=2)
    bootstrap.prepare(settings)
    bootstrap.ensure_admin(settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
    async with trio.open_nursery() as nursery:
        running = await nursery.start(server.run, settings)
        assert running.url.startswith("http://127.0.0.1:") and not running.url.endswith(":0")
        async with httpx.AsyncClient(base_url=running.url, timeout=120) as http:
            health = await http.get("/healthz")
            assert health.status_code == 200 and health.json() == {"status": "ok"}
            login = await http.post("/admin/login", data={"username": "admin", "password": ADMIN_PASSWORD})
            assert login.status_code == 302 and "pp_admin" in login.cookies
            page = await http.get("/admin/")
            assert page.status_code == 200 and "Galleries" in page.text
        running.stop()
    # run() returned: the database was closed cleanly, so the WAL was checkpointed and removed.
    assert not (settings.data_path / "picpeak.sqlite3-wal").exists()


async def _raw_websocket_status(url: str, path: str, cookie: str = "") -> int:
    """Open a WebSocket handshake by hand, read the status line, then hang up (as a closed tab does)."""
    host, port = url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Upgrade: websocket", "Connection: Upgrade",
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"]
    if cookie:
        lines.append(f"Cookie: {cookie}")
    await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode())
    received = b""
    while b"\r\n" not in received:
        chunk = await stream.receive_some(4096)
        assert chunk, received
        received += chunk
    await stream.aclose()
    return int(received.split(b" ", 2)[1])


def _access_lines(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "picpeak_lite.access"]


async def _wait_for_line(caplog: Any, fragment: str) -> str:
    # The line is written when the request has ended on the server's side, which may follow the client's view.
    while True:
        for line in _access_lines(caplog):
            if fragment in line:
                return line
        await trio.sleep(0.01)


async def test_request_log_one_line_per_request_without_query_values(tmp_path: Any, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="picpeak_lite.access")
    settings = make_settings(tmp_path, shutdown_grace_seconds=2)
    bootstrap.prepare(settings)
    bootstrap.ensure_admin(settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
    async with trio.open_nursery() as nursery:
        running = await nursery.start(server.run, settings)
        async with httpx.AsyncClient(base_url=running.url, timeout=120) as http:
            assert (await http.get("/healthz?token=s3cret-share-token&x")).status_code == 200
            assert (await http.get("/no/such/page")).status_code == 404
            login = await http.post("/admin/login", data={"username": "admin", "password": ADMIN_PASSWORD})
            assert login.status_code == 302
            cookie = "; ".join(f"{name}={value}" for name, value in http.cookies.items())
            page = await http.get("/admin/galleries/new")
            csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
            created = await http.post("/api/admin/galleries", json={"name": "Log test"},
                                      headers={"X-CSRF-Token": csrf})
            assert created.status_code == 201
            gallery_id = created.json()["id"]
        assert await _raw_websocket_status(running.url, "/ws/admin/galleries/999999") != 101
        assert await _raw_websocket_status(running.url, f"/ws/admin/galleries/{gallery_id}", cookie) == 101
        ws_line = await _wait_for_line(caplog, f'"WS /ws/admin/galleries/{gallery_id}"')
        refused_line = await _wait_for_line(caplog, '"WS /ws/admin/galleries/999999"')
        running.stop()
    lines = _access_lines(caplog)
    print("\n".join(lines))
    health = next(line for line in lines if "/healthz" in line)
    assert re.fullmatch(r'127\.0\.0\.1 "GET /healthz\?token=\*&x=\* HTTP/1\.1" 200 \d+ \d+ms', health), health
    assert "s3cret" not in "\n".join(lines)
    missing = next(line for line in lines if "/no/such/page" in line)
    assert re.fullmatch(r'127\.0\.0\.1 "GET /no/such/page HTTP/1\.1" 404 [1-9]\d* \d+ms', missing), missing
    login_line = next(line for line in lines if "POST /admin/login" in line)
    assert re.fullmatch(r'127\.0\.0\.1 "POST /admin/login HTTP/1\.1" 302 \d+ \d+ms in=\d+', login_line), login_line
    assert re.fullmatch(rf'127\.0\.0\.1 "WS /ws/admin/galleries/{gallery_id}" 101 \d+ \d+ms', ws_line), ws_line
    assert re.fullmatch(r'127\.0\.0\.1 "WS /ws/admin/galleries/999999" [45]\d\d \d+ \d+ms', refused_line), refused_line


async def test_request_log_writes_a_client_that_went_away_as_499_not_500(tmp_path: Any, caplog: Any) -> None:
    """A client that leaves before the answer (an upload cut by a reload or by going offline) is not a server
    error: it is logged as 499 "client closed request", as nginx does, at INFO. It was logged as 500."""
    caplog.set_level(logging.INFO, logger="picpeak_lite.access")
    async with served.serve(tmp_path) as running:
        host, port = running.url.removeprefix("http://").rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(
                f"POST /api/admin/galleries/{running.gallery_id}/upload HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer {running.token}\r\nContent-Length: 100000\r\n"
                "Content-Type: multipart/form-data; boundary=b\r\n\r\n--b\r\n".encode())
            await trio.sleep(0.2)  # the request has started; the rest of the body never comes
        line = await _wait_for_line(caplog, "/upload HTTP/1.1")
    record = next(r for r in caplog.records if r.name == "picpeak_lite.access" and "/upload" in r.getMessage())
    assert re.fullmatch(r'127\.0\.0\.1 "POST /api/admin/galleries/1/upload HTTP/1\.1" 499 0 \d+ms in=\d+ incomplete',
                        line), line
    assert record.levelno == logging.INFO


async def test_request_log_believes_x_forwarded_for_only_from_trusted_proxies(tmp_path: Any, caplog: Any) -> None:
    """The README's reverse-proxy setup: with trusted_proxies = "127.0.0.1" the log (and the throttling) see the
    client the proxy names; without it, a client's own X-Forwarded-For is not believed."""
    caplog.set_level(logging.INFO, logger="picpeak_lite.access")
    for trusted, expected in (("127.0.0.1", "203.0.113.7"), ("", "127.0.0.1")):
        settings = make_settings(tmp_path / (trusted or "none"), trusted_proxies=trusted, shutdown_grace_seconds=2)
        async with trio.open_nursery() as nursery:
            running = await nursery.start(server.run, settings)
            async with httpx.AsyncClient(base_url=running.url, timeout=120) as http:
                response = await http.get(f"/healthz?run={expected}", headers={"X-Forwarded-For": "203.0.113.7"})
                assert response.status_code == 200
            running.stop()
        line = next(line for line in _access_lines(caplog) if "/healthz" in line and "run=" in line)
        assert line.startswith(f'{expected} "GET /healthz?run=* HTTP/1.1" 200 '), line
        caplog.clear()


async def test_bind_refuses_a_port_in_use_with_one_sentence(tmp_path: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = make_settings(tmp_path, port=port)
        with pytest.raises(ConfigError) as caught:
            server.bind(settings)
    message = str(caught.value)
    assert message == (f"cannot listen on 127.0.0.1:{port}: the address is already in use (is picpeak-lite "
                       "already running?); choose another port with --port")
    # Nothing of the first-start work was done: run() binds before it prepares the data directory.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings = make_settings(tmp_path, port=taken.getsockname()[1])
        with pytest.raises(ConfigError, match="already in use"):
            await server.run(settings)
    assert not settings.data_path.exists()


async def test_healthz_fails_and_pages_say_so_when_templates_are_missing(tmp_path: Any, services: Any) -> None:
    """A broken install (no templates next to the package): /healthz is 503 with a sentence, not 200 beside
    500s, and a page answers a readable plain-text 500 instead of an empty body."""
    empty = tmp_path / "no-templates"
    empty.mkdir()
    app = create_app(services, templates_dir=empty)
    client = app.test_client()
    health = await client.get("/healthz")
    assert health.status_code == 503
    assert await health.get_json() == {
        "status": "error", "error": f"The page templates are missing: base.html is not in {empty}."}
    page = await client.get("/admin/login", headers={"Accept": "text/html"})
    assert page.status_code == 500
    assert page.mimetype == "text/plain"
    assert "cannot render its pages" in await page.get_data(as_text=True)


async def test_healthz_names_a_template_that_does_not_compile(tmp_path: Any, services: Any) -> None:
    broken = tmp_path / "templates"
    shutil.copytree(TEMPLATES_DIR, broken)
    (broken / "guest" / "expired.html").write_text("{% block main %}never closed")
    client = create_app(services, templates_dir=broken).test_client()
    health = await client.get("/healthz")
    assert health.status_code == 503
    error = (await health.get_json())["error"]
    assert error.startswith("The page template guest/expired.html cannot be loaded: "), error


async def test_favicon_is_served_and_linked(client: Any) -> None:
    icon = await client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.mimetype == "image/x-icon"
    assert (await icon.get_data()).startswith(b"\x00\x00\x01\x00")  # the ICO header
    login = await client.get("/admin/login")
    html = await login.get_data(as_text=True)
    assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in html
    svg = await client.get("/static/favicon.svg")
    assert svg.status_code == 200 and (await svg.get_data()).startswith(b"<svg")


async def test_watermark_settings_say_that_existing_photos_are_rendered_again(admin: Any) -> None:
    """Issue 12, point 13: saving watermark settings re-renders the galleries' photos (the README's rule), so the
    page must not say it applies only to photos processed from now on."""
    page = await (await admin.client.get("/admin/settings/")).get_data(as_text=True)
    assert "from now on" not in page
    assert "Saving re-renders those galleries’ photos in the background; they stay visible meanwhile." in page


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


@pytest.mark.postgresql
async def test_healthz_is_503_with_retry_after_when_the_database_is_gone(services: Any, client: Any) -> None:
    """Issue 31: a host whose PostgreSQL does not answer must leave the load balancer's rotation (503), not look
    like a bug (500). The database is dropped under the running app (its connections are ended by the server)."""
    assert (await client.get("/healthz")).status_code == 200
    name = services.settings.database_url.rsplit("/", 1)[1]
    pgserver.server().drop(name)
    health = await client.get("/healthz")
    assert health.status_code == 503
    assert health.headers["Retry-After"] == "5"
    body = await health.get_json()
    assert body == {"status": "error", "error": "The database does not answer."}
