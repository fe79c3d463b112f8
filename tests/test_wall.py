"""The live wall (issue 16): who may open it (the admin, or a wall link's key, revocable), what it shows (what
guests see, preview images only, captions if chosen), and its feed."""

from __future__ import annotations

import json
import re
from typing import Any

import trio

from picpeak_lite.services import Services
from picpeak_lite.web import qr

from .conftest import AuthActions, websocket_status
from .factories import EXPIRED_AT, add_photo, published, run_pool_until_idle
from .factories import jpeg as small_jpeg
from .test_upload import multipart, rows, start_guest_session


async def make_link(admin: AuthActions, gallery_id: int) -> str:
    answer = await admin.client.post(f"/admin/galleries/{gallery_id}/wall-link", form={"csrf_token": admin.csrf})
    assert answer.status_code == 302 and answer.headers["Location"].endswith("#wall")
    page = await (await admin.client.get(f"/admin/galleries/{gallery_id}")).get_data(as_text=True)
    found = re.search(r'value="[^"]*/wall\?key=([A-Za-z0-9_-]+)" id="wall-link"', page)
    assert found, "the gallery page shows the wall link"
    return found.group(1)


async def test_who_may_open_the_wall(admin: AuthActions, services: Services, app: Any) -> None:
    gallery = await published(admin, name="Party", password="secret-pass", allow_guest_uploads=True)
    slug, gid = gallery["slug"], gallery["id"]
    stranger = app.test_client()
    assert (await admin.client.get(f"/g/{slug}/wall")).status_code == 200
    refused = await stranger.get(f"/g/{slug}/wall")
    assert refused.status_code == 403 and "not valid" in await refused.get_data(as_text=True)
    key = await make_link(admin, gid)
    assert len(key) >= 22
    # The link opens the wall without the gallery's password, and nothing else.
    page = await stranger.get(f"/g/{slug}/wall", query_string={"key": key})
    assert page.status_code == 200 and page.headers["Referrer-Policy"] == "no-referrer"
    assert (await stranger.get(f"/g/{slug}", query_string={"key": key})).status_code == 401
    assert (await stranger.get(f"/g/{slug}/wall", query_string={"key": key + "x"})).status_code == 403
    # A new link replaces it; removing it closes the wall to links.
    newer = await make_link(admin, gid)
    assert newer != key
    assert (await stranger.get(f"/g/{slug}/wall", query_string={"key": key})).status_code == 403
    assert (await stranger.get(f"/g/{slug}/wall", query_string={"key": newer})).status_code == 200
    await admin.client.post(f"/admin/galleries/{gid}/wall-link/remove", form={"csrf_token": admin.csrf})
    assert (await stranger.get(f"/g/{slug}/wall", query_string={"key": newer})).status_code == 403
    # A link opens it while guests could open the gallery; the admin always.
    key = await make_link(admin, gid)
    await services.db.write(lambda conn: conn.execute("UPDATE galleries SET expires_at = ? WHERE id = ?",
                                                      (EXPIRED_AT, gid)))
    assert (await stranger.get(f"/g/{slug}/wall", query_string={"key": key})).status_code == 410
    assert (await admin.client.get(f"/g/{slug}/wall")).status_code == 200
    await services.db.write(lambda conn: conn.execute("UPDATE galleries SET expires_at = NULL, is_draft = 1 "
                                                      "WHERE id = ?", (gid,)))
    assert (await stranger.get(f"/g/{slug}/wall", query_string={"key": key})).status_code == 404
    assert (await stranger.get("/g/no-such-gallery/wall", query_string={"key": key})).status_code == 404


async def test_the_wall_shows_what_guests_see_as_previews(admin: AuthActions, services: Services, app: Any,
                                                          guest: Any) -> None:
    gallery = await published(admin, name="Party", allow_guest_uploads=True, wall_captions=True)
    slug, gid = gallery["slug"], gallery["id"]
    visible = add_photo(services, gid, name="ok.jpg")
    hidden = add_photo(services, gid, name="hidden.jpg", hidden=1)
    failed = add_photo(services, gid, name="failed.jpg", status="failed")
    csrf = await start_guest_session(services, guest)
    body, headers = multipart([("mine.jpg", small_jpeg(91))], fields=[("csrf_token", csrf), ("guest_name", "Zoe")])
    assert (await guest.post(f"/api/g/{slug}/upload", data=body, headers=headers)).status_code == 202
    await run_pool_until_idle(services)
    [zoes] = await rows(services, "SELECT id, storage_key FROM photos WHERE guest_name = 'Zoe'")
    key = await make_link(admin, gid)
    wall = app.test_client()
    listing = await (await wall.get(f"/api/g/{slug}/wall/photos", query_string={"key": key})).get_json()
    assert [p["id"] for p in listing["photos"]] == [zoes["id"], visible]
    assert listing["photos"][0]["caption"] == "Zoe" and listing["photos"][1]["caption"] is None
    assert listing["photos"][0]["view_url"] == f"/g/{slug}/wall/photos/{zoes['id']}.jpg?key={key}"
    served = await wall.get(listing["photos"][0]["view_url"])
    assert served.status_code == 200 and served.content_type == "image/jpeg"
    assert await served.get_data() == services.storage.derived_path(zoes["storage_key"], "view").read_bytes()
    for other in (hidden, failed):
        assert (await wall.get(f"/g/{slug}/wall/photos/{other}.jpg", query_string={"key": key})).status_code == 404
    # The QR code in the corner is the guest upload page's.
    svg = await (await wall.get(f"/g/{slug}/wall/qr.svg", query_string={"key": key})).get_data(as_text=True)
    assert svg.startswith("<svg") and f"/g/{slug}/upload</title>" in svg
    assert qr.matrix(f"http://localhost/g/{slug}/upload")  # the same payload segno encodes
    page = await (await wall.get(f"/g/{slug}/wall", query_string={"key": key})).get_data(as_text=True)
    for needle in ("wall.js", "live.js", "wall.css", f'data-ws-path="/ws/g/{slug}/wall?key={key}"', "Add your photos"):
        assert needle in page
    # Without captions, no names.
    await admin.client.patch(f"/api/admin/galleries/{gid}", json={"wall_captions": False}, headers=admin.headers())
    listing = await (await wall.get(f"/api/g/{slug}/wall/photos", query_string={"key": key})).get_json()
    assert {p["caption"] for p in listing["photos"]} == {None}



async def test_the_wall_feed(live: Services, admin: AuthActions, app: Any, guest: Any) -> None:
    gallery = await published(admin, name="Party", allow_guest_uploads=True, wall_captions=True)
    slug, gid = gallery["slug"], gallery["id"]
    key = await make_link(admin, gid)
    wall = app.test_client()
    assert await websocket_status(wall, f"/ws/g/{slug}/wall") == 403
    assert await websocket_status(wall, f"/ws/g/{slug}/wall?key=nope") == 403
    assert await websocket_status(admin.client, f"/ws/g/{slug}/wall") == 101
    csrf = await start_guest_session(live, guest)
    async with wall.websocket(f"/ws/g/{slug}/wall?key={key}") as ws:
        with trio.fail_after(60):
            assert json.loads(await ws.receive())["type"] == "snapshot"
        body, headers = multipart([("a.jpg", small_jpeg(92))], fields=[("csrf_token", csrf), ("guest_name", "Ann")])
        assert (await guest.post(f"/api/g/{slug}/upload", data=body, headers=headers)).status_code == 202
        await run_pool_until_idle(live)
        with trio.fail_after(60):
            message = json.loads(await ws.receive())
    assert (message["status"], message["caption"], message["filename"]) == ("complete", "Ann", None)
    assert message["view_url"] == f"/g/{slug}/wall/photos/{message['id']}.jpg?key={key}"
    assert message["thumb_url"] == message["view_url"]  # previews only, never originals
