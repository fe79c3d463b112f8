"""SQL for tus uploads (schema: ``tus_uploads``): one row per file sent with the resumable protocol.

The protocol lives in ``web/views/tus.py``, the rules in ``pipeline/resumable.py``; these are their reads and
writes, each a sync ``fn(conn, ...)`` run inside ``Database.read`` / ``Database.write``.
"""

from __future__ import annotations

from picpeak_lite.store.db import Connection, Row

RECEIVING = "receiving"
DONE = "done"
EXPIRED = "expired"


def insert(conn: Connection, *, tus_id: str, gallery_id: int, uploaded_by: str, guest_session_id: int | None,
           upload_id: str, group_key: str | None, length: int, metadata: str, filename: str,
           guest_name: str | None, client_ip: str | None, now: float, expires_at: float) -> None:
    conn.execute(
        "INSERT INTO tus_uploads (id, gallery_id, uploaded_by, guest_session_id, upload_id, group_key, "
        "upload_length, metadata, filename, guest_name, client_ip, created_at, expires_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (tus_id, gallery_id, uploaded_by, guest_session_id, upload_id, group_key, length, metadata, filename,
         guest_name, client_ip, now, expires_at),
    )


def get(conn: Connection, tus_id: str) -> Row | None:
    rows = conn.execute("SELECT * FROM tus_uploads WHERE id = ?", (tus_id,)).fetchall()
    return rows[0] if rows else None


def open_group(conn: Connection, gallery_id: int, uploaded_by: str, guest_session_id: int | None,
               group_key: str) -> str | None:
    """The upload group a file of this uploader's batch ``group_key`` joins: one still receiving files."""
    rows = conn.execute(
        "SELECT t.upload_id FROM tus_uploads t JOIN uploads u ON u.id = t.upload_id "
        "WHERE t.gallery_id = ? AND t.uploaded_by = ? AND t.guest_session_id IS NOT DISTINCT FROM ? "
        "AND t.group_key = ? "
        "AND u.receiving_until IS NOT NULL ORDER BY t.created_at DESC LIMIT 1",
        (gallery_id, uploaded_by, guest_session_id, group_key),
    ).fetchall()
    return rows[0]["upload_id"] if rows else None


def count_in_group(conn: Connection, upload_id: str) -> int:
    return conn.execute("SELECT count(*) AS n FROM tus_uploads WHERE upload_id = ?", (upload_id,)).fetchall()[0]["n"]


def unfinished_of_owner(conn: Connection, gallery_id: int, uploaded_by: str,
                        guest_session_id: int | None, now: float) -> int:
    rows = conn.execute(
        "SELECT count(*) AS n FROM tus_uploads WHERE gallery_id = ? AND uploaded_by = ? "
        "AND guest_session_id IS NOT DISTINCT FROM ? "
        "AND state = 'receiving' AND expires_at >= ?",
        (gallery_id, uploaded_by, guest_session_id, now),
    ).fetchall()
    return rows[0]["n"]


def outstanding_bytes(conn: Connection, uploaded_by: str, client_ip: str | None, now: float) -> int:
    """Bytes that one party's unfinished, unexpired uploads have announced and not sent yet: they count against
    the disk reserve when that party creates another upload. A party is the admin, or the guests at one client
    address; nobody's reservations are counted against anyone else, so a stranger cannot make the disk look
    full to others (each guest party's are capped, see :func:`guest_unfinished_of_client`)."""
    rows = conn.execute(
        "SELECT coalesce(sum(upload_length - upload_offset), 0) AS n FROM tus_uploads "
        "WHERE state = 'receiving' AND expires_at >= ? AND uploaded_by = ? "
        "AND (uploaded_by = 'admin' OR client_ip IS NOT DISTINCT FROM ?)",
        (now, uploaded_by, client_ip),
    ).fetchall()
    return rows[0]["n"]


def guest_unfinished_of_client(conn: Connection, client_ip: str, now: float) -> tuple[int, int]:
    """Guests' unfinished, unexpired uploads created from ``client_ip`` (all sessions, all galleries): how many,
    and the bytes they announced."""
    row = conn.execute(
        "SELECT count(*) AS n, coalesce(sum(upload_length), 0) AS bytes FROM tus_uploads "
        "WHERE client_ip = ? AND state = 'receiving' AND uploaded_by = 'guest' AND expires_at >= ?",
        (client_ip, now),
    ).fetchall()[0]
    return row["n"], row["bytes"]


def guest_unfinished_bytes_in_gallery(conn: Connection, gallery_id: int, now: float) -> int:
    """The bytes guests' unfinished, unexpired uploads in one gallery announced."""
    rows = conn.execute(
        "SELECT coalesce(sum(upload_length), 0) AS n FROM tus_uploads "
        "WHERE gallery_id = ? AND state = 'receiving' AND uploaded_by = 'guest' AND expires_at >= ?",
        (gallery_id, now),
    ).fetchall()
    return rows[0]["n"]


def set_offset(conn: Connection, tus_id: str, offset: int, expires_at: float) -> bool:
    """Record a durable offset (and the expiry it slides to); False when the row is gone or no longer receiving."""
    conn.execute("UPDATE tus_uploads SET upload_offset = ?, expires_at = ? WHERE id = ? AND state = 'receiving'",
                 (offset, expires_at, tus_id))
    return conn.changes() == 1


def extend_group(conn: Connection, upload_id: str, until: float) -> None:
    """A batch's group stays receiving for as long as any of its files may still arrive."""
    conn.execute("UPDATE uploads SET receiving_until = CASE WHEN receiving_until > ? THEN receiving_until ELSE ? END "
                 "WHERE id = ? AND receiving_until IS NOT NULL", (until, until, upload_id))


def mark_done(conn: Connection, tus_id: str, photo_id: int | None, duplicate: bool, keep_until: float) -> bool:
    conn.execute(
        "UPDATE tus_uploads SET state = 'done', photo_id = ?, duplicate = ?, expires_at = ? "
        "WHERE id = ? AND state = 'receiving'",
        (photo_id, int(duplicate), keep_until, tus_id),
    )
    return conn.changes() == 1


def mark_refused(conn: Connection, tus_id: str, error: str, status: int, keep_until: float) -> bool:
    """The file will never be a photo (the intake refused it, or the server gave up): the row is kept as long as
    a finished one, without its bytes, to tell HEAD and PATCH why."""
    conn.execute(
        "UPDATE tus_uploads SET state = 'done', photo_id = NULL, error = ?, error_status = ?, expires_at = ? "
        "WHERE id = ? AND state = 'receiving'",
        (error, status, keep_until, tus_id),
    )
    return conn.changes() == 1


def record_finish_failure(conn: Connection, tus_id: str, attempts: int, finish_after: float) -> None:
    """A try at making the photo failed for a reason that may pass (the bucket, the disk): tried again then."""
    conn.execute("UPDATE tus_uploads SET finish_attempts = ?, finish_after = ? WHERE id = ? AND state = 'receiving'",
                 (attempts, finish_after, tus_id))


def finishing_due(conn: Connection, now: float, limit: int = 100) -> list[Row]:
    """Complete uploads (every byte durable) without their photo yet, whose next try is due."""
    return conn.execute(
        "SELECT * FROM tus_uploads WHERE state = 'receiving' AND upload_offset = upload_length "
        "AND (finish_after IS NULL OR finish_after <= ?) ORDER BY created_at LIMIT ?",
        (now, limit),
    ).fetchall()


def next_finish_at(conn: Connection) -> float | None:
    """When the next complete upload's try is due (NULL ones are due at once); None when none waits."""
    rows = conn.execute(
        "SELECT min(coalesce(finish_after, 0)) AS t FROM tus_uploads "
        "WHERE state = 'receiving' AND upload_offset = upload_length").fetchall()
    return rows[0]["t"]


def delete(conn: Connection, tus_id: str) -> Row | None:
    rows = conn.execute("DELETE FROM tus_uploads WHERE id = ? RETURNING *", (tus_id,)).fetchall()
    return rows[0] if rows else None


def receiving_in_group(conn: Connection, upload_id: str) -> int:
    rows = conn.execute("SELECT count(*) AS n FROM tus_uploads WHERE upload_id = ? AND state = 'receiving'",
                        (upload_id,)).fetchall()
    return rows[0]["n"]


def expire_due(conn: Connection, now: float, tombstone_until: float, busy: list[str]) -> list[Row]:
    """Unfinished uploads past their expiry become tombstones (410 from now on); returns them (their bytes go).
    A tombstone keeps only what a 410 needs: its metadata (up to a few KB) is dropped. ``busy``: uploads a
    request is writing now, left alone (that request records their progress). A complete upload (every byte
    durable, its photo not made yet) never expires: making its photo is the server's job."""
    spared = f"AND id NOT IN ({', '.join('?' for _ in busy)}) " if busy else ""
    return conn.execute(
        "UPDATE tus_uploads SET state = 'expired', expires_at = ?, metadata = '', guest_name = NULL "
        f"WHERE state = 'receiving' AND upload_offset < upload_length AND expires_at < ? {spared}RETURNING *",
        (tombstone_until, now, *busy),
    ).fetchall()


def forget_old(conn: Connection, now: float) -> int:
    """Finished uploads and tombstones whose keeping time is over are forgotten (404 from then on)."""
    conn.execute("DELETE FROM tus_uploads WHERE state != 'receiving' AND expires_at < ?", (now,))
    return conn.changes()


def receiving_ids(conn: Connection) -> set[str]:
    rows = conn.execute("SELECT id FROM tus_uploads WHERE state = 'receiving'").fetchall()
    return {r["id"] for r in rows}
