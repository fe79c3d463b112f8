"""SQL for the admin account, its sessions and API tokens."""

from __future__ import annotations

from picpeak_lite.store.db import Connection, Row


def get_user_by_name(conn: Connection, username: str) -> Row | None:
    rows = conn.execute("SELECT * FROM admin_users WHERE username = ?", (username,)).fetchall()
    return rows[0] if rows else None


def create_user(conn: Connection, username: str, password_hash: str, now: float) -> int:
    return int(conn.execute(
        "INSERT INTO admin_users (username, password_hash, created_at, password_changed_at) VALUES (?, ?, ?, ?) "
        "RETURNING id",
        (username, password_hash, now, now),
    ).fetchall()[0]["id"])


def set_password(conn: Connection, user_id: int, password_hash: str, now: float) -> None:
    """Change the password and revoke every session of that user."""
    conn.execute(
        "UPDATE admin_users SET password_hash = ?, password_changed_at = ? WHERE id = ?",
        (password_hash, now, user_id),
    )
    conn.execute(
        "UPDATE admin_sessions SET revoked_at = ? WHERE user_id = ? AND revoked_at IS NULL", (now, user_id)
    )


def create_session(conn: Connection, user_id: int, token_hash: str, csrf_token: str, now: float,
                   expires_at: float) -> None:
    conn.execute(
        "INSERT INTO admin_sessions (token_hash, user_id, csrf_token, created_at, expires_at) "
        "VALUES (?, ?, ?, ?, ?)",
        (token_hash, user_id, csrf_token, now, expires_at),
    )
    # Keep the table small: forget sessions that ended more than a day ago.
    conn.execute("DELETE FROM admin_sessions WHERE expires_at < ? OR revoked_at < ?", (now - 86400, now - 86400))


def get_session(conn: Connection, token_hash: str, now: float) -> Row | None:
    rows = conn.execute(
        "SELECT s.id, s.user_id, s.csrf_token, u.username FROM admin_sessions s "
        "JOIN admin_users u ON u.id = s.user_id "
        "WHERE s.token_hash = ? AND s.revoked_at IS NULL AND s.expires_at > ?",
        (token_hash, now),
    ).fetchall()
    return rows[0] if rows else None


def revoke_session(conn: Connection, token_hash: str, now: float) -> None:
    conn.execute(
        "UPDATE admin_sessions SET revoked_at = ? WHERE token_hash = ? AND revoked_at IS NULL", (now, token_hash)
    )


def create_token(conn: Connection, name: str, token_hash: str, now: float) -> int:
    return int(conn.execute(
        "INSERT INTO api_tokens (name, token_hash, created_at) VALUES (?, ?, ?) RETURNING id", (name, token_hash, now)
    ).fetchall()[0]["id"])


def revoke_token(conn: Connection, name: str, now: float) -> bool:
    conn.execute("UPDATE api_tokens SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL", (now, name))
    return conn.changes() > 0


def list_tokens(conn: Connection) -> list[Row]:
    return conn.execute(
        "SELECT id, name, created_at, last_used_at, revoked_at FROM api_tokens ORDER BY id"
    ).fetchall()


def get_token(conn: Connection, token_hash: str) -> Row | None:
    rows = conn.execute(
        "SELECT id, name, last_used_at FROM api_tokens WHERE token_hash = ? AND revoked_at IS NULL",
        (token_hash,),
    ).fetchall()
    return rows[0] if rows else None


def touch_token(conn: Connection, token_id: int, now: float) -> None:
    conn.execute("UPDATE api_tokens SET last_used_at = ? WHERE id = ?", (now, token_id))
