"""SQL for "Find me" (issue 36): a gallery's switch, the face index (``faces``, ``face_scans``) as its own queue,
and the search's candidates. Embeddings leave these functions only towards the search (``candidates``) and the
indexer; no route is given them."""

from __future__ import annotations

from picpeak_lite.store.db import Connection, Row
from picpeak_lite.store.queries.photos import GUEST_VISIBLE_PHOTO

# A photo whose faces are looked for: complete, in an active gallery with "Find me" on, and the
# photographer's, or a guest's where the gallery says so.
_TO_INDEX = """
    p.status = 'complete' AND g.find_me = 1 AND g.archive_state = 'active'
    AND (p.uploaded_by = 'admin' OR g.find_me_guest_uploads = 1)
"""


def settings_of(conn: Connection, gallery_id: int) -> Row | None:
    rows = conn.execute("SELECT id, find_me, find_me_guest_uploads FROM galleries WHERE id = ?",
                        (gallery_id,)).fetchall()
    return rows[0] if rows else None


def set_find_me(conn: Connection, gallery_id: int, on: bool, guest_uploads: bool, now: float) -> bool:
    """Switch "Find me" for a gallery. Guests' photos no longer indexed lose their faces now."""
    conn.execute("UPDATE galleries SET find_me = ?, find_me_guest_uploads = ?, updated_at = ? WHERE id = ?",
                 (int(on), int(guest_uploads), now, gallery_id))
    if conn.changes() != 1:
        return False
    if not guest_uploads:
        conn.execute("DELETE FROM face_scans WHERE gallery_id = ? AND photo_id IN "
                     "(SELECT id FROM photos WHERE gallery_id = ? AND uploaded_by = 'guest')",
                     (gallery_id, gallery_id))
    return True


def delete_index(conn: Connection, gallery_id: int, now: float) -> int:
    """Switch "Find me" off and delete every face of the gallery (the faces go with their scans). Returns how
    many faces were deleted."""
    count = conn.execute("SELECT count(*) AS n FROM faces WHERE gallery_id = ?", (gallery_id,)).fetchall()[0]["n"]
    conn.execute("UPDATE galleries SET find_me = 0, updated_at = ? WHERE id = ?", (now, gallery_id))
    conn.execute("DELETE FROM face_scans WHERE gallery_id = ?", (gallery_id,))
    return int(count)


def next_to_index(conn: Connection) -> Row | None:
    """The oldest photo still to look at, or None."""
    rows = conn.execute(
        f"SELECT p.id, p.gallery_id, p.storage_key FROM photos p JOIN galleries g ON g.id = p.gallery_id "
        f"WHERE {_TO_INDEX} AND NOT EXISTS (SELECT 1 FROM face_scans s WHERE s.photo_id = p.id) "
        f"ORDER BY p.id LIMIT 1").fetchall()
    return rows[0] if rows else None


def record(conn: Connection, photo_id: int, found: list[tuple[tuple[int, int, int, int], bytes]],
           error: str | None, now: float) -> bool:
    """Store a photo's faces with its scan, if it is still to be indexed (not deleted, its gallery still on) and
    no other process stored them first. False when nothing was stored."""
    rows = conn.execute(
        f"INSERT INTO face_scans (photo_id, gallery_id, faces, error, scanned_at) "
        f"SELECT p.id, p.gallery_id, ?, ?, ? FROM photos p JOIN galleries g ON g.id = p.gallery_id "
        f"WHERE p.id = ? AND {_TO_INDEX} "
        f"ON CONFLICT (photo_id) DO NOTHING RETURNING gallery_id",
        (len(found), error, now, photo_id)).fetchall()
    if not rows:
        return False
    gallery_id = rows[0]["gallery_id"]
    for (left, top, right, bottom), embedding in found:
        conn.execute("INSERT INTO faces (photo_id, gallery_id, box_left, box_top, box_right, box_bottom, "
                     "embedding) VALUES (?, ?, ?, ?, ?, ?, ?)",
                     (photo_id, gallery_id, left, top, right, bottom, embedding))
    return True


def progress(conn: Connection, gallery_id: int) -> Row:
    """How far the gallery's index is: photos to index, photos done, faces found, and failures."""
    return conn.execute(
        f"SELECT (SELECT count(*) FROM photos p JOIN galleries g ON g.id = p.gallery_id "
        f"        WHERE p.gallery_id = ? AND {_TO_INDEX}) AS photos, "
        f"  (SELECT count(*) FROM face_scans WHERE gallery_id = ?) AS scanned, "
        f"  (SELECT count(*) FROM face_scans WHERE gallery_id = ? AND error IS NOT NULL) AS failed, "
        f"  (SELECT count(*) FROM faces WHERE gallery_id = ?) AS faces",
        (gallery_id, gallery_id, gallery_id, gallery_id)).fetchall()[0]


def candidates(conn: Connection, gallery_id: int) -> list[Row]:
    """The faces a guest of this gallery may be matched against: those of photos every guest may see."""
    return conn.execute(
        f"SELECT f.id, f.photo_id, f.embedding FROM faces f "
        f"WHERE f.gallery_id = ? AND f.photo_id IN "
        f"(SELECT id FROM photos WHERE gallery_id = ? AND {GUEST_VISIBLE_PHOTO}) "
        f"ORDER BY f.id", (gallery_id, gallery_id)).fetchall()


def embeddings_of(conn: Connection, gallery_id: int, face_ids: list[int]) -> list[Row]:
    """Some faces of one gallery (for "not me": the faces like a refused one are hidden too)."""
    if not face_ids:
        return []
    marks = ", ".join("?" * len(face_ids))
    return conn.execute(f"SELECT id, photo_id, embedding FROM faces WHERE gallery_id = ? AND id IN ({marks})",
                        (gallery_id, *face_ids)).fetchall()


def not_me_of(conn: Connection, guest_session_id: int, gallery_id: int) -> set[int]:
    """The faces this guest said were not them in this gallery (schema 30: in the database, so that every
    process and host leaves them out)."""
    rows = conn.execute("SELECT face_id FROM findme_not_me WHERE guest_session_id = ? AND gallery_id = ?",
                        (guest_session_id, gallery_id)).fetchall()
    return {row["face_id"] for row in rows}


def add_not_me(conn: Connection, guest_session_id: int, gallery_id: int, face_ids: list[int], most: int) -> None:
    """Remember ``face_ids`` as not this guest, up to ``most`` faces per guest and gallery (a bound on what one
    session can make us store); they go with the guest session or the gallery."""
    held = conn.execute("SELECT count(*) AS n FROM findme_not_me WHERE guest_session_id = ? AND gallery_id = ?",
                        (guest_session_id, gallery_id)).fetchone()
    room = most - (held["n"] if held is not None else 0)
    for face_id in face_ids[: max(0, room)]:
        conn.execute("INSERT INTO findme_not_me (guest_session_id, gallery_id, face_id) VALUES (?, ?, ?) "
                     "ON CONFLICT DO NOTHING", (guest_session_id, gallery_id, face_id))
