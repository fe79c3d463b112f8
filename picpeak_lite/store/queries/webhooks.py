"""The webhook outbox: the only SQL that touches ``webhook_deliveries``.

Events are written to the outbox in the same transaction as the state change they describe
(:func:`enqueue_event`), so an event exists if and only if the change committed. The sender in
``picpeak_lite.events.webhooks`` then claims due rows, posts them and records the outcome here.

Every function is sync and takes the connection first; the caller owns the transaction. Times are wall-clock
seconds (``time.time()``) passed in by the caller, never read here, so tests can drive the schedule.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import secrets
from collections.abc import Iterable
from typing import Any

from picpeak_lite.config import WEBHOOK_EVENTS, WebhookEndpoint
from picpeak_lite.store.db import Connection
from picpeak_lite.store.queries import outbox

# The retry schedule is every outbox's (store/queries/outbox.py): five attempts over about two and a half hours.
RETRY_DELAYS = outbox.RETRY_DELAYS
MAX_ATTEMPTS = outbox.MAX_ATTEMPTS
TABLE = "webhook_deliveries"

# The event type of a "send test" delivery from the settings page; never enqueued by a state change.
TEST_EVENT = "webhook.test"

# last_error is shown on the admin log page; a receiver's error page must not fill the database.
MAX_ERROR_CHARS = 500


def event_id(event_type: str, subject: str) -> str:
    """The event's id, derived from what it is about rather than drawn at random.

    Enqueueing the same event again (a photo reprocessed, a transaction retried) therefore hits the unique
    constraint instead of creating a second delivery that receivers could not recognise as a duplicate.
    """
    digest = hashlib.sha256(f"{event_type}:{subject}".encode()).hexdigest()
    return "evt_" + digest[:32]


def event_body(event_id: str, event_type: str, data: dict[str, Any], now: float) -> str:
    """The JSON sent to receivers, built once at enqueue so every attempt (and the signature) is identical."""
    created = datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat(timespec="seconds")
    body = {"id": event_id, "type": event_type, "created_at": created.replace("+00:00", "Z"), "data": data}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def enqueue_event(
    conn: Connection,
    endpoints: Iterable[WebhookEndpoint],
    event_type: str,
    subject: str,
    data: dict[str, Any],
    now: float,
) -> None:
    """Queue one event for every endpoint subscribed to ``event_type``; call it inside your transaction.

    ``subject`` names what the event is about and must never be reused for a different thing (a rowid can
    be reused after a delete; add something unique such as the storage key). An event already queued for an
    endpoint is left as it is, first body included. Endpoints added on the settings page (the
    ``webhook_endpoints`` table) receive events too.
    """
    if event_type not in WEBHOOK_EVENTS:
        raise ValueError(f"unknown webhook event {event_type!r}")
    eid = event_id(event_type, subject)
    body: str | None = None
    for endpoint in with_stored_endpoints(conn, endpoints):
        if event_type not in endpoint.events:
            continue
        if body is None:
            body = event_body(eid, event_type, data, now)
        conn.execute(
            """
            INSERT INTO webhook_deliveries
                (event_id, endpoint_url, event_type, body, created_at, next_attempt_at)
            VALUES (?, ?, ?, ?, ?, ?)
            ON CONFLICT (event_id, endpoint_url) DO NOTHING
            """,
            (eid, endpoint.url, event_type, body, now, now),
        )


def stored_endpoints(conn: Connection, *, active_only: bool = True) -> list[WebhookEndpoint]:
    """Receivers added on the settings page."""
    where = "WHERE active = 1" if active_only else ""
    rows = conn.execute(f"SELECT url, secret, events FROM webhook_endpoints {where} ORDER BY id").fetchall()
    return [WebhookEndpoint(url=r["url"], secret=r["secret"], events=tuple(json.loads(r["events"]))) for r in rows]


def with_stored_endpoints(conn: Connection, configured: Iterable[WebhookEndpoint]) -> list[WebhookEndpoint]:
    """The configured endpoints, then the stored ones whose URL the config does not already name."""
    out = list(configured)
    seen = {e.url for e in out}
    out += [e for e in stored_endpoints(conn) if e.url not in seen]
    return out


def endpoint_for_url(conn: Connection, url: str) -> WebhookEndpoint | None:
    """A stored endpoint by URL (active or paused), for the sender to sign a queued delivery with."""
    for endpoint in stored_endpoints(conn, active_only=False):
        if endpoint.url == url:
            return endpoint
    return None


def enqueue_test(conn: Connection, endpoint_url: str, now: float) -> int:
    """Queue a "send test" delivery to one endpoint, due now; returns its row id. Each test is its own event."""
    eid = event_id(TEST_EVENT, f"test:{endpoint_url}:{secrets.token_hex(8)}")
    body = event_body(eid, TEST_EVENT, {"message": "A test delivery from picpeak-lite."}, now)
    conn.execute(
        "INSERT INTO webhook_deliveries (event_id, endpoint_url, event_type, body, created_at, next_attempt_at) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (eid, endpoint_url, TEST_EVENT, body, now, now),
    )
    return conn.last_insert_rowid()


def claim_due(conn: Connection, now: float, limit: int, lease_seconds: float) -> list[dict[str, Any]]:
    """Up to ``limit`` due deliveries, leased for ``lease_seconds`` (``outbox.claim_due``): the lease keeps a
    second sender (another process) from posting the same row at the same time, and brings the row back by
    itself if this process dies mid-attempt. Run it inside a write transaction."""
    return outbox.claim_due(conn, TABLE, now, limit, lease_seconds)


def next_due_at(conn: Connection) -> float | None:
    """When the next pending delivery falls due (None: nothing pending); the sender sleeps until then."""
    return outbox.next_due_at(conn, TABLE)


def record_delivered(conn: Connection, delivery_id: int, status_code: int, now: float) -> None:
    """The receiver answered 2xx: the delivery is done."""
    conn.execute(
        """
        UPDATE webhook_deliveries
        SET status = 'delivered', attempts = attempts + 1, last_status_code = ?, last_error = NULL,
            delivered_at = ?
        WHERE id = ? AND status = 'pending'
        """,
        (status_code, now, delivery_id),
    )


def record_failure(
    conn: Connection,
    delivery_id: int,
    error: str,
    now: float,
    *,
    status_code: int | None = None,
    final: bool = False,
) -> dict[str, Any] | None:
    """Count one failed attempt and schedule the next from :data:`RETRY_DELAYS`, or give up after
    :data:`MAX_ATTEMPTS` (or at once with ``final``, for a delivery that can never succeed).

    Returns the updated row, or None when the delivery is no longer pending.
    """
    row = conn.execute(
        "SELECT attempts FROM webhook_deliveries WHERE id = ? AND status = 'pending'", (delivery_id,)
    ).fetchall()
    if not row:
        return None
    attempts = row[0]["attempts"] + 1
    status, next_attempt_at = outbox.after_failure(attempts, now, final=final)
    return conn.execute(
        """
        UPDATE webhook_deliveries
        SET status = ?, attempts = ?, next_attempt_at = ?, last_status_code = ?, last_error = ?
        WHERE id = ?
        RETURNING *
        """,
        (status, attempts, next_attempt_at, status_code, error[:MAX_ERROR_CHARS], delivery_id),
    ).fetchall()[0]


def list_deliveries(
    conn: Connection,
    *,
    status: str | None = None,
    event_id: str | None = None,
    before_id: int | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    """Deliveries newest first, for the admin log; for the next page pass the last id seen as before_id."""
    clauses: list[str] = []
    params: list[Any] = []
    if status is not None:
        clauses.append("status = ?")
        params.append(status)
    if event_id is not None:
        clauses.append("event_id = ?")
        params.append(event_id)
    if before_id is not None:
        clauses.append("id < ?")
        params.append(before_id)
    where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
    return conn.execute(
        f"SELECT * FROM webhook_deliveries {where} ORDER BY id DESC LIMIT ?", (*params, limit)
    ).fetchall()


def delivery_counts(conn: Connection) -> dict[str, int]:
    """How many deliveries are pending, delivered and failed, for the dashboard."""
    counts = {"pending": 0, "delivered": 0, "failed": 0}
    for row in conn.execute("SELECT status, count(*) AS n FROM webhook_deliveries GROUP BY status"):
        counts[row["status"]] = row["n"]
    return counts
