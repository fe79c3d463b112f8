"""The guest gallery page and its JSON listing: what is listed, in which order, page by page."""

from __future__ import annotations

import base64
import re
import secrets
import time
from typing import Any

import httpx
import pytest
import trio

from picpeak_lite import server
from picpeak_lite.ops import bootstrap
from picpeak_lite.services import Services
from picpeak_lite.store import db
from picpeak_lite.store.queries import listing
from picpeak_lite.web.app import create_app
from picpeak_lite.web.views.common import fallback_url, host_trusted

from .conftest import AuthActions, make_settings, own_services
from .factories import add_photo, jpeg, published
from .factories import expired as expired_gallery

CSRF_META = re.compile(r'<meta name="csrf-token" content="([^"]+)"')
CSRF_INPUT = re.compile(r'name="csrf_token" value="([^"]+)"')
TILE_ID = re.compile(r'<li class="tile[^"]*" data-id="([1-9]\d*)"')


async def enter_password(guest: Any, slug: str, password: str) -> None:
    html = await (await guest.get(f"/g/{slug}")).get_data(as_text=True)
    csrf = CSRF_INPUT.search(html).group(1)
    response = await guest.post(f"/g/{slug}/password", form={"password": password, "csrf_token": csrf})
    assert response.status_code == 302


async def guest_csrf(guest: Any, slug: str) -> str:
    html = await (await guest.get(f"/g/{slug}")).get_data(as_text=True)
    return CSRF_META.search(html).group(1)


async def all_pages(guest: Any, slug: str, **params: Any) -> list[list[int]]:
    pages, after = [], None
    while True:
        query = {**params, **({"after": after} if after else {})}
        response = await guest.get(f"/api/g/{slug}/photos", query_string=query)
        assert response.status_code == 200, await response.get_data(as_text=True)
        body = await response.get_json()
        pages.append([p["id"] for p in body["photos"]])
        after = body["next"]
        if after is None:
            return pages


async def test_page_lists_only_complete_visible_photos(guest: Any, admin: AuthActions, services: Services) -> None:
    gallery = await published(admin, name="Party", welcome_message="Hello all")
    shown = add_photo(services, gallery["id"], taken_at="2024-06-20T14:03:00")
    hidden = add_photo(services, gallery["id"], hidden=1)
    pending = add_photo(services, gallery["id"], status="pending")
    processing = add_photo(services, gallery["id"], status="processing")
    failed = add_photo(services, gallery["id"], status="failed")
    other = await published(admin, name="Other")
    elsewhere = add_photo(services, other["id"])

    response = await guest.get(f"/g/{gallery['slug']}")
    assert response.status_code == 200
    html = await response.get_data(as_text=True)
    assert [int(i) for i in TILE_ID.findall(html)] == [shown]
    assert "Hello all" in html and "All photos (1)" in html
    # The tile: both derivatives with their real widths (a 64 px photo is never enlarged), the browser picks by
    # the tile's width ("auto") at the screen's pixel ratio; ratio attributes, lazy, alt text.
    base = f'/g/{gallery["slug"]}/photos/{shown}'
    assert f'srcset="{base}/grid 64w, {base}/view 64w"' in html and 'sizes="auto, ' in html
    assert 'width="64" height="48"' in html and 'loading="lazy"' in html
    assert 'alt="Photo taken 20 June 2024, 14:03"' in html
    assert "style=" not in html and "<script>" not in html

    body = await (await guest.get(f"/api/g/{gallery['slug']}/photos")).get_json()
    assert [p["id"] for p in body["photos"]] == [shown] and body["next"] is None
    assert body["photos"][0]["camera"] == "Canon EOS R5"
    for photo_id in (hidden, pending, processing, failed, elsewhere):
        for kind in ("grid", "view", "download"):
            r = await guest.get(f"/g/{gallery['slug']}/photos/{photo_id}/{kind}")
            assert r.status_code == 404, (photo_id, kind)


async def test_drafts_expired_and_password_galleries_list_nothing(guest: Any, admin: AuthActions,
                                                                   services: Services) -> None:
    draft = await admin.create_gallery(name="Draft")
    add_photo(services, draft["id"])
    assert (await guest.get(f"/api/g/{draft['slug']}/photos")).status_code == 404
    assert (await guest.get(f"/g/{draft['slug']}/download")).status_code == 404

    private = await published(admin, name="Private", password="letmein")
    add_photo(services, private["id"])
    assert (await guest.get(f"/api/g/{private['slug']}/photos")).status_code == 401
    assert (await guest.get(f"/g/{private['slug']}/download")).status_code == 401
    page = await guest.get(f"/g/{private['slug']}")
    html = await page.get_data(as_text=True)
    assert page.status_code == 401 and "<title>Protected gallery" in html
    assert "og:image" not in html and 'og:title" content="A protected photo gallery"' in html
    await enter_password(guest, private["slug"], "letmein")
    assert len((await (await guest.get(f"/api/g/{private['slug']}/photos")).get_json())["photos"]) == 1
    page = await guest.get(f"/g/{private['slug']}")
    assert "og:" not in await page.get_data(as_text=True)  # no preview of a protected gallery, even inside

    old = await expired_gallery(admin, services, name="Old")
    add_photo(services, old["id"])
    expired = await guest.get(f"/g/{old['slug']}")
    assert expired.status_code == 410
    html = await expired.get_data(as_text=True)
    assert "This gallery has expired" in html and "guest.css" in html
    api = await guest.get(f"/api/g/{old['slug']}/photos")
    assert api.status_code == 410 and "expired" in (await api.get_json())["error"]
    assert (await guest.get(f"/g/{old['slug']}/download")).status_code == 410


async def test_open_graph_for_an_open_gallery(guest: Any, admin: AuthActions, services: Services) -> None:
    gallery = await published(admin, name="Anna & Ben", welcome_message="Thank you for coming")
    first = add_photo(services, gallery["id"], taken_at="2024-01-01T10:00:00")
    html = await (await guest.get(f"/g/{gallery['slug']}")).get_data(as_text=True)
    assert '<meta property="og:title" content="Anna &amp; Ben">' in html
    assert 'og:description" content="Thank you for coming"' in html
    assert re.search(rf'og:image" content="http://[^"]+/g/{gallery["slug"]}/photos/{first}/view"', html)


@pytest.mark.parametrize("sort", ["taken", "uploaded"])
async def test_keyset_pages_have_no_duplicates_or_gaps(guest: Any, admin: AuthActions, services: Services,
                                                       sort: str) -> None:
    gallery = await published(admin, name="Big")
    ids = []
    for i in range(25):
        # Capture times out of upload order, some equal (ties broken by id), some missing (upload time used).
        taken = None if i % 7 == 0 else f"2024-06-20T1{(i * 3) % 10}:00:00"
        ids.append(add_photo(services, gallery["id"], taken_at=taken, data=jpeg(i), created_at=1.7e9 + i))
    pages = await all_pages(guest, gallery["slug"], sort=sort, limit=4)
    flat = [i for page in pages for i in page]
    assert len(pages) == 7 and all(len(p) == 4 for p in pages[:-1])
    assert sorted(flat) == sorted(ids) and len(set(flat)) == len(flat)
    if sort == "uploaded":
        assert flat == sorted(ids, reverse=True)  # newest upload first

    def expected(conn: Any) -> list[int]:
        return [r["id"] for r in conn.execute(
            f"SELECT id FROM photos WHERE gallery_id = ? ORDER BY {listing.TAKEN_KEY}, id", (gallery["id"],))]

    if sort == "taken":
        assert flat == await services.db.read(expected)


async def test_pages_stay_stable_while_photos_come_and_go(guest: Any, admin: AuthActions,
                                                          services: Services) -> None:
    gallery = await published(admin, name="Live")
    ids = [add_photo(services, gallery["id"], data=jpeg(i)) for i in range(7)]
    newest_first = ids[::-1]
    first = await (await guest.get(f"/api/g/{gallery['slug']}/photos",
                                   query_string={"sort": "uploaded", "limit": 3})).get_json()
    assert [p["id"] for p in first["photos"]] == newest_first[:3]
    # A photo before the cursor disappears and a new one arrives (at the top, before the cursor too): the next
    # page neither repeats nor skips.
    await services.db.write(lambda conn: conn.execute("UPDATE photos SET hidden = 1 WHERE id = ?", (ids[-1],)))
    new = add_photo(services, gallery["id"], data=jpeg(99))
    second = await (await guest.get(f"/api/g/{gallery['slug']}/photos", query_string={
        "sort": "uploaded", "limit": 3, "after": first["next"]})).get_json()
    assert [p["id"] for p in second["photos"]] == newest_first[3:6]
    third = await (await guest.get(f"/api/g/{gallery['slug']}/photos", query_string={
        "sort": "uploaded", "limit": 3, "after": second["next"]})).get_json()
    assert [p["id"] for p in third["photos"]] == newest_first[6:] and third["next"] is None
    # A fresh first page shows the new photo at the top.
    fresh = await (await guest.get(f"/api/g/{gallery['slug']}/photos",
                                   query_string={"sort": "uploaded", "limit": 3})).get_json()
    assert [p["id"] for p in fresh["photos"]] == [new, *newest_first[1:3]]


async def test_bad_cursor_and_sort_are_400(guest: Any, admin: AuthActions) -> None:
    gallery = await published(admin, name="G")
    deep = base64.urlsafe_b64encode(b"[" * 5000).decode()  # nested deep enough to exhaust the JSON parser
    # A cursor whose id SQLite cannot hold (it used to reach the query: a 500), for either order.
    huge = [base64.urlsafe_b64encode(f'["2024-01-01T00:00:00",{n}]'.encode()).decode().rstrip("=")
            for n in (2**63, -(2**63) - 1)]
    for query in ({"after": "not-a-cursor"}, {"after": "WzEsMl0"}, {"sort": "name"}, {"limit": "x"},
                  {"after": deep}, {"after": deep[:150]}, {"after": huge[0]}, {"after": huge[1]},
                  {"after": huge[0], "sort": "uploaded"}, {"limit": "9" * 5000}):
        response = await guest.get(f"/api/g/{gallery['slug']}/photos", query_string=query)
        assert response.status_code == 400, query


@pytest.mark.sqlite
@pytest.mark.parametrize("sort", ["uploaded", "taken"])
async def test_a_later_page_seeks_the_index_instead_of_sorting_or_scanning(services: Services, sort: str) -> None:
    """The plan of the query list_photos really runs, for a page after a cursor, in both orders."""
    def plan(conn: Any) -> str:
        executed: list[tuple[str, Any]] = []

        def trace(cursor: Any, sql: str, bindings: Any) -> bool:
            executed.append((sql, bindings))
            return True

        conn.exec_trace = trace
        try:
            listing.list_photos(conn, 1, sort=sort, after=("2024-06-20T14:03:00", 5))
        finally:
            conn.exec_trace = None
        sql, bindings = next((q, b) for q, b in executed if "FROM photos" in q)
        return " ".join(r["detail"] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, bindings).fetchall())

    detail = await services.db.read(plan)
    assert "TEMP B-TREE" not in detail, detail
    expected = "photos_by_gallery (gallery_id=? AND status=? AND id<?)" if sort == "uploaded" else (
        "photos_guest_taken (gallery_id=? AND <expr>>?)")
    assert expected in detail, detail


async def test_upload_page_only_when_guest_uploads_are_on(guest: Any, admin: AuthActions) -> None:
    closed = await published(admin, name="Closed")
    assert (await guest.get(f"/g/{closed['slug']}/upload")).status_code == 403
    opened = await published(admin, name="Open", allow_guest_uploads=True)
    response = await guest.get(f"/g/{opened['slug']}/upload")
    html = await response.get_data(as_text=True)
    assert response.status_code == 200
    assert 'type="file"' in html and "multiple" in html and CSRF_META.search(html)
    assert "/static/live.js" in html and "/static/guest-upload.js" in html
    gallery_html = await (await guest.get(f"/g/{opened['slug']}")).get_data(as_text=True)
    assert f"/g/{opened['slug']}/upload" in gallery_html


# --- links from a trusted origin only (issue 11) -----------------------------------------------------------

OG_URL = re.compile(r'og:url" content="([^"]+)"')
OG_IMAGE = re.compile(r'og:image" content="([^"]+)"')


def open_gallery_row(svc: Services) -> tuple[str, int]:
    """A published gallery without a password and with one complete photo, straight into the database."""
    slug = f"links-{secrets.token_hex(4)}"
    conn = db.connect(svc.settings.database)
    try:
        with db.transaction(conn):
            gallery_id = conn.execute(
                "INSERT INTO galleries (slug, share_token, name, is_draft, created_at, updated_at) "
                "VALUES (?, ?, 'Links', 0, 0, 0) RETURNING id", (slug, secrets.token_hex(16))).fetchall()[0]["id"]
    finally:
        conn.close()
    return slug, add_photo(svc, gallery_id)


@pytest.fixture
async def running(tmp_path: Any) -> Any:
    """A real server on 127.0.0.1 and a free port: its Host handling and its bind address are the real ones."""
    settings = make_settings(tmp_path, shutdown_grace_seconds=1, processing_enabled=False)
    bootstrap.prepare(settings)
    async with trio.open_nursery() as nursery:
        started = await nursery.start(server.run, settings)
        yield started
        started.stop()


async def test_a_forged_host_never_reaches_a_link_or_tag(running: Any) -> None:
    slug, photo_id = open_gallery_row(running.services)
    port = int(running.url.rsplit(":", 1)[1])
    async with httpx.AsyncClient(base_url=running.url, timeout=120) as http:
        async def tags(host: str) -> tuple[str, str]:
            html = (await http.get(f"/g/{slug}", headers={"Host": host})).text
            return OG_URL.search(html).group(1), OG_IMAGE.search(html).group(1)

        for forged in ("evil.example", f"evil.example:{port}", "localhost:1", f"127.0.0.1:{port + 1}",
                       f"evil.example@127.0.0.1:{port}", f"127.0.0.1:{port}/x", "[::1", "a b"):
            og_url, og_image = await tags(forged)
            assert og_url == f"{running.url}/g/{slug}", forged
            assert og_image == f"{running.url}/g/{slug}/photos/{photo_id}/view", forged
        # The bind address and its localhost forms are the server's own names: kept as the client used them.
        for own in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}"):
            assert (await tags(own))[0] == f"http://{own.lower()}/g/{slug}", own


async def test_allowed_hosts_and_public_url_decide_the_origin(tmp_path: Any) -> None:
    with own_services(tmp_path / "a", port=8080, allowed_hosts=("photos.lan", "192.168.1.10:8080")) as svc:
        slug, _ = open_gallery_row(svc)
        guest = create_app(svc).test_client()
        for host, origin in (("photos.lan", "http://photos.lan"), ("photos.lan:9000", "http://photos.lan:9000"),
                             ("PHOTOS.LAN.", "http://photos.lan."), ("192.168.1.10:8080", "http://192.168.1.10:8080"),
                             ("192.168.1.10:8081", "http://127.0.0.1:8080"), ("evil.example", "http://127.0.0.1:8080"),
                             ("sub.photos.lan", "http://127.0.0.1:8080")):
            html = await (await guest.get(f"/g/{slug}", headers={"Host": host})).get_data(as_text=True)
            assert OG_URL.search(html).group(1).lower() == f"{origin}/g/{slug}".lower(), host
        # The admin's share links follow the same rule (an API token: no cookie bound to the test client's host).
        conn = db.connect(svc.settings.database)
        with db.transaction(conn):
            token = bootstrap.create_api_token(conn, "links", time.time())
        conn.close()
        answer = await guest.get("/api/admin/galleries", headers={"Host": "evil.example",
                                                                  "Authorization": f"Bearer {token}"})
        assert [g["share_url"] for g in (await answer.get_json())["galleries"]] == [f"http://127.0.0.1:8080/g/{slug}"]
    with own_services(tmp_path / "b", public_url="https://photos.example.com/") as svc:
        slug, _ = open_gallery_row(svc)
        html = await (await create_app(svc).test_client().get(f"/g/{slug}", headers={"Host": "evil.example"})
                      ).get_data(as_text=True)
        assert OG_URL.search(html).group(1) == f"https://photos.example.com/g/{slug}"


def test_which_hosts_name_the_server() -> None:
    bind = "http://127.0.0.1:8080"
    assert host_trusted("127.0.0.1:8080", "http", (), bind, None)
    assert host_trusted("[::1]:8080", "http", (), bind, None)
    assert not host_trusted("127.0.0.1", "http", (), bind, None)  # port 80, not 8080
    assert host_trusted("localhost", "http", (), "http://127.0.0.1:80", None)
    assert host_trusted("localhost", "https", (), "http://127.0.0.1:443", None)
    assert not host_trusted("localhost:8080", "http", (), "http://192.168.1.10:8080", None)  # not listening there
    assert host_trusted("192.168.1.10:8080", "http", (), "http://192.168.1.10:8080", None)
    # A wildcard bind: the address the connection arrived on, and loopback, are the server's.
    assert host_trusted("192.168.1.10:8080", "http", (), "http://0.0.0.0:8080", ("192.168.1.10", 8080))
    assert host_trusted("localhost:8080", "http", (), "http://0.0.0.0:8080", ("192.168.1.10", 8080))
    assert not host_trusted("192.168.1.11:8080", "http", (), "http://0.0.0.0:8080", ("192.168.1.10", 8080))
    assert fallback_url("http://0.0.0.0:8080", ("192.168.1.10", 8080)) == "http://192.168.1.10:8080"
    assert fallback_url("http://[::]:8080", ("fe80::1", 8080)) == "http://[fe80::1]:8080"
    assert fallback_url("http://127.0.0.1:8080/", ("127.0.0.1", 8080)) == "http://127.0.0.1:8080"
    for bad in ("", " ", "evil.example@127.0.0.1:8080", "127.0.0.1:8080/x", "127.0.0.1:0", "127.0.0.1:99999",
                "127.0.0.1:８０８０", "http://127.0.0.1:8080", "[::1", "[nope]:8080", "a\r\nb"):
        assert not host_trusted(bad, "http", ("127.0.0.1",), bind, ("127.0.0.1", 8080)), repr(bad)


async def test_the_admin_previews_drafts_and_password_galleries_as_a_guest(app: Any, services: Services,
                                                                          admin: AuthActions) -> None:
    """Issue 12, point 11: "Open" on a password gallery, or a draft, shows the photographer the guest's page
    (with a note that guests do not see it this way), without the client's password; guests still cannot."""
    locked = await published(admin, name="Locked", password="client-pass")
    draft = await admin.create_gallery(name="Not yet")
    for gallery, words in ((locked, "Guests need the gallery's password."),
                           (draft, "Guests cannot open this draft yet.")):
        page = await admin.client.get(f"/g/{gallery['slug']}")
        html = await page.get_data(as_text=True)
        assert page.status_code == 200, html
        assert words in html and 'name="password"' not in html
        assert 'data-ws-path=""' in html  # the preview opens no guest feed (which refuses the admin's cookie)
        stranger = await app.test_client().get(f"/g/{gallery['slug']}")
        assert stranger.status_code == (401 if gallery is locked else 404)
        assert "Preview:" not in await stranger.get_data(as_text=True)
    # A reading request only: the admin session does not favourite in a guest's name.
    heart = await admin.client.put(f"/api/g/{locked['slug']}/favourites/1", headers=admin.headers())
    assert heart.status_code == 401
    # An API token is not a browser preview, and a stray Authorization header on a guest page is not judged.
    conn = db.connect(services.settings.database)
    with db.transaction(conn):
        token = bootstrap.create_api_token(conn, "script", time.time())
    conn.close()
    for header in (f"Bearer {token}", "Bearer nonsense"):
        answer = await app.test_client().get(f"/g/{locked['slug']}", headers={"Authorization": header})
        assert answer.status_code == 401
    # The photographer's gallery page links the draft's preview.
    admin_page = await (await admin.client.get(f"/admin/galleries/{draft['id']}")).get_data(as_text=True)
    assert 'id="preview-link"' in admin_page


def test_every_aspect_class_the_grid_can_get_is_in_the_stylesheet() -> None:
    """Issue 12, point 18: the justified grid's tiles carry their ratio as a class (no style attributes under
    the CSP); each class the server can give must be declared in guest.css, or that tile would be square."""
    from pathlib import Path

    from picpeak_lite.web.views.guest import RATIO_MAX, RATIO_MIN, RATIO_STEPS, ratio_class

    css = (Path(__file__).resolve().parents[1] / "static" / "guest.css").read_text()
    for n in range(RATIO_MIN, RATIO_MAX + 1):
        assert f".r{n}{{--r:{n / RATIO_STEPS:g}}}" in css
    assert [ratio_class(*size) for size in ((600, 400), (400, 600), (1, 1), (None, None), (10_000, 10), (1, 900))] \
        == ["r30", "r13", "r20", "r20", "r80", "r5"]
