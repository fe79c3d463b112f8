"""SQL for galleries."""

from __future__ import annotations

from typing import Any

from picpeak_lite.store.db import Connection, Prepared, Row

EDITABLE = (
    "name", "event_type", "event_date", "customer_name", "customer_email", "welcome_message", "expires_at",
    "allow_guest_uploads", "allow_downloads", "watermark", "photo_cap", "guest_photos_need_approval",
    "favourite_limit", "wall_captions", "hold_comments", "theme", "cover_layout", "on_expiry", "hot_folder",
    "hot_folder_in_place", "language",
)

_COUNTS = """
    (SELECT count(*) FROM photos p WHERE p.gallery_id = g.id AND p.status = 'complete') AS complete_count,
    (SELECT count(*) FROM photos p WHERE p.gallery_id = g.id AND p.status IN ('pending', 'processing'))
        AS waiting_count,
    (SELECT count(*) FROM photos p WHERE p.gallery_id = g.id AND p.status = 'failed') AS failed_count,
    (SELECT count(*) FROM photos p WHERE p.gallery_id = g.id AND p.uploaded_by = 'guest') AS guest_count
"""


def create(conn: Connection, values: dict[str, Any], *, slug: str, share_token: str,
           password_hash: str | None, now: float) -> int:
    columns = [c for c in EDITABLE if c in values]
    return int(conn.execute(
        f"INSERT INTO galleries (slug, share_token, password_hash, created_at, updated_at, {', '.join(columns)}) "
        f"VALUES (?, ?, ?, ?, ?, {', '.join('?' for _ in columns)}) RETURNING id",
        (slug, share_token, password_hash, now, now, *(values[c] for c in columns)),
    ).fetchall()[0]["id"])


def update(conn: Connection, gallery_id: int, values: dict[str, Any], now: float) -> bool:
    columns = [c for c in EDITABLE if c in values]
    assignments = [f"{c} = ?" for c in columns] + ["updated_at = ?"]
    params: list[Any] = [values[c] for c in columns] + [now]
    if "password_hash" in values:
        assignments += ["password_hash = ?", "password_version = password_version + 1"]
        params.append(values["password_hash"])
    conn.execute(f"UPDATE galleries SET {', '.join(assignments)} WHERE id = ?", (*params, gallery_id))
    return conn.changes() > 0


def set_draft(conn: Connection, gallery_id: int, is_draft: bool, now: float) -> bool:
    conn.execute(
        "UPDATE galleries SET is_draft = ?, updated_at = ? WHERE id = ?", (int(is_draft), now, gallery_id)
    )
    return conn.changes() > 0


def delete(conn: Connection, gallery_id: int) -> bool:
    conn.execute("DELETE FROM galleries WHERE id = ?", (gallery_id,))
    return conn.changes() > 0


def watermark_fields(conn: Connection, gallery_id: int | None = None) -> list[Row]:
    """What each gallery's (or one gallery's) watermark depends on (``admin_settings.watermark_fingerprints``)."""
    if gallery_id is not None:
        return conn.execute(Prepared("SELECT id, name, watermark FROM galleries WHERE id = ?"), (gallery_id,)
                            ).fetchall()
    return conn.execute("SELECT id, name, watermark FROM galleries").fetchall()


def get(conn: Connection, gallery_id: int) -> Row | None:
    rows = conn.execute(f"SELECT g.*, {_COUNTS} FROM galleries g WHERE g.id = ?", (gallery_id,)).fetchall()
    return rows[0] if rows else None


def row_of(conn: Connection, gallery_id: int) -> Row | None:
    """The gallery's own row without :func:`get`'s photo counts: what an upload's commit checks, once per file
    (the four counted subqueries cost PostgreSQL more to plan than the rest of the commit)."""
    rows = conn.execute(Prepared("SELECT * FROM galleries WHERE id = ?"), (gallery_id,)).fetchall()
    return rows[0] if rows else None


def get_by_slug(conn: Connection, slug: str) -> Row | None:
    rows = conn.execute("SELECT * FROM galleries WHERE slug = ?", (slug,)).fetchall()
    return rows[0] if rows else None


def list_all(conn: Connection) -> list[Row]:
    return conn.execute(f"SELECT g.*, {_COUNTS} FROM galleries g ORDER BY g.created_at DESC, g.id DESC").fetchall()


def slug_taken(conn: Connection, slug: str) -> bool:
    return bool(conn.execute("SELECT 1 FROM galleries WHERE slug = ?", (slug,)).fetchall())
