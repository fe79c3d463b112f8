"""Hearts: per guest session, CSRF-protected, throttled, invisible to other guests, visible to the admin."""

from __future__ import annotations

from typing import Any

from picpeak_lite.services import Services
from picpeak_lite.store.queries import admin_photos as admin_photo_q
from picpeak_lite.web.ratelimit import RateLimit

from .conftest import AuthActions
from .factories import add_photo, published
from .test_guest_pages import enter_password, guest_csrf


async def test_add_and_remove_a_heart(guest: Any, admin: AuthActions, services: Services) -> None:
    gallery = await published(admin, name="G")
    first, second = add_photo(services, gallery["id"]), add_photo(services, gallery["id"])
    slug = gallery["slug"]
    csrf = await guest_csrf(guest, slug)
    url = f"/api/g/{slug}/favourites/{first}"

    assert (await guest.put(url)).status_code == 403  # no token
    assert (await guest.put(url, headers={"X-CSRF-Token": "forged"})).status_code == 403
    cross = await guest.put(url, headers={"X-CSRF-Token": csrf, "Sec-Fetch-Site": "cross-site"})
    assert cross.status_code == 403

    added = await guest.put(url, headers={"X-CSRF-Token": csrf})
    assert added.status_code == 200 and await added.get_json() == {"id": first, "favourite": True, "count": 1}
    again = await guest.put(url, headers={"X-CSRF-Token": csrf})
    assert (await again.get_json())["count"] == 1  # idempotent
    await guest.put(f"/api/g/{slug}/favourites/{second}", headers={"X-CSRF-Token": csrf})

    mine = await (await guest.get(f"/api/g/{slug}/photos", query_string={"favourites": "1"})).get_json()
    assert [p["id"] for p in mine["photos"]] == [first, second]
    assert all(p["favourite"] for p in mine["photos"])
    html = await (await guest.get(f"/g/{slug}?favourites=1")).get_data(as_text=True)
    assert "Download favourites" in html and 'aria-pressed="true"' in html

    removed = await guest.delete(url, headers={"X-CSRF-Token": csrf})
    assert await removed.get_json() == {"id": first, "favourite": False, "count": 1}


async def test_other_guests_favourites_are_invisible(guest: Any, client: Any, admin: AuthActions,
                                                      services: Services) -> None:
    gallery = await published(admin, name="G")
    photo = add_photo(services, gallery["id"])
    slug = gallery["slug"]
    csrf = await guest_csrf(guest, slug)
    await guest.put(f"/api/g/{slug}/favourites/{photo}", headers={"X-CSRF-Token": csrf})

    other = client  # a second browser
    other_csrf = await guest_csrf(other, slug)
    listed = await (await other.get(f"/api/g/{slug}/photos")).get_json()
    assert listed["photos"][0]["favourite"] is False
    assert (await (await other.get(f"/api/g/{slug}/photos", query_string={"favourites": "1"})).get_json()
            )["photos"] == []
    assert (await other.get(f"/g/{slug}/favourites/download")).status_code == 404
    # Removing someone else's heart is a no-op for them.
    await other.delete(f"/api/g/{slug}/favourites/{photo}", headers={"X-CSRF-Token": other_csrf})
    mine = await (await guest.get(f"/api/g/{slug}/photos", query_string={"favourites": "1"})).get_json()
    assert [p["id"] for p in mine["photos"]] == [photo]


async def test_only_visible_photos_of_this_gallery_can_be_hearted(guest: Any, admin: AuthActions,
                                                                  services: Services) -> None:
    gallery = await published(admin, name="G")
    other = await published(admin, name="Other")
    hidden = add_photo(services, gallery["id"], hidden=1)
    pending = add_photo(services, gallery["id"], status="pending")
    elsewhere = add_photo(services, other["id"])
    csrf = await guest_csrf(guest, gallery["slug"])
    for photo_id in (hidden, pending, elsewhere, 999999):
        r = await guest.put(f"/api/g/{gallery['slug']}/favourites/{photo_id}", headers={"X-CSRF-Token": csrf})
        assert r.status_code == 404, photo_id

    private = await published(admin, name="Private", password="pw12")
    locked = add_photo(services, private["id"])
    r = await guest.put(f"/api/g/{private['slug']}/favourites/{locked}", headers={"X-CSRF-Token": csrf})
    assert r.status_code == 401
    await enter_password(guest, private["slug"], "pw12")
    r = await guest.put(f"/api/g/{private['slug']}/favourites/{locked}", headers={"X-CSRF-Token": csrf})
    assert r.status_code == 200


async def test_guest_name_and_the_admin_view(guest: Any, client: Any, admin: AuthActions,
                                             services: Services) -> None:
    gallery = await published(admin, name="G")
    a, b, hidden = (add_photo(services, gallery["id"], name=n) for n in ("a.jpg", "b.jpg", "h.jpg"))
    slug = gallery["slug"]
    csrf = await guest_csrf(guest, slug)
    named = await guest.post(f"/api/g/{slug}/guest", json={"name": "  Aunt\u202e  Mary "},
                             headers={"X-CSRF-Token": csrf})
    assert named.status_code == 200 and await named.get_json() == {"name": "Aunt Mary"}
    for photo in (a, b, hidden):
        await guest.put(f"/api/g/{slug}/favourites/{photo}", headers={"X-CSRF-Token": csrf})
    await services.db.write(lambda conn: conn.execute("UPDATE photos SET hidden = 1 WHERE id = ?", (hidden,)))
    other_csrf = await guest_csrf(client, slug)
    await client.put(f"/api/g/{slug}/favourites/{b}", headers={"X-CSRF-Token": other_csrf})

    # What the admin's photo grid shows: who picked each photo, hidden ones included.
    picks = await services.db.read(admin_photo_q.favourites_by_photo, gallery["id"])
    assert picks == {a: ["Aunt Mary"], b: ["Aunt Mary", "a guest"], hidden: ["Aunt Mary"]}
    # The hidden photo no longer counts for the guest.
    page = await (await guest.get(f"/g/{slug}")).get_data(as_text=True)
    assert 'class="fav-count">2<' in page


async def test_hearts_are_rate_limited_per_session(guest: Any, admin: AuthActions, services: Services,
                                                    mock_clock: Any) -> None:
    """The clock stands still (mock_clock), so no token comes back during the test."""
    gallery = await published(admin, name="G")
    photo = add_photo(services, gallery["id"])
    csrf = await guest_csrf(guest, gallery["slug"])
    url = f"/api/g/{gallery['slug']}/favourites/{photo}"
    statuses = [(await guest.put(url, headers={"X-CSRF-Token": csrf})).status_code for _ in range(62)]
    assert statuses[:60] == [200] * 60 and statuses[60:] == [429, 429]
    blocked = await guest.put(url, headers={"X-CSRF-Token": csrf})
    assert int(blocked.headers["Retry-After"]) >= 1


async def test_rate_limit_refills(services: Services) -> None:
    now = [0.0]
    limit = RateLimit("test", 2, 0.5, db=services.db, clock=lambda: now[0])
    await limit.take("k")
    await limit.take("k")
    try:
        await limit.take("k")
    except Exception as error:
        assert getattr(error, "retry_after", None) == 2
    else:
        raise AssertionError("the third action should be refused")
    now[0] = 2.0
    await limit.take("k")  # one token back after 2 s
    await limit.take("other")  # keys are independent
