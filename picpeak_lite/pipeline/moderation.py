"""The admin's review of guests' photos, as sync units of work ``fn(conn, ...)`` run inside one ``db.write``.

Like ``transitions``, each change writes its webhook rows in the same transaction: ``photo.approved`` when a
photo is approved, ``photo.rejected`` (``action``: ``hidden`` or ``deleted``) when it is hidden or deleted from
the review queue. A deleted photo also gets its ``photo.deleted`` (receivers that mirror the gallery need it
whatever the reason). Only photos still waiting are acted on, so two tabs reviewing at once announce each photo
once; the caller removes deleted photos' files after the commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from picpeak_lite.config import WebhookEndpoint
from picpeak_lite.pipeline import transitions
from picpeak_lite.store.db import Connection, Row
from picpeak_lite.store.queries import moderation as moderation_q
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries import webhooks as webhook_q

ACTIONS = ("approve", "hide", "delete")


def review(conn: Connection, endpoints: Sequence[WebhookEndpoint], gallery_id: int, action: str,
           ids: Iterable[int], now: float) -> list[Row]:
    """Apply one review ``action`` to the photos of ``ids`` that still wait in this gallery; returns their rows
    (as they were before a delete)."""
    if action not in ACTIONS:
        raise ValueError(f"unknown review action {action!r}")
    done: list[Row] = []
    for photo_id in moderation_q.awaiting_in_gallery(conn, gallery_id, ids):
        if action == "delete":
            row = transitions.delete_photo(conn, endpoints, photo_id, now)
            if row is None:
                continue
            _announce(conn, endpoints, "photo.rejected", row, now, action="deleted")
        else:
            if not moderation_q.clear_mark(conn, photo_id, hide=action == "hide"):
                continue
            row = photo_q.get(conn, photo_id)
            assert row is not None
            if action == "approve":
                _announce(conn, endpoints, "photo.approved", row, now)
            else:
                _announce(conn, endpoints, "photo.rejected", row, now, action="hidden")
        done.append(row)
    return done


def _announce(conn: Connection, endpoints: Sequence[WebhookEndpoint], event: str, row: Row, now: float,
              **extra: str) -> None:
    data = {**transitions.photo_event_data(row), "guest_name": row["guest_name"], **extra}
    webhook_q.enqueue_event(conn, endpoints, event, transitions.photo_subject(row), data, now)
