"""SQL for replacing a photo with a re-edited file (pipeline/replacement.py): the swap, confirm, and revert.

``photos.replaced`` is the previous version as JSON (the columns in :data:`KEPT`) while it waits for the
photographer's confirmation; its files stay stored under its own storage key until then.
"""

from __future__ import annotations

import json
from typing import Any

from picpeak_lite.store.db import Connection, Row

# What a photo's version is: its file and what was read from it. Not the display name (proofing exports match
# the photographer's RAW names) and not anything keyed by the photo's id (favourites, the cover, comments).
KEPT = ("storage_key", "sha256", "size", "format", "width", "height", "taken_at", "camera_make", "camera_model",
        "lens", "focal_length", "aperture", "exposure", "iso", "has_gps", "completed_at")


def previous(row: Row) -> dict[str, Any] | None:
    """The previous version kept for ``row`` (None: no replacement waits for confirmation)."""
    return json.loads(row["replaced"]) if row.get("replaced") else None


def start(conn: Connection, row: Row, *, storage_key: str, sha256: str, size: int, format: str, width: int,
          height: int) -> bool:
    """The new file becomes the photo's (pending: the workers make its images and read its EXIF); what it was
    is kept in ``replaced``. Only from the complete state ``row`` was read in, with no replacement waiting."""
    conn.execute(
        "UPDATE photos SET replaced = ?, storage_key = ?, sha256 = ?, size = ?, format = ?, width = ?, height = ?, "
        "status = 'pending', claim_token = NULL, lease_until = NULL, attempts = 0, interruptions = 0, error = NULL, "
        "processing_started_at = NULL, completed_at = NULL, views_stale = 0 "
        "WHERE id = ? AND storage_key = ? AND status = 'complete' AND replaced IS NULL",
        (json.dumps({c: row[c] for c in KEPT}), storage_key, sha256, size, format, width, height, row["id"],
         row["storage_key"]),
    )
    return conn.changes() == 1


def confirm(conn: Connection, photo_id: int) -> bool:
    """Forget the previous version (its files are removed by the caller)."""
    conn.execute("UPDATE photos SET replaced = NULL WHERE id = ? AND replaced IS NOT NULL AND status = 'complete'",
                 (photo_id,))
    return conn.changes() == 1


def revert(conn: Connection, row: Row) -> bool:
    """Bring the previous version back as it was (complete, its images already made); its views are marked stale
    so that a watermark changed meanwhile is drawn again."""
    before = previous(row)
    assert before is not None
    assignments = ", ".join(f"{c} = ?" for c in KEPT)
    conn.execute(
        f"UPDATE photos SET {assignments}, replaced = NULL, status = 'pending', error = NULL, claim_token = NULL, "
        "lease_until = NULL, views_stale = views_stale + 1 "
        "WHERE id = ? AND storage_key = ? AND replaced IS NOT NULL AND status IN ('complete', 'failed')",
        (*(before[c] for c in KEPT), row["id"], row["storage_key"]),
    )
    if conn.changes() != 1:
        return False
    # Through pending, in this same transaction (no worker can claim it): the change feed records the photo
    # becoming complete again, so open pages and the wall load its (previous) images, as after the replacement.
    conn.execute("UPDATE photos SET status = 'complete' WHERE id = ?", (row["id"],))
    return conn.changes() == 1


def previous_keys(conn: Connection) -> set[str]:
    """The storage keys of previous versions waiting for confirmation: files in use (janitor, check)."""
    rows = conn.execute("SELECT json_extract(replaced, '$.storage_key') AS key FROM photos "
                        "WHERE replaced IS NOT NULL").fetchall()
    return {r["key"] for r in rows}


def replacing_visible(conn: Connection, gallery_id: int, photo_id: int) -> Row | None:
    """A photo guests saw before it was replaced, while its new version is being made: as its previous version
    (key, format, size), so that guests keep seeing that instead of a broken image until the new one is ready."""
    rows = conn.execute(
        "SELECT * FROM photos WHERE id = ? AND gallery_id = ? AND replaced IS NOT NULL "
        "AND status IN ('pending', 'processing') AND hidden = 0 AND awaiting_approval = 0",
        (photo_id, gallery_id),
    ).fetchall()
    if not rows:
        return None
    row = dict(rows[0])
    before = previous(row)
    assert before is not None
    row.update(before, status="complete")
    return row
