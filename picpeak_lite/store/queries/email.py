"""The email outbox: the only SQL that touches ``email_outbox``, and the reads that decide which reminders and
digests are due.

A message is queued whole (``message``: the RFC 5322 bytes with their Message-ID) by ``domain/email.py`` in the
transaction that decides it; ``events/email.py`` claims due rows (``store/queries/outbox.py``), sends them and
records the outcome here. Every function is sync and takes the connection first; times are passed in.
"""

from __future__ import annotations

from typing import Any

from picpeak_lite.store.db import Connection
from picpeak_lite.store.queries import outbox

TABLE = "email_outbox"
# last_error / last_reply are shown on the settings page; a server's long answer must not fill the database.
MAX_TEXT_CHARS = 500


def enqueue(
    conn: Connection,
    *,
    message_id: str,
    dedup_key: str,
    kind: str,
    gallery_id: int | None,
    recipient: str,
    subject: str,
    message: bytes,
    now: float,
) -> int | None:
    """Queue one message, due now; returns its row id, or None when a message about ``dedup_key`` is already
    queued (or sent): the first one stands."""
    rows = conn.execute(
        """
        INSERT INTO email_outbox
            (message_id, dedup_key, kind, gallery_id, recipient, subject, message, created_at, next_attempt_at)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
        ON CONFLICT (dedup_key) DO NOTHING
        RETURNING id
        """,
        (message_id, dedup_key, kind, gallery_id, recipient, subject, message, now, now),
    ).fetchall()
    return rows[0]["id"] if rows else None


def is_queued(conn: Connection, dedup_key: str) -> bool:
    return bool(conn.execute("SELECT 1 FROM email_outbox WHERE dedup_key = ?", (dedup_key,)).fetchall())


def claim_due(conn: Connection, now: float, limit: int, lease_seconds: float) -> list[dict[str, Any]]:
    return outbox.claim_due(conn, TABLE, now, limit, lease_seconds)


def next_due_at(conn: Connection) -> float | None:
    return outbox.next_due_at(conn, TABLE)


def sent_since(conn: Connection, since: float) -> list[float]:
    """When each message sent since ``since`` went out, oldest first: the rate limit's window."""
    rows = conn.execute(
        "SELECT sent_at FROM email_outbox WHERE sent_at IS NOT NULL AND sent_at > ? ORDER BY sent_at", (since,)
    ).fetchall()
    return [r["sent_at"] for r in rows]


def record_sent(conn: Connection, row_id: int, reply: str, now: float) -> None:
    """The server accepted the message (2xx after DATA): done."""
    conn.execute(
        """
        UPDATE email_outbox SET status = 'sent', attempts = attempts + 1, last_reply = ?, last_error = NULL,
            sent_at = ?
        WHERE id = ? AND status = 'pending'
        """,
        (reply[:MAX_TEXT_CHARS], now, row_id),
    )


def release(conn: Connection, row_id: int, now: float) -> None:
    """Hand a claimed row back, due at ``now``, without counting an attempt (the rate limit said wait)."""
    conn.execute("UPDATE email_outbox SET next_attempt_at = ? WHERE id = ? AND status = 'pending'", (now, row_id))


def record_failure(
    conn: Connection, row_id: int, error: str, now: float, *, final: bool = False
) -> dict[str, Any] | None:
    """Count one failed attempt and schedule the next (``outbox.after_failure``); None when no longer pending."""
    row = conn.execute(
        "SELECT attempts FROM email_outbox WHERE id = ? AND status = 'pending'", (row_id,)
    ).fetchall()
    if not row:
        return None
    attempts = row[0]["attempts"] + 1
    status, next_attempt_at = outbox.after_failure(attempts, now, final=final)
    return conn.execute(
        """
        UPDATE email_outbox SET status = ?, attempts = ?, next_attempt_at = ?, last_error = ?
        WHERE id = ?
        RETURNING id, status, attempts, recipient, kind
        """,
        (status, attempts, next_attempt_at, error[:MAX_TEXT_CHARS], row_id),
    ).fetchall()[0]


def list_messages(conn: Connection, *, limit: int = 50) -> list[dict[str, Any]]:
    """The newest messages first, without their bytes, for the settings page."""
    return conn.execute(
        """
        SELECT id, message_id, kind, gallery_id, recipient, subject, created_at, status, attempts,
            next_attempt_at, last_error, last_reply, sent_at
        FROM email_outbox ORDER BY id DESC LIMIT ?
        """,
        (limit,),
    ).fetchall()


def counts(conn: Connection) -> dict[str, int]:
    out = {"pending": 0, "sent": 0, "failed": 0}
    for row in conn.execute("SELECT status, count(*) AS n FROM email_outbox GROUP BY status"):
        out[row["status"]] = row["n"]
    return out


def galleries_expiring(conn: Connection, now: float, until: float) -> list[dict[str, Any]]:
    """Published galleries whose expiry falls in (now, until]: the reminders' candidates."""
    return conn.execute(
        "SELECT * FROM galleries WHERE is_draft = 0 AND expires_at IS NOT NULL AND expires_at > ? "
        "AND expires_at <= ? ORDER BY id",
        (now, until),
    ).fetchall()


def galleries_expired(conn: Connection, since: float, now: float) -> list[dict[str, Any]]:
    """Published galleries that expired in (since, now]: an old gallery expired long before email was set up
    is not announced."""
    return conn.execute(
        "SELECT * FROM galleries WHERE is_draft = 0 AND expires_at IS NOT NULL AND expires_at > ? "
        "AND expires_at <= ? ORDER BY id",
        (since, now),
    ).fetchall()


def last_digest_at(conn: Connection, gallery_id: int) -> float | None:
    """When the last digest of this gallery was queued (None: never)."""
    row = conn.execute(
        "SELECT max(created_at) AS at FROM email_outbox WHERE gallery_id = ? AND kind = 'guest_digest'",
        (gallery_id,),
    ).fetchall()[0]
    return row["at"]


def guest_activity(conn: Connection, since: float) -> list[dict[str, Any]]:
    """Per gallery with guest uploads created after ``since``: how many, and how many of the gallery's photos
    wait for approval now."""
    return conn.execute(
        """
        SELECT g.*, (SELECT count(*) FROM photos p WHERE p.gallery_id = g.id AND p.uploaded_by = 'guest'
                     AND p.created_at > ?) AS new_guest_photos,
               (SELECT count(*) FROM photos p WHERE p.gallery_id = g.id AND p.awaiting_approval = 1)
                   AS awaiting_approval
        FROM galleries g
        WHERE EXISTS (SELECT 1 FROM photos p WHERE p.gallery_id = g.id AND p.uploaded_by = 'guest'
                      AND p.created_at > ?)
        ORDER BY g.id
        """,
        (since, since),
    ).fetchall()


def new_guest_photos(conn: Connection, gallery_id: int, since: float) -> tuple[int, int]:
    """(guest photos created since ``since``, photos waiting for approval) in one gallery. A photo made in the
    very instant of the last digest counts again rather than never."""
    row = conn.execute(
        """
        SELECT (SELECT count(*) FROM photos WHERE gallery_id = ? AND uploaded_by = 'guest' AND created_at >= ?) AS n,
               (SELECT count(*) FROM photos WHERE gallery_id = ? AND awaiting_approval = 1) AS waiting
        """,
        (gallery_id, since, gallery_id),
    ).fetchall()[0]
    return row["n"], row["waiting"]


def session_favourites(conn: Connection, guest_session_id: int, gallery_id: int) -> tuple[list[str], str]:
    """One guest session's favourites in a gallery (file names, in name order) and the name it gave ('' if
    none): what "send my selection" tells the photographer."""
    rows = conn.execute(
        "SELECT p.display_name FROM favourites f JOIN photos p ON p.id = f.photo_id "
        "WHERE f.guest_session_id = ? AND p.gallery_id = ? ORDER BY p.display_name, p.id",
        (guest_session_id, gallery_id),
    ).fetchall()
    name = conn.execute("SELECT coalesce(guest_name, '') AS name FROM guest_sessions WHERE id = ?",
                        (guest_session_id,)).fetchall()
    return [r["display_name"] for r in rows], (name[0]["name"] if name else "")
