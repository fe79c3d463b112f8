"""The browser can reach the real server; the admin can log in and create and publish a gallery."""

from __future__ import annotations

import re
from typing import Any

from .conftest import LiveServer, Page, admin_login


def test_admin_creates_and_publishes_a_gallery(server: LiveServer, page: Page) -> None:
    admin_login(page, server)
    page.click("text=New gallery >> nth=0")
    page.fill("input[name=name]", "Anna & Ben")
    page.click("button:has-text('Create gallery')")
    page.wait_for_url(re.compile(r".*/admin/galleries/\d+$"))
    page.click("button:has-text('Publish')")
    link = page.input_value("#share-link")
    assert re.search(r"/g/anna-ben-[a-z2-9]{8}$", link)
    page.screenshot("gallery-published")
    page.goto(link)
    assert page.locator("h1").inner_text() == "Anna & Ben"


def test_wrong_password_shows_the_error(server: LiveServer, page: Page) -> None:
    page.goto(server.url + "/admin/login")
    page.fill("input[name=password]", "wrong")
    page.click("button[type=submit]")
    assert page.locator("[role=alert]").inner_text() == "Wrong user name or password."


def test_phone_layout_has_no_horizontal_scroll(server: LiveServer, phone: Any) -> None:
    phone.goto(server.url + "/admin/login")
    width = phone.evaluate("document.documentElement.scrollWidth")
    assert width <= 390
