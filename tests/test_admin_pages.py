"""The photographer's pages and grid actions through the real routes: dashboard, gallery page with its photo
grid, bulk actions, retry, cover, QR codes; with bad input and without the CSRF token."""

from __future__ import annotations

import io
import re
import time
from typing import Any

import pytest
from PIL import Image

from picpeak_lite.store import db
from picpeak_lite.store.queries import webhooks as webhook_q
from picpeak_lite.web import qr

from .conftest import AuthActions, sql
from .factories import jpeg, run_pool_until_idle, stage_photo

SIZE = (320, 240)  # the admin pages' photos: big enough for a real thumb


@pytest.fixture
async def filled(admin: AuthActions, services: Any) -> dict[str, Any]:
    """A published gallery with two complete photos, one failed, one waiting, one guest upload with a
    favourite, and a second gallery that bulk actions must never touch."""
    gallery = await admin.create_gallery(name="Anna & Ben", allow_guest_uploads=True)
    gid = gallery["id"]
    await admin.client.post(f"/api/admin/galleries/{gid}/publish", headers=admin.headers())
    good1, upload = stage_photo(services, gid, jpeg(1, SIZE), name="first.jpg")
    good2, _ = stage_photo(services, gid, jpeg(2, SIZE), name="second.jpg", upload_id=upload)
    broken, _ = stage_photo(services, gid, jpeg(3, SIZE)[:2000], name="broken.jpg", upload_id=upload)
    guest_photo, _ = stage_photo(services, gid, jpeg(4, SIZE), name="guest.jpg")
    other = await admin.create_gallery(name="Other")
    foreign, _ = stage_photo(services, other["id"], jpeg(5, SIZE), name="foreign.jpg")
    await run_pool_until_idle(services)
    waiting, _ = stage_photo(services, gid, jpeg(6, SIZE), name="waiting.jpg")
    now = time.time()
    sql(services, "UPDATE photos SET uploaded_by = 'guest', guest_name = 'Carla' WHERE id = ?", guest_photo)
    sql(services, "INSERT INTO guest_sessions (token_hash, csrf_token, guest_name, created_at, last_seen_at) "
                  "VALUES ('h1', 'c1', 'Dora', ?, ?)", now, now)
    sql(services, "INSERT INTO favourites (guest_session_id, photo_id, created_at) "
                  "VALUES ((SELECT id FROM guest_sessions WHERE token_hash = 'h1'), ?, ?)", good2, now)
    return {"id": gid, "slug": gallery["slug"], "good": [good1, good2], "broken": broken, "guest": guest_photo,
            "waiting": waiting, "foreign": foreign, "other": other["id"]}


def multi(form: dict[str, Any]) -> Any:
    """A form with repeated fields (``ids``), as a browser sends checkboxes (pairs: the test client urlencodes
    them; a dict or MultiDict would lose all but the first value)."""
    return [(k, x) for k, v in form.items() for x in (v if isinstance(v, list) else [v])]


async def page(admin: AuthActions, url: str, status: int = 200) -> str:
    response = await admin.client.get(url)
    text = await response.get_data(as_text=True)
    assert response.status_code == status, text[:500]
    return text


async def test_dashboard_shows_counts_cover_expiry_and_disk(admin: AuthActions, services: Any,
                                                            filled: dict[str, Any]) -> None:
    sql(services, "UPDATE galleries SET expires_at = ? WHERE id = ?", time.time() + 3 * 86400 - 60, filled["id"])
    html = await page(admin, "/admin/")
    card = html[html.index(f'data-gallery-id="{filled["id"]}"'):]
    card = card[: card.index("</li>")]
    assert re.search(r'class="count-complete">3<', card)  # two photos and the guest's
    assert re.search(r'class="count-waiting">1<', card)
    assert re.search(r'class="count-failed error">1<', card)
    assert re.search(r'class="count-guest">1<', card)
    assert re.search(r'class="count-favourites">1<', card)
    assert "Expires in 3 days" in card
    assert f'src="/api/admin/photos/{filled["good"][0]}/grid"' in card  # the first complete photo by default
    assert "Published" in card
    assert "used by photos" in html and "free of" in html
    assert 'id="low-disk"' not in html


async def test_low_disk_warning_follows_the_threshold_setting(admin: AuthActions, services: Any) -> None:
    form = {"csrf_token": admin.csrf, "default_expiry_days": "30", "default_allow_downloads": "on",
            "low_disk_mb": str(10_000_000)}
    response = await admin.client.post("/admin/settings/defaults", form=form)
    assert response.status_code == 302
    html = await page(admin, "/admin/")
    assert 'id="low-disk"' in html and "less than 10000000 MB free" in html


async def test_gallery_page_tiles_never_broken(admin: AuthActions, filled: dict[str, Any]) -> None:
    html = await page(admin, f"/admin/galleries/{filled['id']}")
    for good in filled["good"]:
        assert f'src="/api/admin/photos/{good}/grid"' in html
    # The failed photo: a card with its reason and a Retry button, never an <img>.
    assert f'src="/api/admin/photos/{filled["broken"]}/grid"' not in html
    tile = html[html.index(f'data-id="{filled["broken"]}"'):]
    tile = tile[: tile.index("</li>")]
    assert "Failed" in tile and "truncated" in tile.lower() and "Retry" in tile
    waiting = html[html.index(f'data-id="{filled["waiting"]}"'):]
    assert "Waiting…" in waiting[: waiting.index("</li>")]
    assert f'data-id="{filled["foreign"]}"' not in html
    assert "♥ Dora" in html  # who favourited what
    assert "Guest: Carla" in html
    assert '<meta name="csrf-token"' in html
    assert 'src="/static/live.js"' in html and 'src="/static/admin-upload.js"' in html
    assert "<script>" not in html and " style=" not in html and " onclick=" not in html


@pytest.mark.parametrize(("query", "expected"), [
    ("status=failed", ["broken"]),
    ("status=waiting", ["waiting"]),
    ("source=guest", ["guest"]),
    ("favourites=1", ["good2"]),
])
async def test_filters(admin: AuthActions, filled: dict[str, Any], query: str, expected: list[str]) -> None:
    ids = {"broken": filled["broken"], "waiting": filled["waiting"], "guest": filled["guest"],
           "good2": filled["good"][1]}
    data = await (await admin.client.get(f"/api/admin/galleries/{filled['id']}/photos?{query}")).get_json()
    assert [p["id"] for p in data["photos"]] == [ids[e] for e in expected]
    html = await page(admin, f"/admin/galleries/{filled['id']}?{query}")
    assert set(map(int, re.findall(r'data-id="(\d+)"', html))) == {ids[e] for e in expected}


async def test_photo_list_json_shape(admin: AuthActions, filled: dict[str, Any]) -> None:
    data = await (await admin.client.get(f"/api/admin/galleries/{filled['id']}/photos")).get_json()
    by_id = {p["id"]: p for p in data["photos"]}
    fav = by_id[filled["good"][1]]
    assert fav["favourited_by"] == ["Dora"] and fav["favourite_count"] == 1
    assert fav["thumb_url"] == f"/api/admin/photos/{fav['id']}/grid"
    assert by_id[filled["broken"]]["thumb_url"] is None and by_id[filled["broken"]]["error"]
    assert (await admin.client.get("/api/admin/galleries/999/photos")).status_code == 404


async def test_hide_and_show_by_form(admin: AuthActions, services: Any, filled: dict[str, Any]) -> None:
    ids = [filled["good"][0], filled["foreign"]]  # the foreign one must be ignored
    form = {"csrf_token": admin.csrf, "action": "hide", "ids": [str(i) for i in ids]}
    response = await admin.client.post(f"/admin/galleries/{filled['id']}/photos", form=multi(form))
    assert response.status_code == 302
    hidden = {r["id"] for r in sql(services, "SELECT id FROM photos WHERE hidden = 1")}
    assert hidden == {filled["good"][0]}
    html = await page(admin, f"/admin/galleries/{filled['id']}?status=hidden")
    assert re.findall(r'data-id="(\d+)"', html) == [str(filled["good"][0])]
    form["action"] = "show"
    await admin.client.post(f"/admin/galleries/{filled['id']}/photos", form=multi(form))
    assert not sql(services, "SELECT id FROM photos WHERE hidden = 1")


async def test_delete_by_form_asks_first_then_deletes_rows_files_and_announces(
        admin: AuthActions, services: Any, filled: dict[str, Any]) -> None:
    sql(services, "INSERT INTO webhook_endpoints (url, secret, events, created_at) VALUES "
                  "('http://127.0.0.1:9/hook', 'secret-secret-secret', '[\"photo.deleted\"]', 0)")
    target = filled["good"][0]
    key = sql(services, "SELECT storage_key FROM photos WHERE id = ?", target)[0]["storage_key"]
    ids = [str(target), str(filled["foreign"])]
    form = {"csrf_token": admin.csrf, "action": "delete", "ids": ids}
    response = await admin.client.post(f"/admin/galleries/{filled['id']}/photos", form=multi(form))
    html = await response.get_data(as_text=True)
    assert response.status_code == 200 and "Delete 1 photo?" in html
    assert sql(services, "SELECT id FROM photos WHERE id = ?", target)
    url = f"/admin/galleries/{filled['id']}/photos"
    response = await admin.client.post(url, form=multi({**form, "confirm": "yes"}))
    assert response.status_code == 302
    assert not sql(services, "SELECT id FROM photos WHERE id = ?", target)
    assert sql(services, "SELECT id FROM photos WHERE id = ?", filled["foreign"])
    assert not services.storage.original_path(key).exists()
    assert not services.storage.derived_path(key, "grid").exists()
    conn = db.connect(services.settings.database)
    try:
        rows = webhook_q.list_deliveries(conn)
    finally:
        conn.close()
    assert [r["event_type"] for r in rows] == ["photo.deleted"]


async def test_bulk_api_and_its_bad_inputs(admin: AuthActions, services: Any, filled: dict[str, Any]) -> None:
    url = f"/api/admin/galleries/{filled['id']}/photos/bulk"
    h = admin.headers()
    ok = await admin.client.post(url, json={"action": "hide", "ids": filled["good"]}, headers=h)
    assert ok.status_code == 200 and (await ok.get_json())["changed"] == 2
    for body in ({"action": "explode", "ids": [1]}, {"action": "hide", "ids": "1"}, {"action": "hide", "ids": []},
                 {"action": "hide", "ids": [True]}, {"action": "cover", "ids": filled["good"]}, [1, 2],
                 {"action": "hide", "ids": [2**63]}, {"action": "delete", "ids": [filled["good"][0], -(2**63) - 1]}):
        response = await admin.client.post(url, json=body, headers=h)
        assert response.status_code == 400, body
        assert "error" in await response.get_json()
    no_csrf = await admin.client.post(url, json={"action": "delete", "ids": filled["good"]})
    assert no_csrf.status_code == 403
    cross = await admin.client.post(url, json={"action": "delete", "ids": filled["good"]},
                                    headers={**h, "Origin": "https://evil.example"})
    assert cross.status_code == 403
    assert len(sql(services, "SELECT id FROM photos WHERE id IN (?, ?)", *filled["good"])) == 2
    missing = await admin.client.post("/api/admin/galleries/999/photos/bulk", json={"action": "hide", "ids": [1]},
                                      headers=h)
    assert missing.status_code == 404


async def test_set_cover(admin: AuthActions, services: Any, filled: dict[str, Any]) -> None:
    url = f"/api/admin/galleries/{filled['id']}/cover"
    h = admin.headers()
    assert (await admin.client.put(url, json={"photo_id": filled["good"][1]}, headers=h)).status_code == 200
    html = await page(admin, "/admin/")
    assert f'src="/api/admin/photos/{filled["good"][1]}/grid"' in html
    for bad in (filled["broken"], filled["waiting"], filled["foreign"]):
        assert (await admin.client.put(url, json={"photo_id": bad}, headers=h)).status_code == 409
    assert (await admin.client.put(url, json={"photo_id": "x"}, headers=h)).status_code == 400
    assert (await admin.client.put(url, json={"photo_id": 2**63}, headers=h)).status_code == 400
    big = {"csrf_token": admin.csrf, "action": "hide", "ids": [str(2**63)]}
    assert (await admin.client.post(f"/admin/galleries/{filled['id']}/photos", form=multi(big))).status_code == 400
    assert (await admin.client.put(url, json={"photo_id": 1})).status_code == 403
    form = {"csrf_token": admin.csrf, "action": "cover", "ids": [str(filled["good"][0])]}
    assert (await admin.client.post(f"/admin/galleries/{filled['id']}/photos", form=multi(form))).status_code == 302
    assert sql(services, "SELECT cover_photo_id FROM galleries WHERE id = ?",
               filled["id"])[0]["cover_photo_id"] == filled["good"][0]


async def test_retry_form(admin: AuthActions, services: Any, filled: dict[str, Any]) -> None:
    response = await admin.client.post(f"/admin/photos/{filled['broken']}/retry", form={"csrf_token": admin.csrf})
    assert response.status_code == 302
    assert sql(services, "SELECT status FROM photos WHERE id = ?", filled["broken"])[0]["status"] == "pending"
    again = await admin.client.post(f"/admin/photos/{filled['good'][0]}/retry", form={"csrf_token": admin.csrf})
    assert again.status_code == 409
    assert (await admin.client.post("/admin/photos/999/retry", form={"csrf_token": admin.csrf})).status_code == 404
    assert (await admin.client.post(f"/admin/photos/{filled['broken']}/retry")).status_code == 403


async def test_forms_need_the_csrf_token(admin: AuthActions, filled: dict[str, Any]) -> None:
    form = {"action": "hide", "ids": [str(filled["good"][0])]}
    assert (await admin.client.post(f"/admin/galleries/{filled['id']}/photos", form=multi(form))).status_code == 403
    form["csrf_token"] = "wrong"
    assert (await admin.client.post(f"/admin/galleries/{filled['id']}/photos", form=multi(form))).status_code == 403


async def test_pages_need_login(client: Any) -> None:
    for url in ("/admin/", "/admin/galleries/1", "/admin/galleries/1/qr", "/admin/galleries/1/qr/gallery.png",
                "/admin/settings/"):
        response = await client.get(url)
        assert response.status_code == 302 and "/admin/login" in response.headers["Location"], url
    assert (await client.get("/api/admin/galleries/1/photos")).status_code == 401


def decode_qr_png(data: bytes, scale: int) -> list[list[bool]]:
    """Read the modules back from the served PNG: one sample in the middle of each module, border skipped."""
    image = Image.open(io.BytesIO(data)).convert("L")
    modules = image.width // scale - 2 * qr.BORDER
    return [[image.getpixel(((qr.BORDER + x) * scale + scale // 2, (qr.BORDER + y) * scale + scale // 2)) < 128
             for x in range(modules)] for y in range(modules)]


async def test_qr_codes_carry_the_share_links(admin: AuthActions, filled: dict[str, Any]) -> None:
    base = f"/admin/galleries/{filled['id']}/qr"
    response = await admin.client.get(f"{base}/gallery.png?scale=6")
    assert response.status_code == 200 and response.content_type == "image/png"
    link = f"http://localhost/g/{filled['slug']}"
    assert decode_qr_png(await response.get_data(), 6) == qr.matrix(link)
    upload = await admin.client.get(f"{base}/upload.png?scale=5")
    assert decode_qr_png(await upload.get_data(), 5) == qr.matrix(link + "/upload")
    svg = await admin.client.get(f"{base}/upload.svg")
    assert svg.content_type == "image/svg+xml" and f"<title>{link}/upload</title>" in await svg.get_data(as_text=True)
    download = await admin.client.get(f"{base}/gallery.png?download=1")
    assert download.headers["Content-Disposition"].startswith("attachment;")
    sheet = await page(admin, base)
    assert link in sheet and f"{base}/upload.svg" in sheet
    assert (await admin.client.get(f"{base}/other.png")).status_code == 404
    assert (await admin.client.get(f"{base}/gallery.gif")).status_code == 404
    assert (await admin.client.get(f"{base}/gallery.png?scale=abc")).status_code == 200
    no_guests = await admin.client.get(f"/admin/galleries/{filled['other']}/qr/upload.png")
    assert no_guests.status_code == 404
    gallery_page = await page(admin, f"/admin/galleries/{filled['id']}")
    assert 'id="qr-gallery"' in gallery_page and 'id="qr-upload"' in gallery_page and link + "/upload" in gallery_page


async def test_new_gallery_form_uses_the_saved_defaults(admin: AuthActions) -> None:
    form = {"csrf_token": admin.csrf, "default_expiry_days": "10", "default_allow_guest_uploads": "on",
            "default_watermark": "on", "default_photo_cap": "250", "low_disk_mb": "100"}
    assert (await admin.client.post("/admin/settings/defaults", form=form)).status_code == 302
    html = await page(admin, "/admin/galleries/new")
    assert re.search(r'name="allow_guest_uploads" checked', html)
    assert re.search(r'name="watermark" checked', html)
    assert not re.search(r'name="allow_downloads" checked', html)
    assert 'name="photo_cap" value="250"' in html
    expected = time.strftime("%Y-%m-%d", time.gmtime(time.time() + 10 * 86400))
    assert f'name="expires_on" value="{expected}"' in html


async def test_gallery_delete_keeps_confirmation(admin: AuthActions, filled: dict[str, Any]) -> None:
    response = await admin.client.post(f"/admin/galleries/{filled['id']}/delete",
                                       form={"csrf_token": admin.csrf, "confirm_name": "nope"})
    assert response.status_code == 400
    assert "Type the gallery&#39;s name exactly" in await response.get_data(as_text=True)


async def test_unknown_query_keys_never_reach_url_for(admin: AuthActions, services: Any,
                                                      filled: dict[str, Any]) -> None:
    """``?gallery_id=`` (or any other key) once clashed with url_for's own arguments: a 500."""
    query = f"gallery_id={filled['other']}&status=hidden&favourites=1&_anchor=x&evil=1"
    html = await page(admin, f"/admin/galleries/{filled['id']}?{query}")
    action = re.search(r'id="photo-actions" class="photo-actions"\s+action="([^"]+)"', html).group(1)
    assert action == f"/admin/galleries/{filled['id']}/photos?status=hidden&amp;favourites=1"
    form = {"csrf_token": admin.csrf, "action": "hide", "ids": [str(filled["good"][0])]}
    response = await admin.client.post(f"/admin/galleries/{filled['id']}/photos?{query}", form=multi(form))
    assert response.status_code == 302
    assert response.headers["Location"] == f"/admin/galleries/{filled['id']}?status=hidden&favourites=1#photos"
    assert [r["id"] for r in sql(services, "SELECT id FROM photos WHERE hidden = 1")] == [filled["good"][0]]
