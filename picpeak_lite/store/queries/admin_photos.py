"""SQL for the photographer's photo grid and dashboard: filters, favourites, hide/show, cover, totals."""

from __future__ import annotations

from collections.abc import Iterable

from picpeak_lite.store.db import Connection, Row
from picpeak_lite.store.queries.listing import COVER_ID, TAKEN_KEY

STATUS_FILTERS = {
    "complete": "p.status = 'complete'",
    "waiting": "p.status IN ('pending', 'processing')",
    "failed": "p.status = 'failed'",
    "hidden": "p.hidden = 1",
}
SOURCE_FILTERS = {"guest": "p.uploaded_by = 'guest'", "admin": "p.uploaded_by = 'admin'"}
_FAV_COUNT = "(SELECT count(*) FROM favourites f WHERE f.photo_id = p.id) AS favourite_count"


def list_photos(conn: Connection, gallery_id: int, *, status: str | None = None, source: str | None = None,
                favourites: bool = False, limit: int = 5000) -> list[Row]:
    """The gallery's photos for the admin grid, with how many guests favourited each: by capture time (the upload
    time for a photo without one), then by name, so that two batches sent in parallel read IMG_0001, IMG_0002, ...
    and not in the order they arrived."""
    clauses = ["p.gallery_id = ?"]
    if status in STATUS_FILTERS:
        clauses.append(STATUS_FILTERS[status])
    if source in SOURCE_FILTERS:
        clauses.append(SOURCE_FILTERS[source])
    if favourites:
        clauses.append("EXISTS (SELECT 1 FROM favourites f WHERE f.photo_id = p.id)")
    return conn.execute(
        f"SELECT p.id, p.display_name, p.status, p.error, p.width, p.height, p.size, p.hidden, p.uploaded_by, "
        f"p.replaced IS NOT NULL AS replaced, "
        f"p.guest_name, p.created_at, p.awaiting_approval, p.media_type, p.duration, {_FAV_COUNT} "
        f"FROM photos p WHERE {' AND '.join(clauses)} "
        f"ORDER BY {TAKEN_KEY}, p.display_name, p.id LIMIT ?",
        (gallery_id, limit),
    ).fetchall()


def favourites_by_photo(conn: Connection, gallery_id: int) -> dict[int, list[str]]:
    """Who favourited what: photo id -> the guests' names ('a guest' when a guest gave none)."""
    rows = conn.execute(
        "SELECT f.photo_id, coalesce(nullif(s.guest_name, ''), 'a guest') AS name FROM favourites f "
        "JOIN photos p ON p.id = f.photo_id JOIN guest_sessions s ON s.id = f.guest_session_id "
        "WHERE p.gallery_id = ? ORDER BY f.created_at",
        (gallery_id,),
    ).fetchall()
    out: dict[int, list[str]] = {}
    for row in rows:
        out.setdefault(row["photo_id"], []).append(row["name"])
    return out


def ids_in_gallery(conn: Connection, gallery_id: int, ids: Iterable[int]) -> list[int]:
    wanted = sorted(set(ids))
    if not wanted:
        return []
    marks = ", ".join("?" for _ in wanted)
    rows = conn.execute(
        f"SELECT id FROM photos WHERE gallery_id = ? AND id IN ({marks}) ORDER BY id", (gallery_id, *wanted)
    ).fetchall()
    return [r["id"] for r in rows]


def set_hidden(conn: Connection, gallery_id: int, ids: Iterable[int], hidden: bool) -> int:
    changed = 0
    for photo_id in ids:
        conn.execute("UPDATE photos SET hidden = ? WHERE id = ? AND gallery_id = ? AND hidden != ?",
                     (int(hidden), photo_id, gallery_id, int(hidden)))
        changed += conn.changes()
    return changed


def set_cover(conn: Connection, gallery_id: int, photo_id: int | None, now: float) -> bool:
    """Make a complete photo of this gallery its cover (None: back to the first photo). False if not allowed."""
    if photo_id is not None:
        ok = conn.execute("SELECT 1 FROM photos WHERE id = ? AND gallery_id = ? AND status = 'complete'",
                          (photo_id, gallery_id)).fetchall()
        if not ok:
            return False
    conn.execute("UPDATE galleries SET cover_photo_id = ?, updated_at = ? WHERE id = ?",
                 (photo_id, now, gallery_id))
    return conn.changes() == 1


def gallery_extras(conn: Connection) -> dict[int, Row]:
    """Per gallery: its cover (the guests' one, :data:`listing.COVER_ID`), favourites, bytes."""
    rows = conn.execute(
        f"""
        SELECT g.id, {COVER_ID} AS cover_id,
            (SELECT count(*) FROM favourites f JOIN photos p ON p.id = f.photo_id WHERE p.gallery_id = g.id)
                AS favourite_count,
            (SELECT coalesce(sum(p.size), 0) FROM photos p WHERE p.gallery_id = g.id) AS original_bytes
        FROM galleries g
        """
    ).fetchall()
    return {r["id"]: r for r in rows}


def total_original_bytes(conn: Connection) -> int:
    return conn.execute("SELECT coalesce(sum(size), 0) AS n FROM photos").fetchall()[0]["n"]
