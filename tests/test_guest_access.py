"""What a guest gets for open, password, draft, expired and unknown galleries."""

from __future__ import annotations

import re
from typing import Any

import trio

from .conftest import AuthActions
from .factories import expired, published

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


async def test_open_gallery(guest: Any, admin: AuthActions) -> None:
    gallery = await published(admin, name="Open House", welcome_message="Welcome, everyone!")
    response = await guest.get(f"/g/{gallery['slug']}")
    assert response.status_code == 200
    html = await response.get_data(as_text=True)
    assert "Open House" in html and "Welcome, everyone!" in html


async def test_draft_and_unknown_are_404(guest: Any, admin: AuthActions) -> None:
    draft = await admin.create_gallery(name="Secret draft")
    assert (await guest.get(f"/g/{draft['slug']}")).status_code == 404
    assert (await guest.get("/g/no-such-gallery-abcdefgh")).status_code == 404


async def test_expired_is_410_with_a_friendly_page(guest: Any, admin: AuthActions, services: Any) -> None:
    gallery = await expired(admin, services, name="Old party")
    response = await guest.get(f"/g/{gallery['slug']}")
    assert response.status_code == 410
    assert "expired" in await response.get_data(as_text=True)


async def test_password_gallery(guest: Any, admin: AuthActions) -> None:
    gallery = await published(admin, name="Private", password="letmein")
    form_page = await guest.get(f"/g/{gallery['slug']}")
    assert form_page.status_code == 401
    html = await form_page.get_data(as_text=True)
    assert 'type="password"' in html and "Private" in html
    csrf = CSRF.search(html).group(1)
    url = f"/g/{gallery['slug']}/password"

    no_csrf = await guest.post(url, form={"password": "letmein"})
    assert no_csrf.status_code == 403
    wrong = await guest.post(url, form={"password": "nope", "csrf_token": csrf})
    assert wrong.status_code == 401
    assert "not right" in await wrong.get_data(as_text=True)
    right = await guest.post(url, form={"password": "letmein", "csrf_token": csrf})
    assert right.status_code == 302
    assert (await guest.get(f"/g/{gallery['slug']}")).status_code == 200

    # Changing the password locks out everyone who entered the old one.
    await admin.client.patch(f"/api/admin/galleries/{gallery['id']}", json={"password": "newpass"},
                             headers=admin.headers())
    assert (await guest.get(f"/g/{gallery['slug']}")).status_code == 401


async def test_the_password_leads_back_to_the_page_asked_for(guest: Any, admin: AuthActions) -> None:
    """A QR code on a wedding table opens the guest upload page: after the password, that page, not the gallery."""
    gallery = await published(admin, name="Tables", password="letmein", allow_guest_uploads=True)
    upload_page = f"/g/{gallery['slug']}/upload"
    form_page = await guest.get(upload_page)
    assert form_page.status_code == 401
    html = await form_page.get_data(as_text=True)
    assert f'name="next" value="{upload_page}"' in html
    csrf = CSRF.search(html).group(1)
    url = f"/g/{gallery['slug']}/password"
    wrong = await guest.post(url, form={"password": "nope", "csrf_token": csrf, "next": upload_page})
    assert wrong.status_code == 401
    assert f'name="next" value="{upload_page}"' in await wrong.get_data(as_text=True)  # kept for the retry
    right = await guest.post(url, form={"password": "letmein", "csrf_token": csrf, "next": upload_page})
    assert right.status_code == 302 and right.headers["Location"].endswith(upload_page)
    assert (await guest.get(upload_page)).status_code == 200
    # Anything but one of this gallery's own pages goes to the gallery.
    for elsewhere in ("https://evil.example/", "//evil.example", "/admin/", f"/g/{gallery['slug']}/photos/1/view"):
        answer = await guest.post(url, form={"password": "letmein", "csrf_token": csrf, "next": elsewhere})
        assert answer.status_code == 302 and answer.headers["Location"].endswith(f"/g/{gallery['slug']}"), elsewhere


async def test_gallery_password_throttled_per_gallery_and_ip(guest: Any, admin: AuthActions,
                                                             autojump_clock: Any) -> None:
    gallery = await published(admin, name="Private", password="letmein")
    other = await published(admin, name="Other", password="letmein")
    csrf = CSRF.search(await (await guest.get(f"/g/{gallery['slug']}")).get_data(as_text=True)).group(1)
    url = f"/g/{gallery['slug']}/password"
    statuses = [(await guest.post(url, form={"password": f"x{i}", "csrf_token": csrf})).status_code
                for i in range(8)]
    assert statuses == [401] * 5 + [429] * 3
    blocked = await guest.post(url, form={"password": "letmein", "csrf_token": csrf})
    assert blocked.status_code == 429 and int(blocked.headers["Retry-After"]) > 0
    # Another gallery and another IP are unaffected.
    other_ok = await guest.post(f"/g/{other['slug']}/password", form={"password": "letmein", "csrf_token": csrf})
    assert other_ok.status_code == 302
    second_ip = await guest.post(url, form={"password": "letmein", "csrf_token": csrf},
                                  scope_base={"client": ("10.1.1.1", 1)})
    assert second_ip.status_code == 302
    await trio.sleep(900)


async def test_password_form_for_draft_is_404(guest: Any, admin: AuthActions) -> None:
    draft = await admin.create_gallery(name="Draft", password="letmein")
    page = await guest.get("/admin/login")  # any page; the guest has no session yet
    assert page.status_code == 200
    response = await guest.post(f"/g/{draft['slug']}/password", form={"password": "letmein"})
    assert response.status_code in (403, 404)


async def test_lock_and_expired_pages_use_no_emoji_and_show_the_contact(guest: Any, admin: AuthActions,
                                                                         services: Any) -> None:
    """Issue 12, point 17: the icons are inline SVG (no emoji font needed), "expired" is said once, and the
    photographer's contact from the settings page is on the expired page."""
    old = await expired(admin, services, name="Old party")
    html = await (await guest.get(f"/g/{old['slug']}")).get_data(as_text=True)
    assert html.lower().count("expired") == 2  # the tab title and the heading, nothing else
    assert "<svg" in html and not any(ord(ch) > 0x2FFF for ch in html)
    assert "contact your photographer." in html and "mailto:" not in html
    csrf = admin.csrf
    bad = await admin.client.post("/admin/settings/contact", form={
        "csrf_token": csrf, "contact_name": "Ana Studio", "contact_email": "not an address", "contact_phone": ""})
    assert bad.status_code == 400
    assert "An email address like name@example.com" in await bad.get_data(as_text=True)
    saved = await admin.client.post("/admin/settings/contact", form={
        "csrf_token": csrf, "contact_name": "Ana Studio", "contact_email": "ana@example.com",
        "contact_phone": "+49 30 1234"})
    assert saved.status_code == 302
    html = await (await guest.get(f"/g/{old['slug']}")).get_data(as_text=True)
    assert "Ana Studio" in html and 'href="mailto:ana@example.com"' in html and 'href="tel:+49301234"' in html
    assert html.lower().count("expired") == 2
    locked = await published(admin, name="Locked", password="secret")
    html = await (await guest.get(f"/g/{locked['slug']}")).get_data(as_text=True)
    assert "<svg" in html and not any(ord(ch) > 0x2FFF for ch in html)
