"""Changes pushed, not polled (events/listener.py, schema step 27): on PostgreSQL a commit made by another
connection, as another process would make it, wakes this process's change feed, workers and outbox senders through
LISTEN/NOTIFY. Every fallback poll here is an hour, so only a notification can explain a delivery; ``fail_after``
only stops a hung test. Run with ``--engine postgresql`` (the figures test runs on both engines)."""

from __future__ import annotations

import functools
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from picpeak_lite.events.feed import ChangeFeed
from picpeak_lite.events.listener import DatabaseListener
from picpeak_lite.events.webhooks import WebhookSender
from picpeak_lite.pipeline.worker import WorkerPool
from picpeak_lite.services import Services
from picpeak_lite.store import db
from picpeak_lite.store.queries import email as email_q
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries import webhooks as webhook_q

from .conftest import own_services
from .factories import create_gallery, jpeg, stage_photo
from .test_webhooks import Receiver, settings_for

HOUR = 3600.0
HUNG = 60  # seconds: a hung-test stop, never a bound on the push


def on_another_connection(svc: Services, fn: Any, *args: Any) -> Any:
    """Commit ``fn(conn, *args)`` on a connection of its own, as another process would."""
    conn = db.connect(svc.settings.database)
    try:
        with db.transaction(conn):
            return fn(conn, *args)
    finally:
        conn.close()


@pytest.mark.postgresql
async def test_a_change_committed_by_another_connection_reaches_the_broker(tmp_path: Path) -> None:
    with own_services(tmp_path) as svc:
        gid = await svc.db.write(create_gallery)
        async with trio.open_nursery() as nursery:
            await nursery.start(ChangeFeed(svc, svc.broker, poll_seconds=HOUR).run)
            await nursery.start(DatabaseListener(svc).run)
            # Taken once both are started (the listener's first ring is behind us): only a notification can ring
            # it now, as this process commits nothing more.
            rung = svc.changes_bell.listen()
            with svc.broker.subscribe(lambda change: change.gallery_id == gid) as subscription:
                photo_id, _ = stage_photo(svc, gid, jpeg(1))  # its own connection: no commit listener of ours
                with trio.fail_after(HUNG):
                    await rung.wait()
                    change = await subscription.receive.receive()
            assert (change.photo_id, change.status) == (photo_id, "pending")
            nursery.cancel_scope.cancel()


@pytest.mark.postgresql
def test_only_commits_notify_and_a_big_transaction_notifies_once_per_channel(tmp_path: Path) -> None:
    """NOTIFY is sent at COMMIT, and a transaction's many changes make one notification per channel. Notifications
    arrive in commit order, so everything the first two connections caused is heard before the third's."""
    with own_services(tmp_path) as svc:
        gid = on_another_connection(svc, create_gallery)
        listening, failing, big, last = (db.connect(svc.settings.database) for _ in range(4))
        try:
            listening.execute("LISTEN picpeak_changes")
            listening.execute("LISTEN picpeak_work")
            pids = {name: conn.execute("SELECT pg_backend_pid() AS pid").fetchall()[0]["pid"]
                    for name, conn in (("failing", failing), ("big", big), ("last", last))}
            with pytest.raises(RuntimeError), db.transaction(failing):
                _insert_pending(failing, gid, 3)
                raise RuntimeError("rolled back")
            with db.transaction(big):
                _insert_pending(big, gid, 50)
            with db.transaction(last):
                last.execute("UPDATE photos SET hidden = 1 WHERE id = (SELECT min(id) FROM photos)")
            heard: list[tuple[str, str]] = []
            raw = listening.raw  # type: ignore[attr-defined]  # store/pg.py PgConnection: LISTEN is PostgreSQL's
            for notify in raw.notifies(timeout=HUNG):  # the timeout only stops a hung test
                name = next(n for n, pid in pids.items() if pid == notify.pid)
                heard.append((name, notify.channel))
                if name == "last":
                    break
        finally:
            for conn in (listening, failing, big, last):
                conn.close()
    assert sorted(heard[:2]) == [("big", "picpeak_changes"), ("big", "picpeak_work")]
    assert heard[2:] == [("last", "picpeak_changes")]  # a hidden photo is no work for the workers


def _insert_pending(conn: db.Connection, gallery_id: int, count: int) -> None:
    upload_id = f"{gallery_id:032d}"
    if photo_q.get_upload(conn, upload_id) is None:
        photo_q.create_upload(conn, upload_id, gallery_id, "admin", None, None, time.time())
    for i in range(count):
        photo_q.insert_photo(
            conn, gallery_id=gallery_id, upload_id=upload_id, storage_key=f"{gallery_id}-{i}-{time.time_ns()}",
            sha256=f"{time.time_ns():064x}"[-64:], display_name=f"p{i}.jpg", size=1, format="jpeg",
            uploaded_by="admin", guest_name=None, width=1, height=1, now=time.time(),
        )


@pytest.mark.postgresql
async def test_a_photo_uploaded_elsewhere_wakes_the_workers_of_a_process_without_a_feed(tmp_path: Path) -> None:
    """``picpeak-lite worker`` runs no change feed: the pending photo's own channel starts its workers."""
    with own_services(tmp_path) as svc:
        gid = await svc.db.write(create_gallery)
        async with trio.open_nursery() as nursery:
            await nursery.start(DatabaseListener(svc).run)
            await nursery.start(functools.partial(WorkerPool(svc, count=1, poll_seconds=HOUR).run))
            rung = svc.workers_bell.listen()  # idle workers ring nothing themselves
            photo_id, _ = stage_photo(svc, gid, jpeg(2))
            with trio.fail_after(HUNG):
                await rung.wait()
                while (await svc.db.read(photo_q.get, photo_id))["status"] != "complete":
                    await trio.sleep(0.02)  # the test looks at the row; the workers have only the bell
            nursery.cancel_scope.cancel()


@pytest.mark.postgresql
async def test_a_webhook_queued_by_another_process_is_sent_by_this_one(tmp_path: Path) -> None:
    with own_services(tmp_path) as svc:
        async with trio.open_nursery() as nursery:
            receiver = Receiver()
            await nursery.start(receiver.run)
            settings = settings_for(receiver.url)
            await nursery.start(DatabaseListener(svc).run)
            sender = WebhookSender(svc.db, settings, bell=svc.webhooks_bell, poll_seconds=HOUR)
            await nursery.start(sender.run)
            rung = svc.webhooks_bell.listen()
            on_another_connection(svc, webhook_q.enqueue_event, settings.webhooks, "photo.uploaded", "photo:9:ab",
                                  {"photo_id": 9}, time.time())
            with trio.fail_after(HUNG):
                await rung.wait()
                await receiver.wait_for_requests(1)
            [request] = receiver.requests
            assert request["signature_ok"] and request["headers"]["x-picpeak-event"] == "photo.uploaded"
            nursery.cancel_scope.cancel()


@pytest.mark.postgresql
async def test_an_email_queued_by_another_process_rings_the_email_sender(tmp_path: Path) -> None:
    with own_services(tmp_path) as svc:
        async with trio.open_nursery() as nursery:
            await nursery.start(DatabaseListener(svc).run)
            rung = svc.email_bell.listen()
            on_another_connection(svc, functools.partial(
                email_q.enqueue, message_id="<m1@test>", dedup_key="test:1", kind="test", gallery_id=None,
                recipient="a@example.test", subject="S", message=b"body", now=time.time()))
            with trio.fail_after(HUNG):
                await rung.wait()
            nursery.cancel_scope.cancel()


@pytest.mark.postgresql
async def test_the_listener_reconnects_after_its_connection_is_ended(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="picpeak_lite.events.listener")
    with own_services(tmp_path) as svc:
        gid = await svc.db.write(create_gallery)
        async with trio.open_nursery() as nursery:
            await nursery.start(ChangeFeed(svc, svc.broker, poll_seconds=HOUR).run)
            listener = DatabaseListener(svc)
            await nursery.start(listener.run)
            first = listener.backend_pid
            assert first is not None
            reconnected = listener.reconnected
            ended = on_another_connection(svc, lambda conn: conn.execute(
                "SELECT pg_terminate_backend(?) AS ended", (first,)).fetchall()[0]["ended"])
            assert ended == 1
            with trio.fail_after(HUNG):
                await reconnected.wait()
            assert listener.backend_pid not in (None, first) and listener.reconnects == 1
            rung = svc.changes_bell.listen()  # after the ring that follows the reconnection
            with svc.broker.subscribe(lambda change: change.gallery_id == gid) as subscription:
                photo_id, _ = stage_photo(svc, gid, jpeg(3))
                with trio.fail_after(HUNG):
                    await rung.wait()
                    change = await subscription.receive.receive()
            assert change.photo_id == photo_id
            nursery.cancel_scope.cancel()
    lost = [r for r in caplog.records if "was lost" in r.getMessage()]
    back = [r for r in caplog.records if "listening again" in r.getMessage()]
    assert (len(lost), len(back)) == (1, 1), [r.getMessage() for r in caplog.records]


@pytest.mark.sqlite
def test_the_listener_is_refused_on_sqlite(tmp_path: Path) -> None:
    with own_services(tmp_path) as svc, pytest.raises(ValueError, match="only PostgreSQL"):
        DatabaseListener(svc)


@pytest.mark.slow
async def test_cross_process_push_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Commit-to-broker time of a change committed by another connection, with each engine's default fallback
    poll: PostgreSQL's listener (poll 1 s) against SQLite's 20 ms poll. Printed, never asserted."""
    with own_services(tmp_path) as svc:
        gid = await svc.db.write(create_gallery)
        photo_id, _ = stage_photo(svc, gid, jpeg(4))
        writer = db.connect(svc.settings.database)
        latencies: list[float] = []
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(ChangeFeed(svc, svc.broker).run)
                if svc.db.dialect == "postgresql":
                    await nursery.start(DatabaseListener(svc).run)

                def toggle() -> float:
                    with db.transaction(writer):
                        writer.execute("UPDATE photos SET hidden = 1 - hidden WHERE id = ?", (photo_id,))
                    return time.perf_counter()

                with svc.broker.subscribe(lambda change: change.photo_id == photo_id) as subscription:
                    for _ in range(60):
                        committed = await trio.to_thread.run_sync(toggle)
                        with trio.fail_after(HUNG):
                            await subscription.receive.receive()
                        latencies.append(time.perf_counter() - committed)
                        await trio.sleep(0.013)  # not in step with the poll
                nursery.cancel_scope.cancel()
        finally:
            writer.close()
    ms = sorted(x * 1000 for x in latencies)
    p95 = ms[int(len(ms) * 0.95) - 1]
    with capsys.disabled():
        print(f"\nnotify: cross_process_push_ms_p50={statistics.median(ms):.1f} p95={p95:.1f} "
              f"engine={svc.db.dialect} changes={len(ms)}")
