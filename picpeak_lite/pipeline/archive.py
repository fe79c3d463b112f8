"""Archiving a gallery and restoring it: the steps, and the task that runs them.

Archiving removes a gallery's derivatives (grid and view images, video previews, cached watermarked downloads)
and packs its originals into one archive object in the same storage (``store/packing.py``); restoring unpacks
them, checks each against its sha256 and sends the photos back to ``pending``, so that the workers make their
images through the normal pipeline. Nothing is archived without the photographer asking: by hand (the gallery
page, the API, ``picpeak-lite gallery archive``) or by the gallery's own ``on_expiry = 'archive'``.

The gallery row is the state machine (``store/queries/archive.py``): ``active -> archiving -> archived ->
restoring -> active``. Each step can be run again from the start after a crash, and :func:`advance` does exactly
that for a gallery found in ``archiving`` or ``restoring``:

* archiving: until ``archive_object`` is set, the originals are all still loose; they are packed (again), the
  stored object is read back and checked against the rows, and only then is ``archive_object`` committed. After
  that the loose files are removed (missing ones are fine) and the gallery becomes ``archived``.
* restoring: originals not back yet are unpacked (each verified before it is made durable); once every one is
  back the archive object is removed and, in one transaction, the photos go back to ``pending`` and the gallery
  to ``active``.

The :class:`Archiver` runs in every serving process, and archives only while it holds the ``archiver`` lease (one
driver for the whole service, ``runtime/lease.py``); the command line runs :func:`advance` itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import trio

from picpeak_lite.domain.accounts import Actor
from picpeak_lite.errors import Conflict, InsufficientStorage, NotFound, StorageUnavailable
from picpeak_lite.i18n import _
from picpeak_lite.perrun import PerRun
from picpeak_lite.pipeline import transitions
from picpeak_lite.runtime.lease import LeaseLost, release_quietly
from picpeak_lite.services import Services
from picpeak_lite.store import locks, packing
from picpeak_lite.store.db import Connection, Database
from picpeak_lite.store.queries import archive as archive_q
from picpeak_lite.store.queries import galleries as gallery_q
from picpeak_lite.store.storage import Storage, original_name

log = logging.getLogger(__name__)
T = TypeVar("T")

# Packing and unpacking are long streams of file or bucket I/O: one gallery at a time per process, its file work
# in threads of its own limiter (never holding up the uploads' and the workers' threads).
_ONE_GALLERY = PerRun("picpeak_archive_gate", trio.Lock)
_FILE_THREADS = PerRun("picpeak_archive_files", lambda: trio.CapacityLimiter(1))


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    return await trio.to_thread.run_sync(fn, *args, limiter=_FILE_THREADS.get())


@dataclass(frozen=True)
class Outcome:
    """Where a gallery stands after :func:`advance`, with its stored bytes (before / after archiving)."""

    gallery_id: int
    state: str
    bytes_before: int | None
    bytes_after: int | None
    error: str | None

    @property
    def freed(self) -> int | None:
        if self.bytes_before is None or self.bytes_after is None:
            return None
        return self.bytes_before - self.bytes_after


def request_archive(conn: Connection, gallery_id: int) -> None:
    """active -> archiving, refused while photos still wait for a worker (their originals would be packed with
    no images made yet, or be taken mid-render). Run in a write transaction."""
    locks.hold(conn, locks.PHOTO_ROWS)  # an upload's commit checks the state under it
    gallery = gallery_q.get(conn, gallery_id)
    if gallery is None:
        raise NotFound(_("There is no such gallery."))
    if gallery["archive_state"] != archive_q.ACTIVE:
        raise Conflict(_("The gallery is not active: it is archived, or being archived or restored."))
    if archive_q.waiting_photos(conn, gallery_id):
        raise Conflict(_("Some photos are still being processed; archive the gallery once they are done."))
    archive_q.move(conn, gallery_id, archive_q.ACTIVE, archive_q.ARCHIVING)


def request_restore(conn: Connection, gallery_id: int) -> None:
    """archived -> restoring. Run in a write transaction."""
    gallery = gallery_q.get(conn, gallery_id)
    if gallery is None:
        raise NotFound(_("There is no such gallery."))
    if gallery["archive_state"] != archive_q.ARCHIVED:
        raise Conflict(_("Only an archived gallery can be restored."))
    archive_q.move(conn, gallery_id, archive_q.ARCHIVED, archive_q.RESTORING)


async def start_archive(svc: Services, gallery_id: int, actor: Actor) -> Any:
    """The photographer's choice, from the page or the API: set archiving and wake the archiver. Returns the row.
    The request is in the audit trail with the change (the archiver's own steps are not: they are no one's)."""
    row = await svc.db.write(_then_get(request_archive, actor, "gallery.archive_requested", svc.clock()), gallery_id)
    svc.archive_bell.ring()
    return row


async def start_restore(svc: Services, gallery_id: int, actor: Actor) -> Any:
    row = await svc.db.write(_then_get(request_restore, actor, "gallery.restore_requested", svc.clock()), gallery_id)
    svc.archive_bell.ring()
    return row


def _then_get(step: Callable[[Connection, int], None], actor: Actor, action: str,
              now: float) -> Callable[[Connection, int], Any]:
    def run(conn: Connection, gallery_id: int) -> Any:
        step(conn, gallery_id)
        actor.record(conn, now, action, gallery_id=gallery_id)
        return gallery_q.get(conn, gallery_id)

    return run


async def advance(db: Database, storage: Storage, endpoints: Any, gallery_id: int,
                  now: Callable[[], float]) -> Outcome:
    """Run the gallery's pending archiving or restoring to its end (see the module docstring). A mismatch is
    recorded on the row (``archive_error``) and nothing is removed; an unreachable bucket raises
    ``StorageUnavailable`` with the state kept, to be resumed later."""
    async with _ONE_GALLERY.get():
        gallery = await db.read(gallery_q.get, gallery_id)
        if gallery is None:
            raise NotFound(_("There is no such gallery."))
        if gallery["archive_state"] == archive_q.ARCHIVING:
            await _archive(db, storage, gallery, now)
        elif gallery["archive_state"] == archive_q.RESTORING:
            await _restore(db, storage, endpoints, gallery, now)
        return await outcome(db, gallery_id)


async def outcome(db: Database, gallery_id: int) -> Outcome:
    row = await db.read(gallery_q.get, gallery_id)
    if row is None:
        raise NotFound(_("There is no such gallery."))
    return Outcome(gallery_id, row["archive_state"], row["archive_bytes_before"], row["archive_bytes_after"],
                   row["archive_error"])


async def _archive(db: Database, storage: Storage, gallery: Any, now: Callable[[], float]) -> None:
    gallery_id = gallery["id"]
    photos = await db.read(archive_q.photos_of, gallery_id)
    keys = [p["storage_key"] for p in photos]
    name = gallery["archive_object"]
    if name is None:
        name = packing.archive_name(gallery_id)
        try:
            before = await _in_thread(_pack_and_check, storage, photos, name)
        except (packing.ArchiveMismatch, InsufficientStorage) as error:
            # Nothing was removed: the gallery stays as it was, with the reason on its page.
            reason = error.message if isinstance(error, InsufficientStorage) else str(error)
            log.error("archiving gallery %d stopped: %s", gallery_id, reason)
            await _in_thread(storage.remove, name)
            await db.write(archive_q.abandon_archive, gallery_id, reason)
            return
        if not await db.write(archive_q.record_packed, gallery_id, name, before):
            if await db.read(gallery_q.get, gallery_id) is None:  # deleted meanwhile: its archive goes too
                await _in_thread(storage.remove, name)
            return  # else another driver recorded the same archive first and goes on with it
    else:
        # Resumed after the archive was recorded: loose originals left must still be in it before they go.
        try:
            await _in_thread(_check_loose_are_packed, storage, photos, name)
        except packing.ArchiveMismatch as error:
            log.error("archiving gallery %d stopped: %s", gallery_id, error)
            await db.write(archive_q.set_error, gallery_id, str(error))
            return
    await _in_thread(storage.remove_files_of, keys)
    after = (await _in_thread(storage.stat, name)).size
    await db.write(archive_q.finish_archive, gallery_id, after, now())
    log.info("archived gallery %d: %d photos into %s", gallery_id, len(keys), name)


def _pack_and_check(storage: Storage, photos: list[Any], name: str) -> int:
    """Pack every photo whose original exists, read the stored archive back. Returns the bytes stored before."""
    before = packing.stored_bytes(storage, [p["storage_key"] for p in photos])
    packed = []
    for p in photos:
        try:
            size = storage.stat(original_name(p["storage_key"])).size
        except FileNotFoundError:
            continue  # a photo failed for its missing original: nothing to keep
        packed.append(packing.Packed(p["id"], p["storage_key"], p["sha256"], size))
    packing.pack(storage, packed, name)
    packing.read_back(storage, name, {p.key: p.sha256 for p in packed})
    return before


def _check_loose_are_packed(storage: Storage, photos: list[Any], name: str) -> None:
    loose = {p["storage_key"]: p["sha256"] for p in photos if storage.has_original(p["storage_key"])}
    if loose:
        packing.read_back(storage, name, loose)


async def _restore(db: Database, storage: Storage, endpoints: Any, gallery: Any,
                   now: Callable[[], float]) -> None:
    gallery_id = gallery["id"]
    photos = await db.read(archive_q.photos_of, gallery_id)
    name = gallery["archive_object"]
    missing = await _in_thread(_missing_originals, storage, photos)
    if missing and name is not None:
        try:
            await _in_thread(_unpack, storage, name, missing)
        except packing.ArchiveMismatch as error:
            log.error("restoring gallery %d stopped: %s", gallery_id, error)
            await db.write(archive_q.set_error, gallery_id, str(error))
            return
    lost = await _in_thread(_missing_originals, storage, photos)
    if name is not None:
        archive_there: bool = await _in_thread(storage.exists, name)
        if lost and archive_there:
            # Only originals that were never packed (missing before archiving) may be given up on; the archive
            # is kept while it holds any of them.
            packed = set(await _in_thread(packing.read_manifest, storage, name))
            if packed & set(lost):
                message = f"{len(packed & set(lost))} originals in {name} could not be put back"
                log.error("restoring gallery %d stopped: %s", gallery_id, message)
                await db.write(archive_q.set_error, gallery_id, message)
                return
        await _in_thread(storage.remove, name)
    ids = {p["storage_key"]: p["id"] for p in photos}
    requeued = await db.write(_finish_restore, gallery_id, endpoints, sorted(ids[k] for k in lost), now())
    log.info("restored gallery %d: %d photos queued for their images, %d without an original", gallery_id,
             len(requeued), len(lost))


def _missing_originals(storage: Storage, photos: list[Any]) -> dict[str, str]:
    """Key -> sha256 of every photo (not failed) whose original is not loose in the storage."""
    return {p["storage_key"]: p["sha256"] for p in photos
            if p["status"] != "failed" and not storage.has_original(p["storage_key"])}


def _unpack(storage: Storage, name: str, missing: dict[str, str]) -> None:
    if not storage.exists(name):
        raise packing.ArchiveMismatch(f"the archive object {name} is missing")
    packing.unpack(storage, name, missing)


def _finish_restore(conn: Connection, gallery_id: int, endpoints: Any, lost: list[int], now: float) -> list[int]:
    """Photos whose original is in neither place (it was missing before archiving, so it is not in the archive)
    are failed with that reason; the others go back to the workers, in the same transaction."""
    for photo_id in lost:
        transitions.fail_missing_original(conn, endpoints, photo_id, now)
    return archive_q.finish_restore(conn, gallery_id)


class Archiver:
    """The task that archives expired galleries whose photographer chose so, and runs every archiving and
    restoring asked for (woken by ``Services.archive_bell``) or interrupted by a crash (found by its first pass)."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        # One process of the service archives at a time (runtime/lease.py); the others look again soon.
        self.lease = svc.lease("archiver")
        self.deferred = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # Ready at once: what it resumes may take minutes (a big gallery's originals), and nothing else waits on
        # it; the first pass runs right after.
        task_status.started()
        while True:
            ring = self.svc.archive_bell.listen()
            await self.pass_once()
            # Another process was archiving: what was asked of this one (its bell) is done after that one ends.
            wait = self.lease.seconds / 3 if self.deferred else self.svc.settings.archive_check_seconds
            with trio.move_on_after(wait):
                await ring.wait()

    async def pass_once(self) -> list[Outcome]:
        """Mark expired galleries set to archive, then advance every gallery with work, holding the ``archiver``
        lease; when another process holds it, nothing (``deferred``). Returns the outcomes."""
        self.deferred = not await self.lease.take()
        if self.deferred:
            return []
        try:
            async with self.lease.kept():
                return await self._advance_all()
        except LeaseLost:
            self.deferred = True
            return []
        finally:
            await release_quietly(self.lease)

    async def _advance_all(self) -> list[Outcome]:
        svc = self.svc
        marked = await svc.db.write(archive_q.mark_expired, svc.clock())
        if marked:
            log.info("galleries expired and set to archive: %s", marked)
        done = []
        for row in await svc.db.read(archive_q.with_work):
            try:
                result = await advance(svc.db, svc.storage, svc.settings.webhooks, row["id"], svc.clock)
            except StorageUnavailable:
                log.warning("archiving: the photo storage did not answer for gallery %d; trying again later",
                            row["id"])
                continue
            except NotFound:
                continue
            except Exception as error:  # recorded on the row; the next pass tries again
                log.exception("archiving or restoring gallery %d failed", row["id"])
                await svc.db.write(archive_q.set_error, row["id"], f"{type(error).__name__}: {error}")
                continue
            done.append(result)
            if result.state == archive_q.ACTIVE:
                svc.workers_bell.ring()
                svc.webhooks_bell.ring()
        return done
