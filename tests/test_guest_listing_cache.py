"""The guest listing's cached JSON fragments (views/guest.py ``FragmentCache``): every kind of change shows at once.

After each change, the listing a warm app gives (its cache filled before the change) must be byte for byte the
listing a fresh app over the same database gives (an empty cache), and the same JSON as the plain way (debug
mode, which encodes the photo dicts whole), seen by the same guest.
"""

from __future__ import annotations

import json
import time
from typing import Any

from picpeak_lite.services import Services
from picpeak_lite.store.queries import galleries as gallery_q
from picpeak_lite.web.app import create_app

from .conftest import AuthActions, sql
from .factories import add_photo, jpeg, published, run_pool_until_idle, stage_photo
from .test_guest_pages import enter_password, guest_csrf


class Listing:
    """What one guest (one cookie jar) is told by the warm app, by a fresh one, and by the plain way."""

    def __init__(self, services: Services, guest: Any, slug: str) -> None:
        self.services, self.guest, self.slug = services, guest, slug

    async def _from(self, app: Any, **params: str) -> tuple[int, bytes]:
        cookies = "; ".join(f"{c.name}={c.value}" for c in self.guest.cookie_jar)
        response = await app.test_client().get(f"/api/g/{self.slug}/photos", query_string=params,
                                                headers={"Cookie": cookies})
        return response.status_code, await response.get_data()

    async def get(self, **params: str) -> Any:
        """The warm app's answer, after checking it against a fresh app's and the plain way's."""
        warm = await self.guest.get(f"/api/g/{self.slug}/photos", query_string=params)
        status, body = warm.status_code, await warm.get_data()
        fresh = await self._from(create_app(self.services), **params)
        assert (status, body) == fresh, f"warm app: {status} {body[:300]!r}; fresh app: {fresh[1][:300]!r}"
        plain_app = create_app(self.services)
        plain_app.debug = True
        plain_status, plain = await self._from(plain_app, **params)
        assert plain_status == status
        if status != 200:
            return None
        parsed = json.loads(body)
        assert parsed == json.loads(plain)
        # As the app's JSON provider writes a dict: compact, sorted keys, ASCII, one newline.
        assert body.decode() == json.dumps(parsed, sort_keys=True, separators=(",", ":")) + "\n"
        return parsed

    async def ids(self, **params: str) -> list[int]:
        return [p["id"] for p in (await self.get(**params))["photos"]]


async def test_each_kind_of_change_shows_at_once(app: Any, admin: AuthActions, guest: Any,
                                                 services: Services) -> None:
    gallery = await published(admin, name="Cached", allow_downloads=True, allow_guest_uploads=True)
    slug, gallery_id = gallery["slug"], gallery["id"]
    first = add_photo(services, gallery_id, taken_at="2024-06-20T14:03:00")
    second = add_photo(services, gallery_id, taken_at="2024-06-20T14:05:00")
    third = add_photo(services, gallery_id, taken_at="2024-06-20T14:07:00")
    csrf = await guest_csrf(guest, slug)
    listing = Listing(services, guest, slug)
    assert await listing.ids() == [first, second, third]
    cache = app.extensions["picpeak_listing_fragments"]
    assert len(cache) == 3  # the warm app's cache is filled, and the rest of the test reads through it

    # A photo completed by the real pipeline joins the listing.
    staged, _ = stage_photo(services, gallery_id, jpeg(7))
    assert await listing.ids() == [first, second, third]
    await run_pool_until_idle(services)
    assert staged in await listing.ids()

    # Hidden, shown again, deleted: the admin's bulk actions.
    async def bulk(action: str, ids: list[int]) -> None:
        answer = await admin.client.post(f"/api/admin/galleries/{gallery_id}/photos/bulk",
                                         json={"action": action, "ids": ids}, headers=admin.headers())
        assert answer.status_code == 200, await answer.get_data(as_text=True)

    await bulk("hide", [second])
    assert second not in await listing.ids()
    await bulk("show", [second])
    assert second in await listing.ids()
    await bulk("delete", [third])
    assert third not in await listing.ids()

    # A guest's photo waiting for approval, then approved.
    sql(services, "UPDATE photos SET awaiting_approval = 1 WHERE id = ?", second)
    assert second not in await listing.ids()
    answer = await admin.client.post(f"/api/admin/galleries/{gallery_id}/review",
                                     json={"action": "approve", "ids": [second]}, headers=admin.headers())
    assert (await answer.get_json())["ids"] == [second]
    assert second in await listing.ids()

    # A changed row (a re-processed photo: new size and capture time) is a new fragment, not the old one.
    sql(services, "UPDATE photos SET width = 48, height = 64, taken_at = '2024-06-21T09:00:00' WHERE id = ?", first)
    [changed] = [p for p in (await listing.get())["photos"] if p["id"] == first]
    assert (changed["width"], changed["height"], changed["taken"]) == (48, 64, "21 June 2024, 09:00")

    # This guest's heart shows for this guest only; another guest's listing has none.
    answer = await guest.put(f"/api/g/{slug}/favourites/{first}", headers={"X-CSRF-Token": csrf})
    assert answer.status_code == 200
    hearts = {p["id"]: p["favourite"] for p in (await listing.get())["photos"]}
    assert hearts[first] is True and not any(v for k, v in hearts.items() if k != first)
    assert await listing.ids(favourites="1") == [first]
    other = app.test_client()
    await guest_csrf(other, slug)
    others = await Listing(services, other, slug).get()
    assert not any(p["favourite"] for p in others["photos"])
    await guest.delete(f"/api/g/{slug}/favourites/{first}", headers={"X-CSRF-Token": csrf})
    assert not any(p["favourite"] for p in (await listing.get())["photos"])

    # The gallery's settings: downloads off, then watermarked; the links follow at once.
    async def patch(**fields: Any) -> None:
        answer = await admin.client.patch(f"/api/admin/galleries/{gallery_id}", json=fields,
                                          headers=admin.headers())
        assert answer.status_code == 200, await answer.get_data(as_text=True)

    assert all(p["download_url"] for p in (await listing.get())["photos"])
    await patch(allow_downloads=False)
    assert not any(p["download_url"] or p["web_download_url"] for p in (await listing.get())["photos"])
    await patch(watermark=True)
    assert len(await listing.ids()) == 3

    # Access: a password now asked for, then entered; then the gallery expired.
    await patch(password="secret words")
    assert await listing.get() is None
    await enter_password(guest, slug, "secret words")
    assert len(await listing.ids()) == 3
    await services.db.write(gallery_q.update, gallery_id, {"expires_at": time.time() - 86400}, time.time())
    assert await listing.get() is None


async def test_the_cache_is_bounded(app: Any, admin: AuthActions, guest: Any, services: Services) -> None:
    gallery = await published(admin, name="Many")
    cache = app.extensions["picpeak_listing_fragments"]
    cache.size = 5
    photos = [add_photo(services, gallery["id"], taken_at=f"2024-06-20T14:0{i}:00") for i in range(8)]
    listing = Listing(services, guest, gallery["slug"])
    assert await listing.ids() == photos
    assert len(cache) == 5
    assert await listing.ids() == photos  # evicted fragments are made again, the same
