"""SQL for proofing: the guests' favourites as the photographer exports them, by guest name.

Favourites belong to guest sessions; the photographer knows guests by the name they gave (one person on a phone
and a laptop is two sessions with one name), so the export groups by name. A session without a name is
``''`` here ("guests without a name" on the page).
"""

from __future__ import annotations

from picpeak_lite.store.db import Connection, Row

_NAME = "coalesce(nullif(trim(s.guest_name), ''), '')"


def favourites(conn: Connection, gallery_id: int, guest_name: str | None = None) -> list[Row]:
    """Every favourite in the gallery (or of the guests with this name): the photo's file name, who, when; in
    file-name order, then by time."""
    where = "p.gallery_id = ?"
    params: list[object] = [gallery_id]
    if guest_name is not None:
        where += f" AND {_NAME} = ?"
        params.append(guest_name)
    return conn.execute(
        f"SELECT p.id AS photo_id, p.display_name, {_NAME} AS guest_name, f.created_at "
        f"FROM favourites f JOIN photos p ON p.id = f.photo_id JOIN guest_sessions s ON s.id = f.guest_session_id "
        f"WHERE {where} ORDER BY p.display_name, p.id, f.created_at",
        params,
    ).fetchall()


def guests(conn: Connection, gallery_id: int) -> list[Row]:
    """Who chose favourites here: each name with how many photos it chose, names first, the nameless last."""
    return conn.execute(
        f"SELECT {_NAME} AS guest_name, count(DISTINCT f.photo_id) AS photos, max(f.created_at) AS last_at "
        f"FROM favourites f JOIN photos p ON p.id = f.photo_id JOIN guest_sessions s ON s.id = f.guest_session_id "
        f"WHERE p.gallery_id = ? GROUP BY 1 ORDER BY {_NAME} = '', lower({_NAME})",
        (gallery_id,),
    ).fetchall()


def is_favourite(conn: Connection, guest_session_id: int, photo_id: int) -> bool:
    return bool(conn.execute("SELECT 1 FROM favourites WHERE guest_session_id = ? AND photo_id = ?",
                             (guest_session_id, photo_id)).fetchall())
