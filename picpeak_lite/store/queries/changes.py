"""SQL for the change log (``photo_changes``, filled by triggers on ``photos`` and on guests' feedback: those
rows have ``feedback = 1``; an upload's feed never reads them)."""

from __future__ import annotations

from picpeak_lite.store.db import Connection, Prepared, Row

_WITH_DETAILS = (
    "SELECT c.seq, c.photo_id, c.gallery_id, c.upload_id, c.status, c.hidden, c.awaiting_approval, c.feedback, "
    "p.display_name, p.error, p.width, p.height, p.guest_name, p.media_type, p.duration "
    "FROM photo_changes c LEFT JOIN photos p ON p.id = c.photo_id "
)


_AFTER = Prepared(_WITH_DETAILS + "WHERE c.seq > ? ORDER BY c.seq LIMIT ?")


def after(conn: Connection, seq: int, limit: int = 1000) -> list[Row]:
    """The change feed's read, after every commit that logged a change: prepared (see ``db.Prepared``)."""
    return conn.execute(_AFTER, (seq, limit)).fetchall()


def for_upload_after(conn: Connection, upload_id: str, seq: int, limit: int = 1000) -> list[Row]:
    return conn.execute(
        _WITH_DETAILS + "WHERE c.upload_id = ? AND c.seq > ? AND c.feedback = 0 ORDER BY c.seq LIMIT ?",
        (upload_id, seq, limit),
    ).fetchall()


def for_gallery_after(conn: Connection, gallery_id: int, seq: int, limit: int = 1000) -> list[Row]:
    return conn.execute(
        _WITH_DETAILS + "WHERE c.gallery_id = ? AND c.seq > ? ORDER BY c.seq LIMIT ?", (gallery_id, seq, limit)
    ).fetchall()


def latest_seq(conn: Connection) -> int:
    return conn.execute("SELECT coalesce(max(seq), 0) AS seq FROM photo_changes").fetchall()[0]["seq"]


def oldest_seq(conn: Connection) -> int:
    """The first seq still in the log (later ones are all there); 0 when the log is empty."""
    return conn.execute("SELECT coalesce(min(seq), 0) AS seq FROM photo_changes").fetchall()[0]["seq"]


def prune(conn: Connection, before: float) -> int:
    """Forget changes older than ``before``, always keeping the newest one (it carries the sequence)."""
    conn.execute(
        "DELETE FROM photo_changes WHERE created_at < ? AND seq < (SELECT max(seq) FROM photo_changes)", (before,)
    )
    return conn.changes()
