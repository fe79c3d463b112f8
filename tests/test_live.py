"""Live progress: the broker, the change feed, and the WebSocket endpoints (test client and a real server)."""

from __future__ import annotations

import functools
import json
import re
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from picpeak_lite import server
from picpeak_lite.events.feed import ChangeFeed
from picpeak_lite.ops import bootstrap
from picpeak_lite.pipeline.worker import WorkerPool
from picpeak_lite.runtime.broker import Broker, Change
from picpeak_lite.services import Services
from picpeak_lite.store import db
from picpeak_lite.store.queries import photos as photo_q

from .conftest import ADMIN_PASSWORD, AuthActions, make_settings, own_services, websocket_status
from .factories import create_gallery, run_pool_until_idle, stage_photo
from .factories import photo_jpeg as jpeg
from .harness import figures


def change(seq: int, status: str = "pending", upload: str = "u" * 32, gallery: int = 1) -> Change:
    return Change(seq=seq, photo_id=seq, gallery_id=gallery, upload_id=upload, status=status, hidden=False)


# --- broker ------------------------------------------------------------------------------------------------

async def test_publish_never_blocks_and_a_slow_subscriber_is_marked_for_resync() -> None:
    broker = Broker(buffer=8)
    with broker.subscribe(lambda c: True) as slow, broker.subscribe(lambda c: c.gallery_id == 1) as fast:
        received = []
        for seq in range(1, 101):
            broker.publish(change(seq))  # sync: cannot block
            received.append(fast.receive.receive_nowait().seq)
        assert received == list(range(1, 101))
        assert slow.overflowed
        slow.drain()
        assert not slow.overflowed
        broker.publish(change(101))
        assert slow.receive.receive_nowait().seq == 101
    assert broker.subscriber_count == 0


# --- in-process, with Quart's test client (the ``live`` fixture: conftest.py) ----------------------------

async def refused_status(ws_client: Any, path: str, headers: dict[str, str] | None = None) -> int:
    status = await websocket_status(ws_client, path, headers)
    assert status != 101, f"{path} was not refused"
    return status


async def receive_json(ws: Any) -> dict[str, Any]:
    with trio.fail_after(60):
        return json.loads(await ws.receive())


async def test_upload_snapshot_then_ordered_deltas_then_done(live: Services, client: Any, admin: AuthActions,
                                                             autojump_clock: Any = None) -> None:
    gid = await live.db.write(create_gallery)
    first, upload = stage_photo(live, gid, jpeg(1), name="one.jpg")
    stage_photo(live, gid, b"\xff\xd8\xff not really", name="two.jpg", upload_id=upload)
    async with client.websocket(f"/ws/uploads/{upload}") as ws:
        snapshot = await receive_json(ws)
        assert snapshot["type"] == "snapshot" and snapshot["total"] == 2 and snapshot["pending"] == 2
        assert [p["filename"] for p in snapshot["photos"]] == ["one.jpg", "two.jpg"]
        await run_pool_until_idle(live, count=1)
        messages = []
        while True:
            message = await receive_json(ws)
            messages.append(message)
            if message["type"] == "done":
                break
    deltas = [m for m in messages if m["type"] == "photo"]
    seqs = [m["seq"] for m in deltas]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) and seqs[0] > snapshot["seq"]
    by_photo: dict[int, list[str]] = {}
    for m in deltas:
        by_photo.setdefault(m["id"], []).append(m["status"])
    assert by_photo[first] == ["processing", "complete"]
    assert sorted(by_photo) == [first, first + 1] and by_photo[first + 1] == ["processing", "failed"]
    done_photo = next(m for m in deltas if m["status"] == "complete")
    assert done_photo["thumb_url"] == f"/api/admin/photos/{first}/grid" and done_photo["width"] == 640
    failed = next(m for m in deltas if m["status"] == "failed")
    assert failed["error"]
    assert messages[-1] == {**messages[-1], "type": "done", "complete": 1, "failed": 1, "total": 2}


async def test_refused_without_session_or_with_foreign_origin(live: Services, client: Any, guest: Any,
                                                              admin: AuthActions) -> None:
    gid = await live.db.write(create_gallery)
    _, upload = stage_photo(live, gid, jpeg(2))
    assert await refused_status(guest, f"/ws/uploads/{upload}") == 403
    assert await refused_status(client, f"/ws/uploads/{upload}", {"Origin": "https://evil.example"}) == 403
    # A draft gallery is nobody's but the admin's.
    await live.db.write(lambda conn: conn.execute("UPDATE galleries SET is_draft = 1 WHERE id = ?", (gid,)))
    assert await refused_status(guest, f"/ws/admin/galleries/{gid}") == 403
    slug = (await live.db.read(lambda conn: conn.execute("SELECT slug FROM galleries WHERE id = ?", (gid,))
                               .fetchall()[0]))["slug"]
    assert await refused_status(guest, f"/ws/g/{slug}") == 404  # as the draft's page: no gallery here


async def test_unknown_upload_gets_an_immediate_error(live: Services, client: Any, admin: AuthActions) -> None:
    async with client.websocket("/ws/uploads/" + "0" * 32) as ws:
        message = await receive_json(ws)
    assert message == {"type": "error", "error": "There is no upload with this id."}


async def test_guest_sees_own_upload_and_only_visible_photos(live: Services, client: Any, guest: Any,
                                                             admin: AuthActions) -> None:
    gallery = await admin.create_gallery(name="Party", password="letmein")
    await client.post(f"/api/admin/galleries/{gallery['id']}/publish", headers=admin.headers())
    assert await refused_status(guest, f"/ws/admin/galleries/{gallery['id']}") == 403
    assert await refused_status(guest, f"/ws/g/{gallery['slug']}") == 401  # before the password, as the page
    form = await (await guest.get(f"/g/{gallery['slug']}")).get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', form).group(1)
    entered = await guest.post(f"/g/{gallery['slug']}/password", form={"password": "letmein", "csrf_token": csrf})
    assert entered.status_code == 302
    guest_row = await live.db.read(lambda conn: conn.execute("SELECT id FROM guest_sessions").fetchall()[0])
    _, admins_upload = stage_photo(live, gallery["id"], jpeg(3))
    # A guest upload of this guest session.
    _, own_upload = stage_photo(live, gallery["id"], jpeg(4))
    await live.db.write(lambda conn: conn.execute("UPDATE uploads SET guest_session_id = ?, uploaded_by = 'guest' "
                                                  "WHERE id = ?", (guest_row["id"], own_upload)))
    assert await refused_status(guest, f"/ws/uploads/{admins_upload}") == 403
    async with guest.websocket(f"/ws/g/{gallery['slug']}") as gallery_ws:
        assert (await receive_json(gallery_ws))["type"] == "snapshot"
        async with guest.websocket(f"/ws/uploads/{own_upload}") as ws:
            snapshot = await receive_json(ws)
            assert snapshot["upload_id"] == own_upload and snapshot["total"] == 1
            await run_pool_until_idle(live, count=1)
            statuses = []
            while (message := await receive_json(ws))["type"] != "done":
                statuses.append(message["status"])
                if message["status"] == "complete":
                    assert message["thumb_url"].startswith(f"/g/{gallery['slug']}/photos/")
            assert statuses == ["processing", "complete"]
        # The gallery feed shows guests only photos becoming visible: no pending/processing states.
        visible = [await receive_json(gallery_ws) for _ in range(2)]
        assert {m["status"] for m in visible} == {"complete"}
        photo_id = visible[0]["id"]
        await client.delete(f"/api/admin/photos/{photo_id}", headers=admin.headers())
        assert await receive_json(gallery_ws) == {"type": "photo", "seq": pytest.approx(0, abs=10**9),
                                                  "id": photo_id, "status": "removed"}


# --- against a real server ---------------------------------------------------------------------------------

@pytest.fixture
async def real_server(tmp_path: Path) -> AsyncIterator[tuple[server.RunningServer, str]]:
    settings = make_settings(tmp_path, shutdown_grace_seconds=1, workers=1)
    bootstrap.prepare(settings)
    bootstrap.ensure_admin(settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
    conn = db.connect(settings.database)
    with db.transaction(conn):
        token = bootstrap.create_api_token(conn, "test", time.time())
    conn.close()
    async with trio.open_nursery() as nursery:
        running = await nursery.start(server.run, settings)
        yield running, token
        running.stop()


def ws_url(running: server.RunningServer, path: str) -> str:
    return running.url.replace("http://", "ws://") + path


async def test_real_server_resume_after_a_dropped_connection_loses_nothing(real_server: Any) -> None:
    running, token = real_server
    svc = running.services
    headers = [("Authorization", f"Bearer {token}")]
    gid = await svc.db.write(create_gallery)
    upload = None
    # Processing is on in the server: stage photos, watch a little, drop, resume with since.
    for i in range(6):
        _, upload = stage_photo(svc, gid, jpeg(10 + i), upload_id=upload)
    svc.workers_bell.ring()
    seen: list[dict[str, Any]] = []
    async with open_websocket_url(ws_url(running, f"/ws/uploads/{upload}"), extra_headers=headers) as ws:
        snapshot = json.loads(await ws.get_message())
        assert snapshot["type"] == "snapshot"
        for _ in range(2):
            seen.append(json.loads(await ws.get_message()))
    last = seen[-1]["seq"] if seen else snapshot["seq"]
    await trio.sleep(0.3)  # changes happen while we are away
    async with open_websocket_url(ws_url(running, f"/ws/uploads/{upload}?since={last}"),
                                  extra_headers=headers) as ws:
        try:
            with trio.fail_after(120):
                while True:
                    message = json.loads(await ws.get_message())
                    seen.append(message)
                    if message["type"] == "done":
                        break
        except ConnectionClosed:
            pass
    deltas = [m for m in seen if m["type"] == "photo"]
    assert all(m["type"] != "snapshot" for m in seen[2:])  # resumed, not restarted
    seqs = [m["seq"] for m in deltas]
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))
    final: dict[int, str] = {}
    for m in deltas:
        final[m["id"]] = m["status"]
    # Across the two connections every photo's history continues its snapshot state with no step missing.
    allowed = {("pending", "processing"), ("processing", "complete")}
    state = {p["id"]: p["status"] for p in snapshot["photos"]}
    for m in deltas:
        assert (state[m["id"]], m["status"]) in allowed, f"photo {m['id']}: {state[m['id']]} -> {m['status']}"
        state[m["id"]] = m["status"]
    assert len(state) == 6 and set(state.values()) == {"complete"} and set(final) <= set(state)
    assert seen[-1]["type"] == "done" and seen[-1]["complete"] == 6


async def test_real_server_refuses_foreign_origin_and_no_auth(real_server: Any) -> None:
    running, token = real_server
    svc = running.services
    gid = await svc.db.write(create_gallery)
    _, upload = stage_photo(svc, gid, jpeg(20))
    for headers in ([], [("Authorization", f"Bearer {token}"), ("Origin", "https://evil.example")]):
        with pytest.raises(ConnectionRejected) as refused:
            async with open_websocket_url(ws_url(running, f"/ws/uploads/{upload}"), extra_headers=headers):
                pass
        assert refused.value.status_code == 403


async def test_a_consumer_that_never_reads_does_not_delay_processing(real_server: Any) -> None:
    running, token = real_server
    svc = running.services
    gid = await svc.db.write(create_gallery)
    upload = None
    for i in range(12):
        _, upload = stage_photo(svc, gid, jpeg(30 + i, (320, 240)), upload_id=upload)
    headers = [("Authorization", f"Bearer {token}")]
    async with open_websocket_url(ws_url(running, f"/ws/admin/galleries/{gid}"), extra_headers=headers,
                                  message_queue_size=1):
        svc.workers_bell.ring()
        with trio.fail_after(120):
            while (await svc.db.read(photo_q.upload_counts, upload))["complete"] < 12:
                await trio.sleep(0.05)


SECOND_PROCESS = textwrap.dedent("""
    import sys, time
    from picpeak_lite.store import db
    conn = db.connect(sys.argv[1])
    with db.transaction(conn):
        conn.execute("UPDATE photos SET hidden = 1 WHERE id = ?", (int(sys.argv[2]),))
    print(time.time())
""")


async def cross_process_change(real_server: Any, capsys: Any) -> float:
    """Another process hides a photo; the admin's feed delivers the change. Returns the seconds it took, which
    the figures line shows (``live cross-process: latency_ms=``)."""
    running, token = real_server
    svc = running.services
    gid = await svc.db.write(create_gallery)
    photo_id, _ = stage_photo(svc, gid, jpeg(40))
    async with httpx.AsyncClient(base_url=running.url, timeout=120) as http:
        assert (await http.get("/healthz")).status_code == 200
    headers = [("Authorization", f"Bearer {token}")]
    async with open_websocket_url(ws_url(running, f"/ws/admin/galleries/{gid}"), extra_headers=headers) as ws:
        assert json.loads(await ws.get_message())["type"] == "snapshot"
        result = await trio.run_process(
            [sys.executable, "-c", SECOND_PROCESS, svc.settings.database, str(photo_id)],
            capture_stdout=True,
        )
        committed_at = float(result.stdout)
        with trio.fail_after(120):  # only stops a hung test; the latency is printed, and bounded when slow
            while True:
                message = json.loads(await ws.get_message())
                if message["type"] == "photo" and message["hidden"]:
                    break
        latency = time.time() - committed_at
    assert message["id"] == photo_id
    figures(capsys, f"live cross-process: latency_ms={latency * 1000:.0f}")
    return latency


async def test_a_change_made_by_another_process_arrives(real_server: Any, capsys: Any) -> None:
    await cross_process_change(real_server, capsys)


@pytest.mark.slow
async def test_a_change_made_by_another_process_arrives_quickly(real_server: Any, capsys: Any) -> None:
    latency = await cross_process_change(real_server, capsys)
    assert latency < 0.25, f"cross-process change took {latency * 1000:.0f} ms"


async def test_worker_pool_and_feed_share_one_services(tmp_path: Path) -> None:
    """The feed wakes workers for pending rows inserted by another process (an import)."""
    with own_services(tmp_path) as svc:
        pool = WorkerPool(svc, count=1, poll_seconds=3600)  # only a ring can start it
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            await nursery.start(ChangeFeed(svc, svc.broker, poll_seconds=0.02).run)
            gid = await svc.db.write(create_gallery)
            photo_id, _ = stage_photo(svc, gid, jpeg(50))  # another connection, like another process
            with trio.fail_after(60):
                while (await svc.db.read(photo_q.get, photo_id))["status"] != "complete":
                    await trio.sleep(0.02)
            nursery.cancel_scope.cancel()


async def test_a_guest_feed_ends_when_the_gallery_is_unpublished(live: Services, client: Any, guest: Any,
                                                                  admin: AuthActions,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from picpeak_lite.web.views.live import GuestAccess

    monkeypatch.setattr(GuestAccess, "RECHECK_SECONDS", 0.0)  # check on every message instead of every 5 s
    gallery = await admin.create_gallery(name="Open")
    await client.post(f"/api/admin/galleries/{gallery['id']}/publish", headers=admin.headers())
    async with guest.websocket(f"/ws/g/{gallery['slug']}") as ws:
        assert (await receive_json(ws))["type"] == "snapshot"
        await client.post(f"/api/admin/galleries/{gallery['id']}/unpublish", headers=admin.headers())
        stage_photo(live, gallery["id"], jpeg(70))  # any change wakes the feed, which asks again
        with pytest.raises(Exception) as closed:
            await receive_json(ws)
    assert "4403" in repr(closed.value) or getattr(closed.value, "code", None) == 4403, repr(closed.value)


async def test_guest_gallery_deltas_carry_no_file_names(live: Services, client: Any, guest: Any,
                                                         admin: AuthActions) -> None:
    gallery = await admin.create_gallery(name="Names")
    await client.post(f"/api/admin/galleries/{gallery['id']}/publish", headers=admin.headers())
    async with guest.websocket(f"/ws/g/{gallery['slug']}") as ws:
        assert (await receive_json(ws))["type"] == "snapshot"
        stage_photo(live, gallery["id"], jpeg(71), name="Other guest's IMG_0001.jpg")
        await run_pool_until_idle(live, count=1)
        delta = await receive_json(ws)
    assert delta["status"] == "complete" and delta["filename"] is None and delta["thumb_url"]


# --- feeds addressed the way their pages are (issue 11) ----------------------------------------------------

async def test_the_guest_feed_is_reached_by_slug_and_answers_as_the_page_does(live: Services, client: Any,
                                                                               guest: Any,
                                                                               admin: AuthActions) -> None:
    open_gallery = await admin.create_gallery(name="Open")
    await client.post(f"/api/admin/galleries/{open_gallery['id']}/publish", headers=admin.headers())
    locked = await admin.create_gallery(name="Locked", password="letmein")
    await client.post(f"/api/admin/galleries/{locked['id']}/publish", headers=admin.headers())
    draft = await admin.create_gallery(name="Draft")
    old = await admin.create_gallery(name="Old")
    await client.post(f"/api/admin/galleries/{old['id']}/publish", headers=admin.headers())
    await live.db.write(lambda conn: conn.execute("UPDATE galleries SET expires_at = 1000 WHERE id = ?",
                                                  (old["id"],)))
    for slug, page_status, feed_status in ((open_gallery["slug"], 200, 101), (locked["slug"], 401, 401),
                                           (draft["slug"], 404, 404), (old["slug"], 410, 410),
                                           ("no-such-gallery", 404, 404), (str(open_gallery["id"]), 404, 404)):
        assert (await guest.get(f"/g/{slug}")).status_code == page_status
        assert await websocket_status(guest, f"/ws/g/{slug}") == feed_status, slug
    # The admin's cookie opens nothing on the guest feed. Since issue 12 point 11 it shows the photographer the
    # guest page as a preview (200), and that preview page names no feed for its script to open.
    preview = await client.get(f"/g/{locked['slug']}")
    assert preview.status_code == 200 and 'data-ws-path=""' in await preview.get_data(as_text=True)
    assert await websocket_status(client, f"/ws/g/{locked['slug']}") == 401
    form = await (await guest.get(f"/g/{locked['slug']}")).get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', form).group(1)
    await guest.post(f"/g/{locked['slug']}/password", form={"password": "letmein", "csrf_token": csrf})
    assert await websocket_status(guest, f"/ws/g/{locked['slug']}") == 101
    # The page tells the script the feed by slug and no longer names the gallery's id.
    page = await (await guest.get(f"/g/{locked['slug']}")).get_data(as_text=True)
    assert f'data-ws-path="/ws/g/{locked["slug"]}"' in page and "data-gallery-id" not in page


async def test_gallery_ids_open_no_feed_for_anyone_but_the_admin(live: Services, client: Any, guest: Any,
                                                                 app: Any, admin: AuthActions) -> None:
    """Issue 11's enumeration: walking ids 1..N with no cookie (and ``since=0``) yields no feed, so no slug."""
    galleries = []
    for name in ("One", "Two", "Three"):
        gallery = await admin.create_gallery(name=name)
        await client.post(f"/api/admin/galleries/{gallery['id']}/publish", headers=admin.headers())
        galleries.append(gallery)
    photo_id, _ = stage_photo(live, galleries[0]["id"], jpeg(72))
    await run_pool_until_idle(live, count=1)
    stranger = app.test_client()
    for gid in range(1, len(galleries) + 3):
        assert await websocket_status(stranger, f"/ws/admin/galleries/{gid}?since=0") == 403
        assert await websocket_status(stranger, f"/ws/galleries/{gid}?since=0") == 404  # the old address is gone
        assert await websocket_status(guest, f"/ws/admin/galleries/{gid}?since=0") == 403
    assert await websocket_status(client, f"/ws/admin/galleries/{galleries[-1]['id'] + 5}") == 404
    # The admin follows any gallery by id, with admin image URLs; the guest, by slug, with the slug's.
    async with client.websocket(f"/ws/admin/galleries/{galleries[0]['id']}?since=0") as ws:
        while (message := await receive_json(ws))["status"] != "complete":
            pass
    assert message["thumb_url"] == f"/api/admin/photos/{photo_id}/grid" and message["filename"]
    async with stranger.websocket(f"/ws/g/{galleries[0]['slug']}?since=0") as ws:
        message = await receive_json(ws)
    assert message["thumb_url"] == f"/g/{galleries[0]['slug']}/photos/{photo_id}/grid"
    assert message["filename"] is None


async def test_the_admin_feed_follows_drafts_and_expired_galleries(live: Services, client: Any,
                                                                    admin: AuthActions) -> None:
    draft = await admin.create_gallery(name="Draft")
    old = await admin.create_gallery(name="Old")
    await live.db.write(lambda conn: conn.execute("UPDATE galleries SET expires_at = 1000 WHERE id = ?",
                                                  (old["id"],)))
    for gallery in (draft, old):
        assert await websocket_status(client, f"/ws/admin/galleries/{gallery['id']}") == 101
    page = await (await client.get(f"/admin/galleries/{draft['id']}")).get_data(as_text=True)
    assert f'data-ws-path="/ws/admin/galleries/{draft["id"]}"' in page


async def test_an_upload_feed_is_its_uploaders_and_the_admins_only(live: Services, client: Any, guest: Any,
                                                                   app: Any, admin: AuthActions) -> None:
    """The upload id is random, but it is not enough: a second browser with it, or a guest who may no longer
    see the gallery, is refused; the admin follows any upload."""
    gallery = await admin.create_gallery(name="Party", password="letmein")
    await client.post(f"/api/admin/galleries/{gallery['id']}/publish", headers=admin.headers())
    form = await (await guest.get(f"/g/{gallery['slug']}")).get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', form).group(1)
    await guest.post(f"/g/{gallery['slug']}/password", form={"password": "letmein", "csrf_token": csrf})
    guest_row = await live.db.read(lambda conn: conn.execute("SELECT id FROM guest_sessions").fetchall()[0])
    _, upload = stage_photo(live, gallery["id"], jpeg(73))
    await live.db.write(lambda conn: conn.execute("UPDATE uploads SET guest_session_id = ?, uploaded_by = 'guest' "
                                                  "WHERE id = ?", (guest_row["id"], upload)))
    other_browser = app.test_client()
    await other_browser.get(f"/g/{gallery['slug']}")  # a guest session of its own, without the password
    assert await websocket_status(guest, f"/ws/uploads/{upload}") == 101
    assert await websocket_status(client, f"/ws/uploads/{upload}") == 101
    assert await websocket_status(other_browser, f"/ws/uploads/{upload}") == 403
    assert await websocket_status(app.test_client(), f"/ws/uploads/{upload}") == 403
    await client.patch(f"/api/admin/galleries/{gallery['id']}", json={"password": "changed-it"},
                       headers=admin.headers())
    assert await websocket_status(guest, f"/ws/uploads/{upload}") == 403  # the old password no longer counts
    assert await websocket_status(client, f"/ws/uploads/{upload}") == 101


async def test_a_since_no_server_could_have_sent_gets_a_fresh_snapshot(live: Services, client: Any,
                                                                        admin: AuthActions) -> None:
    """``since`` past SQLite's integers (or too long for ``int()``) is not a position: a snapshot, no 500."""
    gallery = await admin.create_gallery(name="Since")
    for since in (str(2**63), str(2**64), "9" * 5000, "-1", "x"):
        async with client.websocket(f"/ws/admin/galleries/{gallery['id']}?since={since}") as ws:
            assert (await receive_json(ws))["type"] == "snapshot", since


async def test_open_websockets_are_capped_and_a_place_comes_back_when_one_closes(tmp_path: Path) -> None:
    """max_websockets: past it the handshake is refused 503 with Retry-After (the page polls instead); a closed
    feed gives its place back."""
    from picpeak_lite.web.app import create_app
    from picpeak_lite.web.views.live import FULL

    from .conftest import websocket_refusal
    from .factories import gallery_row

    with own_services(tmp_path, max_websockets=2) as svc:
        slug = "open-feed"
        await svc.db.write(functools.partial(gallery_row, slug=slug))
        async with trio.open_nursery() as nursery:
            await nursery.start(ChangeFeed(svc, svc.broker, poll_seconds=0.02).run)
            guest = create_app(svc).test_client()
            async with guest.websocket(f"/ws/g/{slug}") as first, guest.websocket(f"/ws/g/{slug}") as second:
                assert (await receive_json(first))["type"] == (await receive_json(second))["type"] == "snapshot"
                refusal = await websocket_refusal(guest, f"/ws/g/{slug}")
                assert refusal.status_code == 503 and refusal.headers["Retry-After"] == "30"
                assert FULL in (await refusal.get_data(as_text=True))
            async with guest.websocket(f"/ws/g/{slug}") as again:
                assert (await receive_json(again))["type"] == "snapshot"
            nursery.cancel_scope.cancel()
