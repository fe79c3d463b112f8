"""An editor's day (issue 33): logged in as an editor, the dashboard shows only the galleries granted to them,
their gallery page has no publish or delete controls, the settings, accounts and new-gallery pages are refused,
and the pages pass axe-core. Screenshots: test-artifacts/editor-day-*.png."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx

from .conftest import LiveServer, new_page
from .test_a11y_browser import AXE_OPTIONS

EDITOR_PASSWORD = "editor's own password"


def add_editor(server: LiveServer, name: str) -> None:
    subprocess.run([sys.executable, "-m", "picpeak_lite", "admin", "account", "add", name, "--role", "editor",
                    "--password-stdin", "--data-dir", str(server.data_dir)],
                   input=EDITOR_PASSWORD + "\n", capture_output=True, text=True, check=True)


def test_an_editors_day(server: LiveServer, api: httpx.Client, browser: Any, request: Any) -> None:
    from axe_playwright_python.sync_playwright import Axe

    request.node.name = "editor-day"
    mine = api.post("/api/admin/galleries", json={"name": "Anna & Ben"}).json()
    api.post("/api/admin/galleries", json={"name": "Not yours"})
    add_editor(server, "sam")
    # The owner grants the gallery on the accounts page (as a person would), in their own browser.
    owner_pages = new_page(browser, request, viewport={"width": 1440, "height": 900})
    owner = next(owner_pages)
    owner.goto(server.url + "/admin/login")
    owner.fill("input[name=password]", server.admin_password)
    owner.click("button[type=submit]")
    owner.goto(server.url + "/admin/accounts")
    row = owner.locator("tr", has_text="sam")
    row.get_by_label("Anna & Ben").check()
    row.get_by_role("button", name="Save galleries").click()
    assert owner.locator("tr", has_text="sam").get_by_label("Anna & Ben").is_checked()
    violations = [v["id"] for v in Axe().run(owner.page, options=AXE_OPTIONS).response["violations"]]
    assert violations == [], violations
    owner.screenshot("owner-accounts")
    owner.goto(server.url + "/admin/audit?account=admin")
    assert "account.grants_changed" in owner.locator("tbody").inner_text()
    violations = [v["id"] for v in Axe().run(owner.page, options=AXE_OPTIONS).response["violations"]]
    assert violations == [], violations
    owner.screenshot("owner-audit")
    next(owner_pages, None)

    pages = new_page(browser, request, viewport={"width": 1440, "height": 900})
    page = next(pages)
    page.goto(server.url + "/admin/login")
    page.fill("input[name=username]", "sam")
    page.fill("input[name=password]", EDITOR_PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(server.url + "/admin/")
    cards = page.locator("main").inner_text()
    assert "Anna & Ben" in cards and "Not yours" not in cards
    nav = page.locator("header nav").inner_text()
    assert "Settings" not in nav and "New gallery" not in nav and "Accounts" not in nav
    violations = [v["id"] for v in Axe().run(page.page, options=AXE_OPTIONS).response["violations"]]
    assert violations == [], violations
    page.screenshot("dashboard")
    page.goto(server.url + f"/admin/galleries/{mine['id']}")
    assert page.locator("h1").inner_text() == "Anna & Ben"
    assert page.get_by_role("button", name="Publish").count() == 0
    assert page.get_by_role("button", name="Delete gallery").count() == 0
    assert page.get_by_role("button", name="Make a wall link").count() == 0
    assert page.get_by_role("button", name="Hide from guests").count() == 1
    violations = [v["id"] for v in Axe().run(page.page, options=AXE_OPTIONS).response["violations"]]
    assert violations == [], violations
    page.screenshot("gallery")
    for path in ("/admin/settings/", "/admin/accounts", "/admin/galleries/new"):
        answer = page.goto(server.url + path)
        assert answer is not None and answer.status == 403, path
    page.screenshot("settings-refused")
    next(pages, None)
