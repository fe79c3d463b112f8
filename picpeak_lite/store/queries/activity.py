"""SQL for the activity counters (``gallery_activity``): adding a batch, and what the dashboard shows."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from picpeak_lite.store.db import Connection, Row

KINDS = ("views", "downloads_single", "downloads_zip", "favourites")


def add(conn: Connection, counts: Iterable[tuple[int, str, str, int]]) -> int:
    """Add ``(gallery_id, day, kind, n)`` to the stored counts; a gallery deleted meanwhile is skipped (its rows
    went with it). Returns how many rows were written."""
    written = 0
    for gallery_id, day, kind, n in counts:
        conn.execute(
            "INSERT INTO gallery_activity (gallery_id, day, kind, count) "
            "SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM galleries WHERE id = ?) "
            "ON CONFLICT (gallery_id, day, kind) DO UPDATE SET count = gallery_activity.count + excluded.count",
            (gallery_id, day, kind, n, gallery_id),
        )
        written += conn.changes()
    return written


def since(conn: Connection, first_day: str) -> list[Row]:
    """Every stored count from ``first_day`` (YYYY-MM-DD) on."""
    return conn.execute(
        "SELECT gallery_id, day, kind, count FROM gallery_activity WHERE day >= ? ORDER BY gallery_id, day",
        (first_day,),
    ).fetchall()


def totals(conn: Connection) -> list[Row]:
    return conn.execute(
        "SELECT gallery_id, kind, sum(count) AS count FROM gallery_activity GROUP BY gallery_id, kind"
    ).fetchall()


def guest_uploads_since(conn: Connection, first_day: str) -> list[Row]:
    """Guests' photos per gallery and UTC day of their upload, from the photos themselves (no counter needed:
    each upload already writes its row)."""
    since = dt.datetime.fromisoformat(first_day).replace(tzinfo=dt.UTC).timestamp()
    return conn.execute(
        "SELECT gallery_id, date(created_at, 'unixepoch') AS day, count(*) AS count FROM photos "
        "WHERE uploaded_by = 'guest' AND created_at >= ? GROUP BY gallery_id, day",
        (since,),
    ).fetchall()
