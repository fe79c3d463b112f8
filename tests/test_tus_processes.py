"""tus uploads answered by several processes on one data directory and database (issues 29 and 31).

Each "process" here is a :class:`Services` of its own on the same settings (its own ``instance``, its own
database connections) with the real app in front of it; where the per-process memory of the old design matters
(the writers of ``pipeline/resumable.py`` are kept per trio run), the other process runs in a trio run of its
own, in a thread (:func:`in_other_process`). The chunks of one upload alternate between two processes; a PATCH
reaching one process while a request in another writes the upload is told 423; a writer whose process died is
taken over once its lease has run out, and its late writes are fenced; a DELETE in another process fences the
writer; the janitor's expiry in another process keeps the bytes of an upload being written; the finisher in one
process and the last PATCH in another make one photo; HEAD in any process answers 423 while a try at the photo
holds its claim. Time runs on trio's autojump clock, except where two trio runs share the work (real time there,
and nothing asserted about it).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from picpeak_lite.errors import NotFound
from picpeak_lite.pipeline import resumable
from picpeak_lite.services import Services
from picpeak_lite.store.db import Database
from picpeak_lite.store.queries import tus as tus_q
from picpeak_lite.web.app import create_app

from .conftest import make_settings
from .factories import photo_jpeg
from .harness import figures, query
from .served import prepare

TUS = {"Tus-Resumable": "1.0.0"}
OCTETS = {**TUS, "Content-Type": "application/offset+octet-stream"}


class Process:
    """One serving process: its Services and its app's test client, on the shared data directory and database."""

    def __init__(self, settings: Any, token: str, clock: Callable[[], float]) -> None:
        self.svc = Services(settings=settings, db=Database(settings.database), monotonic=trio.current_time,
                            clock=clock)
        self.http = create_app(self.svc).test_client()
        self.auth = {"Authorization": f"Bearer {token}", **TUS}

    async def create(self, length: int) -> str:
        answer = await self.http.post("/api/admin/galleries/1/tus", headers={**self.auth, "Upload-Length": str(length)})
        assert answer.status_code == 201
        return str(answer.headers["Location"])

    async def patch(self, location: str, offset: int, data: bytes) -> Any:
        return await self.http.patch(location, data=data, headers={**self.auth, **OCTETS,
                                                                   "Upload-Offset": str(offset)})

    async def head(self, location: str) -> Any:
        return await self.http.head(location, headers=self.auth)


def two_processes(tmp_path: Path, *, autojump: bool, **overrides: Any) -> tuple[Any, Process, Process]:
    settings = make_settings(tmp_path, **overrides)
    token = prepare(settings)
    base = time.time()
    clock = (lambda: base + trio.current_time()) if autojump else time.time
    return settings, Process(settings, token, clock), Process(settings, token, clock)


def in_other_process(settings: Any, now: float, work: Callable[[Services], Awaitable[Any]]) -> Any:
    """``work(svc)`` in a trio run of its own, in this thread, with Services of its own whose clock says ``now``:
    another process as far as the code can tell (its own instance id, its own per-run memory)."""
    async def main() -> Any:
        svc = Services(settings=settings, db=Database(settings.database), clock=lambda: now)
        try:
            return await work(svc)
        finally:
            svc.db.close()
    return trio.run(main)


def row_of(settings: Any, location: str) -> dict[str, Any]:
    return query(settings.data_path, "SELECT * FROM tus_uploads WHERE id = ?", location.rsplit("/", 1)[1])[0]


def photos(settings: Any) -> list[dict[str, Any]]:
    return query(settings.data_path, "SELECT id, sha256 FROM photos ORDER BY id")


def close(*processes: Process) -> None:
    for process in processes:
        process.svc.db.close()


async def test_chunks_of_one_upload_alternate_between_two_processes(tmp_path: Path, autojump_clock: Any) -> None:
    settings, a, b = two_processes(tmp_path, autojump=True)
    try:
        data = photo_jpeg(60, size=(1200, 900), quality=95)
        location = await a.create(len(data))
        offset, answer, hops = 0, None, 0
        while offset < len(data):
            process = (a, b)[hops % 2]
            answer = await process.patch(location, offset, data[offset:offset + 50_000])
            assert answer.status_code == 204, await answer.get_data(as_text=True)
            offset = int(answer.headers["Upload-Offset"])
            assert row_of(settings, location)["writer_token"] is None  # each request let its lease go
            hops += 1
        assert answer is not None and hops >= 4
        photo_id = int(answer.headers["Picpeak-Photo-Id"])
        for process in (a, b):
            head = await process.head(location)
            assert head.status_code == 200 and int(head.headers["Picpeak-Photo-Id"]) == photo_id
        assert photos(settings) == [{"id": photo_id, "sha256": hashlib.sha256(data).hexdigest()}]
    finally:
        close(a, b)


async def test_a_patch_to_another_process_while_one_writes_is_423_and_a_dead_writer_is_taken_over(
        tmp_path: Path, autojump_clock: Any) -> None:
    settings, a, b = two_processes(tmp_path, autojump=True)
    try:
        data = photo_jpeg(61, size=(1200, 900), quality=95)
        location = await a.create(len(data))
        tus_id = location.rsplit("/", 1)[1]
        told: list[Any] = []
        piece, pieces = 2_000, 30

        async def body() -> AsyncIterator[bytes]:
            for i in range(pieces):
                yield data[i * piece:(i + 1) * piece]
                await trio.sleep(3)  # a slow client: the chunk takes 90 s, three times the first lease
                if i in (0, pieces - 2):  # at once, and long past the first lease (so it was renewed)
                    told.append(await b.patch(location, 0, b"x" * 100))
                    told.append(await b.head(location))

        row = (await a.svc.db.read(tus_q.get, tus_id))
        assert await resumable.write_chunk(a.svc, row, 0, body(), content_length=None, checksum=None) == piece * pieces
        for refused, head in (told[0:2], told[2:4]):
            # B may not write while A's request holds the upload: 423, and when to ask again.
            assert refused.status_code == 423
            assert 1 <= int(refused.headers["Retry-After"]) <= resumable.WRITER_LEASE_SECONDS
            assert "Another request is sending this upload" in (await refused.get_json())["error"]
            assert head.status_code == 200 and head.headers["Upload-Offset"] == "0"  # HEAD is never held
        stored = row_of(settings, location)
        assert stored["upload_offset"] == piece * pieces and stored["writer_token"] is None
        # A's lease is gone with its request: B goes on at once.
        offset = piece * pieces
        answer = await b.patch(location, offset, data[offset:offset + 10_000])
        assert answer.status_code == 204
        offset += 10_000

        # A process that took the lease and died (kill -9, power cut): its lease stays in the row, and the bytes
        # it wrote past the recorded offset stay in the file, unrecorded.
        dead = Services(settings=settings, db=Database(settings.database), clock=a.svc.clock)
        try:
            now = dead.clock()
            assert await dead.db.write(tus_q.claim_writer, tus_id, offset, dead.instance, "dead-token", now,
                                       now + resumable.WRITER_LEASE_SECONDS) is not None
            with open(resumable.partial_path(a.svc.storage, tus_id), "ab") as f:
                f.write(b"\0" * 5_000)
            refused = await b.patch(location, offset, data[offset:offset + 10_000])
            assert refused.status_code == 423
            await trio.sleep(resumable.WRITER_LEASE_SECONDS - 2)
            assert (await a.patch(location, offset, data[offset:offset + 10_000])).status_code == 423
            await trio.sleep(3)
            # Its time is over: taken over, the unrecorded bytes cut back, and the rest goes up.
            while offset < len(data):
                answer = await (a, b)[offset % 2].patch(location, offset, data[offset:offset + 60_000])
                assert answer.status_code == 204
                offset = int(answer.headers["Upload-Offset"])
            photo_id = int(answer.headers["Picpeak-Photo-Id"])
            # The dead writer's late writes are fenced by its token: it can never move the offset.
            assert not await dead.db.write(tus_q.set_offset, tus_id, "dead-token", 1, dead.clock() + 60)
            assert not await dead.db.write(tus_q.renew_writer, tus_id, "dead-token", dead.clock() + 60,
                                           dead.clock() + 60)
        finally:
            dead.db.close()
        assert row_of(settings, location)["upload_offset"] == len(data)
        assert photos(settings) == [{"id": photo_id, "sha256": hashlib.sha256(data).hexdigest()}]
    finally:
        close(a, b)


async def test_a_delete_in_another_process_ends_the_upload_and_fences_its_writer(
        tmp_path: Path, autojump_clock: Any) -> None:
    """tus termination reaching B while A's request writes: the upload goes at once; A's request, which may not
    be cancelled from another process, records nothing (its lease went with the row) and is told 404."""
    settings, a, b = two_processes(tmp_path, autojump=True)
    try:
        location = await a.create(100_000)
        tus_id = location.rsplit("/", 1)[1]
        deleted: list[int] = []

        async def body() -> AsyncIterator[bytes]:
            for i in range(10):
                yield b"x" * 1_000
                await trio.sleep(4)
                if i == 2:
                    deleted.append((await b.http.delete(location, headers=b.auth)).status_code)

        row = await a.svc.db.read(tus_q.get, tus_id)
        with pytest.raises(NotFound):
            await resumable.write_chunk(a.svc, row, 0, body(), content_length=None, checksum=None)
        assert deleted == [204]
        assert query(settings.data_path, "SELECT count(*) AS n FROM tus_uploads")[0]["n"] == 0
        assert query(settings.data_path, "SELECT count(*) AS n FROM uploads")[0]["n"] == 0  # its group went too
        for process in (a, b):
            assert (await process.head(location)).status_code == 404
        assert not resumable.partial_path(a.svc.storage, tus_id).exists()
    finally:
        close(a, b)


async def test_expiry_in_another_process_keeps_an_upload_being_written(tmp_path: Path, autojump_clock: Any) -> None:
    """A client sending one long chunk for 20 minutes (past tus_idle_minutes): the janitor of another process
    runs meanwhile and must not expire it; once the chunk is recorded and the upload then idles, it does."""
    settings, a, b = two_processes(tmp_path, autojump=True, tus_idle_minutes=15)
    try:
        location = await a.create(100_000)
        tus_id = location.rsplit("/", 1)[1]
        expired_while_writing: list[int] = []

        async def body() -> AsyncIterator[bytes]:
            for i in range(60):
                yield bytes([i]) * 1_000
                await trio.sleep(20)
                if i == 50:  # 17 minutes in: the other process's janitor
                    expired_while_writing.append(await trio.to_thread.run_sync(
                        in_other_process, settings, a.svc.clock(), resumable.expire))

        row = await a.svc.db.read(tus_q.get, tus_id)
        assert await resumable.write_chunk(a.svc, row, 0, body(), content_length=None, checksum=None) == 60_000
        assert expired_while_writing == [0]
        assert resumable.partial_path(a.svc.storage, tus_id).read_bytes() == b"".join(bytes([i]) * 1_000
                                                                                     for i in range(60))
        head = await b.head(location)
        assert head.status_code == 200 and head.headers["Upload-Offset"] == "60000"
        # Idle now: past tus_idle_minutes the other process's janitor expires it (it does run, and works).
        await trio.sleep(16 * 60)
        assert await trio.to_thread.run_sync(in_other_process, settings, a.svc.clock(), resumable.expire) == 1
        assert (await a.head(location)).status_code == 410
        assert not resumable.partial_path(a.svc.storage, tus_id).exists()
    finally:
        close(a, b)


async def test_head_in_any_process_is_423_while_a_try_is_claimed_and_a_dead_try_is_taken_over(
        tmp_path: Path, autojump_clock: Any) -> None:
    settings, a, b = two_processes(tmp_path, autojump=True)
    try:
        data = photo_jpeg(62)
        location = await a.create(len(data))
        tus_id = location.rsplit("/", 1)[1]

        async def whole() -> AsyncIterator[bytes]:
            yield data

        # Every byte durable (what the last PATCH does before it asks for the photo), and then a third process
        # claims the try at the photo and dies before it made it.
        row = await a.svc.db.read(tus_q.get, tus_id)
        assert await resumable.write_chunk(a.svc, row, 0, whole(), content_length=len(data), checksum=None) == len(data)
        dead = Services(settings=settings, db=Database(settings.database), clock=a.svc.clock)
        try:
            now = dead.clock()
            deadline = resumable.finish_deadline(len(data), now)
            assert await dead.db.write(tus_q.claim_finish, tus_id, "dead-try", now, deadline) is not None
            for process in (a, b):
                head = await process.head(location)
                # Not the full offset (a client takes it for success): 423, and when to ask again.
                assert head.status_code == 423 and "Upload-Offset" not in head.headers
                assert int(head.headers["Retry-After"]) >= 1
            finisher_b = resumable.Finisher(b.svc)
            assert await finisher_b.finish_due() == 0  # a live claim is left to its try
            assert photos(settings) == []
            await trio.sleep(deadline - dead.clock() + 1)
            assert await finisher_b.finish_due() == 1  # past its deadline: taken over, the photo made
            assert not await dead.db.write(tus_q.release_finish, tus_id, "dead-try")  # its late release: nothing
        finally:
            dead.db.close()
        [photo] = photos(settings)
        assert photo["sha256"] == hashlib.sha256(data).hexdigest()
        for process in (a, b):
            head = await process.head(location)
            assert head.status_code == 200 and int(head.headers["Picpeak-Photo-Id"]) == photo["id"]
        assert row_of(settings, location)["finish_attempts"] == 0
    finally:
        close(a, b)


async def test_the_finisher_in_one_process_and_the_last_patch_in_another_make_one_photo(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """B's Finisher runs in a trio run of its own, in a loop, while A's last PATCHes arrive: whichever claims a
    try makes the photo, the other learns it; never two photos, never a failed try."""
    settings, a, _b = two_processes(tmp_path, autojump=False)
    try:
        files = [photo_jpeg(70 + i, size=(1200, 900), quality=95) for i in range(6)]
        locations = []
        for data in files:
            location = await a.create(len(data))
            assert (await a.patch(location, 0, data[:-20_000])).status_code == 204
            locations.append(location)
        stop = threading.Event()
        settled_by_b: list[int] = []

        async def finisher_loop(svc: Services) -> int:
            finisher, settled = resumable.Finisher(svc), 0
            while not stop.is_set():
                settled += await finisher.finish_due()
                await trio.sleep(0.005)
            return settled

        def run_b() -> None:
            settled_by_b.append(in_other_process_live(settings, finisher_loop))

        answers: dict[str, Any] = {}

        async def last_patch(location: str, data: bytes) -> None:
            answers[location] = await a.patch(location, len(data) - 20_000, data[-20_000:])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, run_b)
            with trio.fail_after(120):  # a hung-test stop only
                async with trio.open_nursery() as patches:
                    for location, data in zip(locations, files, strict=True):
                        patches.start_soon(last_patch, location, data)
            stop.set()
        made = {p["sha256"]: p["id"] for p in photos(settings)}
        assert len(made) == len(files) and len(photos(settings)) == len(files)
        for location, data in zip(locations, files, strict=True):
            answer = answers[location]
            assert answer.status_code == 204, await answer.get_data(as_text=True)
            assert int(answer.headers["Picpeak-Photo-Id"]) == made[hashlib.sha256(data).hexdigest()]
            row = row_of(settings, location)
            assert row["state"] == "done" and row["finish_attempts"] == 0 and row["finish_token"] is None
        # The other process's Finisher counts the uploads it settled: made their photo, or learned it was made.
        figures(capsys, f"tus_two_processes_finish: uploads={len(files)} photos={len(made)} "
                        f"other_process_finisher_settled={settled_by_b[0]} failed_tries=0")
    finally:
        close(a, _b)


def in_other_process_live(settings: Any, work: Callable[[Services], Awaitable[Any]]) -> Any:
    """As :func:`in_other_process`, on the real clock (for work that runs beside this run's requests)."""
    async def main() -> Any:
        svc = Services(settings=settings, db=Database(settings.database))
        try:
            return await work(svc)
        finally:
            svc.db.close()
    return trio.run(main)
