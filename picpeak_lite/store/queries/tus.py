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


# --- the writer lease: one request in one process writes an upload at a time --------------------------------

def claim_writer(conn: Connection, tus_id: str, offset: int, holder: str, token: str, now: float,
                 until: float, gone: str | None = None) -> Row | None:
    """Take the writer lease of a receiving upload at ``offset``: when nobody holds it, its holder's time is
    over (the process died), ``holder`` (this process) holds it (its own older request, already stopped), or
    its holder is ``gone`` (a process known to have died). The row as taken, or None (the caller reads the row
    to learn why)."""
    rows = conn.execute(
        "UPDATE tus_uploads SET writer_id = ?, writer_token = ?, writer_until = ? "
        "WHERE id = ? AND state = 'receiving' AND upload_offset = ? AND upload_offset < upload_length "
        "AND (writer_token IS NULL OR writer_until < ? OR writer_id = ? OR writer_id = ?) RETURNING *",
        (holder, token, until, tus_id, offset, now, holder, gone),
    ).fetchall()
    return rows[0] if rows else None


def renew_writer(conn: Connection, tus_id: str, token: str, until: float, expires_at: float) -> bool:
    """Bytes are flowing: the lease runs on, and so does the upload's idle expiry. False when the lease is no
    longer this request's (taken over after it ran out) or the upload ended."""
    conn.execute(
        "UPDATE tus_uploads SET writer_until = ?, "
        "expires_at = CASE WHEN expires_at > ? THEN expires_at ELSE ? END "
        "WHERE id = ? AND writer_token = ? AND state = 'receiving'",
        (until, expires_at, expires_at, tus_id, token),
    )
    return conn.changes() == 1


def set_offset(conn: Connection, tus_id: str, token: str, offset: int, expires_at: float) -> bool:
    """Record a durable offset (and the expiry it slides to) and let the lease go, fenced by the lease's token: a
    writer whose lease was taken over can never move the offset. False when the row is gone, no longer
    receiving, or no longer this writer's."""
    conn.execute(
        "UPDATE tus_uploads SET upload_offset = ?, expires_at = ?, writer_id = NULL, writer_token = NULL, "
        "writer_until = NULL WHERE id = ? AND state = 'receiving' AND writer_token = ?",
        (offset, expires_at, tus_id, token))
    return conn.changes() == 1


def release_writer(conn: Connection, tus_id: str, token: str) -> bool:
    """The request ends without new bytes: the lease goes (if it is still this request's)."""
    conn.execute("UPDATE tus_uploads SET writer_id = NULL, writer_token = NULL, writer_until = NULL "
                 "WHERE id = ? AND writer_token = ?", (tus_id, token))
    return conn.changes() == 1


# --- the finishing claim: one try at an upload's photo at a time, in any process --------------------------------

def claim_finish(conn: Connection, tus_id: str, token: str, now: float, until: float) -> Row | None:
    """Claim a try at making the photo of a complete upload (as ``claims.claim_next`` claims a photo): when no
    try holds it, or the one that did is past its deadline (its process died). The row as claimed, or None."""
    rows = conn.execute(
        "UPDATE tus_uploads SET finish_token = ?, finish_until = ? "
        "WHERE id = ? AND state = 'receiving' AND upload_offset = upload_length "
        "AND (finish_token IS NULL OR finish_until < ?) RETURNING *",
        (token, until, tus_id, now),
    ).fetchall()
    return rows[0] if rows else None


def release_finish(conn: Connection, tus_id: str, token: str) -> bool:
    conn.execute("UPDATE tus_uploads SET finish_token = NULL, finish_until = NULL WHERE id = ? AND finish_token = ?",
                 (tus_id, token))
    return conn.changes() == 1


def delete_unless_finishing(conn: Connection, tus_id: str, now: float) -> Row | None:
    """tus termination: the row goes unless a try at its photo holds a live claim (that try ends first)."""
    rows = conn.execute(
        "DELETE FROM tus_uploads WHERE id = ? "
        "AND NOT (state = 'receiving' AND finish_token IS NOT NULL AND finish_until >= ?) RETURNING *",
        (tus_id, now),
    ).fetchall()
    return rows[0] if rows else None


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
    """Complete uploads (every byte durable) without their photo yet, whose next try is due and that no live try
    (in any process) has claimed."""
    return conn.execute(
        "SELECT * FROM tus_uploads WHERE state = 'receiving' AND upload_offset = upload_length "
        "AND (finish_after IS NULL OR finish_after <= ?) AND (finish_token IS NULL OR finish_until < ?) "
        "ORDER BY created_at LIMIT ?",
        (now, now, limit),
    ).fetchall()


def next_finish_at(conn: Connection) -> float | None:
    """When the next complete upload's try is due (NULL ones are due at once; a claimed one when its claim runs
    out, if its try has not settled it by then); None when none waits."""
    rows = conn.execute(
        "SELECT min(CASE WHEN finish_token IS NOT NULL AND finish_until > coalesce(finish_after, 0) "
        "THEN finish_until ELSE coalesce(finish_after, 0) END) AS t FROM tus_uploads "
        "WHERE state = 'receiving' AND upload_offset = upload_length").fetchall()
    return rows[0]["t"]


def receiving_in_group(conn: Connection, upload_id: str) -> int:
    rows = conn.execute("SELECT count(*) AS n FROM tus_uploads WHERE upload_id = ? AND state = 'receiving'",
                        (upload_id,)).fetchall()
    return rows[0]["n"]


def expire_due(conn: Connection, now: float, tombstone_until: float) -> list[Row]:
    """Unfinished uploads past their expiry become tombstones (410 from now on); returns them (their bytes go).
    A tombstone keeps only what a 410 needs: its metadata (up to a few KB) is dropped. An upload whose writer
    lease is live (a request in any process is writing it now) is left alone: that request records its progress.
    A complete upload (every byte durable, its photo not made yet) never expires: making its photo is the
    server's job."""
    return conn.execute(
        "UPDATE tus_uploads SET state = 'expired', expires_at = ?, metadata = '', guest_name = NULL "
        "WHERE state = 'receiving' AND upload_offset < upload_length AND expires_at < ? "
        "AND (writer_token IS NULL OR writer_until < ?) RETURNING *",
        (tombstone_until, now, now),
    ).fetchall()


def forget_old(conn: Connection, now: float) -> int:
    """Finished uploads and tombstones whose keeping time is over are forgotten (404 from then on)."""
    conn.execute("DELETE FROM tus_uploads WHERE state != 'receiving' AND expires_at < ?", (now,))
    return conn.changes()


def receiving_ids(conn: Connection) -> set[str]:
    rows = conn.execute("SELECT id FROM tus_uploads WHERE state = 'receiving'").fetchall()
    return {r["id"] for r in rows}
