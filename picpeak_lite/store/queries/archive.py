"""SQL for archiving and restoring galleries (pipeline/archive.py drives the steps; the gallery row is the state).

States: ``active`` -> ``archiving`` -> ``archived`` -> ``restoring`` -> ``active``. Every change is guarded by
the state it leaves, so two drivers (the server's archiver and the command line) can never both move a gallery.
"""

from __future__ import annotations

from picpeak_lite.store.db import Connection, Row

ACTIVE, ARCHIVING, ARCHIVED, RESTORING = "active", "archiving", "archived", "restoring"
WORKING = (ARCHIVING, RESTORING)


def waiting_photos(conn: Connection, gallery_id: int) -> int:
    """Photos a worker has still to make images of (or is making them of right now)."""
    return conn.execute("SELECT count(*) AS n FROM photos WHERE gallery_id = ? AND status IN ('pending', 'processing')",
                        (gallery_id,)).fetchall()[0]["n"]


def move(conn: Connection, gallery_id: int, from_state: str, to_state: str) -> bool:
    """Change the state if it is still ``from_state``; clears the last error."""
    conn.execute("UPDATE galleries SET archive_state = ?, archive_error = NULL WHERE id = ? AND archive_state = ?",
                 (to_state, gallery_id, from_state))
    return conn.changes() == 1


def photos_of(conn: Connection, gallery_id: int) -> list[Row]:
    """Every photo of the gallery with what its original is checked against."""
    return conn.execute("SELECT id, storage_key, sha256, status, media_type FROM photos WHERE gallery_id = ? "
                        "ORDER BY id", (gallery_id,)).fetchall()


def record_packed(conn: Connection, gallery_id: int, name: str, bytes_before: int) -> bool:
    """The archive object was read back and matched: from now on the loose files may go. Video previews and stale
    images are forgotten (their files go with the other derivatives; neither the preview lane nor an idle worker
    may try to make them again: ``photos.mark_views_stale`` leaves archived galleries alone from here on)."""
    conn.execute("UPDATE galleries SET archive_object = ?, archive_bytes_before = ?, archive_bytes_after = NULL "
                 "WHERE id = ? AND archive_state = 'archiving' AND archive_object IS NULL",
                 (name, bytes_before, gallery_id))
    if conn.changes() != 1:
        return False
    conn.execute("UPDATE photos SET preview_status = NULL, views_stale = 0 WHERE gallery_id = ? "
                 "AND (preview_status IS NOT NULL OR views_stale > 0)", (gallery_id,))
    return True


def finish_archive(conn: Connection, gallery_id: int, bytes_after: int, now: float) -> bool:
    conn.execute("UPDATE galleries SET archive_state = 'archived', archive_bytes_after = ?, archived_at = ?, "
                 "archive_error = NULL WHERE id = ? AND archive_state = 'archiving'", (bytes_after, now, gallery_id))
    return conn.changes() == 1


def abandon_archive(conn: Connection, gallery_id: int, error: str) -> bool:
    """Archiving stopped before any loose file was removed (an original did not match its sha256): back to active."""
    conn.execute("UPDATE galleries SET archive_state = 'active', archive_object = NULL, archive_error = ? "
                 "WHERE id = ? AND archive_state = 'archiving' AND archive_object IS NULL", (error, gallery_id))
    return conn.changes() == 1


def set_error(conn: Connection, gallery_id: int, error: str) -> None:
    conn.execute("UPDATE galleries SET archive_error = ? WHERE id = ?", (error, gallery_id))


def finish_restore(conn: Connection, gallery_id: int) -> list[int]:
    """Every original is back: the complete photos go back to ``pending`` (fresh attempts; a worker makes their
    images through the normal pipeline) and the gallery is active again. Returns the requeued photo ids."""
    conn.execute("UPDATE galleries SET archive_state = 'active', archive_object = NULL, archive_error = NULL "
                 "WHERE id = ? AND archive_state = 'restoring'", (gallery_id,))
    if conn.changes() != 1:
        return []
    rows = conn.execute(
        "UPDATE photos SET status = 'pending', attempts = 0, interruptions = 0, error = NULL, claim_token = NULL, "
        "lease_until = NULL, completed_at = NULL, views_stale = 0 WHERE gallery_id = ? AND status = 'complete' "
        "RETURNING id", (gallery_id,)).fetchall()
    return sorted(r["id"] for r in rows)


def with_work(conn: Connection) -> list[Row]:
    """Galleries in the middle of archiving or restoring (asked for, or interrupted by a crash)."""
    return conn.execute("SELECT id, slug, archive_state FROM galleries WHERE archive_state IN ('archiving', "
                        "'restoring') ORDER BY id").fetchall()


def mark_expired(conn: Connection, now: float) -> list[int]:
    """Galleries whose photographer chose to archive them on expiry and that have expired: set archiving. One
    whose photos are still being processed waits for the next round."""
    rows = conn.execute(
        "UPDATE galleries SET archive_state = 'archiving', archive_error = NULL WHERE on_expiry = 'archive' "
        "AND archive_state = 'active' AND expires_at IS NOT NULL AND expires_at <= ? AND NOT EXISTS (SELECT 1 "
        "FROM photos p WHERE p.gallery_id = galleries.id AND p.status IN ('pending', 'processing')) RETURNING id",
        (now,)).fetchall()
    return sorted(r["id"] for r in rows)


def photo_archived(conn: Connection, photo_id: int) -> bool:
    """Whether the photo belongs to a gallery that is not active (its original may rightly be packed away)."""
    rows = conn.execute("SELECT g.archive_state FROM photos p JOIN galleries g ON g.id = p.gallery_id "
                        "WHERE p.id = ?", (photo_id,)).fetchall()
    return bool(rows) and rows[0]["archive_state"] != ACTIVE
