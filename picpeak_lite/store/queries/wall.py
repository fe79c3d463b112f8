"""SQL for the live wall: its link's token, and the photos it starts with."""

from __future__ import annotations

from picpeak_lite.store.db import Connection, Row
from picpeak_lite.store.queries.photos import GUEST_VISIBLE_PHOTO


def set_token(conn: Connection, gallery_id: int, token: str | None, now: float) -> bool:
    """A new wall link (the old one stops working), or None: no link any more."""
    conn.execute("UPDATE galleries SET wall_token = ?, updated_at = ? WHERE id = ?", (token, now, gallery_id))
    return conn.changes() == 1


def visible_photos(conn: Connection, gallery_id: int, limit: int) -> list[Row]:
    """The newest photos guests may see (the wall's rotation), newest first."""
    return conn.execute(
        f"SELECT id, width, height, guest_name, completed_at FROM photos WHERE gallery_id = ? AND "
        f"{GUEST_VISIBLE_PHOTO} ORDER BY completed_at DESC NULLS LAST, id DESC LIMIT ?",
        (gallery_id, limit),
    ).fetchall()
