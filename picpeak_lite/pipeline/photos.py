"""What the photographer does to photos after upload: delete them (one, a selection of the grid, or from the
review queue), retry a failed one, review guests' photos (approve, hide, delete), hide or show them, choose the
cover. Every route that does one of these (pages, forms and the API) calls it here.

Each is one transaction for the rows, their webhook outbox rows (``transitions``, ``moderation``) and the audit
row; then, after the commit, the files of deleted photos go (a crash in between leaves orphan files for the
reconciler, never a row without its file); then the bell of the work it made rings. Who may do it (editors may
not delete: ``web/auth.require_delete``) and what the request said are the caller's to check.

It lives in ``pipeline/`` beside ``transitions`` and ``moderation``, whose units of work it runs: ``domain/`` is
below ``pipeline/`` (the worker and the intake ask it their rules), so it could not import them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

from picpeak_lite.domain import galleries
from picpeak_lite.domain.accounts import Actor
from picpeak_lite.errors import BadRequest, Conflict, NotFound
from picpeak_lite.i18n import _
from picpeak_lite.pipeline import moderation, transitions
from picpeak_lite.services import Services
from picpeak_lite.store.db import Connection, Row
from picpeak_lite.store.queries import admin_photos as admin_photo_q
from picpeak_lite.store.queries import photos as photo_q

# The grid's bulk actions, and how many photos one bulk action (grid or review) may name.
GRID_ACTIONS = ("hide", "show", "delete", "cover")
MAX_IDS = 5000


def check_selection(action: Any, choices: Sequence[str], ids: Sequence[int]) -> None:
    """A bulk action names one of ``choices`` and between one and ``MAX_IDS`` photos."""
    if action not in choices:
        raise BadRequest(_("Choose one of: %(choices)s.") % {"choices": ", ".join(choices)})
    if not ids:
        raise BadRequest(_("Select at least one photo."))
    if len(ids) > MAX_IDS:
        raise BadRequest(_("At most %(MAX_IDS)s photos at once.") % {"MAX_IDS": MAX_IDS})


def _record_deleted(conn: Connection, actor: Actor, now: float, gallery_id: int, ids: Sequence[int]) -> None:
    actor.record(conn, now, "photos.deleted", gallery_id=gallery_id, detail="ids " + ", ".join(map(str, ids)))


async def _after_delete(svc: Services, rows: Sequence[Row]) -> None:
    """After the commit: the deleted photos' files, then the webhook sender's bell for their photo.deleted."""
    if rows:
        await trio.to_thread.run_sync(svc.storage.remove_files_of, [row["storage_key"] for row in rows])
        svc.webhooks_bell.ring()


async def delete_photo(svc: Services, photo_id: int, actor: Actor) -> None:
    """Delete one photo, wherever it is."""
    now = svc.clock()

    def delete(conn: Connection) -> Row | None:
        row = transitions.delete_photo(conn, svc.settings.webhooks, photo_id, now)
        if row is not None:
            _record_deleted(conn, actor, now, row["gallery_id"], [photo_id])
        return row

    row = await svc.db.write(delete)
    if row is None:
        raise NotFound(_("There is no such photo."))
    await _after_delete(svc, [row])


async def delete_photos(svc: Services, gallery_id: int, ids: Sequence[int], actor: Actor) -> int:
    """Delete those of ``ids`` that are photos of this gallery; returns how many went."""
    now = svc.clock()

    def delete(conn: Connection) -> list[Row]:
        rows = []
        for photo_id in admin_photo_q.ids_in_gallery(conn, gallery_id, ids):
            row = transitions.delete_photo(conn, svc.settings.webhooks, photo_id, now)
            if row is not None:
                rows.append(row)
        if rows:
            _record_deleted(conn, actor, now, gallery_id, [row["id"] for row in rows])
        return rows

    rows = await svc.db.write(delete)
    await _after_delete(svc, rows)
    return len(rows)


async def review(svc: Services, gallery_id: int, action: str, ids: Sequence[int], actor: Actor) -> list[int]:
    """Approve, hide or delete (``moderation.ACTIONS``) those of ``ids`` that still wait for approval in this
    gallery; returns their ids."""
    await galleries.get_gallery(svc, gallery_id)
    now = svc.clock()

    def apply(conn: Connection) -> list[Row]:
        rows = moderation.review(conn, svc.settings.webhooks, gallery_id, action, ids, now)
        if action == "delete" and rows:
            _record_deleted(conn, actor, now, gallery_id, [row["id"] for row in rows])
        return rows

    rows = await svc.db.write(apply)
    if action == "delete":
        await _after_delete(svc, rows)
    elif rows:
        svc.webhooks_bell.ring()
    return [row["id"] for row in rows]


async def retry_photo(svc: Services, photo_id: int) -> Row:
    """Send a failed photo back to the workers; returns its row as it was (its gallery, for the caller)."""

    def retry(conn: Connection) -> tuple[Row | None, bool]:
        row = photo_q.get(conn, photo_id)
        return row, row is not None and photo_q.retry(conn, photo_id)

    row, retried = await svc.db.write(retry)
    if row is None:
        raise NotFound(_("There is no such photo."))
    if not retried:
        raise Conflict(_("Only a failed photo can be retried."))
    svc.workers_bell.ring()
    return row


async def set_hidden(svc: Services, gallery_id: int, ids: Sequence[int], hidden: bool) -> int:
    """Hide those of ``ids`` that are photos of this gallery from guests, or show them again; returns how many
    changed."""
    changed: int = await svc.db.write(admin_photo_q.set_hidden, gallery_id, ids, hidden)
    return changed


async def set_cover(svc: Services, gallery_id: int, photo_id: int | None) -> None:
    """Make a processed photo of this gallery its cover (None: the first visible photo)."""
    await galleries.get_gallery(svc, gallery_id)
    if not await svc.db.write(admin_photo_q.set_cover, gallery_id, photo_id, svc.clock()):
        raise Conflict(_("Only a processed photo of this gallery can be its cover."))
