"""The claim: how a worker takes a pending photo, and every write that must prove it still holds it.

``claim_next`` is one guarded ``UPDATE ... RETURNING`` that moves the oldest pending photo to ``processing``
with a fresh token and a lease. Every later write for that attempt (``renew_lease``, ``complete``, ``fail``,
``release``, ``requeue``) names the token and changes nothing if another worker or the janitor has taken the
photo since: the fencing whose absence made PicPeak complete one photo twice. The state transitions that use
these are in ``pipeline/transitions.py``.
"""

from __future__ import annotations

from typing import Any

from picpeak_lite.store.db import Connection, Prepared, Row
from picpeak_lite.store.queries.photos import MAX_ERROR_LENGTH

_CLAIMED = (
    "UPDATE photos SET status = 'processing', claim_token = ?, attempts = attempts + 1, lease_until = ?, "
    "processing_started_at = ?, claimed_by = ?, error = NULL WHERE id = {chosen} AND status = 'pending' RETURNING *"
)
# The one statement written per engine. SQLite: a write transaction excludes every other writer, so the first
# pending row is the claimant's; two look-ups, so that each walks the photos_queue index. PostgreSQL: workers in
# many processes (and hosts) claim at once, so the row is chosen FOR UPDATE SKIP LOCKED: a row another claim is
# taking is passed over, not waited for, and never taken twice; one ordered look-up, served by the partial index
# photos_claim_order (schema_pg.py).
CLAIM = {
    "sqlite": Prepared(_CLAIMED.format(chosen=(
        "coalesce("
        "(SELECT id FROM photos WHERE status = 'pending' AND attempts = 0 AND interruptions = 0 ORDER BY id LIMIT 1), "
        "(SELECT id FROM photos WHERE status = 'pending' ORDER BY attempts + interruptions, id LIMIT 1))"))),
    "postgresql": Prepared(_CLAIMED.format(chosen=(
        "(SELECT id FROM photos WHERE status = 'pending' ORDER BY attempts + interruptions, id LIMIT 1 "
        "FOR UPDATE SKIP LOCKED)"))),
}


def claim_next(conn: Connection, token: str, now: float, lease_seconds: float, claimant: str = "") -> Row | None:
    """The oldest pending photo not yet tried, else the oldest pending one. A photo whose attempt ended with its
    process (a crash, a kill, a power cut: ``interruptions``) or with its image child (``attempts``) waits behind
    the fresh ones: a server stopped again and again (a loaded machine, restarts) does not meet the same photo at
    every start, and one that kills its child does not hold up the good photos. Among those, the least tried goes
    first, so that kills spread over them instead of meeting the oldest each time. Both look-ups walk the
    ``photos_queue`` index (the second sorts only what the first found none of: photos tried before).
    ``claimant`` names the claiming process (``worker.claimant()``), kept in ``claimed_by``."""
    rows = conn.execute(CLAIM[conn.dialect], (token, now + lease_seconds, now, claimant or None)).fetchall()
    return rows[0] if rows else None


def renew_lease(conn: Connection, photo_id: int, token: str, lease_until: float) -> bool:
    conn.execute(
        "UPDATE photos SET lease_until = ? WHERE id = ? AND claim_token = ? AND status = 'processing'",
        (lease_until, photo_id, token),
    )
    return conn.changes() == 1


def complete(conn: Connection, photo_id: int, token: str, values: dict[str, Any], now: float) -> Row | None:
    """Record a finished photo, if ``token`` still holds its claim: its row as it is now (what its webhook event
    tells), or None."""
    columns = ("width", "height", "taken_at", "camera_make", "camera_model", "lens", "focal_length", "aperture",
               "exposure", "iso", "has_gps", "duration", "fps", "video_codec", "audio_codec")
    # A replaced photo (queries/replacement.py) keeps its place in capture order: its capture time stays.
    assignments = ", ".join("taken_at = CASE WHEN replaced IS NULL THEN ? ELSE taken_at END" if c == "taken_at"
                            else f"{c} = ?" for c in columns)
    rows = conn.execute(Prepared(
        f"UPDATE photos SET status = 'complete', claim_token = NULL, lease_until = NULL, error = NULL, "
        f"completed_at = ?, {assignments} WHERE id = ? AND claim_token = ? AND status = 'processing' RETURNING *"),
        (now, *(values.get(c) for c in columns), photo_id, token),
    ).fetchall()
    return rows[0] if rows else None


def fail(conn: Connection, photo_id: int, token: str, error: str, now: float) -> bool:
    conn.execute(
        "UPDATE photos SET status = 'failed', claim_token = NULL, lease_until = NULL, error = ?, completed_at = ? "
        "WHERE id = ? AND claim_token = ? AND status = 'processing'",
        (error[:MAX_ERROR_LENGTH], now, photo_id, token),
    )
    return conn.changes() == 1


def release(conn: Connection, photo_id: int, token: str) -> bool:
    """Hand a claimed photo back (shutdown): it is pending again and this attempt does not count."""
    conn.execute(
        "UPDATE photos SET status = 'pending', claim_token = NULL, lease_until = NULL, "
        "attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END "
        "WHERE id = ? AND claim_token = ? AND status = 'processing'",
        (photo_id, token),
    )
    return conn.changes() == 1


def release_all_claims(conn: Connection) -> int:
    """Every ``processing`` photo back to ``pending`` (this attempt does not count, as on a clean shutdown).

    For a backup's copy of the database only, never the live one: there no worker holds those claims any more,
    so a restored server reprocesses them at once instead of waiting for their lease.
    """
    conn.execute(
        "UPDATE photos SET status = 'pending', claim_token = NULL, lease_until = NULL, "
        "attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END WHERE status = 'processing'"
    )
    return conn.changes()


def expired_claims(conn: Connection, now: float) -> list[Row]:
    return conn.execute(
        "SELECT id, attempts, interruptions, claim_token, upload_id, gallery_id FROM photos "
        "WHERE status = 'processing' AND lease_until < ?",
        (now,),
    ).fetchall()


def requeue(conn: Connection, photo_id: int, token: str) -> bool:
    """Back to ``pending`` after an attempt that counts (its image child died under it)."""
    conn.execute(
        "UPDATE photos SET status = 'pending', claim_token = NULL, lease_until = NULL "
        "WHERE id = ? AND claim_token = ? AND status = 'processing'",
        (photo_id, token),
    )
    return conn.changes() == 1




def requeue_interrupted(conn: Connection, photo_id: int, token: str) -> bool:
    """Back to ``pending`` after its process died: the attempt does not count, the interruption does."""
    conn.execute(
        "UPDATE photos SET status = 'pending', claim_token = NULL, lease_until = NULL, "
        "attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END, interruptions = interruptions + 1 "
        "WHERE id = ? AND claim_token = ? AND status = 'processing'",
        (photo_id, token),
    )
    return conn.changes() == 1
