"""SQL for the accounts (owner, admin, editor), their sessions, API tokens, second factors and gallery grants."""

from __future__ import annotations

from picpeak_lite.store.db import Connection, Prepared, Row


def get_user_by_name(conn: Connection, username: str) -> Row | None:
    rows = conn.execute("SELECT * FROM admin_users WHERE username = ?", (username,)).fetchall()
    return rows[0] if rows else None


def get_user(conn: Connection, user_id: int) -> Row | None:
    rows = conn.execute("SELECT * FROM admin_users WHERE id = ?", (user_id,)).fetchall()
    return rows[0] if rows else None


def first_owner(conn: Connection) -> Row | None:
    """The owner made first (at first start): the account the CLI means when it is not told one."""
    rows = conn.execute("SELECT * FROM admin_users WHERE role = 'owner' ORDER BY id LIMIT 1").fetchall()
    return rows[0] if rows else None


def create_user(conn: Connection, username: str, password_hash: str, now: float, role: str = "owner") -> int:
    return int(conn.execute(
        "INSERT INTO admin_users (username, password_hash, created_at, password_changed_at, role) "
        "VALUES (?, ?, ?, ?, ?) RETURNING id",
        (username, password_hash, now, now, role),
    ).fetchall()[0]["id"])


def list_users(conn: Connection) -> list[Row]:
    """Every account, with ``grants``: its galleries' ids joined by commas (read apart: the engines' string
    aggregates differ)."""
    granted: dict[int, list[str]] = {}
    for row in conn.execute("SELECT user_id, gallery_id FROM gallery_grants ORDER BY user_id, gallery_id"):
        granted.setdefault(row["user_id"], []).append(str(row["gallery_id"]))
    rows = conn.execute(
        "SELECT u.id, u.username, u.role, u.created_at, u.disabled_at, u.totp_enabled_at "
        "FROM admin_users u ORDER BY u.id"
    ).fetchall()
    return [{**row, "grants": ",".join(granted[row["id"]]) if row["id"] in granted else None} for row in rows]


def active_owners(conn: Connection) -> int:
    return conn.execute(
        "SELECT count(*) AS n FROM admin_users WHERE role = 'owner' AND disabled_at IS NULL"
    ).fetchall()[0]["n"]


def set_role(conn: Connection, user_id: int, role: str) -> bool:
    conn.execute("UPDATE admin_users SET role = ? WHERE id = ?", (role, user_id))
    return conn.changes() > 0


def set_disabled(conn: Connection, user_id: int, now: float | None) -> bool:
    """Disable (``now``) or enable (None) an account. Disabling also revokes its sessions at once; its tokens
    stay revocable by name but are refused while the account is disabled (``get_token`` joins the account)."""
    conn.execute("UPDATE admin_users SET disabled_at = ? WHERE id = ?", (now, user_id))
    changed = conn.changes() > 0
    if now is not None:
        conn.execute(
            "UPDATE admin_sessions SET revoked_at = ? WHERE user_id = ? AND revoked_at IS NULL", (now, user_id)
        )
    return changed


def granted_galleries(conn: Connection, user_id: int) -> list[int]:
    return [r["gallery_id"] for r in conn.execute(
        "SELECT gallery_id FROM gallery_grants WHERE user_id = ? ORDER BY gallery_id", (user_id,))]


def set_grants(conn: Connection, user_id: int, gallery_ids: list[int], now: float) -> None:
    """The editor's galleries are exactly ``gallery_ids`` (ids of no gallery are skipped)."""
    conn.execute("DELETE FROM gallery_grants WHERE user_id = ?", (user_id,))
    for gallery_id in gallery_ids:
        conn.execute(
            "INSERT INTO gallery_grants (user_id, gallery_id, created_at) "
            "SELECT ?, id, ? FROM galleries WHERE id = ? ON CONFLICT DO NOTHING", (user_id, now, gallery_id))


def set_totp(conn: Connection, user_id: int, secret: str | None, enabled_at: float | None) -> None:
    """Store a TOTP secret (``enabled_at`` None while enrolment awaits its first code), or clear it (None)."""
    conn.execute("UPDATE admin_users SET totp_secret = ?, totp_enabled_at = ? WHERE id = ?",
                 (secret, enabled_at, user_id))
    if secret is None:
        conn.execute("DELETE FROM recovery_codes WHERE user_id = ?", (user_id,))


def use_totp_step(conn: Connection, user_id: int, step: int) -> bool:
    """Take the code of ``step``; False when it (or a later one) was used already: a code works once."""
    conn.execute("UPDATE admin_users SET totp_last_step = ? WHERE id = ? AND totp_last_step < ?",
                 (step, user_id, step))
    return conn.changes() > 0


def replace_recovery_codes(conn: Connection, user_id: int, code_hashes: list[str]) -> None:
    conn.execute("DELETE FROM recovery_codes WHERE user_id = ?", (user_id,))
    for code_hash in code_hashes:
        conn.execute("INSERT INTO recovery_codes (user_id, code_hash) VALUES (?, ?)", (user_id, code_hash))


def use_recovery_code(conn: Connection, user_id: int, code_hash: str, now: float) -> bool:
    """Mark the code used; False when it is not one of the account's unused codes (so each works once)."""
    conn.execute(
        "UPDATE recovery_codes SET used_at = ? WHERE user_id = ? AND code_hash = ? AND used_at IS NULL",
        (now, user_id, code_hash),
    )
    return conn.changes() > 0


def unused_recovery_codes(conn: Connection, user_id: int) -> int:
    return conn.execute(
        "SELECT count(*) AS n FROM recovery_codes WHERE user_id = ? AND used_at IS NULL", (user_id,)
    ).fetchall()[0]["n"]


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
                   expires_at: float, *, pending_totp: bool = False) -> None:
    conn.execute(
        "INSERT INTO admin_sessions (token_hash, user_id, csrf_token, created_at, expires_at, pending_totp) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (token_hash, user_id, csrf_token, now, expires_at, int(pending_totp)),
    )
    # Keep the table small: forget sessions that ended more than a day ago.
    conn.execute("DELETE FROM admin_sessions WHERE expires_at < ? OR revoked_at < ?", (now - 86400, now - 86400))


def get_session(conn: Connection, token_hash: str, now: float, *, pending: bool = False) -> Row | None:
    """A live session of an enabled account; with ``pending``, one whose second factor is still due (else only
    complete ones). The account's row is read with it on every request: a disabled account is refused at once."""
    rows = conn.execute(
        "SELECT s.id, s.user_id, s.csrf_token, u.username, u.role FROM admin_sessions s "
        "JOIN admin_users u ON u.id = s.user_id "
        "WHERE s.token_hash = ? AND s.revoked_at IS NULL AND s.expires_at > ? AND u.disabled_at IS NULL "
        "AND s.pending_totp = ?",
        (token_hash, now, int(pending)),
    ).fetchall()
    return rows[0] if rows else None


def revoke_session(conn: Connection, token_hash: str, now: float) -> None:
    conn.execute(
        "UPDATE admin_sessions SET revoked_at = ? WHERE token_hash = ? AND revoked_at IS NULL", (now, token_hash)
    )


def create_token(conn: Connection, name: str, token_hash: str, now: float, user_id: int) -> int:
    return int(conn.execute(
        "INSERT INTO api_tokens (name, token_hash, created_at, user_id) VALUES (?, ?, ?, ?) RETURNING id",
        (name, token_hash, now, user_id),
    ).fetchall()[0]["id"])


def revoke_token(conn: Connection, name: str, now: float) -> bool:
    conn.execute("UPDATE api_tokens SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL", (now, name))
    return conn.changes() > 0


def list_tokens(conn: Connection) -> list[Row]:
    return conn.execute(
        "SELECT t.id, t.name, t.created_at, t.last_used_at, t.revoked_at, u.username FROM api_tokens t "
        "LEFT JOIN admin_users u ON u.id = t.user_id ORDER BY t.id"
    ).fetchall()


def get_token(conn: Connection, token_hash: str) -> Row | None:
    """A live token of an enabled account, with the account's name and role."""
    rows = conn.execute(Prepared(  # asked by every request with a token (db.Prepared)
        "SELECT t.id, t.name, t.last_used_at, t.user_id, u.username, u.role FROM api_tokens t "
        "JOIN admin_users u ON u.id = t.user_id "
        "WHERE t.token_hash = ? AND t.revoked_at IS NULL AND u.disabled_at IS NULL"),
        (token_hash,),
    ).fetchall()
    return rows[0] if rows else None


def touch_token(conn: Connection, token_id: int, now: float) -> None:
    conn.execute("UPDATE api_tokens SET last_used_at = ? WHERE id = ?", (now, token_id))


def gallery_of_photo(conn: Connection, photo_id: int) -> int | None:
    rows = conn.execute("SELECT gallery_id FROM photos WHERE id = ?", (photo_id,)).fetchall()
    return rows[0]["gallery_id"] if rows else None


def gallery_of_upload(conn: Connection, upload_id: str) -> int | None:
    rows = conn.execute("SELECT gallery_id FROM uploads WHERE id = ?", (upload_id,)).fetchall()
    return rows[0]["gallery_id"] if rows else None
