"""Issue 18: uploads run at most ``upload_lead`` photos ahead of the workers, and only while workers take photos
(runtime/backlog.py). A real SQLite file, real claims, the real server and worker pool; the stall rule on
trio's autojump clock."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import httpx
import trio

from picpeak_lite.runtime.backlog import HOLD_SECONDS, STALL_SECONDS, Backlog
from picpeak_lite.runtime.broker import Change
from picpeak_lite.services import Services
from picpeak_lite.store.queries import claims

from .conftest import make_settings, own_services
from .factories import add_photo, create_gallery, jpeg
from .harness import query
from .test_streaming_intake import HANG_GUARD
from .test_streaming_intake import _wait as _until
from .test_upload import _serve, multipart


def _claimed(photo_id: int) -> Change:
    """What the change feed hands the backlog when a worker claims ``photo_id``."""
    return Change(seq=photo_id, photo_id=photo_id, gallery_id=1, upload_id="u", status="processing", hidden=False)


async def _pending_photos(svc: Services, count: int) -> list[int]:
    gallery_id = await svc.db.write(create_gallery)
    return [add_photo(svc, gallery_id, status="pending") for _ in range(count)]


async def _upload_six(settings: Any, nursery: trio.Nursery) -> Any:
    """The real server on ``settings``, once it has answered one admin request of six photos with a 202."""
    running, token = await _serve(settings, nursery)
    body, headers = multipart([(f"{i}.jpg", jpeg(i, (320, 240))) for i in range(6)])
    async with httpx.AsyncClient(base_url=running.url, headers={"Authorization": f"Bearer {token}"},
                                 timeout=HANG_GUARD) as http:
        answer = await http.post("/api/admin/galleries/1/upload", content=body, headers=headers)
    assert answer.status_code == 202, answer.text
    assert len(answer.json()["photos"]) == 6
    return running


async def test_an_upload_waits_for_a_worker_once_the_lead_is_reached(tmp_path: Path) -> None:
    with own_services(tmp_path) as svc:
        ids = await _pending_photos(svc, 2)
        backlog = Backlog(svc.db, lead=2)
        backlog.saw(_claimed(0))  # a worker is taking photos
        done = trio.Event()

        async def upload() -> None:
            await backlog.wait_for_room()
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(upload)
            await _until(lambda: backlog.waiting == 1)
            assert not done.is_set()  # two photos wait for a worker: the next file waits too
            token = secrets.token_hex(8)
            claimed = await svc.db.write(claims.claim_next, token, 0.0, 60.0)
            assert claimed is not None and claimed["id"] == ids[0]
            backlog.saw(_claimed(claimed["id"]))
            with trio.fail_after(HANG_GUARD):
                await done.wait()
        assert backlog.waiting == 0


async def test_below_the_lead_or_with_no_lead_nothing_waits(tmp_path: Path, autojump_clock: Any) -> None:
    with own_services(tmp_path) as svc:
        await _pending_photos(svc, 2)
        began = trio.current_time()
        for backlog in (Backlog(svc.db, lead=3), Backlog(svc.db, lead=0)):
            backlog.saw(_claimed(0))
            await backlog.wait_for_room()
        assert trio.current_time() == began


async def test_with_no_worker_taking_photos_uploads_are_not_held_back(tmp_path: Path, autojump_clock: Any) -> None:
    """Holding an upload back helps only while workers take photos: with none known (processing off, no
    ``picpeak-lite worker``), the gate is open at once; once they stop, it opens after STALL_SECONDS."""
    with own_services(tmp_path) as svc:
        await _pending_photos(svc, 2)
        backlog = Backlog(svc.db, lead=1)
        began = trio.current_time()
        await backlog.wait_for_room()
        assert trio.current_time() == began  # no claim was ever seen
        backlog.saw(_claimed(0))
        await backlog.wait_for_room()  # the workers took one photo, then nothing more
        assert trio.current_time() - began >= STALL_SECONDS
        await backlog.wait_for_room()
        assert trio.current_time() - began < 2 * STALL_SECONDS  # still stalled: no second wait


async def test_a_request_larger_than_the_lead_is_taken_and_processed(tmp_path: Path) -> None:
    """The real server with a lead of one photo: the workers' claims reach the backlog through the change feed
    and let each file of the request in; nothing is lost or stuck."""
    settings = make_settings(tmp_path, shutdown_grace_seconds=1, workers=1, upload_lead=1)
    async with trio.open_nursery() as nursery:
        running = await _upload_six(settings, nursery)
        assert running.services.backlog.workers_taking()  # told of the claims by the change feed

        def statuses() -> list[str]:
            return [r["status"] for r in query(settings.data_path, "SELECT status FROM photos ORDER BY id")]

        await _until(lambda: statuses() == ["complete"] * 6)
        running.stop()


async def test_with_processing_off_a_request_larger_than_the_lead_is_not_held(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, shutdown_grace_seconds=1, processing_enabled=False, upload_lead=1)
    async with trio.open_nursery() as nursery:
        running = await _upload_six(settings, nursery)
        assert running.services.backlog.waiting == 0 and not running.services.backlog.workers_taking()
        rows = query(settings.data_path, "SELECT status FROM photos")
        assert [r["status"] for r in rows] == ["pending"] * 6  # for `picpeak-lite worker`, when it runs
        running.stop()


async def test_a_file_is_held_back_for_hold_seconds_at_most(tmp_path: Path, autojump_clock: Any) -> None:
    """Workers keep taking photos but other uploads keep the lead reached (every claim's room taken by someone
    else): the file waits ``HOLD_SECONDS``, then is let in, and that is counted."""
    with own_services(tmp_path) as svc:
        await _pending_photos(svc, 2)
        backlog = Backlog(svc.db, lead=1)
        waited = []

        async def upload() -> None:
            began = trio.current_time()
            await backlog.wait_for_room()
            waited.append(trio.current_time() - began)

        async def parked() -> None:
            """Until the upload waits on the bell, or is done. Without sleeping: while its count of pending photos
            runs in a thread, the autojump clock would run ahead."""
            for _ in range(10_000_000):  # a hang guard in checkpoints: the clock does not move while this runs
                if backlog.waiting or waited:
                    return
                await trio.lowlevel.checkpoint()
            raise AssertionError("the upload neither waits for room nor has it")

        async with trio.open_nursery() as nursery:
            backlog.saw(_claimed(0))
            nursery.start_soon(upload)
            for n in range(1, 1000):  # a claim every second, the pending count never below the lead
                await parked()
                if waited:
                    break
                await trio.sleep(1)
                backlog.saw(_claimed(n))
        assert HOLD_SECONDS <= waited[0] <= HOLD_SECONDS + STALL_SECONDS
        assert backlog.let_in_late == 1 and backlog.waiting == 0
