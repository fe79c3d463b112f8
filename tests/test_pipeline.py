"""The queue, the worker pool and the janitor against a real SQLite file and real images."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from picpeak_lite.media import images
from picpeak_lite.pipeline import transitions
from picpeak_lite.pipeline.janitor import Janitor
from picpeak_lite.pipeline.worker import TOO_SLOW, WorkerPool, _Claim
from picpeak_lite.services import Services
from picpeak_lite.store import db
from picpeak_lite.store.queries import claims
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries import webhooks as webhook_q
from picpeak_lite.store.storage import new_key

from . import bombs, imagefactory
from .conftest import AuthActions, own_services, sql
from .factories import create_gallery, photo_jpeg, run_pool_until_idle, stage_photo
from .hostile import tree_pids


@pytest.fixture
def conn(services: Services) -> Any:
    connection = db.connect(services.settings.database)
    yield connection
    connection.close()


@pytest.fixture
def gallery_id(conn: Any) -> int:
    with db.transaction(conn):
        return create_gallery(conn)


def status_of(conn: Any, photo_id: int) -> dict[str, Any]:
    row = photo_q.get(conn, photo_id)
    assert row is not None
    return row


# --- the claim ---------------------------------------------------------------------------------------------

async def test_concurrent_claims_from_many_threads_never_claim_twice(services: Services, conn: Any,
                                                               gallery_id: int) -> None:
    """Twelve connections in twelve threads race for 60 photos; each photo is claimed exactly once."""
    upload = secrets.token_hex(16)
    ids = {stage_photo(services, gallery_id, b"x%d" % i, upload_id=upload)[0] for i in range(60)}
    claimed: list[int] = []
    lock = threading.Lock()

    def claimer() -> None:
        mine = db.connect(services.settings.database)
        try:
            while True:
                row = claims.claim_next(mine, secrets.token_hex(8), time.time(), 60)
                if row is None:
                    return
                with lock:
                    claimed.append(row["id"])
        finally:
            mine.close()

    threads = [threading.Thread(target=claimer) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(claimed) == sorted(ids)
    assert all(status_of(conn, i)["attempts"] == 1 for i in ids)


CLAIM_SCRIPT = textwrap.dedent("""
    import secrets, sys, time
    from picpeak_lite.store import db
    from picpeak_lite.store.queries import claims
    conn = db.connect(sys.argv[1])
    got = []
    while True:
        row = claims.claim_next(conn, secrets.token_hex(8), time.time(), 60)
        if row is None:
            break
        got.append(row["id"])
    print(",".join(map(str, got)))
""")


async def test_two_processes_claim_disjoint_sets(services: Services, gallery_id: int) -> None:
    upload = secrets.token_hex(16)
    ids = {stage_photo(services, gallery_id, b"y%d" % i, upload_id=upload)[0] for i in range(200)}
    procs = [subprocess.Popen([sys.executable, "-c", CLAIM_SCRIPT, services.settings.database],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        results.append({int(x) for x in out.strip().split(",") if x})
    assert results[0].isdisjoint(results[1])
    assert results[0] | results[1] == ids


async def test_stale_worker_cannot_overwrite_after_its_lease_expired(services: Services, conn: Any,
                                                               gallery_id: int) -> None:
    photo_id, _ = stage_photo(services, gallery_id, b"z")
    now = time.time()
    with db.transaction(conn):
        slow = claims.claim_next(conn, "token-slow", now, 60)
    assert slow is not None and slow["id"] == photo_id
    with db.transaction(conn):  # the slow worker's lease runs out; the janitor requeues
        requeued, failed = transitions.requeue_expired(conn, (), now + 61)
    assert (requeued, failed) == ([photo_id], [])
    with db.transaction(conn):
        fresh = claims.claim_next(conn, "token-fresh", now + 62, 60)
    # The slow worker's process is taken for dead: its attempt does not count, the interruption does.
    assert fresh is not None and (fresh["attempts"], fresh["interruptions"]) == (1, 1)
    with db.transaction(conn):
        assert transitions.fail_photo(conn, (), photo_id, "token-slow", "late failure", now + 63) is None
        assert not claims.renew_lease(conn, photo_id, "token-slow", now + 200)
        done = transitions.complete_photo(conn, (), photo_id, "token-fresh", {"width": 10, "height": 10}, now + 64)
    assert done is not None and done["status"] == "complete"
    with db.transaction(conn):
        # A late completion from the slow worker after the fresh one finished changes nothing either.
        assert transitions.complete_photo(conn, (), photo_id, "token-slow", {"width": 1, "height": 1}, now + 65) is None
    assert status_of(conn, photo_id)["width"] == 10


async def test_a_photo_whose_process_died_waits_behind_the_untried_ones(services: Services, conn: Any,
                                                                         gallery_id: int) -> None:
    """A server killed while it worked on a photo (kill -9 on a loaded machine, again and again) met that same
    photo first at every start, and three kills failed a good photo. Now the untried photos go first, and the
    interrupted attempt is not counted."""
    tried, _ = stage_photo(services, gallery_id, b"tried")
    now = time.time()
    with db.transaction(conn):
        assert claims.claim_next(conn, "dead-process", now, 60)["id"] == tried
        assert transitions.requeue_expired(conn, (), now + 61) == ([tried], [])
    fresh = [stage_photo(services, gallery_id, b"fresh%d" % i)[0] for i in range(2)]
    order = []
    with db.transaction(conn):
        while (row := claims.claim_next(conn, f"t{len(order)}", now + 62, 60)) is not None:
            order.append((row["id"], row["attempts"]))
    assert order == [(fresh[0], 1), (fresh[1], 1), (tried, 1)]
    if conn.dialect != "sqlite":
        return  # what follows is SQLite's planner
    plan = conn.execute("EXPLAIN QUERY PLAN SELECT coalesce("
                        "(SELECT id FROM photos WHERE status = 'pending' AND attempts = 0 AND interruptions = 0 "
                        "ORDER BY id LIMIT 1), "
                        "(SELECT id FROM photos WHERE status = 'pending' ORDER BY id LIMIT 1))").fetchall()
    searches = [r["detail"] for r in plan if "photos" in r["detail"]]
    assert len(searches) == 2 and all("USING INDEX photos_queue" in d or "USING COVERING INDEX photos_queue" in d
                                      for d in searches), [r["detail"] for r in plan]


async def test_interruptions_are_bounded(services: Services, conn: Any, gallery_id: int) -> None:
    """A photo whose process dies under it every time is still given up, after MAX_INTERRUPTIONS, and a retry
    gives it a fresh count."""
    photo_id, _ = stage_photo(services, gallery_id, b"poison")
    now = time.time()
    limit = transitions.MAX_INTERRUPTIONS
    for interruption in range(1, limit + 1):
        with db.transaction(conn):
            row = claims.claim_next(conn, f"t{interruption}", now, 60)
            assert (row["attempts"], row["interruptions"]) == (1, interruption - 1)
        now += 61
        with db.transaction(conn):
            requeued, failed = transitions.requeue_expired(conn, (), now)
        assert (requeued, failed) == (([photo_id], []) if interruption < limit else ([], [photo_id]))
    row = status_of(conn, photo_id)
    assert row["status"] == "failed" and row["error"] == (
        f"Gave up after its processing was interrupted {limit} times: the server stopped while making it.")
    with db.transaction(conn):
        assert claims.claim_next(conn, "again", now, 60) is None
        assert photo_q.retry(conn, photo_id)
        assert claims.claim_next(conn, "again", now, 60)["interruptions"] == 0


async def test_status_is_checked_by_the_database(conn: Any, services: Services, gallery_id: int) -> None:
    photo_id, _ = stage_photo(services, gallery_id, b"q")
    with pytest.raises(db.ConstraintError), db.transaction(conn):
        conn.execute("UPDATE photos SET status = 'done' WHERE id = ?", (photo_id,))
    with pytest.raises(db.ConstraintError), db.transaction(conn):
        conn.execute("UPDATE photos SET status = 'processing' WHERE id = ?", (photo_id,))  # no claim token


# --- the worker pool ---------------------------------------------------------------------------------------

async def test_pool_processes_good_and_bad_photos(services: Services, conn: Any, gallery_id: int) -> None:
    exif = imagefactory.make_exif(orientation=6, make="Canon", model="EOS R5", date_original="2024:06:20 14:03:00")
    good, upload = stage_photo(services, gallery_id, photo_jpeg(1, (800, 600), exif=exif))
    png, _ = stage_photo(services, gallery_id, imagefactory.save(imagefactory.photo(300, 200), "png"),
                         upload_id=upload, fmt="png")
    truncated, _ = stage_photo(services, gallery_id, photo_jpeg(2)[:3000], upload_id=upload)
    await run_pool_until_idle(services)

    row = status_of(conn, good)
    assert row["status"] == "complete" and row["attempts"] == 1
    assert (row["width"], row["height"]) == (600, 800)  # orientation 6 swaps the sides
    assert row["camera_make"] == "Canon" and row["camera_model"] == "EOS R5"
    assert row["taken_at"] == "2024-06-20T14:03:00"
    assert services.storage.derived_path(row["storage_key"], "grid").exists()
    assert services.storage.derived_path(row["storage_key"], "view").exists()
    assert status_of(conn, png)["status"] == "complete"
    bad = status_of(conn, truncated)
    assert bad["status"] == "failed" and "truncated" in bad["error"].lower()
    upload_row = photo_q.get_upload(conn, upload)
    assert upload_row["completed_at"] is not None


async def test_webhook_outbox_written_once_per_event(tmp_path: Path) -> None:
    webhook = {"url": "https://hooks.example.com/x", "secret": "0123456789abcdef"}
    with own_services(tmp_path, webhooks=[webhook]) as svc:
        gid = await svc.db.write(create_gallery)
        _, upload = stage_photo(svc, gid, photo_jpeg(3))
        bad, _ = stage_photo(svc, gid, b"\xff\xd8\xff garbage", upload_id=upload)
        await run_pool_until_idle(svc)
        # Reprocess the failed one (it fails again): no second delivery id appears.
        assert await svc.db.write(photo_q.retry, bad)
        await run_pool_until_idle(svc)
        rows = await svc.db.read(lambda c: webhook_q.list_deliveries(c, limit=100))
        types = sorted(r["event_type"] for r in rows)
        assert types == ["photo.failed", "photo.uploaded", "upload.completed"]
        assert len({r["event_id"] for r in rows}) == 3


async def test_worker_hands_photo_back_on_shutdown(services: Services, conn: Any, gallery_id: int) -> None:
    big, _ = stage_photo(services, gallery_id, photo_jpeg(4, (3000, 2000)))
    pool = WorkerPool(services, count=1, poll_seconds=0.05)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        while status_of(conn, big)["status"] != "processing":
            await trio.sleep(0.005)
        nursery.cancel_scope.cancel()
    row = status_of(conn, big)
    assert row["status"] == "pending" and row["attempts"] == 0 and row["claim_token"] is None


async def test_a_shutdown_between_the_work_and_its_write_hands_the_photo_back(services: Services, conn: Any,
                                                                          gallery_id: int) -> None:
    """The cancellation of a shutdown can reach a worker after its photo's images are made and before their
    result is written (waiting for the database's writer). It hands the photo back, as it does mid-work: it
    was left 'processing' until its lease ran out, after a clean exit (CI's sigterm test saw it once)."""
    photo, _ = stage_photo(services, gallery_id, photo_jpeg(5))
    pool = WorkerPool(services, count=1, poll_seconds=0.05)
    held, release, seen = trio.Event(), threading.Event(), []

    def hold_the_writer(conn: Any) -> None:
        seen.append(conn.execute("SELECT status FROM photos WHERE id = ?", (photo,)).fetchone()["status"])
        trio.from_thread.run_sync(held.set)
        release.wait()

    grid = services.storage.derived_path(status_of(conn, photo)["storage_key"], "grid")
    try:
        async with trio.open_nursery() as nursery:
            async with pool.image_limiter:  # the worker claims the photo, then waits here to make its images
                await nursery.start(pool.run)
                while status_of(conn, photo)["status"] != "processing":
                    await trio.sleep(0.005)
                nursery.start_soon(services.db.write, hold_the_writer)  # before the result can be written
                await held.wait()
            while not grid.exists():  # the images are made; the worker's next step is the result's write
                await trio.sleep(0.005)
            await trio.testing.wait_all_tasks_blocked(cushion=0.1)
            nursery.cancel_scope.cancel()
            release.set()
    finally:
        release.set()
    assert seen == ["processing"]
    row = status_of(conn, photo)
    assert row["status"] == "pending" and row["attempts"] == 0 and row["claim_token"] is None


async def test_photo_deleted_while_processing_is_discarded_quietly(services: Services, client: Any,
                                                                   admin: AuthActions, conn: Any, gallery_id: int,
                                                                   caplog: Any) -> None:
    doomed, _ = stage_photo(services, gallery_id, photo_jpeg(7))
    later, _ = stage_photo(services, gallery_id, photo_jpeg(8))  # claimed second (by id)
    pool = WorkerPool(services, count=1, poll_seconds=0.05)
    async with trio.open_nursery() as nursery:
        async with pool.image_limiter:  # the worker claims, finds the original, then waits here to decode it
            await nursery.start(pool.run)
            while status_of(conn, doomed)["status"] != "processing":
                await trio.sleep(0.005)
            deleted = await client.delete(f"/api/admin/photos/{doomed}", headers=admin.headers())
            assert deleted.status_code == 204
        while status_of(conn, later)["status"] != "complete":  # the worker lives on
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert photo_q.get(conn, doomed) is None
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text  # a normal race, not a bug


async def test_photo_ids_are_never_given_twice(services: Services, client: Any, admin: AuthActions,
                                               gallery_id: int) -> None:
    """SQLite alone would give the next photo the id of the last one deleted: browsers would show the deleted
    photo's cached images under the new photo's URL for a week."""
    stage_photo(services, gallery_id, photo_jpeg(9))
    last, _ = stage_photo(services, gallery_id, photo_jpeg(10))
    assert (await client.delete(f"/api/admin/photos/{last}", headers=admin.headers())).status_code == 204
    again, _ = stage_photo(services, gallery_id, photo_jpeg(11))
    assert again == last + 1


async def run_pool_until_views_fresh(svc: Services) -> None:
    pool = WorkerPool(svc, count=2, poll_seconds=0.05)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        with trio.fail_after(120):  # a hung-test stop only
            while await svc.db.read(lambda c: c.execute("SELECT count(*) AS n FROM photos WHERE views_stale > 0 "
                                                        "OR status IN ('pending', 'processing')").fetchall()[0]["n"]):
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()


async def test_view_images_follow_a_watermark_turned_on_later(services: Services, client: Any, admin: AuthActions,
                                                             conn: Any, gallery_id: int) -> None:
    photo, _ = stage_photo(services, gallery_id, imagefactory.save(imagefactory.flat(800, 600), "jpeg"))
    other_gallery = await services.db.write(create_gallery, "Other")
    untouched, _ = stage_photo(services, other_gallery, photo_jpeg(13))
    await run_pool_until_views_fresh(services)
    view = services.storage.derived_path(status_of(conn, photo)["storage_key"], "view")
    grid = services.storage.derived_path(status_of(conn, photo)["storage_key"], "grid")
    plain = view.read_bytes()
    assert imagefactory.largest_change_from_flat(plain) < 8
    assert imagefactory.largest_change_from_flat(grid.read_bytes()) < 8
    other_view = services.storage.derived_path(status_of(conn, untouched)["storage_key"], "view")
    other_made = other_view.stat().st_mtime_ns
    seq = conn.execute("SELECT max(seq) AS seq FROM photo_changes").fetchall()[0]["seq"]

    turned_on = await client.patch(f"/api/admin/galleries/{gallery_id}", json={"watermark": True},
                                   headers=admin.headers())
    assert turned_on.status_code == 200
    assert status_of(conn, photo)["views_stale"] == 1 and status_of(conn, untouched)["views_stale"] == 0
    await run_pool_until_views_fresh(services)

    marked = view.read_bytes()
    assert imagefactory.largest_change_from_flat(marked) > 40  # the watermark is in the view now
    assert imagefactory.largest_change_from_flat(grid.read_bytes()) > 40  # and in the grid (issue 35, point 14)
    row = status_of(conn, photo)
    assert row["status"] == "complete" and row["views_stale"] == 0
    # It stayed complete (visible) all along: the change log has nothing new, and the other gallery was left alone.
    assert conn.execute("SELECT count(*) AS n FROM photo_changes WHERE seq > ?", (seq,)).fetchall()[0]["n"] == 0
    assert other_view.stat().st_mtime_ns == other_made

    renamed = await client.patch(f"/api/admin/galleries/{gallery_id}", json={"name": "Anna & Ben"},
                                 headers=admin.headers())
    assert renamed.status_code == 200 and status_of(conn, photo)["views_stale"] == 1  # the name is the text
    await run_pool_until_views_fresh(services)
    assert view.read_bytes() != marked


async def test_an_older_render_never_replaces_a_newer_one(services: Services, client: Any, admin: AuthActions,
                                                          conn: Any, gallery_id: int) -> None:
    """One process at a time makes a photo's images again (its views lease); a render that read older settings
    writes nothing once they changed, and leaves the photo marked for a render from the newer ones."""
    photo, _ = stage_photo(services, gallery_id, imagefactory.save(imagefactory.flat(800, 600), "jpeg"))
    await run_pool_until_views_fresh(services)
    view = services.storage.derived_path(status_of(conn, photo)["storage_key"], "view")
    unmarked = view.read_bytes()
    assert (await client.patch(f"/api/admin/galleries/{gallery_id}", json={"watermark": True, "name": "First"},
                               headers=admin.headers())).status_code == 200
    slow = WorkerPool(services, count=1)
    async with trio.open_nursery() as nursery, slow.image_limiter:
        nursery.start_soon(slow.refresh_stale_views, photo % slow.tasks)  # the task whose share holds the photo
        while slow.image_limiter.statistics().tasks_waiting == 0:  # it has read the settings, waits to decode
            await trio.sleep(0.005)
        # Meanwhile no other worker takes the photo: its lease is held.
        assert await services.db.read(photo_q.next_stale_views, 0, 1, services.clock()) is None
        assert (await client.patch(f"/api/admin/galleries/{gallery_id}", json={"name": "Second"},
                                   headers=admin.headers())).status_code == 200
        # The limiter let go: the slow render, from "First", finds the mark changed and writes nothing.
    assert view.read_bytes() == unmarked and status_of(conn, photo)["views_stale"] > 0
    assert sql(services, "SELECT name FROM leases") == []  # given back
    await run_pool_until_views_fresh(services)  # made with "Second"
    assert view.read_bytes() != unmarked and status_of(conn, photo)["views_stale"] == 0


@pytest.mark.sqlite
async def test_the_stale_views_query_seeks_its_index(conn: Any) -> None:
    plan = conn.execute("EXPLAIN QUERY PLAN " + photo_q.NEXT_STALE_VIEWS["sqlite"], (2, 0, 0.0)).fetchall()
    assert plan[0]["detail"] == "SCAN photos USING INDEX photos_views_stale"  # stale rows only


async def test_lease_is_renewed_while_working(tmp_path: Path, autojump_clock: Any) -> None:
    """A photo that takes longer than its lease is not stolen from a live worker. (On trio's virtual clock,
    which the rows' clock follows: the renewal is due at a third of the lease, whatever the machine's load.)"""
    with own_services(tmp_path, lease_seconds=5) as svc:
        svc.clock = trio.current_time
        gid = await svc.db.write(create_gallery)
        photo_id, _ = stage_photo(svc, gid, photo_jpeg(5))
        pool = WorkerPool(svc, count=1)
        token = secrets.token_hex(8)
        row = await svc.db.write(claims.claim_next, token, svc.clock(), 5)
        claim = _Claim(photo_id, token)
        with trio.move_on_after(4):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pool._renew_lease, claim, nursery.cancel_scope)
                await trio.sleep(3.9)
        after = await svc.db.read(photo_q.get, photo_id)
        assert after["lease_until"] > row["lease_until"] and not claim.lost


# --- janitor and reconciler --------------------------------------------------------------------------------

async def test_reconciler_removes_orphans_and_fails_missing_originals(services: Services, conn: Any,
                                                                      gallery_id: int) -> None:
    storage = services.storage
    kept, _ = stage_photo(services, gallery_id, b"kept")
    lost, _ = stage_photo(services, gallery_id, b"lost")
    os.unlink(storage.original_path(status_of(conn, lost)["storage_key"]))
    orphan_key = new_key()
    orphan = storage.original_path(orphan_key)
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"crash between rename and commit")
    fresh_key = new_key()
    fresh = storage.original_path(fresh_key)
    fresh.parent.mkdir(parents=True, exist_ok=True)
    fresh.write_bytes(b"an upload about to commit")
    old = time.time() - 3600
    os.utime(orphan, (old, old))
    stale_temp = storage.new_temp_path()
    stale_temp.write_bytes(b"cut off")
    os.utime(stale_temp, (time.time() - 7200,) * 2)

    counts = await Janitor(services).reconcile()
    assert counts == {"temp_swept": 1, "orphans_removed": 1, "missing_failed": 1}
    assert not orphan.exists() and fresh.exists()  # within the grace period: left alone
    assert status_of(conn, lost)["error"] == "The original file is missing from storage."
    assert status_of(conn, kept)["status"] == "pending"


async def test_janitor_recovers_a_dead_workers_photo_within_one_lease(tmp_path: Path) -> None:
    """A worker dies holding a claim: the janitor's ticks leave it alone while the lease runs, and the first tick
    after it ran out makes it pending again, well within lease + 2 intervals. The clock is moved by hand, a
    janitor interval per tick, so the bound is about our logic and not about the machine's load."""
    with own_services(tmp_path, lease_seconds=5) as svc:
        now = [1_700_000_000.0]
        svc.clock = lambda: now[0]
        gid = await svc.db.write(create_gallery)
        photo_id, _ = stage_photo(svc, gid, b"w")
        started = now[0]
        await svc.db.write(claims.claim_next, "dead-worker", svc.clock(), 5)
        janitor = Janitor(svc)
        requeued: list[int] = []
        for _ in range(100):
            if (await svc.db.read(photo_q.get, photo_id))["status"] == "pending":
                break
            assert now[0] - started <= 5, "requeued while its lease was still running"
            now[0] += janitor.interval  # the janitor's next tick
            requeued, _ = await janitor.requeue_expired()
        assert requeued == [photo_id]
        assert now[0] - started < 5 + 2 * janitor.interval


async def test_a_slow_machine_costs_a_live_worker_neither_its_photo_nor_an_attempt(tmp_path: Path) -> None:
    """The worker is alive and still on the photo, but its renewal came late (a loaded machine): the lease ran
    out. The janitor leaves the claim to it (lease expiry means a dead process, not a slow one), no attempt is
    spent, and the photo completes with one attempt. Under load this used to requeue it, cancel the worker and
    count the attempt; three such and the photo failed. The clock is moved by hand, past the lease."""
    with own_services(tmp_path, lease_seconds=5, max_attempts=1) as svc:
        now = [1_700_000_000.0]
        svc.clock = lambda: now[0]
        gid = await svc.db.write(create_gallery)
        photo_id, _ = stage_photo(svc, gid, photo_jpeg(3))
        pool = WorkerPool(svc, count=1)
        janitor = Janitor(svc)
        # The limiter is let go before the nursery waits: the worker claims, then waits to decode (a slow machine).
        async with trio.open_nursery() as nursery, pool.image_limiter:
            nursery.start_soon(pool.process_one)
            while pool.image_limiter.statistics().tasks_waiting == 0:
                await trio.sleep(0.005)
            now[0] += 5 + 2 * janitor.interval  # its lease ran out while it waited
            requeued, failed = await janitor.requeue_expired()
            row = await svc.db.read(photo_q.get, photo_id)
            assert (requeued, failed, row["status"], row["attempts"]) == ([], [], "processing", 1)
        row = await svc.db.read(photo_q.get, photo_id)
        assert (row["status"], row["attempts"], row["error"]) == ("complete", 1, None)


async def test_the_running_janitor_requeues_a_dead_workers_photo(tmp_path: Path, autojump_clock: Any) -> None:
    """The same through the janitor's own loop, on trio's virtual clock (the rows' clock follows it)."""
    with own_services(tmp_path, lease_seconds=5) as svc:
        svc.clock = trio.current_time
        gid = await svc.db.write(create_gallery)
        photo_id, _ = stage_photo(svc, gid, b"w")
        await svc.db.write(claims.claim_next, "dead-worker", svc.clock(), 5)
        janitor = Janitor(svc)
        async with trio.open_nursery() as nursery:
            await nursery.start(janitor.run)
            # At least 20 virtual seconds of polls, four leases. (Not trio.fail_after: while every task waits on
            # a database thread, the autojump clock skips straight to the nearest deadline.)
            for _ in range(400):
                if (await svc.db.read(photo_q.get, photo_id))["status"] == "pending":
                    break
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        assert (await svc.db.read(photo_q.get, photo_id))["status"] == "pending"


@pytest.mark.slow
async def test_janitor_recovers_a_dead_workers_photo_within_one_lease_in_real_time(tmp_path: Path) -> None:
    """A worker dies holding a claim: about one lease later the photo is pending again (real time, 5 s lease)."""
    with own_services(tmp_path, lease_seconds=5) as svc:
        gid = await svc.db.write(create_gallery)
        photo_id, _ = stage_photo(svc, gid, b"w")
        started = trio.current_time()
        await svc.db.write(claims.claim_next, "dead-worker", svc.clock(), 5)
        janitor = Janitor(svc)
        async with trio.open_nursery() as nursery:
            await nursery.start(janitor.run)
            with trio.fail_after(5 + 2 * janitor.interval):
                while (await svc.db.read(photo_q.get, photo_id))["status"] != "pending":
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        assert trio.current_time() - started < 5 + 2 * janitor.interval


# --- routes ------------------------------------------------------------------------------------------------

async def test_status_retry_and_image_routes(services: Services, client: Any, admin: AuthActions, conn: Any,
                                             gallery_id: int) -> None:
    good, upload = stage_photo(services, gallery_id, photo_jpeg(6), name="Anna’s photo.jpg")
    bad, _ = stage_photo(services, gallery_id, b"\x89PNG\r\n\x1a\n broken", upload_id=upload, fmt="png")
    status = await (await client.get(f"/api/admin/uploads/{upload}")).get_json()
    assert (status["total"], status["pending"], status["complete"]) == (2, 2, 0)
    assert status["photos"][0]["filename"] == "Anna’s photo.jpg" and status["photos"][0]["thumb_url"] is None

    waiting = await client.get(f"/api/admin/photos/{good}/grid")
    assert waiting.status_code == 503 and waiting.headers["Retry-After"]
    conflict = await client.post(f"/api/admin/photos/{good}/retry", headers=admin.headers())
    assert conflict.status_code == 409

    await run_pool_until_idle(services)
    status = await (await client.get(f"/api/admin/uploads/{upload}")).get_json()
    assert (status["complete"], status["failed"], status["done"]) == (1, 1, True)
    failed_entry = next(p for p in status["photos"] if p["id"] == bad)
    assert failed_entry["status"] == "failed" and failed_entry["error"]

    grid = await client.get(status["photos"][0]["thumb_url"])
    assert grid.status_code == 200 and grid.headers["Content-Type"] == "image/jpeg"
    # Both are made again if the watermark changes: an hour, then a 304 while unchanged.
    assert grid.headers["ETag"] and grid.headers["Cache-Control"] == "private, max-age=3600"
    view = await client.get(status["photos"][0]["view_url"])
    assert view.status_code == 200 and view.headers["Cache-Control"] == "private, max-age=3600"
    again = await client.get(status["photos"][0]["thumb_url"], headers={"If-None-Match": grid.headers["ETag"]})
    assert again.status_code == 304
    unprocessable = await client.get(f"/api/admin/photos/{bad}/view")
    assert unprocessable.status_code == 422 and (await unprocessable.get_json())["error"] == failed_entry["error"]
    original = await client.get(f"/api/admin/photos/{good}/original")
    assert original.status_code == 200 and original.headers["Content-Type"] == "image/jpeg"
    assert original.headers["Content-Disposition"].startswith("attachment;")
    assert "filename*=UTF-8''Anna%E2%80%99s%20photo.jpg" in original.headers["Content-Disposition"]

    retried = await client.post(f"/api/admin/photos/{bad}/retry", headers=admin.headers())
    assert retried.status_code == 200 and await retried.get_json() == {"id": bad, "status": "pending"}
    assert (await client.get("/api/admin/uploads/" + "0" * 32)).status_code == 404
    assert (await client.get("/api/admin/uploads/not-an-id")).status_code == 404
    assert (await client.post("/api/admin/photos/999999/retry", headers=admin.headers())).status_code == 404


async def test_guests_see_only_complete_photos(services: Services, client: Any, guest: Any, admin: AuthActions,
                                               conn: Any) -> None:
    gallery = await admin.create_gallery(name="Party")
    await client.post(f"/api/admin/galleries/{gallery['id']}/publish", headers=admin.headers())
    done, upload = stage_photo(services, gallery["id"], photo_jpeg(7))
    await run_pool_until_idle(services)
    waiting, _ = stage_photo(services, gallery["id"], photo_jpeg(8), upload_id=upload)
    slug = gallery["slug"]
    assert (await guest.get(f"/g/{slug}/photos/{done}/grid")).status_code == 200
    assert (await guest.get(f"/g/{slug}/photos/{waiting}/grid")).status_code == 404
    # The admin's upload status is not the guest's to read, and the admin routes need the admin.
    assert (await guest.get(f"/api/g/{slug}/uploads/{upload}")).status_code == 404
    assert (await guest.get(f"/api/admin/photos/{done}/grid")).status_code == 401
    # Another gallery's photo through this gallery's URL: 404.
    other = await admin.create_gallery(name="Other")
    await client.post(f"/api/admin/galleries/{other['id']}/publish", headers=admin.headers())
    assert (await guest.get(f"/g/{other['slug']}/photos/{done}/grid")).status_code == 404
    # Deleting removes the row and the files.
    key = status_of(conn, done)["storage_key"]
    assert (await client.delete(f"/api/admin/photos/{done}", headers=admin.headers())).status_code == 204
    assert not services.storage.original_path(key).exists()
    assert not services.storage.derived_path(key, "grid").exists()
    assert (await guest.get(f"/g/{slug}/photos/{done}/grid")).status_code == 404


async def test_a_slow_uploads_files_are_never_lost_to_the_reconciler(services: Services, conn: Any,
                                                                      gallery_id: int) -> None:
    """A file stored long before its upload commits (a phone on a slow link): its key's reservation expires and
    the reconciler deletes it, then removes the file. The upload's commit finds its reservation gone (a database
    read, no storage call) and reports the file lost instead of answering with a photo whose original is gone."""
    from picpeak_lite.pipeline.intake import Intake, Limits

    services.storage.create_dirs()
    gallery = photo_q_gallery(conn, gallery_id)
    with Intake(db=services.db, storage=services.storage, settings=services.settings, gallery=gallery,
                limits=Limits.admin(services.settings), clock=services.clock) as intake:
        first = intake.start_file("first.jpg")
        await first.write(photo_jpeg(60))
        entry = await intake.finish_file(first)
        assert entry is not None and entry.key is not None
        stored = services.storage.original_path(entry.key)
        later = time.time() + 3600
        services.clock = lambda: later  # the rest of the body took an hour to arrive
        counts = await Janitor(services).reconcile()
        assert counts["orphans_removed"] == 1 and not stored.exists()
        second = intake.start_file("second.jpg")
        await second.write(photo_jpeg(61))
        await intake.finish_file(second)
        await intake.commit(lambda c: photo_q_gallery(c, gallery_id), uploaded_by="admin")
        answer = intake.answer()
    assert [p["filename"] for p in answer["photos"]] == ["second.jpg"]
    assert answer["errors"] == [{"filename": "first.jpg",
                                 "error": "The file was lost before it could be saved; please upload it again."}]
    rows = conn.execute("SELECT storage_key FROM photos").fetchall()
    assert len(rows) == 1 and services.storage.original_path(rows[0]["storage_key"]).exists()


def photo_q_gallery(conn: Any, gallery_id: int) -> dict[str, Any]:
    return conn.execute("SELECT * FROM galleries WHERE id = ?", (gallery_id,)).fetchall()[0]


async def test_sending_a_failed_photo_again_retries_it(services: Services, client: Any, admin: AuthActions,
                                                      conn: Any) -> None:
    gallery = await admin.create_gallery(name="Retry by upload")
    data = photo_jpeg(62)
    photo_id, _ = stage_photo(services, gallery["id"], data)
    with db.transaction(conn):
        conn.execute("UPDATE photos SET status = 'failed', error = 'disk full', attempts = 3 WHERE id = ?",
                     (photo_id,))
    body = (b"--b\r\nContent-Disposition: form-data; name=\"photos\"; filename=\"again.jpg\"\r\n"
            b"Content-Type: image/jpeg\r\n\r\n" + data + b"\r\n--b--\r\n")
    response = await client.post(f"/api/admin/galleries/{gallery['id']}/upload", data=body,
                                 headers={**admin.headers(), "Content-Type": "multipart/form-data; boundary=b"})
    assert response.status_code == 202, await response.get_data(as_text=True)
    answer = await response.get_json()
    assert answer["photos"][0]["duplicate"] is True and answer["photo_ids"] == [photo_id]
    row = status_of(conn, photo_id)
    assert (row["status"], row["error"], row["attempts"]) == ("pending", None, 0)
    assert conn.execute("SELECT count(*) AS n FROM photos").fetchall()[0]["n"] == 1


# --- decode deadline and scan limit (issue 27) --------------------------------------------------------------

async def test_a_scan_bomb_an_older_check_let_in_fails_with_its_sentence(services: Services, conn: Any,
                                                                        gallery_id: int) -> None:
    """Stored without the header check (as by an older version): the decode is handed at most MAX_SCANS scans,
    the photo fails with the sentence, and a good photo of the same run completes."""
    bomb, upload = stage_photo(services, gallery_id, bombs.jpeg_scans(20_000, width=2000, height=2000))
    good, _ = stage_photo(services, gallery_id, photo_jpeg(11), upload_id=upload)
    await run_pool_until_idle(services)
    row = status_of(conn, bomb)
    assert row["status"] == "failed" and row["error"] == images.TOO_MANY_SCANS
    assert status_of(conn, good)["status"] == "complete"


async def test_a_photo_past_its_decode_deadline_fails_and_is_tried_again_on_retry(tmp_path: Path,
                                                                                  autojump_clock: Any) -> None:
    """On trio's virtual clock the deadline passes as soon as the event loop waits for the image child; the
    decode (a scan bomb at the limit, seconds of real work in one block) is stopped by killing the child, and
    the photo fails with the deadline's sentence. A retry runs it again (a fresh attempt, which fails the same way)."""
    with own_services(tmp_path, decode_deadline_seconds=1) as svc:
        svc.clock = trio.current_time
        gid = await svc.db.write(create_gallery)
        slow = bombs.jpeg_scans(images.MAX_SCANS - 1, width=4000, height=4000, refine=True)
        photo_id, _ = stage_photo(svc, gid, slow)
        await run_pool_until_idle(svc)
        row = await svc.db.read(photo_q.get, photo_id)
        assert row["status"] == "failed" and row["error"] == TOO_SLOW.format(seconds=1)
        assert "1 seconds" in row["error"] and row["attempts"] == 1
        assert await svc.db.write(photo_q.retry, photo_id)
        await run_pool_until_idle(svc)
        row = await svc.db.read(photo_q.get, photo_id)
        assert row["status"] == "failed" and row["error"] == TOO_SLOW.format(seconds=1) and row["attempts"] == 1


async def test_an_image_child_that_dies_costs_an_attempt_and_the_server_lives_on(tmp_path: Path) -> None:
    """The image child is killed while it decodes (what a decoder crash or the OOM killer does): the worker lives
    on, the attempt counts and the photo is tried again; at ``max_attempts`` it fails with a sentence, and a good
    photo of the same run completes. The child is killed for real, from outside, as the kernel would."""
    with own_services(tmp_path, max_attempts=2) as svc:
        gid = await svc.db.write(create_gallery)
        slow = bombs.jpeg_scans(images.MAX_SCANS - 1, width=4000, height=4000, refine=True)  # seconds of decoding
        photo_id, _ = stage_photo(svc, gid, slow)
        pool = WorkerPool(svc, count=1)
        killed = 0
        for attempt in (1, 2):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pool.process_one)
                while nursery.child_tasks:  # kill every image child until the attempt is over
                    for pid in image_children():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                            killed += 1
                    await trio.sleep(0.01)
            row = await svc.db.read(photo_q.get, photo_id)
            assert row["attempts"] == attempt
            assert row["status"] == ("pending" if attempt == 1 else "failed"), row
        assert killed >= 2
        assert row["error"] == "The image decoder stopped while reading this file; it may be damaged. (tried 2 times)"
        good, _ = stage_photo(svc, gid, photo_jpeg(5))
        await run_pool_until_idle(svc, count=1)
        assert (await svc.db.read(photo_q.get, good))["status"] == "complete"


def image_children() -> list[int]:
    """This process's image children (trio-parallel's spawned workers), not multiprocessing's resource tracker."""
    found = []
    for pid in tree_pids(os.getpid())[1:]:
        with contextlib.suppress(FileNotFoundError):
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found
