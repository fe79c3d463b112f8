"""Activity counters (issue 16): counted in memory, stored in batches (one transaction per interval, not a write
per request), stored once more when the server stops, and shown on the dashboard. Time runs on autojump_clock."""

from __future__ import annotations

import datetime as dt
from typing import Any

import httpx
import pytest
import trio

from picpeak_lite import server
from picpeak_lite.ops import bootstrap
from picpeak_lite.runtime import activity
from picpeak_lite.runtime.activity import Activity
from picpeak_lite.services import Services
from picpeak_lite.store import db

from .conftest import ADMIN_PASSWORD, AuthActions, make_settings
from .factories import add_photo, create_gallery, published
from .harness import figures
from .test_upload import start_guest_session

NOW = 1_780_000_000.0  # a fixed wall clock: 2026-05-28
TODAY = dt.datetime.fromtimestamp(NOW, dt.UTC).date().isoformat()


def stored(services: Services) -> dict[tuple[int, str, str], int]:
    """Read on a connection of its own, in this thread: with autojump_clock, time must not jump while it reads."""
    conn = db.connect(services.settings.database)
    try:
        found = conn.execute("SELECT gallery_id, day, kind, count FROM gallery_activity").fetchall()
    finally:
        conn.close()
    return {(r["gallery_id"], r["day"], r["kind"]): r["count"] for r in found}


async def next_flush(counter: Activity) -> float:
    """Wait for the counter's next transaction; returns when it came (trio time)."""
    await counter.flushed.listen().wait()
    return trio.current_time()


async def test_counts_are_stored_in_batches(services: Services, autojump_clock: Any,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    gid = await services.db.write(create_gallery)
    counter = Activity(services.db, lambda: NOW, flush_seconds=10.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(counter.run)
        started = trio.current_time()
        for i in range(1000):
            counter.count(gid, "views")
            if i % 100 == 0:
                counter.count(gid, "downloads_zip")
            await trio.sleep(0.005)  # a thousand requests over five seconds
        assert stored(services) == {} and counter.flushes == 0
        assert counter.pending() == {(gid, TODAY, "views"): 1000, (gid, TODAY, "downloads_zip"): 10}
        assert await next_flush(counter) - started >= 10.0
        assert counter.flushes == 1  # one transaction for all of them
        assert stored(services) == {(gid, TODAY, "views"): 1000, (gid, TODAY, "downloads_zip"): 10}
        counter.count(gid, "views", 5)
        await next_flush(counter)
        assert counter.flushes == 2 and stored(services)[(gid, TODAY, "views")] == 1005
        await trio.sleep(60.0)
        assert counter.flushes == 2  # nothing counted: nothing written
        nursery.cancel_scope.cancel()
    figures(capsys, f"activity: counted={counter.counted} transactions={counter.flushes}")


async def test_the_last_counts_are_stored_when_it_stops(services: Services, autojump_clock: Any) -> None:
    gid = await services.db.write(create_gallery)
    counter = Activity(services.db, lambda: NOW, flush_seconds=3600.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(counter.run)
        counter.count(gid, "favourites", 3)
        await trio.sleep(1.0)
        nursery.cancel_scope.cancel()
    assert stored(services) == {(gid, TODAY, "favourites"): 3}


async def test_many_keys_flush_early_and_a_deleted_gallery_is_skipped(services: Services,
                                                                      autojump_clock: Any) -> None:
    keep = await services.db.write(create_gallery)
    gone = await services.db.write(create_gallery)
    days = iter(NOW + 86400 * i for i in range(100))
    counter = Activity(services.db, lambda: next(days), flush_seconds=3600.0, max_pending=50)
    async with trio.open_nursery() as nursery:
        await nursery.start(counter.run)
        counter.count(gone, "views")
        conn = db.connect(services.settings.database)  # in this thread: the clock must not jump meanwhile
        try:
            with db.transaction(conn):
                conn.execute("DELETE FROM galleries WHERE id = ?", (gone,))
        finally:
            conn.close()
        flushed = counter.flushed.listen()
        started = trio.current_time()
        for _ in range(49):  # a new day each time: 50 keys in all
            counter.count(keep, "views")
        await flushed.wait()
        assert trio.current_time() - started < 3600  # not the hour of flush_seconds: the full buffer rang
        assert counter.flushes == 1 and counter.pending() == {}
        nursery.cancel_scope.cancel()
    found = stored(services)
    assert len(found) == 49 and {g for g, _, _ in found} == {keep}


async def test_a_failed_flush_keeps_its_counts(services: Services) -> None:
    counter = Activity(services.db, lambda: NOW)
    counter.count(1, "views", 2)
    with pytest.raises(ValueError):
        counter.count(1, "likes")
    services.db.close()
    with pytest.raises(Exception):  # noqa: B017 - whatever a closed database raises
        await counter.flush()
    assert counter.pending() == {(1, TODAY, "views"): 2}


async def test_requests_count_and_the_dashboard_shows_it(admin: AuthActions, services: Services, guest: Any) -> None:
    gallery = await published(admin, name="Party", allow_downloads=True, allow_guest_uploads=True)
    photo = add_photo(services, gallery["id"], name="a.jpg")
    csrf = await start_guest_session(services, guest)
    for _ in range(3):
        assert (await guest.get(f"/g/{gallery['slug']}")).status_code == 200
    assert (await guest.get(f"/g/{gallery['slug']}/photos/{photo}/download")).status_code == 200
    assert (await guest.get(f"/g/{gallery['slug']}/download")).status_code == 200
    assert (await guest.put(f"/api/g/{gallery['slug']}/favourites/{photo}", headers={"X-CSRF-Token": csrf})
            ).status_code == 200
    # The same heart again is no new favourite.
    await guest.put(f"/api/g/{gallery['slug']}/favourites/{photo}", headers={"X-CSRF-Token": csrf})
    counted = {kind: n for (_, _, kind), n in services.activity.pending().items()}
    assert counted == {"views": 3, "downloads_single": 1, "downloads_zip": 1, "favourites": 1}
    assert stored(services) == {}  # nothing written per request
    page = await (await admin.client.get("/admin/")).get_data(as_text=True)
    assert "3 views" in page and "1 download, 1 zip" in page and "1 favourite given" in page
    await services.activity.flush()
    assert services.activity.pending() == {}
    page = await (await admin.client.get("/admin/")).get_data(as_text=True)
    assert "3 views" in page and 'class="bar-views"' in page


async def test_the_summary_adds_stored_pending_and_guest_uploads(services: Services) -> None:
    conn = db.connect(services.settings.database)
    try:
        with db.transaction(conn):
            gid = create_gallery(conn)
            conn.execute("INSERT INTO gallery_activity VALUES (?, ?, 'views', 4)", (gid, TODAY))
            conn.execute("INSERT INTO gallery_activity VALUES (?, '2020-01-01', 'views', 6)", (gid,))
            conn.execute("INSERT INTO uploads (id, gallery_id, uploaded_by, created_at) VALUES (?, ?, 'guest', ?)",
                         ("u" * 32, gid, NOW))
            conn.execute("INSERT INTO photos (gallery_id, upload_id, storage_key, sha256, display_name, size, "
                         "format, uploaded_by, created_at) VALUES (?, ?, 'k', ?, 'a.jpg', 1, 'jpeg', 'guest', ?)",
                         (gid, "u" * 32, "0" * 64, NOW))
        today = dt.date.fromisoformat(TODAY)
        result = activity.summary(conn, {(gid, TODAY, "downloads_zip"): 2}, today)
    finally:
        conn.close()
    mine = result[gid]
    assert mine["totals"] == {"views": 10, "downloads_single": 0, "downloads_zip": 2, "favourites": 0}
    assert len(mine["days"]) == activity.SERIES_DAYS and mine["days"][-1] == {
        "day": TODAY, "views": 4, "downloads": 2, "favourites": 0, "guest_uploads": 1}
    assert mine["peak"] == 4


async def test_the_server_stores_its_counts_when_it_stops(tmp_path: Any) -> None:
    settings = make_settings(tmp_path, shutdown_grace_seconds=2)
    bootstrap.prepare(settings)
    bootstrap.ensure_admin(settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
    conn = db.connect(settings.database)
    try:
        with db.transaction(conn):
            gid = create_gallery(conn)
            slug = conn.execute("SELECT slug FROM galleries WHERE id = ?", (gid,)).fetchall()[0]["slug"]
    finally:
        conn.close()
    async with trio.open_nursery() as nursery:
        running = await nursery.start(server.run, settings)
        async with httpx.AsyncClient(base_url=running.url, timeout=120) as http:
            assert (await http.get(f"/g/{slug}")).status_code == 200
        running.stop()
    conn = db.connect(settings.database)
    try:
        found = conn.execute("SELECT kind, count FROM gallery_activity").fetchall()
    finally:
        conn.close()
    assert found == [{"kind": "views", "count": 1}]
