"""SQL for photos and upload groups: inserting, finding, listing, retrying, deleting.

The claim (how a worker takes a pending photo, and the token-guarded writes that follow it) has its own module,
``store/queries/claims.py``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from picpeak_lite.i18n import N_
from picpeak_lite.store.db import Connection, Prepared, Row
from picpeak_lite.store.queries import replacement


class PhotoStatus(StrEnum):
    """A photo's ``status`` column: ``pending -> processing -> complete | failed``. The values are the stored
    strings (and those of the status JSON), so a row's plain ``str`` compares equal to its member."""

    PENDING = "pending"
    PROCESSING = "processing"
    COMPLETE = "complete"
    FAILED = "failed"


# Video codecs Chromium and Firefox play as they are (media/video.py BROWSER_CODECS; kept here as data, SQL
# needs no media import)
BROWSER_CODECS = frozenset({"h264", "vp8", "vp9", "av1"})
VIDEO_MIME = {"mp4": "video/mp4", "mov": "video/quicktime", "webm": "video/webm"}
MAX_ERROR_LENGTH = 1000
ORIGINAL_MISSING = N_("The original file is missing from storage.")  # the reason a photo without its file fails
TERMINAL = (PhotoStatus.COMPLETE, PhotoStatus.FAILED)

# The SQL condition for a photo a guest may see; used by every query that lists photos for guests. Here rather
# than in ``access`` (which re-exports it) so that ``access`` can call these functions without an import cycle.
# A guest's photo in a gallery whose guest photos need approval is awaiting_approval until the admin's review
# (schema: the moderation step); the uploader alone still sees it (``access.own_awaiting_photo``).
GUEST_VISIBLE_PHOTO = "status = 'complete' AND hidden = 0 AND awaiting_approval = 0"


def create_upload(conn: Connection, upload_id: str, gallery_id: int, uploaded_by: str,
                  guest_session_id: int | None, guest_name: str | None, now: float,
                  receiving_until: float | None = None) -> None:
    """``receiving_until``: the lease of a request still arriving (schema 7); None for a closed group."""
    conn.execute(
        "INSERT INTO uploads (id, gallery_id, uploaded_by, guest_session_id, guest_name, created_at, "
        "receiving_until) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (upload_id, gallery_id, uploaded_by, guest_session_id, guest_name, now, receiving_until),
    )


def renew_receiving(conn: Connection, upload_ids: list[str], until: float) -> set[str]:
    """Extend the lease of uploads whose request is still arriving; returns those still receiving."""
    if not upload_ids:
        return set()
    marks = ", ".join("?" * len(upload_ids))
    rows = conn.execute(
        f"UPDATE uploads SET receiving_until = ? WHERE id IN ({marks}) AND receiving_until IS NOT NULL "
        "RETURNING id",
        (until, *upload_ids),
    ).fetchall()
    return {r["id"] for r in rows}


def close_receiving(conn: Connection, upload_id: str) -> bool:
    """The request has ended: the group may now complete. False when it was abandoned meanwhile."""
    conn.execute("UPDATE uploads SET receiving_until = NULL WHERE id = ? AND receiving_until IS NOT NULL",
                 (upload_id,))
    return conn.changes() == 1


def expired_receiving(conn: Connection, now: float) -> list[str]:
    """Uploads whose request stopped renewing its lease: its process died or hung. A group with a complete tus
    upload whose photo is still being made (pipeline/resumable.py, finishing) waits for it."""
    rows = conn.execute(
        "SELECT id FROM uploads WHERE receiving_until < ? AND id NOT IN (SELECT upload_id FROM tus_uploads "
        "WHERE state = 'receiving' AND upload_offset = upload_length AND upload_id IS NOT NULL) "
        "ORDER BY created_at", (now,)).fetchall()
    return [r["id"] for r in rows]


def keep_upload_photos(conn: Connection, upload_id: str) -> set[int]:
    """The request was answered: its photos are no longer provisional. Returns the ids it still has."""
    conn.execute("UPDATE photos SET provisional = 0 WHERE upload_id = ? AND provisional = 1", (upload_id,))
    return {r["id"] for r in conn.execute("SELECT id FROM photos WHERE upload_id = ?", (upload_id,)).fetchall()}


def keep_photo(conn: Connection, photo_id: int) -> bool:
    """Another request was told this photo is already in the gallery: it stays, even if the request that sent
    it first is cut off. False when it is gone."""
    conn.execute("UPDATE photos SET provisional = 0 WHERE id = ? AND provisional = 1", (photo_id,))
    return bool(conn.execute("SELECT 1 FROM photos WHERE id = ?", (photo_id,)).fetchall())


def set_upload_guest_name(conn: Connection, upload_id: str, guest_name: str | None) -> None:
    """The form's guest name can arrive after the first files (whose rows then got the session's name)."""
    conn.execute("UPDATE uploads SET guest_name = ? WHERE id = ?", (guest_name, upload_id))
    conn.execute("UPDATE photos SET guest_name = ? WHERE upload_id = ?", (guest_name, upload_id))


def delete_provisional(conn: Connection, upload_id: str) -> list[Row]:
    """Take back the photos of a request that was never answered 202; returns the deleted rows."""
    return conn.execute("DELETE FROM photos WHERE upload_id = ? AND provisional = 1 RETURNING *",
                        (upload_id,)).fetchall()


def delete_upload_if_empty(conn: Connection, upload_id: str) -> bool:
    conn.execute("DELETE FROM uploads WHERE id = ? AND NOT EXISTS (SELECT 1 FROM photos WHERE upload_id = ?)",
                 (upload_id, upload_id))
    return conn.changes() == 1


def get_upload(conn: Connection, upload_id: str) -> Row | None:
    rows = conn.execute("SELECT * FROM uploads WHERE id = ?", (upload_id,)).fetchall()
    return rows[0] if rows else None


def insert_photo(conn: Connection, *, gallery_id: int, upload_id: str, storage_key: str, sha256: str,
                 display_name: str, size: int, format: str, uploaded_by: str, guest_name: str | None,
                 width: int, height: int, now: float, provisional: bool = False,
                 video: dict[str, Any] | None = None) -> int:
    """Insert a pending photo under a new id: one never given before, even to a photo since deleted (schema 5).
    ``provisional``: its request is still arriving (schema 7). ``video``: the probe's facts (VideoInfo.to_json)
    of a video, which makes it ``media_type = 'video'``."""
    photo_id = conn.execute(Prepared(
        "UPDATE photo_id_counter SET next_id = 1 + CASE WHEN next_id > top.id THEN next_id ELSE top.id END "
        "FROM (SELECT coalesce(max(id), 0) + 1 AS id FROM photos) AS top RETURNING next_id - 1 AS id")
    ).fetchall()[0]["id"]
    conn.execute(Prepared(
        "INSERT INTO photos (id, gallery_id, upload_id, storage_key, sha256, display_name, size, format, "
        "uploaded_by, guest_name, width, height, created_at, provisional) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
        (photo_id, gallery_id, upload_id, storage_key, sha256, display_name, size, format, uploaded_by,
         guest_name, width, height, now, int(provisional)),
    )
    if video is not None:
        set_video_facts(conn, photo_id, video)
    return photo_id


def set_video_facts(conn: Connection, photo_id: int, facts: dict[str, Any]) -> None:
    """A video's probe facts (at upload, and again by the worker's own probe). A clip browsers cannot play
    gets ``preview_status = 'pending'``: the preview lane makes a playable copy (pipeline/video_previews.py).
    So does every clip in a gallery with downloads off: guests play the copy there, never the original."""
    needs_preview = facts.get("video_codec") not in BROWSER_CODECS
    conn.execute(
        "UPDATE photos SET media_type = 'video', duration = ?, fps = ?, video_codec = ?, audio_codec = ?, "
        "preview_status = CASE WHEN ? = 1 OR (SELECT allow_downloads = 0 FROM galleries g WHERE g.id = gallery_id) "
        "THEN coalesce(preview_status, 'pending') ELSE NULL END WHERE id = ?",
        (facts.get("duration"), facts.get("fps"), facts.get("video_codec"), facts.get("audio_codec"),
         int(needs_preview), photo_id),
    )


def want_previews(conn: Connection, gallery_id: int) -> int:
    """Downloads were turned off: every video of the gallery without a playable copy gets one made (guests
    play the copy, not the original). Returns how many were marked."""
    conn.execute("UPDATE photos SET preview_status = 'pending' WHERE gallery_id = ? AND media_type = 'video' "
                 "AND preview_status IS NULL AND (SELECT archive_object IS NULL FROM galleries WHERE id = ?)",
                 (gallery_id, gallery_id))
    return conn.changes()


def next_preview(conn: Connection) -> Row | None:
    """The oldest complete video still waiting for its playable preview (schema: videos)."""
    rows = conn.execute("SELECT id, storage_key, duration FROM photos WHERE preview_status = 'pending' "
                        "AND status = 'complete' ORDER BY id LIMIT 1").fetchall()
    return rows[0] if rows else None


def preview_done(conn: Connection, photo_id: int) -> bool:
    conn.execute("UPDATE photos SET preview_status = 'complete', preview_error = NULL "
                 "WHERE id = ? AND preview_status = 'pending'", (photo_id,))
    return conn.changes() == 1


def preview_failed(conn: Connection, photo_id: int, reason: str) -> bool:
    conn.execute("UPDATE photos SET preview_status = 'failed', preview_error = ? "
                 "WHERE id = ? AND preview_status = 'pending'", (reason[:MAX_ERROR_LENGTH], photo_id))
    return conn.changes() == 1


_BY_SHA = Prepared("SELECT id, display_name, size, status FROM photos WHERE gallery_id = ? AND sha256 = ?")


def find_by_sha(conn: Connection, gallery_id: int, sha256: str) -> Row | None:
    """Asked twice per uploaded file (when it is stored, and in its commit): prepared (``db.Prepared``)."""
    rows = conn.execute(_BY_SHA, (gallery_id, sha256)).fetchall()
    return rows[0] if rows else None


_IN_GALLERY = Prepared("SELECT count(*) AS n FROM photos WHERE gallery_id = ?")


def count_in_gallery(conn: Connection, gallery_id: int) -> int:
    """Asked in every upload's commit (the gallery's cap): prepared (``db.Prepared``)."""
    return conn.execute(_IN_GALLERY, (gallery_id,)).fetchall()[0]["n"]


def get(conn: Connection, photo_id: int) -> Row | None:
    rows = conn.execute(Prepared("SELECT * FROM photos WHERE id = ?"), (photo_id,)).fetchall()
    return rows[0] if rows else None


def get_visible(conn: Connection, gallery_id: int, photo_id: int) -> Row | None:
    """The photo if it is in this gallery and a guest may see it (``access.visible_photo`` turns None into 404)."""
    rows = conn.execute(
        f"SELECT * FROM photos WHERE id = ? AND gallery_id = ? AND {GUEST_VISIBLE_PHOTO}",
        (photo_id, gallery_id),
    ).fetchall()
    return rows[0] if rows else None














def mark_views_stale(conn: Connection, gallery_ids: list[int]) -> int:
    """These galleries' watermark changed: their photos' images are to be made again (schema 6). A photo being
    processed may have read the old watermark, so it is marked too (complete() leaves the mark); a pending one
    will read the new one. An archived gallery's photos have no images to make (their originals are packed away:
    pipeline/archive.py); restoring makes them all again anyway."""
    if not gallery_ids:
        return 0
    marks = ", ".join("?" * len(gallery_ids))
    conn.execute(
        f"UPDATE photos SET views_stale = views_stale + 1 "
        f"WHERE gallery_id IN ({marks}) AND status IN ('processing', 'complete') AND gallery_id NOT IN "
        f"(SELECT id FROM galleries WHERE archive_object IS NOT NULL)",
        gallery_ids,
    )
    return conn.changes()


# One form per engine: SQLite's planner, left to itself, walks every complete photo through photos_queue, so the
# index is named; PostgreSQL's picks the partial index by itself and has no such hint.
# A photo whose images another process is making again holds the lease 'views:<id>' (runtime/lease.py).
_STALE_VIEWS_WHERE = ("WHERE views_stale > 0 AND status = 'complete' AND id % ? = ? AND NOT EXISTS "
                      "(SELECT 1 FROM leases WHERE leases.name = 'views:' || photos.id AND leases.expires_at > ?) "
                      "ORDER BY id LIMIT 1")
NEXT_STALE_VIEWS = {
    "sqlite": f"SELECT * FROM photos INDEXED BY photos_views_stale {_STALE_VIEWS_WHERE}",
    "postgresql": f"SELECT * FROM photos {_STALE_VIEWS_WHERE}",
}


def next_stale_views(conn: Connection, worker: int, workers: int, now: float) -> Row | None:
    """A complete photo whose images are to be made again and that no process is making again now; workers of
    one pool look at disjoint photos."""
    rows = conn.execute(NEXT_STALE_VIEWS[conn.dialect], (workers, worker, float(now))).fetchall()
    return rows[0] if rows else None


def views_lease(photo_id: int) -> str:
    """The name of the lease held while a photo's images are made again."""
    return f"views:{photo_id}"


def views_still_stale(conn: Connection, photo_id: int, stale: int) -> bool:
    """Still complete and marked exactly as when its images were made again (nothing changed since)."""
    rows = conn.execute(
        "SELECT 1 FROM photos WHERE id = ? AND status = 'complete' AND views_stale = ?", (photo_id, stale)
    ).fetchall()
    return bool(rows)


def views_refreshed(conn: Connection, photo_id: int, stale: int, token: str | None = None) -> bool:
    """The images were made again from the settings of the time ``stale`` was read; False when the watermark
    changed once more since (the photo stays marked and is made again), or, with ``token``, when the photo's
    views lease is no longer that token's (another process may have made them since)."""
    conn.execute("UPDATE photos SET views_stale = 0 WHERE id = ? AND views_stale = ? AND (? IS NULL OR EXISTS "
                 "(SELECT 1 FROM leases WHERE leases.name = ? AND leases.token = ?))",
                 (photo_id, stale, token, views_lease(photo_id), token))
    return conn.changes() == 1






def retry(conn: Connection, photo_id: int) -> bool:
    """``failed`` -> ``pending`` with a fresh attempt budget; nothing else moves."""
    conn.execute(
        "UPDATE photos SET status = 'pending', error = NULL, attempts = 0, interruptions = 0, completed_at = NULL "
        "WHERE id = ? AND status = 'failed'",
        (photo_id,),
    )
    if conn.changes() == 1:
        conn.execute("UPDATE uploads SET completed_at = NULL WHERE id = (SELECT upload_id FROM photos WHERE id = ?)",
                     (photo_id,))
        return True
    return False


def requeue_for_derivatives(conn: Connection, photo_id: int) -> bool:
    """``complete`` -> ``pending`` with a fresh attempts budget, so that a worker makes the images again.

    Guarded by the status: a photo that moved on (deleted, already requeued) is left alone. The upload group
    stays completed, so no second ``upload.completed`` is sent; ``photo.uploaded`` keeps its id.
    """
    conn.execute(
        "UPDATE photos SET status = 'pending', attempts = 0, error = NULL, claim_token = NULL, lease_until = NULL, "
        "completed_at = NULL WHERE id = ? AND status = 'complete'",
        (photo_id,),
    )
    return conn.changes() == 1


def mark_missing_original(conn: Connection, photo_id: int, now: float) -> bool:
    conn.execute(
        "UPDATE photos SET status = 'failed', claim_token = NULL, lease_until = NULL, completed_at = ?, "
        "error = ? WHERE id = ? AND status != 'failed'",
        (now, ORIGINAL_MISSING, photo_id),
    )
    return conn.changes() == 1


def upload_counts(conn: Connection, upload_id: str) -> Row:
    return conn.execute(Prepared(
        "SELECT count(*) AS total, "
        "count(*) FILTER (WHERE status = 'pending') AS pending, "
        "count(*) FILTER (WHERE status = 'processing') AS processing, "
        "count(*) FILTER (WHERE status = 'complete') AS complete, count(*) FILTER (WHERE status = 'failed') AS failed "
        "FROM photos WHERE upload_id = ?"),
        (upload_id,),
    ).fetchall()[0]


def upload_photos(conn: Connection, upload_id: str) -> list[Row]:
    return conn.execute(Prepared(
        "SELECT id, display_name, status, error, width, height, size, awaiting_approval, media_type, duration "
        "FROM photos "
        "WHERE upload_id = ? ORDER BY id"),
        (upload_id,),
    ).fetchall()


def finish_upload_if_terminal(conn: Connection, upload_id: str, now: float) -> bool:
    """Mark the upload group completed when its request has ended and every photo is terminal. True only the
    first time. While ``receiving_until`` is set more photos may still come, so the group is not complete."""
    conn.execute(Prepared(
        "UPDATE uploads SET completed_at = ? WHERE id = ? AND completed_at IS NULL AND receiving_until IS NULL "
        "AND NOT EXISTS "
        "(SELECT 1 FROM photos WHERE upload_id = ? AND status NOT IN ('complete', 'failed'))"),
        (now, upload_id, upload_id),
    )
    return conn.changes() == 1


def delete(conn: Connection, photo_id: int) -> Row | None:
    rows = conn.execute("DELETE FROM photos WHERE id = ? RETURNING *", (photo_id,)).fetchall()
    return rows[0] if rows else None


def existing_ids(conn: Connection, ids: list[int]) -> list[int]:
    """Those of ``ids`` that still have a row (backup asks the live database which photos went meanwhile)."""
    marks = ", ".join("?" * len(ids))
    return [r["id"] for r in conn.execute(f"SELECT id FROM photos WHERE id IN ({marks})", ids).fetchall()]


def key_in_use(conn: Connection, storage_key: str) -> bool:
    """A photo's files, or those of a previous version kept until a replacement is confirmed."""
    if conn.execute("SELECT 1 FROM photos WHERE storage_key = ?", (storage_key,)).fetchall():
        return True
    return storage_key in replacement.previous_keys(conn)


def keys_of_gallery(conn: Connection, gallery_id: int) -> list[str]:
    rows = conn.execute("SELECT storage_key FROM photos WHERE gallery_id = ?", (gallery_id,)).fetchall()
    return [r["storage_key"] for r in rows]


def rows_for_check(conn: Connection) -> list[Row]:
    """Every photo with what ``check`` and ``backup`` verify its original against. ``archived``: its gallery is
    not active (pipeline/archive.py), so its original may rightly be packed away (in ``archive_object``, once
    that is set) and its images gone."""
    return conn.execute("SELECT p.id, p.storage_key, p.sha256, p.status, p.display_name, "
                        "g.archive_state != 'active' AS archived, g.archive_object FROM photos p "
                        "JOIN galleries g ON g.id = p.gallery_id ORDER BY p.id").fetchall()


def rows_with_keys(conn: Connection) -> list[Row]:
    """Every photo's key (for the reconciler); ``archived`` as in :func:`rows_for_check`."""
    return conn.execute("SELECT p.id, p.storage_key, p.status, g.archive_state != 'active' AS archived "
                        "FROM photos p JOIN galleries g ON g.id = p.gallery_id").fetchall()


def original_guard(conn: Connection, photo_id: int) -> Row | None:
    """What the reconciler compares before and after it asks the storage for a photo's original: the key, the
    status, and the gallery's archive state with the time of its last archiving (a restore in between changes it)."""
    rows = conn.execute("SELECT p.id, p.storage_key, p.status, g.archive_state, g.archived_at FROM photos p "
                        "JOIN galleries g ON g.id = p.gallery_id WHERE p.id = ?", (photo_id,)).fetchall()
    return rows[0] if rows else None


def count_pending(conn: Connection) -> int:
    """Photos waiting for a worker (on the queue's index)."""
    return conn.execute(Prepared("SELECT count(*) AS n FROM photos WHERE status = 'pending'")).fetchall()[0]["n"]


def queue_counts(conn: Connection) -> Row:
    return conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'pending') AS pending, "
        "count(*) FILTER (WHERE status = 'processing') AS processing FROM photos"
    ).fetchall()[0]


def timings(conn: Connection) -> list[Row]:
    """When each photo's row was written and when it became terminal (``picpeak-lite bench`` reads these)."""
    return conn.execute(
        "SELECT id, upload_id, display_name, status, created_at, completed_at FROM photos ORDER BY id"
    ).fetchall()
