"""SQL for the admin's review of guests' photos (moderation): the queue, approving, and finding a photo its
uploader may still see while it waits.

A photo is ``awaiting_approval`` from its insert (a trigger of the schema's moderation step, for guests' photos
in galleries with ``guest_photos_need_approval``) until the admin's review clears the mark; every statement here
that clears it is guarded by the mark, so a photo is approved or rejected once.
"""

from __future__ import annotations

from collections.abc import Iterable

from picpeak_lite.store.db import Connection, Row


def queue(conn: Connection, gallery_id: int, limit: int = 1000) -> list[Row]:
    """The photos waiting for review, oldest first (the order they arrived in)."""
    return conn.execute(
        "SELECT id, display_name, status, error, width, height, media_type, duration, guest_name, created_at "
        "FROM photos WHERE gallery_id = ? AND awaiting_approval = 1 ORDER BY id LIMIT ?",
        (gallery_id, limit),
    ).fetchall()


def queue_length(conn: Connection, gallery_id: int) -> int:
    return conn.execute("SELECT count(*) AS n FROM photos WHERE gallery_id = ? AND awaiting_approval = 1",
                        (gallery_id,)).fetchall()[0]["n"]


def awaiting_in_gallery(conn: Connection, gallery_id: int, ids: Iterable[int]) -> list[int]:
    """Those of ``ids`` that are this gallery's and still wait for review."""
    wanted = sorted(set(ids))
    if not wanted:
        return []
    marks = ", ".join("?" for _ in wanted)
    rows = conn.execute(
        f"SELECT id FROM photos WHERE gallery_id = ? AND awaiting_approval = 1 AND id IN ({marks}) ORDER BY id",
        (gallery_id, *wanted),
    ).fetchall()
    return [r["id"] for r in rows]


def clear_mark(conn: Connection, photo_id: int, *, hide: bool) -> bool:
    """Approve (``hide=False``: guests see it once it is complete) or reject by hiding it. False when the photo
    was reviewed meanwhile."""
    conn.execute(
        "UPDATE photos SET awaiting_approval = 0, hidden = CASE WHEN ? = 1 THEN 1 ELSE hidden END "
        "WHERE id = ? AND awaiting_approval = 1",
        (int(hide), photo_id),
    )
    return conn.changes() == 1


def own_awaiting(conn: Connection, gallery_id: int, photo_id: int, guest_session_id: int) -> Row | None:
    """The photo if it is complete and waiting for review and this guest session uploaded it."""
    rows = conn.execute(
        "SELECT p.* FROM photos p JOIN uploads u ON u.id = p.upload_id "
        "WHERE p.id = ? AND p.gallery_id = ? AND p.awaiting_approval = 1 AND p.hidden = 0 "
        "AND p.status = 'complete' AND u.guest_session_id = ?",
        (photo_id, gallery_id, guest_session_id),
    ).fetchall()
    return rows[0] if rows else None


def own_waiting(conn: Connection, gallery_id: int, guest_session_id: int, limit: int = 100) -> list[Row]:
    """This guest session's photos in the gallery that wait for review (complete, so that they can be shown to
    it), newest first."""
    return conn.execute(
        "SELECT p.id, p.width, p.height FROM photos p JOIN uploads u ON u.id = p.upload_id "
        "WHERE p.gallery_id = ? AND p.awaiting_approval = 1 AND p.hidden = 0 AND p.status = 'complete' "
        "AND u.guest_session_id = ? ORDER BY p.id DESC LIMIT ?",
        (gallery_id, guest_session_id, limit),
    ).fetchall()
