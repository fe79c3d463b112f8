"""SQL for the limits that hold for the whole service (web/ratelimit.py's token buckets, web/throttle.py's
password attempts): kept in the database, so that a limit of 5 is 5 for every process and host together.

Times are epoch seconds from the caller's clock. A token bucket is decided by one statement (an upsert that
refills, checks and spends on the row it locks, so concurrent writers on PostgreSQL each see the other's spend);
a password attempt's reservation reads then writes, so its caller holds ``locks.PASSWORD_ATTEMPTS``.
"""

from __future__ import annotations

from picpeak_lite.store.db import Connection, Row

# Keys kept at most per table (token buckets; password-attempt keys): past it the janitor drops the stalest.
MAX_KEYS = 50_000

# The bucket's tokens now: refilled at :rate since ``at`` (never backwards: a clock behind another process's
# refills nothing), at most :burst.
_ELAPSED = "(CASE WHEN :now > rate_buckets.at THEN :now - rate_buckets.at ELSE 0 END)"
_AVAILABLE = (f"(CASE WHEN rate_buckets.tokens + {_ELAPSED} * :rate >= :burst THEN :burst "
              f"ELSE rate_buckets.tokens + {_ELAPSED} * :rate END)")
_GRANTED = f"(:force = 1 OR {_AVAILABLE} >= 1)"
_LEFT = f"({_AVAILABLE} - CASE WHEN {_GRANTED} THEN :amount ELSE 0 END)"
_AT = "(CASE WHEN :now > rate_buckets.at THEN :now ELSE rate_buckets.at END)"

TAKE = f"""
INSERT INTO rate_buckets (bucket, key, tokens, at, full_at, granted)
VALUES (:bucket, :key, :burst - :amount, :now, :now + :amount / :rate, 1)
ON CONFLICT (bucket, key) DO UPDATE SET
    tokens = {_LEFT},
    at = {_AT},
    full_at = {_AT} + (:burst - {_LEFT}) / :rate,
    granted = CASE WHEN {_GRANTED} THEN 1 ELSE 0 END
RETURNING tokens, granted
"""


def take_tokens(conn: Connection, bucket: str, key: str, now: float, burst: float, rate: float, amount: float,
                *, force: bool = False) -> Row:
    """Refill the bucket to ``now``; if it holds at least one token (or ``force``: a charge after the fact, which
    may go into debt) spend ``amount``. One statement: returns ``granted`` (1 or 0) and the ``tokens`` left (as
    they are now when refused). A new bucket starts full."""
    row = conn.execute(TAKE, {"bucket": bucket, "key": key, "now": float(now), "burst": float(burst),
                              "rate": float(rate), "amount": float(amount), "force": 1 if force else 0}).fetchone()
    assert row is not None  # an upsert with RETURNING always returns its row
    return row


def cheap_commit(conn: Connection) -> None:
    """Let this transaction commit without waiting for its WAL to reach the disk (PostgreSQL): a limit's state lost
    in a database crash costs a few extra taps, while the wait would be paid by every tap. SQLite's commits are
    as durable as its connection is set up (one writer, ``synchronous = FULL``)."""
    if conn.dialect == "postgresql":
        conn.execute("SET LOCAL synchronous_commit TO OFF")


# --- password attempts ---------------------------------------------------------------------------------------

def attempts_of(conn: Connection, throttle: str, target: str, client: str, now: float) -> Row:
    """The key's failures and its attempts in flight (reservations not yet expired): how many of each, the
    oldest and latest time of all of them and of the failures alone, and when the first reservation expires."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE pending_until IS NULL) AS failures, "
        "count(*) FILTER (WHERE pending_until IS NOT NULL) AS pending, "
        "min(at) AS oldest, max(at) AS latest, "
        "min(at) FILTER (WHERE pending_until IS NULL) AS oldest_failure, "
        "max(at) FILTER (WHERE pending_until IS NULL) AS latest_failure, "
        "min(pending_until) AS pending_ends "
        "FROM password_attempts WHERE throttle = ? AND target = ? AND client = ? "
        "AND (pending_until IS NULL OR pending_until > ?)",
        (throttle, target, client, now),
    ).fetchone()
    assert row is not None  # an aggregate always returns one row
    return row


def forget_before(conn: Connection, throttle: str, target: str, client: str, before: float, now: float) -> None:
    """Remove the key's rows from ``before`` or earlier, and its expired reservations."""
    conn.execute("DELETE FROM password_attempts WHERE throttle = ? AND target = ? AND client = ? "
                 "AND (at <= ? OR pending_until <= ?)", (throttle, target, client, before, now))


def forget_key(conn: Connection, throttle: str, target: str, client: str) -> None:
    """Remove the key's failures (a right password); others' attempts still in flight stay."""
    conn.execute("DELETE FROM password_attempts WHERE throttle = ? AND target = ? AND client = ? "
                 "AND pending_until IS NULL", (throttle, target, client))


def reserve(conn: Connection, throttle: str, target: str, client: str, now: float, until: float) -> int:
    """An attempt in flight for the key until ``until``; returns its id."""
    row = conn.execute(
        "INSERT INTO password_attempts (throttle, target, client, at, pending_until, forget_at) "
        "VALUES (?, ?, ?, ?, ?, ?) RETURNING id", (throttle, target, client, now, until, until)).fetchone()
    assert row is not None
    return int(row["id"])


def release(conn: Connection, ids: list[int]) -> None:
    """Remove reservations (their attempt is answered, or was never made)."""
    for reservation in ids:
        conn.execute("DELETE FROM password_attempts WHERE id = ? AND pending_until IS NOT NULL", (reservation,))


def add_failure(conn: Connection, throttle: str, target: str, client: str, now: float, forget_at: float,
                keep: int) -> None:
    """One failure for the key, keeping its ``keep`` latest failures (further ones change nothing: the wait has
    reached the window long before)."""
    conn.execute("INSERT INTO password_attempts (throttle, target, client, at, pending_until, forget_at) "
                 "VALUES (?, ?, ?, ?, NULL, ?)", (throttle, target, client, now, forget_at))
    conn.execute(
        "DELETE FROM password_attempts WHERE throttle = ? AND target = ? AND client = ? AND pending_until IS NULL "
        "AND id < (SELECT id FROM password_attempts WHERE throttle = ? AND target = ? AND client = ? "
        "AND pending_until IS NULL ORDER BY id DESC LIMIT 1 OFFSET ?)",
        (throttle, target, client, throttle, target, client, keep - 1),
    )


# --- housekeeping (the janitor) ------------------------------------------------------------------------------

def prune(conn: Connection, now: float, max_keys: int) -> dict[str, int]:
    """Remove what says nothing any more: full buckets, expired reservations, and the attempts of keys whose
    every row may be forgotten; then, past ``max_keys`` buckets or attempt keys, the stalest. Returns counts."""
    conn.execute("DELETE FROM rate_buckets WHERE full_at <= ?", (now,))
    removed = {"buckets": conn.changes()}
    conn.execute("DELETE FROM password_attempts WHERE pending_until <= ?", (now,))
    reservations = conn.changes()
    conn.execute(
        "DELETE FROM password_attempts WHERE (throttle, target, client) IN ("
        "SELECT throttle, target, client FROM password_attempts GROUP BY throttle, target, client "
        "HAVING max(forget_at) <= ?)", (now,))
    removed["attempts"] = reservations + conn.changes()
    over = conn.execute("SELECT count(*) AS n FROM rate_buckets").fetchone()
    if over is not None and over["n"] > max_keys:
        conn.execute(
            "DELETE FROM rate_buckets WHERE (bucket, key) IN (SELECT bucket, key FROM rate_buckets "
            "ORDER BY full_at LIMIT ?)", (over["n"] - max_keys,))
        removed["buckets"] += conn.changes()
    keys = conn.execute("SELECT count(*) AS n FROM (SELECT 1 FROM password_attempts "
                        "GROUP BY throttle, target, client) AS k").fetchone()
    if keys is not None and keys["n"] > max_keys:
        conn.execute(
            "DELETE FROM password_attempts WHERE (throttle, target, client) IN ("
            "SELECT throttle, target, client FROM password_attempts GROUP BY throttle, target, client "
            "ORDER BY max(forget_at) LIMIT ?)", (keys["n"] - max_keys,))
        removed["attempts"] += conn.changes()
    return removed


def count_rows(conn: Connection) -> dict[str, int]:
    """How many rows each table holds (for tests and the bench)."""
    return {table: int(conn.execute(f"SELECT count(*) AS n FROM {table}").fetchall()[0]["n"])
            for table in ("rate_buckets", "password_attempts")}
