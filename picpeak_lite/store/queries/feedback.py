"""SQL for guests' feedback on photos: likes, 1-5 star ratings and comments, and the photographer's view of them.

A guest writes only its own likes and ratings (keyed by ``guest_session_id``; one of each per photo, changed in
place) and adds comments; the caller proves the photo is one the guest may see (``access.visible_photo``). A
comment is ``held`` (the gallery holds comments until approved), ``approved`` or ``rejected``; every statement
that reviews one is guarded by ``status = 'held'``, so each is approved or rejected once. Which comments a
reader may see is decided here, in one condition (:func:`comments_for`): approved ones for everyone, and a held
one also for its author's session and the admin.
"""

from __future__ import annotations

from collections.abc import Iterable

from picpeak_lite.store.db import Connection, Row


def set_like(conn: Connection, guest_session_id: int, photo_id: int, now: float) -> None:
    conn.execute(
        "INSERT INTO photo_likes (guest_session_id, photo_id, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
        (guest_session_id, photo_id, now),
    )


def remove_like(conn: Connection, guest_session_id: int, photo_id: int) -> None:
    conn.execute("DELETE FROM photo_likes WHERE guest_session_id = ? AND photo_id = ?", (guest_session_id, photo_id))


def set_rating(conn: Connection, guest_session_id: int, photo_id: int, stars: int, now: float) -> None:
    conn.execute(
        "INSERT INTO photo_ratings (guest_session_id, photo_id, stars, rated_at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (guest_session_id, photo_id) DO UPDATE SET stars = excluded.stars, rated_at = excluded.rated_at",
        (guest_session_id, photo_id, stars, now),
    )


def remove_rating(conn: Connection, guest_session_id: int, photo_id: int) -> None:
    conn.execute("DELETE FROM photo_ratings WHERE guest_session_id = ? AND photo_id = ?",
                 (guest_session_id, photo_id))


def add_comment(conn: Connection, photo_id: int, guest_session_id: int, guest_name: str, body: str, status: str,
                now: float) -> int:
    conn.execute(
        "INSERT INTO photo_comments (photo_id, guest_session_id, guest_name, body, status, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (photo_id, guest_session_id, guest_name, body, status, now),
    )
    return conn.last_insert_rowid()


def summary(conn: Connection, photo_id: int, guest_session_id: int | None) -> Row:
    """One photo's counts (likes, ratings and their mean, approved and held comments) and this guest's own like
    and rating (0 and NULL without a session)."""
    return conn.execute(
        "SELECT (SELECT count(*) FROM photo_likes WHERE photo_id = :p) AS likes, "
        "(SELECT count(*) FROM photo_ratings WHERE photo_id = :p) AS ratings, "
        "(SELECT avg(stars) FROM photo_ratings WHERE photo_id = :p) AS rating_mean, "
        "(SELECT count(*) FROM photo_comments WHERE photo_id = :p AND status = 'approved') AS comments, "
        "(SELECT count(*) FROM photo_comments WHERE photo_id = :p AND status = 'held') AS held, "
        "EXISTS (SELECT 1 FROM photo_likes WHERE photo_id = :p AND guest_session_id = :g) AS liked, "
        "(SELECT stars FROM photo_ratings WHERE photo_id = :p AND guest_session_id = :g) AS my_rating",
        {"p": photo_id, "g": guest_session_id},
    ).fetchall()[0]


def comments_for(conn: Connection, photo_id: int, *, guest_session_id: int | None, admin: bool,
                 limit: int = 500) -> list[Row]:
    """The comments on a photo this reader may see, oldest first: approved ones; held ones only for the admin
    and for the session that wrote them; rejected ones only for the admin."""
    if admin:
        where, params = "photo_id = ?", [photo_id]
    else:
        where = "photo_id = ? AND (status = 'approved' OR (status = 'held' AND guest_session_id = ?))"
        params = [photo_id, guest_session_id if guest_session_id is not None else -1]
    return conn.execute(
        f"SELECT id, photo_id, guest_name, body, status, created_at, guest_session_id FROM photo_comments "
        f"WHERE {where} ORDER BY id LIMIT ?",
        (*params, limit),
    ).fetchall()


def newest_comment(conn: Connection, photo_id: int) -> Row | None:
    """The photo's newest comment whatever its status (for the photographer's live feed)."""
    rows = conn.execute(
        "SELECT id, photo_id, guest_name, body, status, created_at, guest_session_id FROM photo_comments "
        "WHERE photo_id = ? ORDER BY id DESC LIMIT 1",
        (photo_id,),
    ).fetchall()
    return rows[0] if rows else None


def gallery_comments(conn: Connection, gallery_id: int, *, status: str | None = None, limit: int = 1000) -> list[Row]:
    """The gallery's comments for the photographer (of one status, or all), held first, then newest first."""
    where = "p.gallery_id = ?" + (" AND c.status = ?" if status else "")
    params: list[object] = [gallery_id] + ([status] if status else [])
    return conn.execute(
        f"SELECT c.id, c.photo_id, c.guest_name, c.body, c.status, c.created_at, p.display_name "
        f"FROM photo_comments c JOIN photos p ON p.id = c.photo_id WHERE {where} "
        f"ORDER BY c.status = 'held' DESC, c.id DESC LIMIT ?",
        (*params, limit),
    ).fetchall()


def held_in_gallery(conn: Connection, gallery_id: int, ids: Iterable[int]) -> list[int]:
    """Those of ``ids`` that are comments on this gallery's photos and still held."""
    wanted = sorted(set(ids))
    if not wanted:
        return []
    marks = ", ".join("?" for _ in wanted)
    rows = conn.execute(
        f"SELECT c.id FROM photo_comments c JOIN photos p ON p.id = c.photo_id "
        f"WHERE p.gallery_id = ? AND c.status = 'held' AND c.id IN ({marks}) ORDER BY c.id",
        (gallery_id, *wanted),
    ).fetchall()
    return [r["id"] for r in rows]


def in_gallery(conn: Connection, gallery_id: int, ids: Iterable[int]) -> list[int]:
    """Those of ``ids`` that are comments on this gallery's photos, whatever their status."""
    wanted = sorted(set(ids))
    if not wanted:
        return []
    marks = ", ".join("?" for _ in wanted)
    rows = conn.execute(
        f"SELECT c.id FROM photo_comments c JOIN photos p ON p.id = c.photo_id "
        f"WHERE p.gallery_id = ? AND c.id IN ({marks}) ORDER BY c.id",
        (gallery_id, *wanted),
    ).fetchall()
    return [r["id"] for r in rows]


def review(conn: Connection, comment_id: int, status: str, now: float) -> bool:
    """Approve or reject a held comment; False when it was reviewed meanwhile."""
    conn.execute("UPDATE photo_comments SET status = ?, reviewed_at = ? WHERE id = ? AND status = 'held'",
                 (status, now, comment_id))
    return conn.changes() == 1


def delete_comment(conn: Connection, comment_id: int) -> bool:
    conn.execute("DELETE FROM photo_comments WHERE id = ?", (comment_id,))
    return conn.changes() == 1


def per_photo(conn: Connection, gallery_id: int) -> list[Row]:
    """Every photo of the gallery with any feedback or favourite: its file name and counts, in file-name order
    (for the proofing export and the sidecars; held and rejected comments are not counted)."""
    return conn.execute(
        "SELECT p.id AS photo_id, p.display_name, "
        "(SELECT count(*) FROM favourites f WHERE f.photo_id = p.id) AS favourites, "
        "(SELECT count(*) FROM photo_likes l WHERE l.photo_id = p.id) AS likes, "
        "(SELECT count(*) FROM photo_ratings r WHERE r.photo_id = p.id) AS ratings, "
        "(SELECT avg(stars) FROM photo_ratings r WHERE r.photo_id = p.id) AS rating_mean "
        "FROM photos p WHERE p.gallery_id = ? AND p.status = 'complete' AND ("
        "EXISTS (SELECT 1 FROM favourites f WHERE f.photo_id = p.id) "
        "OR EXISTS (SELECT 1 FROM photo_likes l WHERE l.photo_id = p.id) "
        "OR EXISTS (SELECT 1 FROM photo_ratings r WHERE r.photo_id = p.id) "
        "OR EXISTS (SELECT 1 FROM photo_comments c WHERE c.photo_id = p.id AND c.status = 'approved')) "
        "ORDER BY p.display_name, p.id",
        (gallery_id,),
    ).fetchall()


def approved_comments(conn: Connection, gallery_id: int) -> list[Row]:
    """Every approved comment in the gallery, by photo then time (the export's and the sidecars' text)."""
    return conn.execute(
        "SELECT c.photo_id, c.guest_name, c.body, c.created_at FROM photo_comments c "
        "JOIN photos p ON p.id = c.photo_id WHERE p.gallery_id = ? AND c.status = 'approved' ORDER BY c.photo_id, c.id",
        (gallery_id,),
    ).fetchall()


def ratings_by_name(conn: Connection, gallery_id: int) -> list[Row]:
    """Each rating with its guest's name ('' when none was given), for the export's per-guest column."""
    return conn.execute(
        "SELECT r.photo_id, coalesce(nullif(trim(s.guest_name), ''), '') AS guest_name, r.stars "
        "FROM photo_ratings r JOIN photos p ON p.id = r.photo_id JOIN guest_sessions s ON s.id = r.guest_session_id "
        "WHERE p.gallery_id = ? ORDER BY r.photo_id, lower(s.guest_name), r.rated_at",
        (gallery_id,),
    ).fetchall()

