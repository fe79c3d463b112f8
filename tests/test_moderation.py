"""Moderation (issue 16): a gallery whose guest photos need approval holds each guest's photo back until the
admin's review; guests (listings, zips, favourites, images, the feed) see it only once approved, its uploader
sees it with "waiting for approval", and the review sends photo.approved / photo.rejected."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from picpeak_lite.services import Services

from .conftest import AuthActions, make_settings
from .factories import jpeg, published, run_pool_until_idle
from .test_upload import multipart, rows, start_guest_session


@pytest.fixture
def settings(tmp_path: Any) -> Any:
    """A configured webhook receiver (never called here: the outbox rows are what is checked)."""
    return make_settings(tmp_path, webhooks=[{"url": "https://hooks.example.com/in", "secret": "s" * 16}])


async def guest_upload(client: Any, csrf: str, slug: str, *files: tuple[str, bytes], name: str = "Aunt Mary") -> Any:
    body, headers = multipart(list(files), fields=[("csrf_token", csrf), ("guest_name", name)])
    response = await client.post(f"/api/g/{slug}/upload", data=body, headers=headers)
    assert response.status_code == 202, await response.get_data(as_text=True)
    return await response.get_json()


async def moderated(admin: AuthActions, **fields: Any) -> dict[str, Any]:
    return await published(admin, name="Party", allow_guest_uploads=True, allow_downloads=True,
                           guest_photos_need_approval=True, **fields)


async def events(services: Services) -> list[tuple[str, dict[str, Any]]]:
    found = await rows(services, "SELECT event_type, body FROM webhook_deliveries ORDER BY id")
    return [(r["event_type"], json.loads(r["body"])["data"]) for r in found]


async def review(admin: AuthActions, gallery_id: int, action: str, ids: list[int]) -> Any:
    return await admin.client.post(f"/api/admin/galleries/{gallery_id}/review", json={"action": action, "ids": ids},
                                   headers=admin.headers())


async def test_the_switch_is_a_gallery_field(admin: AuthActions) -> None:
    gallery = await moderated(admin)
    assert gallery["guest_photos_need_approval"] is True
    plain = await published(admin, name="Plain")
    assert plain["guest_photos_need_approval"] is False
    form = await admin.client.get(f"/admin/galleries/{gallery['id']}/edit")
    assert 'name="guest_photos_need_approval" checked' in await form.get_data(as_text=True)


async def test_guest_photos_wait_and_only_their_uploader_sees_them(admin: AuthActions, services: Services,
                                                                   guest: Any, app: Any) -> None:
    gallery = await moderated(admin)
    slug = gallery["slug"]
    uploader_csrf = await start_guest_session(services, guest)
    answer = await guest_upload(guest, uploader_csrf, slug, ("mine.jpg", jpeg(11)))
    [photo_id] = answer["photo_ids"]
    # The admin's own photo in the same gallery never waits.
    body, headers = multipart([("admin.jpg", jpeg(12))])
    assert (await admin.client.post(f"/api/admin/galleries/{gallery['id']}/upload", data=body,
                                    headers={**headers, **admin.headers()})).status_code == 202
    await run_pool_until_idle(services)
    marks = await rows(services, "SELECT display_name, uploaded_by, awaiting_approval FROM photos ORDER BY id")
    assert [(r["display_name"], r["awaiting_approval"]) for r in marks] == [("mine.jpg", 1), ("admin.jpg", 0)]

    other = app.test_client()
    other_csrf = await start_guest_session(services, other)
    for client in (guest, other):
        listing = await (await client.get(f"/api/g/{slug}/photos")).get_json()
        assert [p["id"] for p in listing["photos"]] != [] and photo_id not in [p["id"] for p in listing["photos"]]
        # Not favourited, not downloaded, not in the zip.
        heart = await client.put(f"/api/g/{slug}/favourites/{photo_id}",
                                 headers={"X-CSRF-Token": uploader_csrf if client is guest else other_csrf})
        assert heart.status_code == 404
        assert (await client.get(f"/g/{slug}/photos/{photo_id}/download")).status_code == 404
    assert (await other.get(f"/g/{slug}/photos/{photo_id}/grid")).status_code == 404
    # Its uploader sees its images, and the status route says it is waiting.
    assert (await guest.get(f"/g/{slug}/photos/{photo_id}/grid")).status_code == 200
    status = await (await guest.get(f"/api/g/{slug}/uploads/{answer['upload_id']}")).get_json()
    assert status["photos"][0]["awaiting_approval"] is True
    # On the gallery page too, for the uploader alone.
    own_page = await (await guest.get(f"/g/{slug}")).get_data(as_text=True)
    assert "Your photos, waiting for approval" in own_page and f"/g/{slug}/photos/{photo_id}/grid" in own_page
    other_page = await (await other.get(f"/g/{slug}")).get_data(as_text=True)
    assert "waiting for approval" not in other_page and f"/photos/{photo_id}/" not in other_page

    # The admin sees it in the queue, on the page and as JSON.
    queue = await (await admin.client.get(f"/api/admin/galleries/{gallery['id']}/review")).get_json()
    assert [(p["id"], p["guest_name"]) for p in queue["photos"]] == [(photo_id, "Aunt Mary")]
    page = await (await admin.client.get(f"/admin/galleries/{gallery['id']}")).get_data(as_text=True)
    assert 'id="review"' in page and f'data-id="{photo_id}"' in page

    approved = await review(admin, gallery["id"], "approve", [photo_id])
    assert (await approved.get_json())["ids"] == [photo_id]
    assert (await other.get(f"/g/{slug}/photos/{photo_id}/grid")).status_code == 200
    listing = await (await other.get(f"/api/g/{slug}/photos")).get_json()
    assert photo_id in [p["id"] for p in listing["photos"]]
    # Approving twice does nothing (and announces nothing) the second time.
    assert (await (await review(admin, gallery["id"], "approve", [photo_id])).get_json())["ids"] == []
    announced = [(kind, data["photo_id"]) for kind, data in await events(services) if kind.startswith("photo.a")]
    assert announced == [("photo.approved", photo_id)]
    # photo.uploaded said the photo was processed but not yet shown; photo.approved says it is.
    flags = [(kind, data["photo_id"], data["awaiting_approval"]) for kind, data in await events(services)
             if kind in ("photo.uploaded", "photo.approved")]
    [admins] = await rows(services, "SELECT id FROM photos WHERE uploaded_by = 'admin'")
    assert sorted(flags) == sorted([("photo.uploaded", photo_id, True), ("photo.uploaded", admins["id"], False),
                                    ("photo.approved", photo_id, False)])


async def test_hide_and_delete_are_rejections(admin: AuthActions, services: Services, guest: Any) -> None:
    gallery = await moderated(admin)
    csrf = await start_guest_session(services, guest)
    answer = await guest_upload(guest, csrf, gallery["slug"], ("a.jpg", jpeg(21)), ("b.jpg", jpeg(22)))
    hide_id, delete_id = answer["photo_ids"]
    await run_pool_until_idle(services)
    assert (await (await review(admin, gallery["id"], "hide", [hide_id])).get_json())["ids"] == [hide_id]
    assert (await (await review(admin, gallery["id"], "delete", [delete_id])).get_json())["ids"] == [delete_id]
    [hidden] = await rows(services, "SELECT id, hidden, awaiting_approval FROM photos")
    assert hidden == {"id": hide_id, "hidden": 1, "awaiting_approval": 0}
    sent = [(kind, data["photo_id"], data.get("action")) for kind, data in await events(services)
            if kind in ("photo.rejected", "photo.deleted")]
    assert sent == [("photo.rejected", hide_id, "hidden"), ("photo.deleted", delete_id, None),
                    ("photo.rejected", delete_id, "deleted")]
    [kept] = await rows(services, "SELECT storage_key FROM photos WHERE id = ?", hide_id)
    assert services.storage.original_path(kept["storage_key"]).exists()  # a hidden photo keeps its file
    # A hidden photo can still be shown through the grid, as any hidden photo.
    await admin.client.post(f"/api/admin/galleries/{gallery['id']}/photos/bulk", json={"action": "show",
                            "ids": [hide_id]}, headers=admin.headers())
    assert (await guest.get(f"/g/{gallery['slug']}/photos/{hide_id}/grid")).status_code == 200


async def test_review_refuses_bad_input_with_a_sentence(admin: AuthActions) -> None:
    gallery = await moderated(admin)
    for body, needle in (({"action": "burn", "ids": [1]}, "Choose one of"), ({"action": "approve", "ids": []},
                         "Select at least one"), ({"action": "approve", "ids": ["x"]}, "list of photo ids")):
        answer = await admin.client.post(f"/api/admin/galleries/{gallery['id']}/review", json=body,
                                         headers=admin.headers())
        assert answer.status_code == 400 and needle in (await answer.get_json())["error"]
    missing = await review(admin, 999_999, "approve", [1])
    assert missing.status_code == 404


async def test_the_no_script_form_reviews_one_photo(admin: AuthActions, services: Services, guest: Any) -> None:
    gallery = await moderated(admin)
    csrf = await start_guest_session(services, guest)
    [photo_id] = (await guest_upload(guest, csrf, gallery["slug"], ("a.jpg", jpeg(31))))["photo_ids"]
    answer = await admin.client.post(f"/admin/galleries/{gallery['id']}/review?only={photo_id}",
                                     form={"action": "approve", "csrf_token": admin.csrf or ""})
    assert answer.status_code == 302 and answer.headers["Location"].endswith("#review")
    assert (await rows(services, "SELECT awaiting_approval FROM photos"))[0]["awaiting_approval"] == 0



async def receive_json(ws: Any) -> dict[str, Any]:
    with trio.fail_after(60):
        return json.loads(await ws.receive())


async def test_feeds_guests_hear_of_a_photo_only_when_approved(live: Services, admin: AuthActions, guest: Any,
                                                               app: Any) -> None:
    gallery = await moderated(admin)
    csrf = await start_guest_session(live, guest)
    watcher = app.test_client()
    await start_guest_session(live, watcher)
    async with watcher.websocket(f"/ws/g/{gallery['slug']}") as guest_ws, \
            admin.client.websocket(f"/ws/admin/galleries/{gallery['id']}") as admin_ws:
        assert (await receive_json(guest_ws))["type"] == "snapshot"
        assert (await receive_json(admin_ws))["type"] == "snapshot"
        [photo_id] = (await guest_upload(guest, csrf, gallery["slug"], ("a.jpg", jpeg(41))))["photo_ids"]
        await run_pool_until_idle(live)
        while (message := await receive_json(admin_ws)).get("status") != "complete":
            pass
        assert message["awaiting_approval"] is True and message["id"] == photo_id
        await review(admin, gallery["id"], "approve", [photo_id])
        approved = await receive_json(admin_ws)
        assert (approved["status"], approved["awaiting_approval"]) == ("complete", False)
        # The guest's first word of this photo is the approval: nothing while it waited.
        seen = await receive_json(guest_ws)
        assert (seen["id"], seen["status"], seen["filename"]) == (photo_id, "complete", None)
