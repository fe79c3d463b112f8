"""Feedback on a phone (issue 34): a guest opens a photo, likes it, gives it four stars and comments with a name,
in a gallery that holds comments; the comment shows as waiting, the photographer's API lists it held; the
lightbox with its panel has no axe violation. Screenshot: test-artifacts/<test>-phone-feedback.png."""

from __future__ import annotations

from typing import Any

from .. import imagefactory
from .conftest import LiveServer, page_at, wait_processed
from .test_a11y_browser import AXE_OPTIONS


def test_a_guest_rates_and_comments_on_a_phone(server: LiveServer, api: Any, browser: Any, request: Any) -> None:
    from axe_playwright_python.sync_playwright import Axe

    made = api.post("/api/admin/galleries", json={"name": "Anna & Ben", "hold_comments": True}).json()
    gallery = {**made, **api.post(f"/api/admin/galleries/{made['id']}/publish").json()}
    files = [("photos", ("DSC_0001.jpg", imagefactory.save(imagefactory.photo(900, 600, seed=3), "jpeg")))]
    upload = api.post(f"/api/admin/galleries/{gallery['id']}/upload", files=files).json()
    wait_processed(api, upload["upload_id"])

    with page_at(browser, request, (390, 844)) as phone:
        phone.goto(f"{server.url}/g/{gallery['slug']}")
        phone.click(".tile-link")
        phone.click(".lb-feedback-toggle")
        panel = phone.locator("#lb-feedback")
        panel.wait_for(state="visible")
        phone.click(".fb-like")
        phone.locator(".fb-like[aria-pressed=true]").wait_for()
        phone.locator(".fb-star").nth(3).click()  # four stars
        phone.locator(".fb-average").filter(has_text="4.0 of 5").wait_for()
        phone.fill(".fb-form input[name=name]", "Aunt Mary")
        phone.fill(".fb-form textarea[name=text]", "<b>Print</b> this one, please!")
        phone.click(".fb-form button[type=submit]")
        phone.locator(".fb-status").filter(has_text="once the photographer has approved it").wait_for()
        comment = phone.locator(".fb-comment.is-held")
        comment.wait_for()
        assert comment.locator("p").first.inner_text() == "<b>Print</b> this one, please!"  # text, not markup
        assert phone.locator(".fb-comment b").count() == 0
        assert phone.locator(".fb-name").is_hidden()  # the name is the session's now
        # The panel fits the phone's width: nothing sticks out sideways.
        assert phone.evaluate("() => document.getElementById('lb-feedback').scrollWidth <= window.innerWidth")
        phone.screenshot("phone-feedback")
        violations = Axe().run(phone.page, options=AXE_OPTIONS).response["violations"]
        assert violations == [], [(v["id"], [n["target"] for n in v["nodes"]][:3]) for v in violations]

    listed = api.get(f"/api/admin/galleries/{gallery['id']}/comments").json()["comments"]
    assert [(c["name"], c["text"], c["status"]) for c in listed] == [
        ("Aunt Mary", "<b>Print</b> this one, please!", "held")]
