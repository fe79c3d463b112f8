"""SQL for guest sessions and the password grants they hold."""

from __future__ import annotations

from picpeak_lite.store.db import Connection, Row


def create_session(conn: Connection, token_hash: str, csrf_token: str, now: float) -> int:
    conn.execute(
        "INSERT INTO guest_sessions (token_hash, csrf_token, created_at, last_seen_at) VALUES (?, ?, ?, ?)",
        (token_hash, csrf_token, now, now),
    )
    return conn.last_insert_rowid()


def get_session(conn: Connection, token_hash: str) -> Row | None:
    rows = conn.execute(
        "SELECT id, csrf_token, guest_name FROM guest_sessions WHERE token_hash = ?", (token_hash,)
    ).fetchall()
    return rows[0] if rows else None


def set_name(conn: Connection, session_id: int, name: str | None) -> None:
    conn.execute("UPDATE guest_sessions SET guest_name = ? WHERE id = ?", (name, session_id))


def grant_access(conn: Connection, session_id: int, gallery_id: int, password_version: int, now: float) -> None:
    conn.execute(
        "INSERT INTO gallery_access (guest_session_id, gallery_id, password_version, granted_at) "
        "VALUES (?, ?, ?, ?) ON CONFLICT (guest_session_id, gallery_id) "
        "DO UPDATE SET password_version = excluded.password_version, granted_at = excluded.granted_at",
        (session_id, gallery_id, password_version, now),
    )


def has_access(conn: Connection, session_id: int, gallery_id: int, password_version: int) -> bool:
    rows = conn.execute(
        "SELECT 1 FROM gallery_access WHERE guest_session_id = ? AND gallery_id = ? AND password_version = ?",
        (session_id, gallery_id, password_version),
    ).fetchall()
    return bool(rows)


def prune_idle_sessions(conn: Connection, before: float) -> int:
    """Forget sessions created before ``before`` that hold nothing: no grant, favourite, upload, like, rating or
    comment."""
    conn.execute(
        "DELETE FROM guest_sessions WHERE created_at < ? "
        "AND NOT EXISTS (SELECT 1 FROM gallery_access a WHERE a.guest_session_id = guest_sessions.id) "
        "AND NOT EXISTS (SELECT 1 FROM favourites f WHERE f.guest_session_id = guest_sessions.id) "
        "AND NOT EXISTS (SELECT 1 FROM uploads u WHERE u.guest_session_id = guest_sessions.id) "
        "AND NOT EXISTS (SELECT 1 FROM photo_likes l WHERE l.guest_session_id = guest_sessions.id) "
        "AND NOT EXISTS (SELECT 1 FROM photo_ratings r WHERE r.guest_session_id = guest_sessions.id) "
        "AND NOT EXISTS (SELECT 1 FROM photo_comments c WHERE c.guest_session_id = guest_sessions.id)",
        (before,),
    )
    return conn.changes()
