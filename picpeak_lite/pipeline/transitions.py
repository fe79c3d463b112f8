"""Every photo state change, as one sync unit of work ``fn(conn, ...)`` run inside a ``db.write`` transaction.

Each function changes the row (guarded by the claim token where there is a claim) and writes what follows
from the change in the same transaction: the webhook outbox rows, and the upload group's completion. So a
change and its consequences commit together or not at all, and a worker that lost its claim produces neither.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from picpeak_lite.config import WebhookEndpoint
from picpeak_lite.store.db import Connection, Row
from picpeak_lite.store.queries import claims
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries import webhooks as webhook_q

# A photo whose attempts ended with their process this many times is failed: ten server deaths in a row on one
# photo are no longer chance (the claim order puts it behind every fresh photo each time).
MAX_INTERRUPTIONS = 10


def photo_subject(row: Row) -> str:
    # The storage key too: ids are never reused since schema 5, but subjects written before then may share one.
    return f"photo:{row['id']}:{row['storage_key']}"


def photo_event_data(row: Row) -> dict[str, Any]:
    return {
        "photo_id": row["id"],
        "gallery_id": row["gallery_id"],
        "upload_id": row["upload_id"],
        "filename": row["display_name"],
        "status": row["status"],
        "error": row["error"],
        "width": row["width"],
        "height": row["height"],
        "uploaded_by": row["uploaded_by"],
        "media_type": row.get("media_type", "photo"),
        "duration": row.get("duration"),
        # A guest's photo in a gallery whose guest photos need approval: processed, but not yet shown to guests
        # (photo.approved or photo.rejected follows).
        "awaiting_approval": bool(row.get("awaiting_approval", 0)),
    }


def complete_photo(conn: Connection, endpoints: Sequence[WebhookEndpoint], photo_id: int, token: str,
                   values: dict[str, Any], now: float) -> Row | None:
    """Mark the photo complete if ``token`` still holds the claim. None when the claim was lost."""
    row = claims.complete(conn, photo_id, token, values, now)
    if row is None:
        return None
    webhook_q.enqueue_event(conn, endpoints, "photo.uploaded", photo_subject(row), photo_event_data(row), now)
    finish_upload(conn, endpoints, row["upload_id"], now)
    return row


def fail_photo(conn: Connection, endpoints: Sequence[WebhookEndpoint], photo_id: int, token: str, reason: str,
               now: float) -> Row | None:
    if not claims.fail(conn, photo_id, token, reason, now):
        return None
    return _after_failure(conn, endpoints, photo_id, now)


def requeue_expired(conn: Connection, endpoints: Sequence[WebhookEndpoint], now: float,
                    alive: Collection[str] = ()) -> tuple[list[int], list[int]]:
    """Return photos whose lease ran out (their process died) to ``pending``, without counting the attempt.

    Nothing a photo contains runs in the server's process: its image work runs in a child, and a child that
    dies under a file counts that attempt (``worker.Crashed``). So a lease that ran out means the server was
    stopped (``kill -9``, a power cut, the OOM killer, a loaded machine's restarts), which is not the photo's
    fault and must not fail it. It counts as an interruption, and after :data:`MAX_INTERRUPTIONS` the photo is
    given up all the same, so that attempts stay bounded even for a cause nobody foresaw. Claims whose token is
    in ``alive`` (attempts this process is still running) are left alone: their lease ran out only because the
    renewal came late on a loaded machine. Returns (requeued, failed) ids.
    """
    requeued, failed = [], []
    for row in claims.expired_claims(conn, now):
        if row["claim_token"] in alive:
            continue
        if row["interruptions"] + 1 >= MAX_INTERRUPTIONS:
            reason = (f"Gave up after its processing was interrupted {row['interruptions'] + 1} times: the server "
                      "stopped while making it.")
            if claims.fail(conn, row["id"], row["claim_token"], reason, now):
                _after_failure(conn, endpoints, row["id"], now)
                failed.append(row["id"])
        elif claims.requeue_interrupted(conn, row["id"], row["claim_token"]):
            requeued.append(row["id"])
    return requeued, failed


def fail_missing_original(conn: Connection, endpoints: Sequence[WebhookEndpoint], photo_id: int,
                          now: float) -> Row | None:
    if not photo_q.mark_missing_original(conn, photo_id, now):
        return None
    return _after_failure(conn, endpoints, photo_id, now)


def delete_photo(conn: Connection, endpoints: Sequence[WebhookEndpoint], photo_id: int, now: float) -> Row | None:
    """Delete the row (the caller removes the files after the commit) and announce it."""
    row = photo_q.delete(conn, photo_id)
    if row is None:
        return None
    webhook_q.enqueue_event(conn, endpoints, "photo.deleted", photo_subject(row), photo_event_data(row), now)
    finish_upload(conn, endpoints, row["upload_id"], now)
    return row


def abandon_upload(conn: Connection, endpoints: Sequence[WebhookEndpoint], upload_id: str, now: float) -> list[Row]:
    """Take back what a request that was never answered 202 left: its provisional photos (the caller removes
    their files after the commit). Photos another request was told about stay, and then the group stays, no
    longer receiving, and completes as any other. Returns the deleted rows.

    Only photos already announced (complete or failed: ``photo.uploaded`` / ``photo.failed`` went out) are
    announced as deleted; a receiver never hears of the others. No ``upload.completed`` for a group that goes.
    """
    rows = photo_q.delete_provisional(conn, upload_id)
    for row in rows:
        if row["status"] in photo_q.TERMINAL:
            webhook_q.enqueue_event(conn, endpoints, "photo.deleted", photo_subject(row), photo_event_data(row), now)
    if not photo_q.delete_upload_if_empty(conn, upload_id) and photo_q.close_receiving(conn, upload_id):
        finish_upload(conn, endpoints, upload_id, now)
    return rows


def abandon_expired_uploads(conn: Connection, endpoints: Sequence[WebhookEndpoint], now: float) -> list[Row]:
    """Every upload whose request's lease ran out (its process died): see :func:`abandon_upload`."""
    rows: list[Row] = []
    for upload_id in photo_q.expired_receiving(conn, now):
        rows += abandon_upload(conn, endpoints, upload_id, now)
    return rows


def _after_failure(conn: Connection, endpoints: Sequence[WebhookEndpoint], photo_id: int, now: float) -> Row:
    row = photo_q.get(conn, photo_id)
    assert row is not None
    webhook_q.enqueue_event(conn, endpoints, "photo.failed", photo_subject(row), photo_event_data(row), now)
    finish_upload(conn, endpoints, row["upload_id"], now)
    return row


def finish_upload(conn: Connection, endpoints: Sequence[WebhookEndpoint], upload_id: str, now: float) -> bool:
    """Complete the group if its request has ended and every photo is terminal, with ``upload.completed``.
    True when it completed now (the caller wakes the webhook sender)."""
    if not photo_q.finish_upload_if_terminal(conn, upload_id, now):
        return False
    counts = photo_q.upload_counts(conn, upload_id)
    upload = photo_q.get_upload(conn, upload_id)
    assert upload is not None
    data = {"upload_id": upload_id, "gallery_id": upload["gallery_id"], **counts}
    webhook_q.enqueue_event(conn, endpoints, "upload.completed", f"upload:{upload_id}", data, now)
    return True
