"""The guest photo listing: one page at a time, by keyset, in capture or upload order.

A page is "the next ``limit`` rows after (sort key, id)", never ``OFFSET``: the cost of page 30 is the cost of
page 1, and a photo that appears or disappears between two requests cannot shift later pages (no duplicates,
no gaps). The cursor the client gets back is opaque (base64 of the last row's sort key and id) and is checked
on the way back in.

Orders:

* ``taken``: capture time, oldest first (the story of the day), falling back to the upload time for photos
  without one; ``id`` breaks ties.
* ``uploaded``: newest upload first (a guest who just uploaded finds their photos at the top), which is
  descending ``id`` order; served by the ``photos_by_gallery`` index read backwards.

Only photos matching :data:`queries.photos.GUEST_VISIBLE_PHOTO` are ever listed.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from picpeak_lite.store.db import Connection, Row, fits_integer
from picpeak_lite.store.queries.photos import GUEST_VISIBLE_PHOTO

SORTS = ("taken", "uploaded")
PAGE_SIZE = 60
MAX_PAGE_SIZE = 200

# Capture time as written by the pipeline ('2024-06-20T14:03:00'), else the upload time in the same shape, so
# that one text comparison orders both. Deterministic, so an expression index can serve it.
# Migration 4 indexes (gallery_id, TAKEN_KEY, id) for visible photos: keep the two expressions identical.
TAKEN_KEY = "coalesce(taken_at, strftime('%Y-%m-%dT%H:%M:%S', created_at, 'unixepoch'))"

COLUMNS = (
    "id, display_name, width, height, taken_at, camera_make, camera_model, lens, focal_length, aperture, "
    "exposure, iso, format, size, created_at, media_type, duration, preview_status, video_codec"
)
COLUMN_NAMES = tuple(name.strip() for name in COLUMNS.split(","))


class BadCursor(ValueError):
    pass


def encode_cursor(sort: str, row: Row) -> str:
    key = row["sort_key"] if sort == "taken" else None
    raw = json.dumps([key, row["id"]], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


MAX_CURSOR_LENGTH = 200  # ours are about 50 characters; a long one is someone else's (deep JSON nesting)


def decode_cursor(sort: str, cursor: str) -> tuple[str | None, int]:
    if len(cursor) > MAX_CURSOR_LENGTH:
        raise BadCursor("not a cursor")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key, photo_id = json.loads(raw)
    except (binascii.Error, ValueError, TypeError, RecursionError) as error:
        raise BadCursor("not a cursor") from error
    if not isinstance(photo_id, int) or isinstance(photo_id, bool) or not fits_integer(photo_id):
        raise BadCursor("not a cursor")
    if sort == "taken" and not isinstance(key, str):
        raise BadCursor("not a cursor")
    return key, photo_id


def list_photos(conn: Connection, gallery_id: int, *, sort: str = "taken", after: tuple[str | None, int] | None = None,
                limit: int = PAGE_SIZE, guest_session_id: int | None = None,
                favourites_only: bool = False) -> tuple[list[Row], bool]:
    """One page of visible photos and whether there are more. Each row has ``favourite`` for this guest."""
    if sort not in SORTS:
        raise ValueError(f"unknown sort {sort!r}")
    limit = max(1, min(limit, MAX_PAGE_SIZE))
    sort_key = TAKEN_KEY if sort == "taken" else "id"
    where = [f"gallery_id = ? AND {GUEST_VISIBLE_PHOTO}"]
    params: list[Any] = [gallery_id]
    if after is not None:
        if sort == "taken":
            # The first condition is implied by the second; it is there so that SQLite seeks the index to the
            # cursor instead of scanning the gallery from its start (a row value alone does not seek).
            where.append(f"{TAKEN_KEY} >= ? AND ({TAKEN_KEY}, id) > (?, ?)")
            params += [after[0], after[0], after[1]]
        else:
            where.append("id < ?")
            params.append(after[1])
    if favourites_only:
        where.append("id IN (SELECT photo_id FROM favourites WHERE guest_session_id = ?)")
        params.append(guest_session_id if guest_session_id is not None else -1)
    order = f"{TAKEN_KEY}, id" if sort == "taken" else "id DESC"
    rows = conn.execute(
        f"SELECT {COLUMNS}, {sort_key} AS sort_key, "
        f"EXISTS (SELECT 1 FROM favourites f WHERE f.photo_id = photos.id AND f.guest_session_id = ?) AS favourite "
        f"FROM photos WHERE {' AND '.join(where)} ORDER BY {order} LIMIT ?",
        (guest_session_id if guest_session_id is not None else -1, *params, limit + 1),
    ).fetchall()
    return rows[:limit], len(rows) > limit


def count_visible(conn: Connection, gallery_id: int) -> int:
    return conn.execute(
        f"SELECT count(*) AS n FROM photos WHERE gallery_id = ? AND {GUEST_VISIBLE_PHOTO}", (gallery_id,)
    ).fetchall()[0]["n"]


def download_totals(conn: Connection, gallery_id: int, web_px: int, scaled: tuple[float, float],
                    unscaled: float) -> Row:
    """What "Download all" will send: ``count`` photos, ``bytes`` of originals, and ``web_bytes``, the web size's
    estimate: a video goes whole (zips carry its original); a photo's original bytes times its pixel share at
    ``web_px`` on the long edge, s*s, times ``scaled[0] + scaled[1] * s`` (or ``unscaled`` when it is not made
    smaller), the ratios measured in ``media/images.py``."""
    return conn.execute(
        "SELECT count(*) AS count, coalesce(sum(size), 0) AS bytes, coalesce(sum(CASE "
        "  WHEN media_type = 'video' THEN size "
        "  WHEN s >= 1.0 THEN size * ? "
        "  ELSE size * s * s * (? + ? * s) END), 0) AS web_bytes "
        "FROM (SELECT size, media_type, CAST(? AS DOUBLE PRECISION) / "
        "  CASE WHEN coalesce(width, 1) > coalesce(height, 1) THEN coalesce(width, 1) ELSE coalesce(height, 1) END "
        "  AS s "
        f"      FROM photos WHERE gallery_id = ? AND {GUEST_VISIBLE_PHOTO}) AS sized",
        (unscaled, scaled[0], scaled[1], web_px, gallery_id),
    ).fetchall()[0]


# The one cover choice, for a gallery row ``g`` (the guest's hero, the dashboard's card, the link preview): the
# chosen cover if a guest may see it, else the first visible photo by capture time (the guest listing's first).
# Unqualified names in the subqueries are the photos' own (SQLite resolves the innermost table first).
COVER_ID = (
    "coalesce("
    f"(SELECT c.id FROM photos c WHERE c.id = g.cover_photo_id AND c.gallery_id = g.id AND {GUEST_VISIBLE_PHOTO}), "
    f"(SELECT c.id FROM photos c WHERE c.gallery_id = g.id AND {GUEST_VISIBLE_PHOTO} "
    f"ORDER BY {TAKEN_KEY}, c.id LIMIT 1))"
)


def cover_photo(conn: Connection, gallery: Row) -> Row | None:
    """The gallery's cover (:data:`COVER_ID`), or None while no photo is visible."""
    rows = conn.execute(
        f"SELECT {COLUMNS} FROM photos WHERE id = (SELECT {COVER_ID} FROM galleries g WHERE g.id = ?)",
        (gallery["id"],),
    ).fetchall()
    return rows[0] if rows else None


def all_visible(conn: Connection, gallery_id: int, *, guest_session_id: int | None = None,
                favourites_only: bool = False) -> list[Row]:
    """Every visible photo (for zips), in capture order, with the storage fields the download needs."""
    where = f"gallery_id = ? AND {GUEST_VISIBLE_PHOTO}"
    params: list[Any] = [gallery_id]
    if favourites_only:
        where += " AND id IN (SELECT photo_id FROM favourites WHERE guest_session_id = ?)"
        params.append(guest_session_id if guest_session_id is not None else -1)
    return conn.execute(
        f"SELECT id, display_name, format, size, storage_key, taken_at, media_type FROM photos WHERE {where} "
        f"ORDER BY {TAKEN_KEY}, id",
        params,
    ).fetchall()
