"""SQL for favourites: a guest session's hearts, and the admin's view of who picked what.

A guest only ever reads and writes its own rows (every statement here is keyed by ``guest_session_id``); the
photo must be one the guest may see, which the caller proves with ``access.visible_photo`` first.
"""

from __future__ import annotations

from typing import Any

from ..access import GUEST_VISIBLE_PHOTO
from ..db import Connection

Row = dict[str, Any]


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


def favourites_by_photo(conn: Connection, gallery_id: int) -> list[Row]:
    """For the admin: every photo of the gallery that someone picked, most picked first, with who picked it.

    ``[{"photo_id", "display_name", "count", "guests": [{"guest_session_id", "guest_name", "created_at"}]}]``;
    ``guest_name`` is None for guests who gave no name. Hidden photos are included (the admin sees them).
    """
    rows = conn.execute(
        "SELECT p.id AS photo_id, p.display_name, p.hidden, f.guest_session_id, s.guest_name, f.created_at "
        "FROM favourites f JOIN photos p ON p.id = f.photo_id JOIN guest_sessions s ON s.id = f.guest_session_id "
        "WHERE p.gallery_id = ? ORDER BY p.id, f.created_at",
        (gallery_id,),
    ).fetchall()
    by_photo: dict[int, Row] = {}
    for row in rows:
        entry = by_photo.setdefault(row["photo_id"], {
            "photo_id": row["photo_id"], "display_name": row["display_name"], "hidden": bool(row["hidden"]),
            "count": 0, "guests": [],
        })
        entry["count"] += 1
        entry["guests"].append({"guest_session_id": row["guest_session_id"], "guest_name": row["guest_name"],
                                "created_at": row["created_at"]})
    return sorted(by_photo.values(), key=lambda e: (-e["count"], e["photo_id"]))
