"""SQL for named leases (schema 30): what one process of the service does at a time (``runtime/lease.py``).

A lease is a row: its ``holder`` (a process's instance id), a ``token`` made anew at each take (so that a holder
that stalled past its time and came back cannot renew what another process took meanwhile), and ``expires_at``
(epoch seconds from the callers' wall clocks, which every process and host must agree on to well under a lease).
Each decision is one statement on the row, so two processes racing for a lease on PostgreSQL or SQLite never
both get it.
"""

from __future__ import annotations

from picpeak_lite.store.db import Connection, Row


def take(conn: Connection, name: str, holder: str, token: str, now: float, until: float,
         gone: str | None = None) -> bool:
    """Take the lease ``name`` until ``until`` when nobody holds it or its time ran out (its holder is gone, or
    held it as a turn: a round done until then), or its holder is ``gone`` (a process known to have died). True
    when ``holder`` has it now, with ``token``."""
    row = conn.execute(
        "INSERT INTO leases (name, holder, token, expires_at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, token = excluded.token, "
        "expires_at = excluded.expires_at "
        "WHERE leases.expires_at <= ? OR leases.holder = ? "
        "RETURNING token",
        (name, holder, token, float(until), float(now), gone),
    ).fetchone()
    return row is not None and row["token"] == token


def renew(conn: Connection, name: str, token: str, until: float) -> bool:
    """Move a held lease's end to ``until``; False when the lease is no longer this token's (it ran out and
    another process took it)."""
    return conn.execute("UPDATE leases SET expires_at = ? WHERE name = ? AND token = ? RETURNING name",
                        (float(until), name, token)).fetchone() is not None


def release(conn: Connection, name: str, token: str) -> None:
    """Give the lease up now (on the way out), so that another process need not wait for it to run out."""
    conn.execute("DELETE FROM leases WHERE name = ? AND token = ?", (name, token))


def holder_of(conn: Connection, name: str, now: float) -> Row | None:
    """Who holds ``name`` now (holder, expires_at), or None when nobody does."""
    return conn.execute("SELECT holder, expires_at FROM leases WHERE name = ? AND expires_at > ?",
                        (name, float(now))).fetchone()


def prune(conn: Connection, before: float) -> int:
    """Remove leases that ran out before ``before``: those of processes that died holding them (a photo's
    ``views:<id>``); a lease in use is renewed, and a turn ends in the future. Returns how many went."""
    conn.execute("DELETE FROM leases WHERE expires_at < ?", (float(before),))
    return conn.changes()
