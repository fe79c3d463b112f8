"""SQL for hot folders: which galleries have one, and which files each has taken (by path, size and time)."""

from __future__ import annotations

from picpeak_lite.store.db import Connection, Row


def watched_galleries(conn: Connection) -> list[Row]:
    """Every gallery with a hot folder, drafts and expired ones too (the photographer fills them before and
    after the event): id, slug, hot_folder, hot_folder_in_place."""
    return conn.execute(
        "SELECT id, slug, hot_folder, hot_folder_in_place FROM galleries "
        "WHERE hot_folder IS NOT NULL AND hot_folder != '' ORDER BY id"
    ).fetchall()


def taken(conn: Connection, gallery_id: int) -> dict[str, tuple[int, int]]:
    """The files this gallery's hot folder has taken: relative path -> (size, mtime_ns)."""
    rows = conn.execute("SELECT path, size, mtime_ns FROM hot_folder_files WHERE gallery_id = ?", (gallery_id,))
    return {r["path"]: (r["size"], r["mtime_ns"]) for r in rows.fetchall()}


def record(conn: Connection, gallery_id: int, files: list[tuple[str, int, int, int | None, str | None]],
           now: float) -> None:
    """Remember files as taken: (relative path, size, mtime_ns, photo id or None, error or None). A file
    written again under the same name (another size or time) replaces its row and is taken again."""
    for path, size, mtime_ns, photo_id, error in files:
        conn.execute(
            "INSERT INTO hot_folder_files (gallery_id, path, size, mtime_ns, photo_id, error, taken_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (gallery_id, path) DO UPDATE SET size = excluded.size, "
            "mtime_ns = excluded.mtime_ns, photo_id = excluded.photo_id, error = excluded.error, "
            "taken_at = excluded.taken_at",
            (gallery_id, path, size, mtime_ns, photo_id, error, now),
        )


def counts(conn: Connection, gallery_id: int) -> Row:
    """How many files the hot folder took, and how many became photos."""
    rows = conn.execute(
        "SELECT count(*) AS files, count(photo_id) AS photos FROM hot_folder_files WHERE gallery_id = ?",
        (gallery_id,),
    ).fetchall()
    return rows[0]
