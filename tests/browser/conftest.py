"""Browser tests: a real `picpeak-lite serve` in a subprocess and Debian's Chromium driven by Playwright.

The server runs in its own process because Playwright's sync API blocks the calling thread. Screenshots go to
``test-artifacts/`` (ignored by git). Every page is checked for console errors when its test ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("PICPEAK_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
ADMIN_PASSWORD = "browser test password"
# How long a test waits for the server's own work (processing, a live change, a delivery) before it calls it
# hung: far above a quiet machine's seconds, because CI runs on a busy 2-core box and these are not speed tests.
PATIENCE_S = 120
PATIENCE_MS = PATIENCE_S * 1000
# Playwright's default for each action (30 s), doubled for the same reason.
ACTION_TIMEOUT_MS = 60_000
BROWSER_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every browser test is a system test (a real server process and a real Chromium): ``-m "not system"``
    leaves them out of a developer's quick run; plain ``pytest`` (and CI) still runs them."""
    for item in items:
        if BROWSER_DIR in Path(item.path).parents:
            item.add_marker(pytest.mark.system)


@dataclass
class LiveServer:
    url: str
    data_dir: Path
    process: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)
    admin_password: str = ADMIN_PASSWORD


def start_server(data_dir: Path, *extra: str, env: dict[str, str] | None = None) -> LiveServer:
    process = subprocess.Popen(
        [sys.executable, "-m", "picpeak_lite", "serve", "--port", "0", "--data-dir", str(data_dir), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD, **(env or {})},
    )
    assert process.stdout is not None
    output: list[str] = []
    for line in process.stdout:
        output.append(line)
        match = re.search(r"running at (http://127\.0\.0\.1:\d+)/admin", line)
        if match:
            # Keep reading: the server logs a line per request, and a full pipe would stop it mid-test.
            threading.Thread(target=_drain, args=(process, output), daemon=True).start()
            return LiveServer(match.group(1), data_dir, process, output)
    process.kill()
    raise AssertionError("the server did not start:\n" + "".join(output))


def _drain(process: subprocess.Popen[str], output: list[str]) -> None:
    # Until EOF, or until stop_server's communicate() closes the pipe under us.
    with contextlib.suppress(ValueError, OSError):
        output.extend(process.stdout or ())


def stop_server(server: LiveServer) -> None:
    server.process.send_signal(signal.SIGTERM)
    try:
        server.process.communicate(timeout=PATIENCE_S)
    except subprocess.TimeoutExpired:
        server.process.kill()
        raise


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    """A fresh server for one test (modules that share one across their tests override this)."""
    live = start_server(tmp_path / "data")
    yield live
    stop_server(live)


@pytest.fixture
def api(server: LiveServer) -> Iterator[Any]:
    yield from api_client(server)


def failed_count(server: LiveServer, photo_id: int) -> int:
    """How often the change log saw this photo become 'failed' (read from the server's database file)."""
    from picpeak_lite.store import db

    conn = db.connect(server.data_dir / "picpeak.sqlite3")
    try:
        rows = conn.execute("SELECT count(*) AS n FROM photo_changes WHERE photo_id = ? AND status = 'failed'",
                            (photo_id,)).fetchall()
        return rows[0]["n"]
    finally:
        conn.close()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium is needed for the browser tests and was not found at {CHROMIUM} "
                    "(Debian: apt-get install chromium; .ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


class Page:
    """A Playwright page that records console errors and failed requests, and saves screenshots."""

    def __init__(self, page: Any, name: str) -> None:
        self.page = page
        self.name = name
        self.console_errors: list[str] = []
        page.on("console", lambda msg: msg.type == "error" and self.console_errors.append(msg.text))
        page.on("pageerror", lambda error: self.console_errors.append(str(error)))

    def screenshot(self, label: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{self.name}-{label}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def __getattr__(self, name: str) -> Any:
        return getattr(self.page, name)


def wait_processed(api: Any, upload_id: str) -> None:
    """Until every photo of the upload is complete or failed (a hung-test stop at PATIENCE_S, not a speed bound)."""
    deadline = time.monotonic() + PATIENCE_S
    while not api.get(f"/api/admin/uploads/{upload_id}").json()["done"]:
        assert time.monotonic() < deadline, "the photos were not processed in time"
        time.sleep(0.2)


@contextlib.contextmanager
def page_at(browser: Any, request: Any, viewport: tuple[int, int]) -> Iterator[Page]:
    """:func:`new_page` at ``viewport`` (width, height), its end (closing, the console check) run on every way out."""
    pages = new_page(browser, request, viewport={"width": viewport[0], "height": viewport[1]})
    try:
        yield next(pages)
    finally:
        next(pages, None)


def new_page(browser: Any, request: Any, **context_args: Any) -> Iterator[Page]:
    context = browser.new_context(accept_downloads=True, **context_args)
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    page = Page(context.new_page(), request.node.name)
    yield page
    context.close()
    # A 401/404/410 answered on purpose is logged by Chromium as a failed resource; those are expected.
    unexpected = [e for e in page.console_errors if "status of 4" not in e]
    assert not unexpected, f"console errors: {unexpected}"


@pytest.fixture
def page(browser: Any, request: Any) -> Iterator[Page]:
    yield from new_page(browser, request, viewport={"width": 1280, "height": 900})


@pytest.fixture
def phone(browser: Any, request: Any) -> Iterator[Page]:
    yield from new_page(browser, request, viewport={"width": 390, "height": 844}, device_scale_factor=3,
                        is_mobile=True, has_touch=True)


def api_client(server: LiveServer) -> Iterator[Any]:
    """An httpx client on the server's JSON API with a fresh API token (made by the real CLI)."""
    import httpx

    out = subprocess.run(
        [sys.executable, "-m", "picpeak_lite", "admin", "token", "create", "--name", "browser",
         "--data-dir", str(server.data_dir)], capture_output=True, text=True, check=True)
    token = re.search(r"ppk_\S+", out.stdout + out.stderr).group(0)  # type: ignore[union-attr]
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"},
                      timeout=PATIENCE_S) as client:
        yield client


def admin_login(page: Page, server: LiveServer) -> None:
    page.goto(server.url + "/admin/login")
    page.fill("input[name=password]", server.admin_password)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/admin/$"))
