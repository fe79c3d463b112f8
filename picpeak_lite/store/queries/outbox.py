"""What every outbox shares (``webhook_deliveries``, ``email_outbox``): claiming due rows under a lease, the
time of the next due row, and the retry schedule after a failed attempt.

An outbox row is written in the transaction that decides it must be sent, then a long-lived sender claims it,
tries it and records the outcome. The claim pushes ``next_attempt_at`` past a lease, so a second sender cannot
take the same row meanwhile and a row whose sender died comes back by itself when the lease runs out. Times
are wall-clock seconds passed in by the caller, never read here, so tests can drive the schedule.
"""

from __future__ import annotations

from typing import Any

from picpeak_lite.store.db import Connection, Prepared

# Delay before the retry that follows the n-th failed attempt. After the last one fails the row is given up:
# five attempts in all, spread over about two and a half hours.
RETRY_DELAYS: tuple[float, ...] = (60.0, 300.0, 1800.0, 7200.0)
MAX_ATTEMPTS = len(RETRY_DELAYS) + 1

# The tables that are outboxes (names are put into SQL text, so only these).
TABLES = ("webhook_deliveries", "email_outbox")


def _table(name: str) -> str:
    if name not in TABLES:
        raise ValueError(f"{name!r} is not an outbox")
    return name


def claim_due(conn: Connection, table: str, now: float, limit: int, lease_seconds: float) -> list[dict[str, Any]]:
    """Take up to ``limit`` pending rows that are due, oldest due first, pushing them ``lease_seconds`` into the
    future; returned by id. One guarded statement, so that two senders never take one row: the outer condition
    is checked again on the row itself, and on PostgreSQL a row another sender is taking is passed over (SKIP
    LOCKED) rather than waited for (on SQLite the write transaction already excludes every other sender). The
    choice is a MATERIALIZED common table expression: PostgreSQL may run a plain ``IN (SELECT ... LIMIT n FOR
    UPDATE SKIP LOCKED)`` more than once, each run skipping the rows the last one locked, and take more than n."""
    table = _table(table)
    skip_locked = " FOR UPDATE SKIP LOCKED" if conn.dialect == "postgresql" else ""
    rows = conn.execute(Prepared(
        f"WITH chosen AS MATERIALIZED (SELECT id FROM {table} WHERE status = 'pending' AND next_attempt_at <= ? "
        f"ORDER BY next_attempt_at, id LIMIT ?{skip_locked}) "
        f"UPDATE {table} SET next_attempt_at = ? WHERE id IN (SELECT id FROM chosen) "
        "AND status = 'pending' AND next_attempt_at <= ? RETURNING *"),
        (now, limit, now + lease_seconds, now),
    ).fetchall()
    return sorted(rows, key=lambda row: row["id"])


def next_due_at(conn: Connection, table: str) -> float | None:
    """When the next pending row falls due (None: nothing pending); the sender sleeps until then."""
    table = _table(table)
    row = conn.execute(Prepared(f"SELECT min(next_attempt_at) AS due FROM {table} WHERE status = 'pending'")
                       ).fetchall()[0]
    return row["due"]


def after_failure(attempts: int, now: float, *, final: bool = False) -> tuple[str, float]:
    """The status and next attempt time of a row whose ``attempts``-th attempt just failed: the next retry from
    :data:`RETRY_DELAYS`, or 'failed' after :data:`MAX_ATTEMPTS` (at once with ``final``, for a row that can
    never succeed)."""
    if final or attempts >= MAX_ATTEMPTS:
        return "failed", now
    return "pending", now + RETRY_DELAYS[attempts - 1]
