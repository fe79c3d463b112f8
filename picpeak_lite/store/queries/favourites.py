"""SQL for favourites: a guest session's hearts, and the admin's view of who picked what.

A guest only ever reads and writes its own rows (every statement here is keyed by ``guest_session_id``); the
photo must be one the guest may see, which the caller proves with ``access.visible_photo`` first.
"""

from __future__ import annotations

from picpeak_lite.store.db import Connection
from picpeak_lite.store.queries.photos import GUEST_VISIBLE_PHOTO


def add(conn: Connection, guest_session_id: int, photo_id: int, now: float) -> bool:
    """True when the heart is new."""
    conn.execute(
        "INSERT INTO favourites (guest_session_id, photo_id, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
        (guest_session_id, photo_id, now),
    )
    return conn.changes() == 1


def remove(conn: Connection, guest_session_id: int, photo_id: int) -> bool:
    conn.execute("DELETE FROM favourites WHERE guest_session_id = ? AND photo_id = ?", (guest_session_id, photo_id))
    return conn.changes() == 1


def count_for_guest(conn: Connection, guest_session_id: int, gallery_id: int) -> int:
    """This guest's favourites among the photos it can see in the gallery."""
    return conn.execute(
        f"SELECT count(*) AS n FROM favourites WHERE guest_session_id = ? AND photo_id IN "
        f"(SELECT id FROM photos WHERE gallery_id = ? AND {GUEST_VISIBLE_PHOTO})",
        (guest_session_id, gallery_id),
    ).fetchall()[0]["n"]
