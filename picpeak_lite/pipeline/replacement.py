"""Replacing a photo with a re-edited file, and confirming or reverting that.

The new file arrives like any upload (:class:`~.intake.Intake`: streamed, hashed, header-checked, made durable
under a new storage key), but instead of a new row it takes the photo's place: the same id, so favourites, the
cover and anything else keyed by the photo stay; the same capture time, so its position (``claims.complete``
keeps ``taken_at`` while a replacement waits); the same display name (proofing exports match the RAW names). The
photo goes back to ``pending`` and the workers make its images through the normal claim. What it was is kept in
``photos.replaced`` with its original and images still stored (queries/replacement.py), until the photographer
confirms (then those files are removed) or reverts (then the new file's are, and the previous version is back at
once, its images already made).

What guests see meanwhile: the previous version. The guest feed says nothing about a photo going back to
pending (only photos becoming complete, or removed), the photo's image routes serve the previous version's
images until the new ones exist (``access.visible_photo``), and once it is complete the feed's ``complete``
message tells open pages and the wall to load the new images.
"""

from __future__ import annotations

import trio

from picpeak_lite.domain.accounts import Actor
from picpeak_lite.errors import AppError, BadRequest, Conflict, NotFound, TooLarge, UnsupportedMedia
from picpeak_lite.i18n import _
from picpeak_lite.pipeline.intake import MB, Intake, Limits, io_limiter
from picpeak_lite.services import Services
from picpeak_lite.store.db import INTEGER_MAX, Connection, Row
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries import replacement as replacement_q
from picpeak_lite.store.queries import reservations as reservations_q

FAILURES: dict[int, type[AppError]] = {413: TooLarge, 415: UnsupportedMedia, 409: Conflict}


def open_intake(svc: Services, gallery: Row) -> Intake:
    """The intake for one replacement file: the admin's limits; a replacement adds no photo, so the gallery's
    cap does not apply."""
    limits = Limits(svc.settings.admin_max_file_mb * MB, 1)
    return Intake(db=svc.db, storage=svc.storage, settings=svc.settings, gallery={**gallery, "photo_cap": INTEGER_MAX},
                  limits=limits, clock=svc.clock)


async def photo_of(svc: Services, gallery_id: int, photo_id: int) -> Row:
    row = await svc.db.read(photo_q.get, photo_id)
    if row is None or row["gallery_id"] != gallery_id:
        raise NotFound(_("There is no such photo in this gallery."))
    return row


async def replace(svc: Services, intake: Intake, photo_id: int, actor: Actor) -> Row:
    """Give the photo the file the intake received (one file, checked and stored). Returns the photo's row.
    Refused: a photo that is not complete, one whose last replacement waits for confirmation, a video, a file
    already in the gallery. The stored file is removed on every refusal by the intake's exit."""
    entries = intake.entries
    if len(entries) != 1:
        raise BadRequest(_("Send exactly one file to replace the photo with."))
    entry = entries[0]
    if entry.error is not None:
        raise FAILURES.get(entry.status, BadRequest)(entry.error)
    if entry.duplicate:
        if entry.photo_id == photo_id:
            raise Conflict(_("This is the photo's current file."))
        raise Conflict(_("This file is already in the gallery (photo %(id)s).") % {"id": entry.photo_id})
    if entry.video is not None:
        raise UnsupportedMedia(_("Only photos can be replaced; upload a video as a new one."))
    assert entry.key is not None and entry.header is not None
    key, header = entry.key, entry.header
    gallery_id = intake.gallery_id

    def swap(conn: Connection) -> Row:
        row = photo_q.get(conn, photo_id)
        if row is None or row["gallery_id"] != gallery_id:
            raise NotFound(_("There is no such photo in this gallery."))
        _check_replaceable(row)
        if photo_q.find_by_sha(conn, gallery_id, entry.sha256) is not None:
            raise Conflict(_("This file is already in the gallery."))
        if not reservations_q.take(conn, key):  # a database read, never a storage call under the writer
            raise Conflict(_("The file was lost before it could be saved; please send it again."))
        changed = replacement_q.start(conn, row, storage_key=key, sha256=entry.sha256, size=entry.size,
                                      format=header.format, width=header.width, height=header.height)
        assert changed  # checked above in this transaction
        new = photo_q.get(conn, photo_id)
        assert new is not None
        actor.record(conn, now, "photo.replaced", gallery_id=gallery_id,
                     detail=f"photo {photo_id}: {row['display_name']}")
        return new

    now = svc.clock()
    row = await svc.db.write(swap)
    entry.inserted = True  # no checkpoint since the commit: the intake's exit leaves the file alone now
    svc.workers_bell.ring()
    return row


def _check_replaceable(row: Row) -> None:
    if row["media_type"] == "video":
        raise UnsupportedMedia(_("Only photos can be replaced; upload a video as a new one."))
    if row["replaced"] is not None:
        raise Conflict(_("This photo's last replacement waits for you: confirm or revert it first."))
    if row["status"] != "complete":
        raise Conflict(_("Only a finished photo can be replaced; wait until it is made, or delete it."))


async def confirm(svc: Services, gallery_id: int, photo_id: int, actor: Actor) -> None:
    """Keep the new version: the previous original and its images are deleted."""
    now = svc.clock()

    def forget(conn: Connection) -> str:
        row = _waiting(conn, gallery_id, photo_id)
        if row["status"] == "failed":
            raise Conflict(_("The new version could not be made; revert to the previous one."))
        if row["status"] != "complete":
            raise Conflict(_("The new version is still being made; confirm once it is ready."))
        before = replacement_q.previous(row)
        assert before is not None
        changed = replacement_q.confirm(conn, photo_id)
        assert changed  # checked above in this transaction
        actor.record(conn, now, "photo.replacement_confirmed", gallery_id=gallery_id, detail=f"photo {photo_id}")
        key: str = before["storage_key"]
        return key

    key = await svc.db.write(forget)
    await trio.to_thread.run_sync(svc.storage.remove_photo_files, key, limiter=io_limiter())


async def revert(svc: Services, gallery_id: int, photo_id: int, actor: Actor) -> None:
    """Bring the previous version back; the new file and its images are deleted."""
    now = svc.clock()

    def back(conn: Connection) -> str:
        row = _waiting(conn, gallery_id, photo_id)
        if row["status"] not in ("complete", "failed"):
            raise Conflict(_("The new version is still being made; revert once it is ready."))
        before = replacement_q.previous(row)
        assert before is not None
        other = photo_q.find_by_sha(conn, gallery_id, before["sha256"])
        if other is not None and other["id"] != photo_id:
            raise Conflict(_("The previous version was uploaded again as photo %(id)s; delete that one first.")
                           % {"id": other["id"]})
        changed = replacement_q.revert(conn, row)
        assert changed  # checked above in this transaction
        actor.record(conn, now, "photo.replacement_reverted", gallery_id=gallery_id, detail=f"photo {photo_id}")
        key: str = row["storage_key"]
        return key

    key = await svc.db.write(back)
    svc.workers_bell.ring()  # its images are made again if the watermark changed meanwhile (views_stale)
    await trio.to_thread.run_sync(svc.storage.remove_photo_files, key, limiter=io_limiter())


def _waiting(conn: Connection, gallery_id: int, photo_id: int) -> Row:
    row = photo_q.get(conn, photo_id)
    if row is None or row["gallery_id"] != gallery_id:
        raise NotFound(_("There is no such photo in this gallery."))
    if row["replaced"] is None:
        raise Conflict(_("No replaced version of this photo waits for confirmation."))
    return row
