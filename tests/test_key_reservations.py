"""No storage call inside a write transaction (issue 30), and the key reservations that made that possible.

With S3 every storage call is a network request; made inside ``db.write`` it holds the single writer (on SQLite
every writer of every process, on PostgreSQL the named lock) for as long as the bucket takes to answer. The
watch here is a real database and a real local storage, each a subclass used only by these tests: the database
marks the thread that runs a write transaction's function, and the storage notes every public call made from
such a thread. The real app, real uploads, the real worker pool and the real reconciler run over them.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
import trio

from picpeak_lite.config import Settings
from picpeak_lite.domain.accounts import CLI
from picpeak_lite.errors import Conflict
from picpeak_lite.ops import bootstrap
from picpeak_lite.pipeline import replacement
from picpeak_lite.pipeline.janitor import Janitor, claim_orphans
from picpeak_lite.services import Services
from picpeak_lite.store import db
from picpeak_lite.store.db import Database
from picpeak_lite.store.queries import reservations as reservations_q
from picpeak_lite.store.storage import LocalStorage, new_key

from . import pgserver
from .conftest import ADMIN_PASSWORD, AuthActions, sql
from .factories import photo_jpeg, published, run_pool_until_idle
from .test_replace import replace, shot, step
from .test_upload import admin_upload

T = TypeVar("T")


class WatchedDatabase(Database):
    """The real database; each write transaction's function runs with its thread marked."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self._marks = threading.local()
        self.writes = 0
        self.held: dict[str, float] = {}  # seconds spent inside write transactions' functions, by function name
        self.called: list[str] = []  # the write transactions' functions, by name, in order

    def in_write(self) -> bool:
        return bool(getattr(self._marks, "inside", False))

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        def marked(conn: db.Connection, *inner: Any) -> T:
            self._marks.inside = True
            self.writes += 1
            started = time.perf_counter()
            try:
                return fn(conn, *inner)
            finally:
                self._marks.inside = False
                name = getattr(fn, "__name__", "?")
                self.called.append(name)
                self.held[name] = self.held.get(name, 0.0) + time.perf_counter() - started

        return await super().write(marked, *args)


@dataclass(frozen=True)
class WatchedStorage(LocalStorage):
    """The real local storage; every public method call is counted, and named when it came from inside a write."""

    db: WatchedDatabase = field(compare=False, default=None)  # type: ignore[assignment]
    inside: list[str] = field(compare=False, default_factory=list)
    outside: list[str] = field(compare=False, default_factory=list)

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if name.startswith("_") or not inspect.ismethod(value):
            return value
        database = super().__getattribute__("db")
        inside, outside = super().__getattribute__("inside"), super().__getattribute__("outside")

        @functools.wraps(value)
        def watched(*args: Any, **kwargs: Any) -> Any:
            (inside if database.in_write() else outside).append(name)
            return value(*args, **kwargs)

        return watched


@pytest.fixture
async def services(settings: Settings) -> AsyncIterator[Services]:
    """As conftest's, over the watched database and storage."""
    bootstrap.prepare(settings)
    bootstrap.ensure_admin(settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
    database = WatchedDatabase(settings.database)
    svc = Services(settings=settings, db=database, monotonic=trio.current_time)
    svc.storage = WatchedStorage(settings.data_path, database)
    yield svc
    database.close()


def watched(services: Services) -> WatchedStorage:
    storage = services.storage
    assert isinstance(storage, WatchedStorage)
    return storage


async def test_no_storage_call_happens_inside_a_write_transaction(admin: AuthActions, services: Services) -> None:
    """Uploads, processing, a replacement confirmed, a delete, and a reconciler round that removes an orphan and
    fails a photo whose original went missing: every storage call is made outside the write transactions."""
    storage = watched(services)

    def none_inside(stage: str) -> None:
        assert storage.inside == [], f"{stage}: storage calls inside a write transaction: {sorted(set(storage.inside))}"

    gallery = await published(admin, name="Watched")
    gid = gallery["id"]
    sent = await admin_upload(admin, gid, [("a.jpg", shot(1)), ("b.jpg", shot(2)), ("c.jpg", shot(3))])
    assert sent.status_code == 202, await sent.get_data(as_text=True)
    first, second, third = (await sent.get_json())["photo_ids"]
    none_inside("upload")
    await run_pool_until_idle(services)
    none_inside("processing")
    assert (await replace(admin, gid, first, shot(4))).status_code == 202
    none_inside("replacement")
    await run_pool_until_idle(services)
    assert (await step(admin, gid, first, "confirm")).status_code == 200
    assert (await admin.client.delete(f"/api/admin/photos/{second}", headers=admin.headers())).status_code == 204
    none_inside("confirm and delete")
    # A crash between an upload's reservation and its row, an hour ago; and an original lost from the disk.
    crashed = new_key()
    await services.db.write(reservations_q.reserve, [crashed], services.clock() - 3600)
    temp = storage.new_temp_path()
    temp.write_bytes(b"stored, never committed")
    storage.commit_original(temp, crashed)
    os.utime(storage.original_path(crashed), (time.time() - 3600,) * 2)
    lost = sql(services, "SELECT storage_key FROM photos WHERE id = ?", third)[0]["storage_key"]
    os.unlink(storage.original_path(lost))
    counts = await Janitor(services).reconcile()
    none_inside("reconciler")
    assert (counts["orphans_removed"], counts["missing_failed"]) == (1, 1)
    assert not storage.has_original(crashed)
    assert sql(services, "SELECT status FROM photos WHERE id = ?", third)[0]["status"] == "failed"
    # Not vacuous: the watch saw the writes and the storage calls of all of the above.
    assert services.db.writes > 10  # type: ignore[attr-defined]
    assert {"commit_original", "has_original", "remove_photo_files"} <= set(storage.outside)


async def test_a_reserved_file_is_kept_until_its_reservation_expires(services: Services) -> None:
    """The reservation decides, not the file's age: a file written long ago (a slow bucket's PUT) stays while its
    key is reserved, and goes with the reservation once that is older than the grace period. A reservation whose
    file was never written is cleared too; a normal upload leaves none behind."""
    storage = watched(services)
    storage.create_dirs()
    slow, never_written = new_key(), new_key()
    now = time.time()
    await services.db.write(reservations_q.reserve, [slow], now)
    await services.db.write(reservations_q.reserve, [never_written], now)
    temp = storage.new_temp_path()
    temp.write_bytes(b"arrived slowly")
    storage.commit_original(temp, slow)
    os.utime(storage.original_path(slow), (now - 3600, now - 3600))
    services.clock = lambda: now + 60
    assert (await Janitor(services).reconcile())["orphans_removed"] == 0
    assert storage.original_path(slow).exists()
    services.clock = lambda: now + 3600
    assert (await Janitor(services).reconcile())["orphans_removed"] == 1  # the one with a file
    assert not storage.original_path(slow).exists()
    assert sql(services, "SELECT storage_key FROM key_reservations") == []


async def test_an_upload_takes_its_reservations_and_the_reconciler_leaves_its_files(
        admin: AuthActions, services: Services) -> None:
    """Every reservation is taken by the commit (a duplicate's too, its file removed by the intake): none is left
    for the reconciler, which an hour later leaves every row's file alone."""
    gallery = await published(admin, name="Taken")
    twice = photo_jpeg(70)
    sent = await admin_upload(admin, gallery["id"], [("a.jpg", twice), ("b.jpg", photo_jpeg(71)),
                                                     ("a-again.jpg", twice)])
    assert sent.status_code == 202
    assert sql(services, "SELECT storage_key FROM key_reservations") == []
    services.clock = lambda: time.time() + 3600
    assert (await Janitor(services).reconcile())["orphans_removed"] == 0
    keys = [r["storage_key"] for r in sql(services, "SELECT storage_key FROM photos ORDER BY id")]
    assert len(keys) == 2 and all(watched(services).has_original(k) for k in keys)


async def test_a_request_of_many_files_reserves_its_keys_in_doubling_blocks(
        admin: AuthActions, services: Services) -> None:
    """Twelve files reserve their keys in four writes (1, 2, 4 and 8 keys), not twelve: each write is a commit the
    workers' writes queue behind (on SQLite an fsync). The three keys left over are given back at the end."""
    gallery = await published(admin, name="Blocks")
    database = services.db
    assert isinstance(database, WatchedDatabase)
    before = len(database.called)
    sent = await admin_upload(admin, gallery["id"], [(f"p{i}.jpg", photo_jpeg(80 + i)) for i in range(12)])
    assert sent.status_code == 202
    assert database.called[before:].count("renew") == 4
    assert len(sql(services, "SELECT id FROM photos WHERE gallery_id = ?", gallery["id"])) == 12
    assert sql(services, "SELECT storage_key FROM key_reservations") == []


async def test_a_replacement_whose_reservation_expired_reports_its_file_lost(admin: AuthActions,
                                                                            services: Services) -> None:
    """The replacement's swap takes its reservation as an upload's commit does: once the reconciler deleted it
    (the new file waited past the grace period), the swap says the file was lost and the photo stays as it was."""
    gallery = await published(admin, name="Replaced late")
    sent = await admin_upload(admin, gallery["id"], [("a.jpg", shot(5))])
    (photo,) = (await sent.get_json())["photo_ids"]
    await run_pool_until_idle(services)
    before = sql(services, "SELECT storage_key, status FROM photos WHERE id = ?", photo)[0]
    row = sql(services, "SELECT * FROM galleries WHERE id = ?", gallery["id"])[0]
    with replacement.open_intake(services, row) as intake:
        sink = intake.start_file("a-edit.jpg")
        await sink.write(shot(6))
        entry = await intake.finish_file(sink)
        assert entry is not None and entry.key is not None
        later = time.time() + 3600
        services.clock = lambda: later
        assert (await Janitor(services).reconcile())["orphans_removed"] == 1
        with pytest.raises(Conflict) as refused:
            await replacement.replace(services, intake, photo, CLI)
    assert refused.value.message == "The file was lost before it could be saved; please send it again."
    assert sql(services, "SELECT storage_key, status FROM photos WHERE id = ?", photo)[0] == before


@pytest.mark.postgresql
def test_the_reconciler_waits_for_a_commit_that_takes_the_same_reservation() -> None:
    """PostgreSQL: an upload's commit has taken its reservation and inserted its row but not yet committed; the
    reconciler's claim on the same (expired) reservation waits for it, then finds the row and keeps the key.
    Without the order in claim_orphans (delete the reservation first, look for the row last) it would claim it."""
    url = pgserver.server().new_database()
    setup = db.connect(url)
    gid = int(setup.execute("INSERT INTO galleries (slug, share_token, name, created_at, updated_at) "
                            "VALUES ('g', 't', 'G', 0, 0) RETURNING id").fetchall()[0]["id"])
    setup.execute("INSERT INTO uploads (id, gallery_id, uploaded_by, created_at) VALUES (?, ?, 'admin', 0)",
                  ("u" * 32, gid))
    key = new_key()
    reservations_q.reserve(setup, [key], 0.0)
    upload, reconciler = db.connect(url), db.connect(url)
    upload.execute("BEGIN")
    assert reservations_q.take(upload, key)
    upload.execute("INSERT INTO photos (gallery_id, upload_id, storage_key, sha256, display_name, size, format, "
                   "uploaded_by, created_at) VALUES (?, ?, ?, ?, 'p.jpg', 1, 'jpeg', 'admin', 0)",
                   (gid, "u" * 32, key, "0" * 64))
    claimed: list[set[str]] = []

    def reconcile() -> None:
        with db.transaction(reconciler):
            claimed.append(claim_orphans(reconciler, {key}, time.time()))

    thread = threading.Thread(target=reconcile)
    thread.start()
    time.sleep(0.5)  # not a bound: a chance for the claim to run early, which the row lock must hold back
    assert claimed == []
    upload.execute("COMMIT")
    thread.join(timeout=60)
    assert claimed == [set()]
    for c in (setup, upload, reconciler):
        c.close()


@dataclass(frozen=True)
class SlowHeadStorage(WatchedStorage):
    """As a bucket that answers each existence check (S3's HEAD) after half a second."""

    def has_original(self, key: str) -> bool:
        time.sleep(0.5)
        return super().has_original(key)


async def test_an_uploads_commit_does_not_wait_for_a_slow_bucket(admin: AuthActions, services: Services) -> None:
    """The figure: how long an upload's commits hold the writer when the bucket's HEAD takes 0.5 s (printed; 2 s
    for 4 files when the commit asked the storage, about nothing now)."""
    database = services.db
    assert isinstance(database, WatchedDatabase)
    storage = SlowHeadStorage(services.settings.data_path, database)
    services.storage = storage
    gallery = await published(admin, name="Slow bucket")
    files = [(f"{n}.jpg", photo_jpeg(80 + n)) for n in range(4)]
    started = time.perf_counter()
    sent = await admin_upload(admin, gallery["id"], files)
    request_s = time.perf_counter() - started
    assert sent.status_code == 202
    heads_inside = storage.inside.count("has_original")
    print(f"slow_head: files={len(files)} head_delay_s=0.5 commit_held_s={database.held.get('_record', 0.0):.3f} "
          f"reserve_held_s={database.held.get('reserve', 0.0):.3f} heads_inside_writes={heads_inside} "
          f"request_s={request_s:.2f}")
    assert heads_inside == 0
